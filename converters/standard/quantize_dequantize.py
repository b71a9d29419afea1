"""QuantizeAndDequantize{V2,V3,V4} and QuantizeAndDequantizeV4Grad as standard ONNX ops.

Written as the same float32/float64 steps as TF's ComputeQuantizationRange and its quantize
functor: the scale from whichever side of the range is tighter (T_MAX when a side cannot decide),
the other side re-derived from the dequantization step, the clamp only when the range is given,
ONNX Round (ties to even, what rint does on x86) for HALF_TO_EVEN and Floor(v + 0.5) in T for HALF_UP.

A given range that is a constant of the graph is adjusted at conversion time by the NumPy reference
(ort_ops.reference._quantize_dequantize.compute_range, bit-exact against TF), so the graph holds only
the per-element clamp, scale, round and rescale (``_lean_constant_range``); V4Grad's constant range
becomes two constant bounds (``_lean_grad_bounds``).
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto
from onnx import helper as onnx_helper

from converters.standard._builder import NP_TYPES, Lowering
from ort_ops.reference import _quantize_dequantize as reference
from ort_ops.specs.quantize_dequantize import axis_rank_message

SUPPORTED = (TensorProto.FLOAT, TensorProto.DOUBLE)
NP_TO_ONNX = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}  # the only types TF has CPU kernels for


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


def _lean_constant_range(lw: Lowering, x: str, mn, mx, axis: int, rank, grid, np_type, half_up: bool):
    """The output for a constant given range, or None where the parameters need the general sequence.

    The adjusted range, scale and inverse scale come from the reference. Per element: clamp, * scale,
    round, * inverse (4 or 5 nodes, TF's own operations). The flushes can go: a subnormal x inside the
    range times a scale below 1/(4 FLT_MIN) stays below 1/4 and rounds to a zero of x's sign, which
    is what TF's flushed x gives; a subnormal product rounds to that zero too; a nonzero rounded value
    times an inverse scale >= FLT_MIN is normal. One exception: a lower bound +0 turns a negative
    subnormal x into +0 where TF's flushed -0 stays -0, so x is flushed there (4 more nodes). The clamp
    is Clip for a scalar range (ORT's Clip is Eigen's clamp bit for bit: NaN x kept, ties keep x); per
    axis Min/Max return the bound on a signed-zero tie, so a zero bound takes the general sequence.
    """
    signed, num_bits, narrow = grid
    lo, hi, scale, inverse = reference.compute_range(
        np.asarray(mn, np_type).reshape(-1), np.asarray(mx, np_type).reshape(-1), signed, num_bits, narrow
    )
    tiny = np.finfo(np_type).tiny
    params = (lo, hi, scale, inverse)
    if not all(np.all(np.isfinite(p)) for p in params) or not np.all(lo <= hi):
        return None
    if np.any(inverse < tiny) or np.any(scale <= 0) or np.any(scale >= np_type(0.25) / tiny):
        return None
    if axis != -1 and (np.any(lo == 0) or np.any(hi == 0)):
        return None
    if axis == -1:
        if lo[0] == 0 and not np.signbit(lo[0]):
            x = lw.flush(x, np_type)
        clamped = lw.op("Clip", x, lw.const(lo[0], np_type), lw.const(hi[0], np_type))
        scale, inverse = scale[0], inverse[0]
    else:
        view = [-1] + [1] * (rank - 1 - axis)
        clamped = lw.op("Max", lw.op("Min", x, lw.const(hi.reshape(view), np_type)), lw.const(lo.reshape(view), np_type))
        scale, inverse = scale.reshape(view), inverse.reshape(view)
    scaled = lw.op("Mul", clamped, lw.const(scale, np_type))
    rounded = lw.op("Floor", lw.op("Add", scaled, lw.const(0.5, np_type))) if half_up else lw.op("Round", scaled)
    return lw.op("Mul", rounded, lw.const(inverse, np_type))


def _data_range(lw: Lowering, x: str, axis: int, rank, np_type):
    """min/max of the data (per tensor or per channel). NaN elements are left out of the reduction.

    A zero extreme takes the sign of the zero TF's reduction keeps (docs/semantics.md 2.6), which
    ReduceMin/ReduceMax leave open: the sign becomes the step's and so every output zero's.
    """
    x = lw.flush(x, np_type)
    is_nan = lw.op("IsNaN", x)
    axes = None if axis == -1 else [a for a in range(rank) if a != axis]
    keep = axis != -1
    lo = lw.reduce("ReduceMin", lw.where(is_nan, lw.const(np.inf, np_type), x, np_type), axes, keep)
    hi = lw.reduce("ReduceMax", lw.where(is_nan, lw.const(-np.inf, np_type), x, np_type), axes, keep)
    kept_zero = _kept_zero_per_tensor(lw, x, np_type) if axis == -1 else _kept_zero_per_axis(lw, x, axis, rank, np_type)
    zero = lw.const(0, np_type)
    # (lw.where with the type: ORT's float Where may lose a zero's sign)
    lo = lw.where(lw.op("Equal", lo, zero), kept_zero, lo, np_type)
    hi = lw.where(lw.op("Equal", hi, zero), kept_zero, hi, np_type)
    return lo, hi


def _int(lw: Lowering, v) -> str:
    return lw.const(v, np.int64)


def _kept_zero_per_tensor(lw: Lowering, x: str, np_type) -> str:
    """The zero (with its sign) Eigen's vectorized full reduction keeps when the min or max is 0.

    Ties keep the earlier operand everywhere except in the scalar tail, where the later element wins
    and beats the packet result: so a zero in the tail (the last n % W elements) decides, the last one.
    Otherwise the packet lanes: the horizontal fold halves the packet, a tie keeping the lower half, so
    lanes rank by their index read with the bits reversed (W=8: 0, 4, 2, 6, 1, 5, 3, 7); within a lane,
    the first of the four block accumulators (blocks of 4 packets) holding a zero, then the leftover
    whole packets, each in order. This is a priority key per element; the smallest key is kept.
    """
    width = 8 if np_type == np.float32 else 4
    v = lw.op("Concat", lw.op("Reshape", x, _int(lw, [-1])), lw.const([1], np_type), axis=0)  # never empty
    n = lw.op("Size", x)
    j = lw.op("Range", _int(lw, 0), lw.op("Size", v), _int(lw, 1))
    whole4 = lw.op("Mul", lw.op("Div", n, _int(lw, 4 * width)), _int(lw, 4 * width))
    whole = lw.op("Mul", lw.op("Div", n, _int(lw, width)), _int(lw, width))
    bits = width.bit_length() - 1
    fold_rank = [int(format(lane, f"0{bits}b")[::-1], 2) for lane in range(width)]
    lane = lw.op("Gather", _int(lw, fold_rank), lw.op("Mod", j, _int(lw, width)), axis=0)
    block = lw.op("Where", lw.op("Less", j, whole4), lw.op("Mod", lw.op("Div", j, _int(lw, width)), _int(lw, 4)), _int(lw, 4))
    span = lw.op("Add", n, _int(lw, 1))
    packet_key = lw.op("Add", lw.op("Mul", lw.op("Add", lw.op("Mul", lane, _int(lw, 5)), block), span), j)
    tail_key = lw.op("Sub", _int(lw, -1), j)  # negative: before every packet key, the later the smaller
    key = lw.op("Where", lw.op("Less", j, whole), packet_key, tail_key)
    masked = lw.op("Where", lw.op("Equal", v, lw.const(0, np_type)), key, _int(lw, np.iinfo(np.int64).max))
    index = lw.op("ArgMin", masked, axis=0, keepdims=1)
    return lw.op("Reshape", lw.op("Gather", v, index, axis=0), _int(lw, []))


def _kept_zero_per_axis(lw: Lowering, x: str, axis: int, rank: int, np_type) -> str:
    """Per channel, the zero TF's per-axis reduction keeps: its scalar scan over (post, pre) lets the
    later of two tied zeros win, so the last zero in that order decides. Shaped like the keepdims range."""
    shape = lw.op("Shape", x)
    pre = _int(lw, [1]) if axis == 0 else lw.reduce("ReduceProd", lw.op("Slice", shape, _int(lw, [0]), _int(lw, [axis])), [0], True)
    depth = lw.op("Slice", shape, _int(lw, [axis]), _int(lw, [axis + 1]))
    x3 = lw.op("Reshape", x, lw.op("Concat", pre, depth, _int(lw, [-1]), axis=0))
    # [depth, post, pre] flattened per channel: position q * pre + r is the scan order
    scan = lw.op("Reshape", lw.op("Transpose", x3, perm=[1, 2, 0]), lw.op("Concat", depth, _int(lw, [-1]), axis=0))
    ones = lw.op("ConstantOfShape", lw.op("Concat", depth, _int(lw, [1]), axis=0),
                 value=onnx_helper.make_tensor("value", NP_TO_ONNX[np.dtype(np_type)], [1], [1]))
    scan = lw.op("Concat", scan, ones, axis=1)  # a nonzero last column: never empty, never chosen
    position = lw.op("Range", _int(lw, 0), lw.op("Gather", lw.op("Shape", scan), _int(lw, 1), axis=0), _int(lw, 1))
    masked = lw.op("Where", lw.op("Equal", scan, lw.const(0, np_type)), position, _int(lw, -1))
    index = lw.op("ArgMax", masked, axis=1, keepdims=1)
    kept = lw.op("Reshape", lw.op("GatherElements", scan, index, axis=1), _int(lw, [-1]))
    return _per_axis_view(lw, kept, axis, rank)


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
    constant = (lw.constant_value(1), lw.constant_value(2)) if range_given else (None, None)
    lw.take_over()
    x = lw.inputs[0]
    if constant[0] is not None and constant[1] is not None:
        out = _lean_constant_range(lw, x, *constant, axis, rank, (signed, num_bits, narrow), np_type, half_up)
        if out is not None:
            lw.emit(0, out)
            return
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


def _lean_grad_bounds(lw: Lowering, mn, mx, axis: int, rank, np_type):
    """Constant bounds lo, hi with ``lo <= x <= hi`` on the unflushed x equal to TF's test on the flushed
    x against the flushed range: a zero bound (after the flush) becomes the largest subnormal of the
    side away from the range (a flushed x is >= 0 exactly when x > -FLT_MIN), a normal bound decides
    subnormal x like zero anyway. Then dx = flushed g * mask (9 nodes), whose product is never subnormal.
    """
    largest_subnormal = np.nextafter(np.finfo(np_type).tiny, np_type(0))
    lo = reference.flush(np.asarray(mn, np_type))
    hi = reference.flush(np.asarray(mx, np_type))
    lo = np.where(lo == 0, -largest_subnormal, lo).astype(np_type)
    hi = np.where(hi == 0, largest_subnormal, hi).astype(np_type)
    if axis != -1:
        view = [-1] + [1] * (rank - 1 - axis)
        lo, hi = lo.reshape(view), hi.reshape(view)
    return lw.const(lo, np_type), lw.const(hi, np_type)


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
    constant = lw.constant_value(2), lw.constant_value(3)
    lw.take_over()
    g, x, mn, mx = lw.inputs
    if constant[0] is not None and constant[1] is not None:
        lo, hi = _lean_grad_bounds(lw, *constant, axis, rank, np_type)
        inside = lw.op("And", lw.op("GreaterOrEqual", x, lo), lw.op("LessOrEqual", x, hi))
        lw.emit(0, lw.op("Mul", lw.flush(g, np_type), lw.mask_as(inside, t)))
        lw.emit(1, lw.const(np.zeros_like(constant[0], np_type), np_type))
        lw.emit(2, lw.const(np.zeros_like(constant[1], np_type), np_type))
        return
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
