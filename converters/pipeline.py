"""Frozen TF GraphDef -> ONNX model: tf2onnx for everything outside the family, our handlers inside it.

This follows tf2onnx.convert's own sequence (import the graph, parse it into tf2onnx graphs,
rewrite, map ops to handlers, optimize, build the model) with two additions: family nodes are
shielded from tf2onnx's rewriters right after parsing (see converters.family), and the result is
checked for leftover TF ops (converters.completeness).
"""
from __future__ import annotations

import contextlib
import logging
from typing import Callable, Dict, Optional, Sequence

import numpy as np
import onnx
from onnx import TensorProto

from converters.completeness import check_fully_converted
from converters import float8
from converters.errors import ConversionError, LoweringError
from converters.exact_outputs import EXACT_OUTPUTS_KEY, quantization_outputs
from converters.family import FAMILY_OPS, QUANTIZATION_OPS, shield_family_nodes, shielded_type
from converters.gradients import gradient_handlers, shield_gradient_nodes
from converters.fusions import (
    batch_norm_clip_fake_quant_class,
    constant_value,
    fold_batch_norm_class,
    merge_clips_class,
    pad_into_depthwise_class,
)
from converters.layout import absorb_channel_transposes
from converters.layout import optimizers as layout_optimizers
from converters.grouped_conv import rewrite_grouped_depthwise
from converters.pad_before_conv import fold_pads_before_padding_convs
from converters.space_to_batch import isolate_space_to_batch_inputs
from converters.linear_cost import linear_graph
from converters.redundant_clamps import drop_redundant_clamps
from converters.lowering_custom import lower_to_custom_node
from ort_ops.model import set_lowest_ir_version
from ort_ops.schemas import DOMAIN, OPSET_VERSION
from ort_ops.spec import OpError

# The lowerings that write TF's computation exactly, for every graph (inference, training steps, saliency maps).
LOWERINGS = ("custom", "standard")
# The integer lowering: a QAT inference graph as its integer model, judged in quantization steps (converters.integer).
INTEGER_LOWERING = "integer"
ALL_LOWERINGS = LOWERINGS + (INTEGER_LOWERING,)
DEFAULT_OPSET = 17

logger = logging.getLogger(__name__)


def _standard_lowerings() -> Dict[str, Callable]:
    # Imported lazily: converters.standard is written separately and only needed for this mode.
    from converters.standard import STANDARD_LOWERINGS

    return STANDARD_LOWERINGS


def float_inference_graph(op_types) -> bool:
    """Whether a graph of these TF op types is a float inference graph: no quantizer and no gradient of the
    family. There no output is bit-exact, and the custom lowering writes what ONNX Runtime runs fastest (its
    grouped Conv for a depthwise convolution, standard_conv_for_depthwise; batch norms folded into their
    convolutions, convert_frozen_graph's fold_batch_norm)."""
    return not any(t in QUANTIZATION_OPS or (t in FAMILY_OPS and ("Grad" in t or "Backprop" in t)) for t in op_types)


def standard_conv_for_depthwise(ctx, node, keep_domain: bool) -> bool:
    """Whether the custom lowering writes this DepthwiseConv2dNative as the standard lowering's grouped Conv.

    It does where the domain's node gains nothing over ONNX Runtime's own grouped Conv and costs time: the
    depthwise convolution of a float inference graph (float32, a constant filter, no quantizer and no
    gradient of the family in the graph). ONNX Runtime fuses a Conv with the batch norm's Mul and Add and the
    ReLU after it and runs it in its blocked NCHWc layout, where a domain node stops those fusions and needs
    layout reorders around it (docs/layout.md has the measurements). The domain's kernel sums in TF's Eigen
    order, bit for bit; that matters where a quantizer reads the sums (a value at a rounding tie flips with
    the sum's last bit) and for a training step's or saliency map's agreement with TF, so those graphs keep
    the domain node, as do the other element types (float16, bfloat16, float64) and a filter that is an input.
    The filter must also be finite and free of subnormals: TF multiplies padding in (an infinite tap over
    padding gives NaN), and flushes a subnormal tap to zero, where ONNX Runtime's Conv does neither; on such a
    filter only the domain's kernel computes what TF computes."""
    if keep_domain or ctx.get_dtype(node.input[0]) != TensorProto.FLOAT:
        return False
    w = constant_value(node.inputs[1])
    if w is None or w.dtype != np.float32:
        return False
    magnitude = np.abs(w)
    return bool(np.isfinite(w).all() and not ((magnitude > 0) & (magnitude < np.finfo(np.float32).tiny)).any())


def _family_handlers(lowering: str, failures: list, graph_facts: dict) -> dict:
    """tf2onnx custom_op_handlers for the shielded family types.

    tf2onnx (with continue_on_error, as its own converters use) only logs a handler's exception; we
    record it in ``failures`` so that conversion fails with our error instead of a log line.
    ``graph_facts`` is filled once the TF graph is parsed (``keep_domain_depthwise``: not float_inference_graph).
    """
    if lowering not in ALL_LOWERINGS:
        raise ValueError(f"lowering must be one of {ALL_LOWERINGS}, got {lowering!r}")
    table = _standard_lowerings() if lowering == "standard" else None

    def make_handler(op_type):
        def handler(ctx, node, name, args):
            # Undo the shielding: from here on the node is the TF op again.
            node.type = op_type
            try:
                if lowering == "integer":
                    # Every family node as the domain's, which converters.integer then rewrites as QDQ.
                    lower_to_custom_node(ctx, node, op_type)
                elif table is None and op_type == "DepthwiseConv2dNative" and standard_conv_for_depthwise(
                        ctx, node, graph_facts.get("keep_domain_depthwise", True)):
                    try:
                        _standard_lowerings()[op_type](ctx, node)
                    except LoweringError:  # a geometry only the domain's kernel takes: keep the domain node
                        lower_to_custom_node(ctx, node, op_type)
                elif table is None:
                    lower_to_custom_node(ctx, node, op_type)
                else:
                    lowering_fn = table.get(op_type)
                    if lowering_fn is None:
                        raise LoweringError(op_type, name, "the standard lowering has no rule for this op")
                    lowering_fn(ctx, node)
            except OpError as e:
                failures.append(ConversionError(f"{op_type} (node {name!r}): {e.detail}"))
                raise
            except Exception as e:
                failures.append(e)
                raise

        return handler

    handlers = {shielded_type(op): (make_handler(op), []) for op in FAMILY_OPS}
    handlers.update(gradient_handlers(lowering, failures))
    return handlers


def _optimize(g, fold_batch_norm: bool = False, fuse_family: bool = True):
    """tf2onnx's optimizers, as tf2onnx.convert runs them, with one copy of the graph instead of dozens,
    the transpose optimizer taught our ops (converters.layout) and our fusions (converters.fusions).

    With ``catch_errors=True`` tf2onnx deep-copies the whole graph (constants included) before every
    optimizer in every round (12 optimizers, two or more rounds), so that it can go on from the copy
    if an optimizer raises. Measured on the MobileNetV2 QAT graph, those copies were 60% of the
    optimizer's time, and their cost grows with the graph times the rounds. Here the graph is copied
    once and optimized in place (the same optimizers in the same order, so the same result); only if
    an optimizer raises does the copy go through tf2onnx's careful mode.

    converters.linear_cost makes the clean-up after each optimizer, the identity optimizer and the
    layout optimizer's loop linear in the graph (they grew with nodes x outputs or nodes x moves).
    """
    import copy

    from tf2onnx import optimizer

    passes = layout_optimizers()
    passes["pad_into_depthwise"] = pad_into_depthwise_class()
    if fold_batch_norm:
        passes["fold_batch_norm"] = fold_batch_norm_class()
    if fuse_family:  # the integer lowering reads the family's nodes one by one (converters.integer)
        # After the folding: a batch norm folded into its convolution leaves nothing to fuse here.
        passes["batch_norm_clip_fake_quant"] = batch_norm_clip_fake_quant_class()
        passes["merge_clips"] = merge_clips_class()
    backup = copy.deepcopy(g)
    try:
        with linear_graph(g, optimizing=True):
            return optimizer.optimize_graph(g, catch_errors=False, optimizers=passes)
    except Exception:  # an optimizer failed: start again from the copy, skipping what fails
        logger.warning("a tf2onnx optimizer failed; optimizing again with tf2onnx's per-optimizer recovery", exc_info=True)
        with linear_graph(backup, optimizing=True):
            return optimizer.optimize_graph(backup, catch_errors=True, optimizers=passes)


def unmappable_dtype_error(tf_graph, key_error) -> ConversionError:
    """The ConversionError for tf2onnx's KeyError on a TF dtype it has no ONNX type for: every node that
    outputs such a dtype or names it in an attribute (Cast's DstT), by op and name."""
    import tensorflow as tf
    from tf2onnx.tf_utils import TF_TO_ONNX_DTYPE

    def unmapped(dtype) -> bool:
        return dtype not in (tf.resource, tf.variant) and dtype.as_datatype_enum not in TF_TO_ONNX_DTYPE

    found = []
    for op in tf_graph.get_operations():
        dtypes = [t.dtype for t in op.outputs]
        for value in op.node_def.attr.values():
            if value.WhichOneof("value") == "type":
                dtypes.append(tf.as_dtype(value.type))
        bad = sorted({d.name for d in dtypes if unmapped(d)})
        if bad:
            found.append(f"{op.type} (node {op.name!r}): {', '.join(bad)}")
    if not found:
        return ConversionError(f"tf2onnx failed on a missing key {key_error} (no unmappable dtype found in the graph)")
    return ConversionError(
        f"{len(found)} node(s) use a TF dtype that has no ONNX tensor type here: " + "; ".join(found[:10])
        + ("; ..." if len(found) > 10 else "")
        + ". Keep that part of the model out of the converted graph (convert from an earlier or later tensor), "
        "or cast to a supported type in TF before converting"
    )


def convert_frozen_graph(
    frozen_graph,
    input_names: Sequence[str],
    output_names: Sequence[str],
    lowering: str = "custom",
    opset: int = DEFAULT_OPSET,
    name: str = "converted",
    tensors_to_rename: Optional[dict] = None,
    initialized_tables: Optional[dict] = None,
    shape_override: Optional[dict] = None,
    output_path: Optional[str] = None,
    fold_batch_norm: Optional[bool] = None,
    integer_weights: str = "uint8",
) -> onnx.ModelProto:
    """Convert a frozen GraphDef (variables already constants) to an ONNX model.

    ``integer_weights`` (``lowering="integer"``): "uint8" (default, right on every CPU) or "int8" (faster where
    ONNX Runtime's u8s8 kernels are exact: VNNI x86 CPUs, ARM; docs/integer.md).

    ``fold_batch_norm=True`` folds inference-mode batch norms with constant statistics into the
    preceding convolution (custom lowering; converters.fusions). It changes float rounding, so the
    model no longer claims bit-exact quantization outputs. ``None`` (the default) folds them in a float
    inference graph (no quantizer, no family gradient: float_inference_graph), where no output is bit-exact
    anyway and ONNX Runtime, as tf2onnx's models get, then runs one fused convolution per layer; ``False``
    never folds.

    Raises LoweringError / ConversionError when a family op cannot be written in ``lowering``, and
    UnconvertedOpsError when tf2onnx left any op unconverted. The model carries the lowest IR version its
    opsets need (ort_ops.lowest_ir_version).
    """
    import tensorflow as tf
    from tf2onnx import tf_loader, utils
    from tf2onnx.tfonnx import process_graphs

    failures: list = []
    graph_facts: dict = {}
    handlers = _family_handlers(lowering, failures, graph_facts)
    handlers.update(float8.cast_handlers(failures))
    if lowering == "integer":
        from converters.integer import check_integer_opset, refuse_training_graph

        opset = check_integer_opset(opset)
    extra_opset = [utils.make_opsetid(DOMAIN, OPSET_VERSION)] if lowering in ("custom", "integer") else []
    opset = utils.find_opset(opset)

    tf_loader.clear_functions()
    with tf.device("/cpu:0"), tf.Graph().as_default() as tf_graph:
        tf.import_graph_def(frozen_graph, name="")
        if lowering == "integer":
            from converters.integer.unfolded import quantizers_unfolded

            unfolded = quantizers_unfolded()
        else:
            unfolded = contextlib.nullcontext()
        try:
            with unfolded:
                main_g, subgraphs = float8.graphs_from_tf(tf_graph, opset, list(input_names), list(output_names), shape_override)
        except KeyError as e:  # tf2onnx's dtype map: a bare KeyError naming only the dtype
            raise unmappable_dtype_error(tf_graph, e) from e
        for g in [main_g] + subgraphs:
            g.set_config(None, opset, extra_opset)
            drop_redundant_clamps(g)
            isolate_space_to_batch_inputs(g)  # tf2onnx's handlers read every output of the op's producer
            fold_pads_before_padding_convs(g)  # before tf2onnx's Pad-into-Conv rewrite drops a conv's own pads
            rewrite_grouped_depthwise(g)
            absorb_channel_transposes(g, lowering)
        # Read by the handlers; the types are TF's until shielded, the grouped convolutions rewritten.
        graph_facts["keep_domain_depthwise"] = not float_inference_graph(
            n.type for g in [main_g] + subgraphs for n in g.get_nodes())
        if lowering == "integer":
            refuse_training_graph(n for g in [main_g] + subgraphs for n in g.get_nodes())
            fold_batch_norm = False  # the integer lowering folds batch norms into the weights' scales itself
        elif fold_batch_norm is None:
            fold_batch_norm = lowering == "custom" and not graph_facts["keep_domain_depthwise"]
        for g in [main_g] + subgraphs:
            shield_family_nodes(g)
            shield_gradient_nodes(g)
        exact_outputs = quantization_outputs(tf_graph, output_names, tensors_to_rename)
        # tf2onnx's rewriters and make_graph clean the graph up with delete_unused_nodes too, at a cost of
        # outputs x nodes (converters.linear_cost).
        with linear_graph(main_g, *subgraphs):
            g = process_graphs(
                main_g, subgraphs, handlers, [], [], True, None, initialized_tables, tensors_to_rename
            )
            if failures:
                raise failures[0]
            with linear_graph(g):
                g = _optimize(g, fold_batch_norm, fuse_family=lowering != "integer")
                model = float8.make_model(g, f"converted from {name} by converters (tf2onnx, lowering={lowering})")

    if lowering == "integer":
        from converters.integer import lower_to_integer

        model, integer_summary, output_steps = lower_to_integer(model, integer_weights)
    if lowering in ("standard", "integer"):
        # No node of the domain remains, so the model must not demand the custom library.
        del_imports = [i for i, imp in enumerate(model.opset_import) if imp.domain == DOMAIN]
        for i in reversed(del_imports):
            del model.opset_import[i]
    # tf2onnx stamps the IR version it associates with the opset (8 for 17, but 10 from its newer tables); every
    # model the project writes carries the lowest its opsets need, so that onnxruntime 1.17 (IR 9) reads it.
    set_lowest_ir_version(model)
    check_fully_converted(model)
    if fold_batch_norm or lowering == "integer":  # integer: judged in quantization steps (converters.integer)
        exact_outputs = []  # folded weights round differently: quantized values may move by a grid step
    onnx.helper.set_model_props(model, {EXACT_OUTPUTS_KEY: ",".join(exact_outputs)})
    if lowering == "integer":
        from converters.integer import record

        record(model, integer_summary, output_steps)
    if output_path:
        onnx.save_model(model, output_path)
    return model
