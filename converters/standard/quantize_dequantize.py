"""QuantizeAndDequantize{V2,V3,V4} and QuantizeAndDequantizeV4Grad as standard ONNX ops.

Written as the same float32/float64 steps as TF's ComputeQuantizationRange and its quantize
functor: the scale from whichever side of the range is tighter (T_MAX when a side cannot decide),
the other side re-derived from the dequantization step, the clamp only when the range is given,
ONNX Round (ties to even, what rint does on x86) for HALF_TO_EVEN and Floor(v + 0.5) in T for HALF_UP.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from converters.standard._builder import NP_TYPES, Lowering
from ort_ops.specs.quantize_dequantize import axis_rank_message

SUPPORTED = (TensorProto.FLOAT, TensorProto.DOUBLE)  # the only types TF has CPU kernels for


def _element_type(lw: Lowering, indices):
    t = lw.dtype(indices[0])
    if t not in SUPPORTED:
        lw.fail("only float32 and float64 are supported (TF has no kernel for other types)")
    for i in indices[1:]:
        if lw.dtype(i) != t:
            lw.fail("all float inputs must have the same type")
    return t, NP_TYPES[t]


def _grid(lw: Lowering, signed: bool, num_bits: int, narrow: bool, label: str):
    """(min_q, max_q) as TF's int64 values."""
    if not 0 < num_bits < (62 if signed else 63):
        lw.fail(f"num_bits is out of range: {num_bits} with {label} {int(signed)}")
    if signed:
        return (-(1 << (num_bits - 1)) + (1 if narrow else 0)), (1 << (num_bits - 1)) - 1
    return 0, (1 << num_bits) - 1


def _axis(lw: Lowering, axis: int, op_label: str):
    """Validate axis; return the input rank when per-axis (it must be known), else None."""
    if axis < -1:
        lw.fail(f"Axis must be at least -1. Found {axis}")
    if axis == -1:
        return None
    rank = lw.rank(1 if op_label == "grad" else 0)
    if rank is None:
        lw.fail("per-axis quantization needs the input's rank at conversion time")
    if axis >= rank:
        lw.fail(axis_rank_message(axis, rank))
    return rank


def _per_axis_view(lw: Lowering, v: str, axis: int, rank: int) -> str:
    """A [D] vector reshaped to broadcast along ``axis`` of a rank-``rank`` tensor."""
    return lw.op("Reshape", v, lw.const([-1] + [1] * (rank - 1 - axis), np.int64))


def _check_range_shape(lw: Lowering, axis: int, rank):
    for i, name in ((1, "input_min"), (2, "input_max")):
        r = lw.rank(i)
        if axis == -1 and r is not None and r != 0:
            lw.fail(f"{name} must be a scalar.")
        if axis != -1 and r is not None and r != 1:
            lw.fail(f"Shape must be rank 1 for {name}_tensor when the axis is specified")
    if axis != -1:
        x, s = lw.shape(0), lw.shape(1)
        if x and s and x[axis] >= 0 and s[0] >= 0 and s[0] != x[axis]:
            lw.fail(f"input_min_tensor has incorrect size, was {s[0]} expected {x[axis]} to match dim {axis} of the input")


def _check_constant_range(lw: Lowering, axis: int):
    """A range given as constants is checked like TF's kernel does at run time."""
    mn, mx = lw.constant_value(1), lw.constant_value(2)
    if axis == -1 and mn is not None and mx is not None and float(mn) > float(mx):
        lw.fail(f"Invalid range: input_min {float(mn):g} > input_max {float(mx):g}")


def quantize_dequantize(lw, x, mn, mx, min_q, max_q, np_type, range_given: bool, half_up: bool) -> str:
    """The quantize-dequantize formula for a (min, max) pair of tensor names (scalars or broadcastable)."""
    # TF's kernels run with flush-to-zero/denormals-are-zero: flush the inputs and the range values
    # (the per-element products can only turn subnormal where these already are).
    f = lambda v: lw.flush(v, np_type)  # noqa: E731
    x, mn, mx = f(x), f(mn), f(mx)
    t_max = lw.const(np.finfo(np_type).max, np_type)
    zero = lw.const(0, np_type)
    qmin, qmax = lw.const(min_q, np_type), lw.const(max_q, np_type)  # int64 -> T, rounded like TF's cast
    s_min = lw.where(lw.op("Greater", lw.op("Mul", qmin, mn), zero), lw.op("Div", qmin, mn), t_max)
    s_max = lw.where(lw.op("Greater", lw.op("Mul", qmax, mx), zero), lw.op("Div", qmax, mx), t_max)
    from_min = lw.op("Less", s_min, s_max)  # ties and the both-T_MAX case take the max side
    scale = f(lw.where(from_min, s_min, s_max))
    inv = f(lw.where(from_min, f(lw.op("Div", mn, qmin)), f(lw.op("Div", mx, qmax)), np_type))
    v = x
    if range_given:
        hi = lw.where(from_min, f(lw.op("Mul", qmax, inv)), mx, np_type)
        lo = lw.where(from_min, mn, f(lw.op("Mul", qmin, inv)), np_type)
        # Eigen's cwiseMin(hi).cwiseMax(lo): a NaN x or a NaN bound leaves the value as it is.
        v = lw.where(lw.op("Less", hi, v), hi, v, np_type)
        v = lw.where(lw.op("Less", v, lo), lo, v, np_type)
    scaled = lw.op("Mul", v, scale)
    if half_up:
        rounded = lw.op("Floor", lw.op("Add", scaled, lw.const(0.5, np_type)))
    else:
        rounded = lw.op("Round", scaled)  # ONNX Round is half to even, like rint
    return lw.op("Mul", rounded, inv)


def _data_range(lw: Lowering, x: str, axis: int, rank, np_type):
    """min/max of the data (per tensor or per channel). NaN elements are left out of the reduction."""
    x = lw.flush(x, np_type)
    is_nan = lw.op("IsNaN", x)
    axes = None if axis == -1 else [a for a in range(rank) if a != axis]
    keep = axis != -1
    lo = lw.reduce("ReduceMin", lw.where(is_nan, lw.const(np.inf, np_type), x, np_type), axes, keep)
    hi = lw.reduce("ReduceMax", lw.where(is_nan, lw.const(-np.inf, np_type), x, np_type), axes, keep)
    return lo, hi


def _lower_forward(ctx, node, version: int):
    lw = Lowering(ctx, node)
    t, np_type = _element_type(lw, [0, 1, 2])
    signed = bool(lw.attr("signed_input", True))
    narrow = bool(lw.attr("narrow_range", False))
    axis = int(lw.attr("axis", -1))
    if version == 3:
        range_given = bool(lw.attr("range_given", True))
        half_up = False
        bits = lw.constant_value(3)
        if bits is None:
            lw.fail("num_bits must be a constant for the standard lowering (its range cannot be checked at run time)")
        if bits.ndim != 0:
            lw.fail(f"Invalid shape. The `num_bits` tensor should be a scalar. Got dimensions: {bits.ndim}")
        num_bits, label = int(bits), "`signed_input_`"
    else:
        range_given = bool(lw.attr("range_given", False))
        mode = lw.attr("round_mode", "HALF_TO_EVEN")
        if mode not in ("HALF_TO_EVEN", "HALF_UP"):
            lw.fail(f"round_mode must be HALF_TO_EVEN or HALF_UP, got {mode!r}")
        half_up = mode == "HALF_UP"
        num_bits, label = int(lw.attr("num_bits", 8)), "signed_input_"
    min_q, max_q = _grid(lw, signed, num_bits, narrow, label)
    rank = _axis(lw, axis, "forward")
    if range_given:
        _check_range_shape(lw, axis, rank)
        _check_constant_range(lw, axis)
    lw.take_over()
    x = lw.inputs[0]
    if range_given:
        mn, mx = lw.inputs[1], lw.inputs[2]
        if axis != -1:
            mn, mx = _per_axis_view(lw, mn, axis, rank), _per_axis_view(lw, mx, axis, rank)
    else:
        mn, mx = _data_range(lw, x, axis, rank, np_type)
    lw.emit(0, quantize_dequantize(lw, x, mn, mx, min_q, max_q, np_type, range_given, half_up))


def lower_v2(ctx, node):
    _lower_forward(ctx, node, 2)


def lower_v3(ctx, node):
    _lower_forward(ctx, node, 3)


def lower_v4(ctx, node):
    _lower_forward(ctx, node, 4)


def lower_v4_grad(ctx, node):
    lw = Lowering(ctx, node)
    t, np_type = _element_type(lw, [0, 1, 2, 3])
    axis = int(lw.attr("axis", -1))
    rank = _axis(lw, axis, "grad")
    g_shape, x_shape = lw.shape(0), lw.shape(1)
    if g_shape is not None and x_shape is not None and (
        len(g_shape) != len(x_shape) or any(a != b and a >= 0 and b >= 0 for a, b in zip(g_shape, x_shape))
    ):
        lw.fail("gradient and input must be the same size")
    for i in (2, 3):
        r = lw.rank(i)
        if r is not None and r > 1:
            lw.fail(f"Input min tensor must have dimension 0 or 1. Received {r}.")
        if axis == -1 and r is not None and r != 0:
            lw.fail("input_min must be a scalar if axis is unspecified")
    lw.take_over()
    g, x, mn, mx = lw.inputs
    # denormals-are-zero on the inputs; only g's zero sign reaches the output
    g, x = lw.flush(g, np_type), lw.flush(x, np_type, keep_sign=False)
    lo, hi = lw.flush(mn, np_type, keep_sign=False), lw.flush(mx, np_type, keep_sign=False)
    if axis != -1:
        lo, hi = _per_axis_view(lw, lo, axis, rank), _per_axis_view(lw, hi, axis, rank)
    # TF multiplies by the mask (so -g*0 = -0 and inf*0 = NaN outside the range), using the given range.
    inside = lw.op("And", lw.op("LessOrEqual", lo, x), lw.op("LessOrEqual", x, hi))
    lw.emit(0, lw.op("Mul", g, lw.mask_as(inside, t)))
    lw.emit(1, lw.zeros_like(mn, np_type))
    lw.emit(2, lw.zeros_like(mx, np_type))


LOWERINGS = {
    "QuantizeAndDequantizeV2": lower_v2,
    "QuantizeAndDequantizeV3": lower_v3,
    "QuantizeAndDequantizeV4": lower_v4,
    "QuantizeAndDequantizeV4Grad": lower_v4_grad,
}
