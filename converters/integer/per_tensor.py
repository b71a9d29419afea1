"""An integer model's quantized tensors, each judged on TF's own values of the quantized tensors before it.

End to end, an integer model's outputs drift from TF's by whole steps that grow with depth (converters.integer.
steps): a flip at a near-tie in one layer moves the next layer's input. Here that drift is cut out. Every
activation quantizer's DequantizeLinear output is named after TF's fake-quantized tensor; in a copy of the model,
each consumer of such a tensor reads instead TF's value of it, quantized again on the same grid (QuantizeLinear of
a grid value is its integer, exactly, so the next QDQ group still fuses and runs ONNX Runtime's integer kernel),
while the tensor itself is computed from TF's values of the tensors before it. One run gives every quantized tensor
one layer away from TF's; each is judged in the steps of TF's own grid (its quantizer's range in the TF graph), on
its values and on its integers, against ``DEFAULT_TENSOR_BOUND``: a layer that computes
what TF computed lands within one step (it can differ only where TF's float result lies within the integer
model's rounding differences of a half-step boundary), and a wrong scale, zero point, weight or bias in it moves
it by many.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from converters.integer.grid import FAKE_QUANT_DIVIDES, QUANTIZE_DEQUANTIZE_OPS, fake_quant_grid, quantizer_grid
from converters.integer.steps import steps_between

DEFAULT_TENSOR_BOUND = 1.0
_FED = "/tf_value"


@dataclasses.dataclass
class TensorCheck:
    name: str
    step: float
    size: int
    max_steps: float
    identical: float
    within_one: float
    bound: float

    @property
    def ok(self) -> bool:
        return self.max_steps <= self.bound


@dataclasses.dataclass
class TensorReport:
    checks: List[TensorCheck]
    unmatched: List[str]  # quantized tensors TF has no value for (named by the rewrite, e.g. a regridded MaxPool)

    @property
    def ok(self) -> bool:
        # No check at all is a pass only where the model has no quantized activation to judge (every layer a
        # float island: the summary says "0/N in integer"); quantized tensors TF has no value for are not.
        return all(c.ok for c in self.checks) and (bool(self.checks) or not self.unmatched)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "unmatched": list(self.unmatched),
                "tensors": [dataclasses.asdict(c) | {"ok": c.ok} for c in self.checks]}

    def table(self) -> str:
        failing = [c for c in self.checks if not c.ok]
        worst = max(self.checks, key=lambda c: c.max_steps, default=None)
        identical = sum(c.identical * c.size for c in self.checks) / max(1, sum(c.size for c in self.checks))
        lines = [f"per quantized tensor, on TF's values of the tensors before it: {len(self.checks)} tensors, "
                 f"{100 * identical:.2f}% of values on TF's integer, largest error "
                 f"{0 if worst is None else worst.max_steps:g} step(s) (bound {DEFAULT_TENSOR_BOUND:g})"
                 + ("" if worst is None else f" at {worst.name}")]
        for c in failing[:10]:
            lines.append(f"  FAIL {c.name}: {c.max_steps:g} steps ({100 * c.within_one:.1f}% within one)")
        if self.unmatched:
            lines.append(f"  not judged (no TF tensor of that name): {len(self.unmatched)}")
        if not self.checks and not self.unmatched:
            lines.append("  the model quantizes no activation: nothing runs in integer, its outputs are judged end to end")
        lines.append("per-tensor verification " + ("passed" if self.ok else "FAILED"))
        return "\n".join(lines)


def _activation_dequantizers(model: onnx.ModelProto) -> list:
    """(DequantizeLinear node, its scale) for every per-tensor activation DQ (not a weight's or a bias's)."""
    inits = {i.name: i for i in model.graph.initializer}
    found = []
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear" or node.input[0] in inits:
            continue
        scale = numpy_helper.to_array(inits[node.input[1]])
        if scale.size == 1:
            found.append((node, float(scale)))
    return found


def _per_tensor_quantizer(op) -> bool:
    """Whether a TF op is a quantizer with one fixed grid for the whole tensor."""
    if op.type in QUANTIZE_DEQUANTIZE_OPS:
        return op.get_attr("range_given") and op.get_attr("axis") == -1
    return op.type in FAKE_QUANT_DIVIDES and op.type != "FakeQuantWithMinMaxVarsPerChannel"


def _tf_grid(op, fetched):
    """TF's grid of a quantizer op of the TF graph, its range (and V3's num_bits) from ``fetched``."""
    if op.type == "FakeQuantWithMinMaxArgs":
        attrs = {k: op.get_attr(k) for k in ("num_bits", "narrow_range", "min", "max")}
        return fake_quant_grid(op.name, op.type, attrs)
    if op.type in QUANTIZE_DEQUANTIZE_OPS:
        attrs = {k: op.get_attr(k) for k in ("signed_input", "range_given", "narrow_range", "axis")}
        if op.type == "QuantizeAndDequantizeV3":
            attrs["num_bits"] = int(fetched[op.inputs[3].name])
        else:
            attrs.update(num_bits=op.get_attr("num_bits"), round_mode=op.get_attr("round_mode"))
    else:
        attrs = {k: op.get_attr(k) for k in ("num_bits", "narrow_range")}
    return quantizer_grid(op.name, op.type, attrs, fetched[op.inputs[1].name], fetched[op.inputs[2].name])


def fed_model(model: onnx.ModelProto, names: List[str]) -> onnx.ModelProto:
    """A copy of ``model`` where the consumers of each tensor in ``names`` (activation DQ outputs) read a graph
    input ``<name>/tf_value`` requantized on the same grid, and each such tensor is an output."""
    fed = onnx.ModelProto()
    fed.CopyFrom(model)
    graph = fed.graph
    dq = {n.output[0]: n for n in graph.node if n.op_type == "DequantizeLinear" and n.output[0] in set(names)}
    extra = []
    for name in names:
        node = dq[name]
        integers, requantized = name + _FED + "/integers", name + _FED + "/dequantized"
        extra.append(helper.make_node("QuantizeLinear", [name + _FED, node.input[1], node.input[2]], [integers],
                                      name=name + _FED + "/QuantizeLinear"))
        extra.append(helper.make_node("DequantizeLinear", [integers, node.input[1], node.input[2]], [requantized],
                                      name=name + _FED + "/DequantizeLinear"))
        for consumer in graph.node:
            for i, tensor in enumerate(consumer.input):
                if tensor == name:
                    consumer.input[i] = requantized
        graph.input.append(helper.make_tensor_value_info(name + _FED, onnx.TensorProto.FLOAT, None))
        if name not in {o.name for o in graph.output}:
            graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    graph.node.extend(extra)
    return fed


def _in_onnx_layout(tf_value: np.ndarray, onnx_value: np.ndarray) -> Optional[np.ndarray]:
    """TF's value in the ONNX tensor's layout (NHWC -> NCHW where that is what the shapes say); the closer
    layout where both fit."""
    options = []
    if tf_value.shape == onnx_value.shape:
        options.append(tf_value)
    if tf_value.ndim == 4 and np.transpose(tf_value, (0, 3, 1, 2)).shape == onnx_value.shape:
        options.append(np.transpose(tf_value, (0, 3, 1, 2)))
    if not options:
        return None
    return min(options, key=lambda v: float(np.nanmax(np.abs(v - onnx_value))) if v.size else 0.0)


def verify_quantized_tensors(onnx_model, tf_fn=None, inputs=None, seed: int = 0, frozen=None,
                             bound: float = DEFAULT_TENSOR_BOUND) -> TensorReport:
    """Judge every activation quantizer's output of an integer model on TF's values of its inputs (module
    docstring). ``tf_fn``: the TF function (or ``frozen``: converters.node_verification.freeze_like_converter's
    result); ``inputs``: by ONNX input name (default: the verifier's seeded random inputs)."""
    import tensorflow as tf

    from converters.node_verification import _tf_run, freeze_like_converter
    from converters.verification import random_inputs, run_onnx
    from converters.verify_tf import concrete_function

    if inputs is None:
        inputs = random_inputs(onnx_model, seed)
    if frozen is None:
        frozen = freeze_like_converter(concrete_function(tf_fn, inputs), onnx_model)
    frozen_fn, renames = frozen
    with tf.Graph().as_default() as graph:
        tf.import_graph_def(frozen_fn.graph_def, name="")
    dequantizers = _activation_dequantizers(onnx_model)
    tf_name_of = {onnx_name: tf_name for tf_name, onnx_name in renames.items()}  # the outputs keep the user's names
    present = []
    unmatched = []
    for node, _ in dequantizers:
        try:
            graph.get_tensor_by_name(tf_name_of.get(node.output[0], node.output[0]))
            present.append(node.output[0])
        except (KeyError, ValueError):
            unmatched.append(node.output[0])
    # TF's grid of each tensor, from its own quantizer's range (the model under test may have it wrong).
    grids, range_tensors = {}, []
    for name in list(present):
        op = graph.get_tensor_by_name(tf_name_of.get(name, name)).op
        while op.type == "Identity":  # a renamed output: the signature's Identity of the quantizer
            op = op.inputs[0].op
        if not _per_tensor_quantizer(op):
            present.remove(name)
            unmatched.append(name)
            continue
        grids[name] = op
        if op.type != "FakeQuantWithMinMaxArgs":
            range_tensors += [t.name for t in op.inputs[1:4]]  # min, max (and V3's num_bits)
    init_values = {i.name: numpy_helper.to_array(i) for i in onnx_model.graph.initializer}
    fetch = [tf_name_of.get(n, n) for n in present] + range_tensors
    fetched = _tf_run(graph, frozen_fn, renames, inputs, init_values, list(dict.fromkeys(fetch)))
    tf_values = {n: fetched[tf_name_of.get(n, n)] for n in present}
    for name, op in grids.items():
        grids[name] = _tf_grid(op, fetched)
    # ONNX Runtime's own run gives each tensor's layout (and the closer one where a shape is ambiguous).
    integers_of = {node.output[0]: node.input[0] for node, _ in dequantizers}
    exposed = onnx.ModelProto()
    exposed.CopyFrom(onnx_model)
    for name in present:
        if name not in {o.name for o in exposed.graph.output}:
            exposed.graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    plain = run_onnx(exposed, inputs)
    feeds = dict(inputs)
    for name in list(present):
        value = _in_onnx_layout(tf_values[name], plain[name])
        if value is None:
            present.remove(name)
            unmatched.append(name)
            continue
        feeds[name + _FED] = value.astype(np.float32)
    fed = fed_model(onnx_model, present)
    for name in present:
        fed.graph.output.append(helper.make_tensor_value_info(integers_of[name], onnx.TensorProto.UINT8, None))
    results = run_onnx(fed, feeds)
    checks = []
    for name in present:
        grid = grids[name]
        step, zero_point = float(grid.scale), float(grid.zero_point)
        expected = feeds[name + _FED]
        d = np.rint(steps_between(expected, results[name], step))
        # The integers too: a zero point shifted in QuantizeLinear and DequantizeLinear alike leaves the values,
        # not the integers the next integer kernel reads.
        tf_integers = np.rint(expected.astype(np.float64) / step) + zero_point
        k = np.abs(results[integers_of[name]].astype(np.float64) - tf_integers)
        worst = np.maximum(d, k)
        checks.append(TensorCheck(name, step, int(d.size), float(worst.max()) if d.size else 0.0,
                                  float(np.mean(worst == 0)) if d.size else 1.0,
                                  float(np.mean(worst <= 1)) if d.size else 1.0, bound))
    return TensorReport(checks, unmatched)
