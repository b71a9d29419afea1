"""TF's float8 tensors as ONNX FLOAT8E4M3FN / FLOAT8E5M2 (opset >= 19), where ONNX Runtime computes TF's bits.

Keras 3's ``model.quantize("float8")`` quantizes a Dense layer's input and kernel with
``x * (1/scale) -> clip to +-max -> Cast float32->float8_e4m3fn -> Cast back -> * scale`` (its gradient
quantizes with float8_e5m2). tf2onnx has no ONNX type for TF's float8 dtypes and fails with a bare
``KeyError: tf.float8_e4m3fn``; its Cast handler would also write ONNX's default ``saturate=1``, which
clamps where TF overflows.

What TF computes (tf.cast on the CPU, Eigen's/ml_dtypes' conversion): round to nearest, ties to even; a
value that rounds past the largest finite value overflows to NaN for float8_e4m3fn (it has no infinity:
|x| > 464, the tie at 464 goes down to 448) and to +-inf for float8_e5m2 (|x| >= 61440); +-inf give NaN
and +-inf respectively; NaN stays NaN with its sign; widening back is exact.

What ONNX Runtime's Cast computes (measured, onnxruntime 1.32 CPU; tests/test_keras3_quantization.py
compares every float16 value, a dense float32 sweep, +-0, +-inf, NaNs, ties and values past the maximum):
with ``saturate=1`` every overflow clamps to the largest finite value, against TF everywhere past it; with
``saturate=0`` infinities, NaNs and every value that does not overflow agree with TF bit for bit, and so
do most overflows, but not all: float8_e4m3fn gives +-448 for 480 <= |x| < 496 (TF: NaN) and float8_e5m2
gives NaN for 61440 <= |x| < 65536 (TF: +-inf). Neither setting is TF's alone.

So a TF Cast to float8 becomes ``Cast(saturate=0)`` of ``x * (|x| > bound ? inf : 1)``: every input TF
overflows is made the infinity of its sign first, which ONNX Runtime maps as TF does (NaN for e4m3fn,
+-inf for e5m2); the rest goes through unchanged. The guard is left out where the Cast's input is
provably within the bound: the output of Min/Max with constant bounds, i.e. Keras' clip to the format's
largest value (a NaN passes such a clip as NaN or as a bound, both of which the Cast maps like TF).
A Cast from float8 widens exactly (plain ONNX Cast).

Only what was compared is converted: Casts between float8_e4m3fn / float8_e5m2 and float32 / float16,
float8 constants, and Identity. Anything else that touches a float8 tensor (another op, another float8
format, an opset below 19) is a ConversionError that names the node and the dtype.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
from onnx import TensorProto

from converters.errors import ConversionError

OPSET = 19  # FLOAT8 tensor types and Cast's saturate attribute; see make_model
IR_VERSION_19 = 9  # ONNX's IR version of opset 19
CAST_TYPE = "OrtOpsFloat8Cast"  # the private type a float8 Cast gets until our handler writes it (cf. family.py)

# TF dtype name -> (ONNX element type, bound, inclusive): TF overflows exactly where |x| > bound
# (|x| >= bound when inclusive), i.e. from the midpoint between the largest finite value and the next
# power step on, with ties to even deciding the midpoint itself.
FORMATS = {
    "float8_e4m3fn": (TensorProto.FLOAT8E4M3FN, 464.0, False),
    "float8_e5m2": (TensorProto.FLOAT8E5M2, 61440.0, True),
}
# The float types a float8 Cast may come from or go to (compared exhaustively or by sweep against TF).
WIDE_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}
PASSIVE_OPS = ("Const", "Identity")  # carry float8 values without computing on them
_ONNX_FLOAT8 = {fmt[0] for fmt in FORMATS.values()}
_ALL_ONNX_FLOAT8 = {getattr(TensorProto, n) for n in ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ")}


def _is_float8(dtype) -> bool:
    return dtype.name.startswith("float8")


def _op_dtypes(op) -> set:
    """Every dtype an op of a tf.Graph reads, writes or names in a type attribute."""
    import tensorflow as tf

    dtypes = {t.dtype for t in op.outputs} | {t.dtype for t in op.inputs}
    for value in op.node_def.attr.values():
        if value.WhichOneof("value") == "type":
            dtypes.add(tf.as_dtype(value.type))
        elif value.WhichOneof("value") == "list":
            dtypes.update(tf.as_dtype(t) for t in value.list.type)
    return {d.base_dtype for d in dtypes if _is_float8(d.base_dtype)}


def check_graph(tf_graph, opset: int) -> bool:
    """Raise ConversionError for every use of float8 in ``tf_graph`` that is not converted exactly (see the
    module docstring); returns whether the graph has float8 tensors at all."""
    found = False
    for op in tf_graph.get_operations():
        dtypes = _op_dtypes(op)
        if not dtypes:
            continue
        found = True
        names = ", ".join(sorted(d.name for d in dtypes))
        where = f"{op.type} (node {op.name!r})"
        unknown = sorted(d.name for d in dtypes if d.name not in FORMATS)
        if unknown:
            raise ConversionError(
                f"{where}: {', '.join(unknown)} is not converted: only float8_e4m3fn and float8_e5m2 have ONNX types "
                "whose ONNX Runtime casts were checked against TF's (float8_e4m3fnuz and float8_e5m2fnuz: TF 2.21's CPU "
                "has no cast to them; float8_e4m3b11fnuz: ONNX has no such type). Keep it out of the converted graph "
                "or cast to float8_e4m3fn / float8_e5m2 in TF"
            )
        if opset != OPSET:
            raise ConversionError(
                f"{where}: {names} tensors need ONNX opset {OPSET} (FLOAT8 tensor types and Cast's saturate come with "
                f"opset 19; tf2onnx 1.17 writes ops of opset <= 18, which opset 19 keeps as they are, while opsets 20 "
                f"and 21 change some of them): convert with opset={OPSET} (this conversion asked for {opset})"
            )
        if op.type == "Cast":
            src, dst = op.get_attr("SrcT"), op.get_attr("DstT")
            wide = dst if _is_float8(src) else src
            if wide.name not in WIDE_TYPES:
                raise ConversionError(
                    f"{where}: Cast from {src.name} to {dst.name} is not converted: only casts between float8_e4m3fn / "
                    "float8_e5m2 and float32 / float16 were checked against TF; cast through float32 in TF"
                )
        elif op.type not in PASSIVE_OPS:
            raise ConversionError(
                f"{where} reads or writes {names} tensors: of the ops that touch float8 only Cast (to and from "
                "float32 / float16), Const and Identity are converted, where ONNX Runtime was checked against TF; "
                "keep the op out of the float8 part of the graph (cast to float32 first)"
            )
    return found


@contextmanager
def onnx_dtypes(active: bool):
    """tf2onnx's TF -> ONNX dtype map with the float8 formats added, for the parse of a graph that uses them
    (tf2onnx's own map lacks them: the bare KeyError). Restored afterwards, so that tf2onnx used directly
    in the same process is unchanged."""
    from tensorflow.core.framework import types_pb2
    from tf2onnx.tf_utils import TF_TO_ONNX_DTYPE

    added = {}
    if active:
        for name, (onnx_type, _, _) in FORMATS.items():
            key = getattr(types_pb2, "DT_" + name.upper())
            if key not in TF_TO_ONNX_DTYPE:
                added[key] = onnx_type
        TF_TO_ONNX_DTYPE.update(added)
    try:
        yield
    finally:
        for key in added:
            TF_TO_ONNX_DTYPE.pop(key, None)


def graphs_from_tf(tf_graph, opset: int, *args, **kwargs):
    """tf2onnx's ``graphs_from_tf`` for a graph that may use float8: the graph is checked first
    (``check_graph``), parsed with the float8 dtypes mapped, and each float8 Cast gets the private type
    that ``cast_handlers`` converts. A float8 dtype that still reaches tf2onnx's map (in a function body,
    which the check does not open) is a ConversionError, not tf2onnx's bare KeyError."""
    from tf2onnx.tfonnx import graphs_from_tf as tf2onnx_graphs_from_tf

    active = check_graph(tf_graph, opset)
    try:
        with onnx_dtypes(active):
            main_g, subgraphs = tf2onnx_graphs_from_tf(tf_graph, *args, **kwargs)
    except KeyError as e:
        key = e.args[0] if e.args else None
        if getattr(key, "name", "").startswith("float8"):
            raise ConversionError(f"{key.name}: a float8 tensor tf2onnx cannot type (in a function body?): {e}") from e
        raise
    if active:
        for g in [main_g] + list(subgraphs):
            for node in g.get_nodes():
                if node.type == "Cast" and (node.get_attr_value("to") in _ONNX_FLOAT8 or g.get_dtype(node.input[0]) in _ONNX_FLOAT8):
                    node.type = CAST_TYPE
    return main_g, subgraphs


def uses_float8(g) -> bool:
    """Whether a tf2onnx graph has float8 tensors (after the handlers: the Casts of ``_lower_cast``)."""
    return any(g.get_dtype(o) in _ALL_ONNX_FLOAT8 for n in g.get_nodes() for o in n.output)


def make_model(g, doc: str):
    """``g.make_model(doc)``, at opset 19 for a graph with float8 tensors. tf2onnx 1.17's table of opsets stops
    at 18, so it is extended for this one call. Opset 19 changes no op tf2onnx writes: it adds types (float8
    among them) and attributes whose defaults keep the opset-18 behaviour (Pad's wrap mode, AveragePool's
    dilations, Resize's half_pixel_symmetric), except Cast's saturate=1, which matters only for a Cast to
    float8, and every such Cast is written here with saturate=0. Other graphs go to tf2onnx unchanged (which
    rejects opsets above 18)."""
    from tf2onnx import constants

    if g.opset != OPSET or OPSET in constants.OPSET_TO_IR_VERSION or not uses_float8(g):
        return g.make_model(doc)
    constants.OPSET_TO_IR_VERSION[OPSET] = IR_VERSION_19
    try:
        return g.make_model(doc)
    finally:
        constants.OPSET_TO_IR_VERSION.pop(OPSET, None)


def _format(onnx_type: int):
    return next(fmt for fmt in FORMATS.values() if fmt[0] == onnx_type)


_MAX_OPS, _MIN_OPS = ("Max", "Maximum"), ("Min", "Minimum")


def value_interval(ctx, name: str, depth: int = 2):
    """(lo, hi) such that the value ``name`` of tf2onnx graph ``ctx`` lies in [lo, hi] wherever it is not
    NaN, from Max/Min nodes with one constant operand (a clip), ``depth`` producers deep; (-inf, inf)
    when nothing is known. Max(v, c) >= min(c) and <= max(hi_v, max(c)); Min(v, c) likewise."""
    node = ctx.get_node_by_output(name)
    unknown = (-np.inf, np.inf)
    if depth == 0 or node is None or node.type not in _MAX_OPS + _MIN_OPS or len(node.input) != 2:
        return unknown
    constant = [ctx.is_const(i) for i in node.input]
    if constant.count(True) != 1:
        return unknown
    c = np.asarray(ctx.get_tensor_value(node.input[constant.index(True)], as_list=False), np.float64)
    if c.size == 0 or np.isnan(c).any():
        return unknown
    lo, hi = value_interval(ctx, node.input[constant.index(False)], depth - 1)
    if node.type in _MAX_OPS:
        return max(lo, float(c.min())), max(hi, float(c.max()))
    return min(lo, float(c.min())), min(hi, float(c.max()))


def needs_guard(interval, bound: float, inclusive: bool) -> bool:
    """Whether a value in ``interval`` can overflow the format whose overflow starts at ``bound``."""
    largest = max(abs(interval[0]), abs(interval[1]))
    return largest >= bound if inclusive else largest > bound


def _lower_cast(ctx, node, name):
    """One TF Cast to or from float8: see the module docstring."""
    from tf2onnx import utils

    to = node.get_attr_value("to")
    x = node.input[0]
    outputs, shapes, dtypes = list(node.output), [ctx.get_shape(node.output[0])], [to]
    ctx.remove_node(node.name)
    if to not in _ALL_ONNX_FLOAT8:  # widening from float8: exact
        ctx.make_node("Cast", [x], attr={"to": to}, outputs=outputs, name=name, shapes=shapes, dtypes=dtypes)
        return
    _, bound, inclusive = _format(to)
    np_src = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}[ctx.get_dtype(x)]
    if needs_guard(value_interval(ctx, x), bound, inclusive):
        def const(v):
            return ctx.make_const(utils.make_name(f"{name}_float8"), np.asarray(v, np_src)).output[0]

        # x * (overflows ? inf : 1): a Where that selects x itself could turn -0 into +0 (ORT's CPU Where,
        # see converters.standard._builder.Lowering.where); x * 1 is x, -0, subnormals and NaNs included.
        magnitude = ctx.make_node("Abs", [x]).output[0]
        over = ctx.make_node("GreaterOrEqual" if inclusive else "Greater", [magnitude, const(bound)]).output[0]
        factor = ctx.make_node("Where", [over, const(np.inf), const(1.0)]).output[0]
        x = ctx.make_node("Mul", [x, factor]).output[0]
    ctx.make_node("Cast", [x], attr={"to": to, "saturate": 0}, outputs=outputs, name=name, shapes=shapes,
                  dtypes=dtypes)


def cast_handlers(failures: list) -> dict:
    """tf2onnx custom_op_handlers for the private float8 Cast type (see ``graphs_from_tf``)."""

    def handler(ctx, node, name, args):
        node.type = "Cast"
        try:
            _lower_cast(ctx, node, name)
        except Exception as e:  # tf2onnx only logs a handler's exception
            failures.append(e)
            raise

    return {CAST_TYPE: (handler, [])}
