"""Drop a ReLU or ReLU6 whose clamp the fake-quantizer after it repeats, where that is exact.

tfmot puts a FakeQuant after every ReLU6 (MobileNetV2 has 35). The quantizer clamps its input to its own
nudged range anyway, so when that range lies inside [0, 6] the ReLU6 changes nothing the quantizer
outputs, yet it costs a full pass over the tensor in ONNX Runtime (a Clip, 7% of the converted
MobileNetV2's time at batch 8). This rewrite runs on the TF graph right after tf2onnx has parsed it, so
both lowerings gain, and only where the result is the same bit for bit for every input:

* the quantizer's range is a constant (an inference graph; a training step's ranges are variables);
* the ReLU's output is read by the quantizer alone (a gradient graph also reads it, so it stays);
* FQ(v) == FQ(lo) for every v <= lo and FQ(v) == FQ(hi) for every v >= hi, where [lo, hi] is the
  ReLU's clamp ([0, inf) or [0, 6]). FakeQuant is a composition of float32 clamps, subtractions,
  multiplications or divisions by a positive scale, floor and additions, each non-decreasing, so it is
  non-decreasing in v, and the condition holds exactly when FQ(-inf) == FQ(lo) and FQ(+inf) == FQ(hi).
  Inside [lo, hi] the ReLU returns v itself, except that it gives +0 for -0 and (flush-to-zero) for a
  subnormal, which the quantizer maps as it maps +0 (it flushes its input), and NaN for NaN (TF's
  ReLUs propagate NaN, as the quantizer does). The check evaluates the NumPy reference kernel at
  those probes, the endpoints and their neighbours, and compares bits, so a range that reaches past the
  clamp (a negative nudged min, a nudged max above 6 by an ulp) keeps its ReLU.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

import ort_ops
from converters.family import tf_attributes
from converters.fusions import constant_value, only_consumer
from ort_ops.spec import OpError

F32 = np.float32
CLAMPS = {"Relu": (F32(0), F32(np.inf)), "Relu6": (F32(0), F32(6))}
QUANTIZERS = ("FakeQuantWithMinMaxArgs", "FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxVarsPerChannel")


def _probes(lo, hi):
    """The values whose quantized bits decide the rewrite (see the module docstring)."""
    tiny = np.finfo(F32).tiny
    points = [-np.inf, -np.finfo(F32).max, -1, -tiny / 2, -0.0, 0.0, tiny / 2, tiny, lo, hi, 7, np.finfo(F32).max,
              np.inf, np.nan, -np.nan]
    points += [np.nextafter(lo, F32(-np.inf)), np.nextafter(lo, F32(np.inf))]
    if np.isfinite(hi):
        points += [np.nextafter(hi, F32(-np.inf)), np.nextafter(hi, F32(np.inf))]
    return np.array(points, F32)


def tf_relu(x, lo, hi):
    """TF's Relu/Relu6 on float32 under flush-to-zero: NaN stays NaN, -0 and subnormals give +0."""
    clamped = np.minimum(np.maximum(x, lo), hi)  # np.maximum/minimum propagate NaN, as TF's ReLUs do
    subnormal_or_zero = np.abs(x) < np.finfo(F32).tiny
    return np.where(np.isnan(x), x, np.where(subnormal_or_zero, F32(0), clamped)).astype(F32)


def clamp_is_redundant(op_type: str, lo, hi, ranges: list, attrs: dict) -> bool:
    """Whether ``op_type`` (a FakeQuant of the family) with constant ``ranges`` ([] for Args, [min, max]
    otherwise) outputs the same bits for x and for TF's clamp of x to [lo, hi], for every float32 x."""
    spec = ort_ops.get_spec(op_type)
    x = _probes(lo, hi)
    if op_type == "FakeQuantWithMinMaxVarsPerChannel":
        channels = np.asarray(ranges[0]).shape[0]
        x = np.repeat(x[:, None], channels, axis=1)  # every probe in every channel
    with np.errstate(all="ignore"):
        plain = spec.run_reference([x] + ranges, attrs)[0]
        clamped = spec.run_reference([tf_relu(x, lo, hi)] + ranges, attrs)[0]
    return np.array_equal(plain.view(np.uint32), clamped.view(np.uint32))


def drop_redundant_clamps(g) -> int:
    """Rewire each fake-quantizer of tf2onnx graph ``g`` (TF op types, before shielding) that reads a
    ReLU it makes redundant to the ReLU's input, and remove the ReLU. Returns how many were dropped."""
    dropped = 0
    for node in list(g.get_nodes()):
        if node.type not in QUANTIZERS:
            continue
        relu = node.inputs[0]
        if relu is None or relu.type not in CLAMPS or g.get_dtype(relu.output[0]) != TensorProto.FLOAT:
            continue
        if not only_consumer(g, relu.output[0], node):
            continue
        ranges = [constant_value(n) for n in node.inputs[1:]]
        if any(r is None or r.dtype != F32 for r in ranges):
            continue
        spec = ort_ops.get_spec(node.type)
        try:
            attrs = tf_attributes(node, spec)
            if not clamp_is_redundant(node.type, *CLAMPS[relu.type], ranges, attrs):
                continue
        except OpError:
            continue  # an invalid node: its handler reports it
        g.replace_input(node, node.input[0], relu.input[0], 0)
        g.remove_node(relu.name)
        dropped += 1
    return dropped
