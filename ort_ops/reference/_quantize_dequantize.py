"""Shared math of QuantizeAndDequantize{V2,V3,V4} and V4Grad, in TensorFlow's order and element type T.

T is float32 or float64 and every intermediate stays in T (NumPy would otherwise promote a
float32 array combined with a Python number). Clamps follow Eigen's ``cwiseMin``/``cwiseMax``
(``std::min``/``std::max``: a NaN first operand wins, a NaN bound is ignored).
"""
from __future__ import annotations

import numpy as np

from ort_ops.reference import _qdq_eigen_order as order
from ort_ops.reference._fake_quant import eigen_max, eigen_min, flush
from ort_ops.spec import OpError
from ort_ops.specs.quantize_dequantize import axis_rank_message

HALF_TO_EVEN = "HALF_TO_EVEN"
HALF_UP = "HALF_UP"


def format_value(value) -> str:
    """A float the way TensorFlow's StrCat prints it: the shortest of %.6g/%.9g (float32) or
    %.15g/%.17g (float64) that reads back exactly."""
    v = np.asarray(value)
    t = v.dtype.type
    if np.isnan(v):
        return "-nan" if np.signbit(v) else "nan"
    if np.isinf(v):
        return "-inf" if v < 0 else "inf"
    short, long_ = ("%.6g", "%.9g") if v.dtype == np.float32 else ("%.15g", "%.17g")
    text = short % float(v)
    return text if t(float(text)) == v else long_ % float(v)


def check_dtypes(op: str, named_arrays) -> np.dtype:
    """All T-typed tensors must share one dtype, float32 or float64 (TF's CPU kernels)."""
    dtype = None
    for name, arr in named_arrays:
        if arr.dtype not in (np.float32, np.float64):
            raise OpError(op, f"{name} must be float32 or float64, got {arr.dtype}")
        if dtype is not None and arr.dtype != dtype:
            raise OpError(op, f"{name} must have the same type as input ({dtype}), got {arr.dtype}")
        dtype = dtype or arr.dtype
    return dtype


def check_num_bits(op: str, num_bits: int, signed_input: bool, signed_label: str) -> None:
    if not 0 < num_bits < (62 if signed_input else 63):
        raise OpError(op, f"num_bits is out of range: {num_bits} with {signed_label} {int(signed_input)}")


def quantized_bounds(signed_input: bool, num_bits: int, narrow_range: bool):
    """The integer grid [min_q, max_q] as Python ints (narrow_range only affects signed grids)."""
    if signed_input:
        half = 1 << (num_bits - 1)
        return (-half + 1 if narrow_range else -half), half - 1
    return 0, (1 << num_bits) - 1


def compute_range(min_range, max_range, signed_input: bool, num_bits: int, narrow_range: bool):
    """TF's ComputeQuantizationRange over arrays of (min_range, max_range) in T.

    Returns (min_range', max_range', scale, inverse_scale): the scale comes from whichever side
    allows the smaller scale (ties and the both-unbounded case go to the max side) and the other
    end of the range is re-derived from the chosen dequantization step.
    """
    t = min_range.dtype.type
    q_lo, q_hi = quantized_bounds(signed_input, num_bits, narrow_range)
    min_q, max_q = t(q_lo), t(q_hi)  # int64 -> T conversion rounds to nearest, as in C++
    big = np.finfo(t).max
    with np.errstate(all="ignore"):
        # TF computes with flush-to-zero / denormals-are-zero on.
        min_range, max_range = flush(min_range), flush(max_range)
        scale_min_side = np.where(flush((min_q * min_range).astype(t)) > 0, flush((min_q / min_range).astype(t)), big).astype(t)
        scale_max_side = np.where(flush((max_q * max_range).astype(t)) > 0, flush((max_q / max_range).astype(t)), big).astype(t)
        from_min = scale_min_side < scale_max_side
        scale = np.where(from_min, scale_min_side, scale_max_side).astype(t)
        inverse = flush(np.where(from_min, (min_range / min_q).astype(t), (max_range / max_q).astype(t)).astype(t))
        new_max = np.where(from_min, flush((max_q * inverse).astype(t)), max_range).astype(t)
        new_min = np.where(from_min, min_range, flush((min_q * inverse).astype(t))).astype(t)
    return new_min, new_max, scale, inverse


def round_values(v, round_mode: str):
    """HALF_TO_EVEN: IEEE rint (Eigen's packet round on x86). HALF_UP: floor(v + 0.5) computed in T."""
    t = v.dtype.type
    if round_mode == HALF_TO_EVEN:
        return np.rint(v).astype(t)
    return np.floor((v + t(0.5)).astype(t)).astype(t)


def quantize_dequantize(x, min_range, max_range, scale, inverse, range_given: bool, round_mode: str, keep_input_nan=True):
    """The output: with a given range the input is clamped to the adjusted range first.

    Where both the rounded input and ``inverse`` are NaN, the result is the rounded input's NaN
    where ``keep_input_nan`` (broadcast against x) holds, else ``inverse``'s (see _qdq_eigen_order).
    """
    t = x.dtype.type
    with np.errstate(all="ignore"):
        x = flush(x)
        if range_given:
            x = eigen_max(eigen_min(x, max_range), min_range).astype(t)
        scaled = flush((x * scale).astype(t))
        rounded = round_values(scaled, round_mode)
        out = flush((rounded * inverse).astype(t))
        both_nan = np.isnan(rounded) & np.isnan(inverse)
        if both_nan.any():
            out = np.where(both_nan, np.where(keep_input_nan, rounded, inverse), out).astype(t)
        return out


def channel_view(x, axis: int):
    """``x`` as [prod(dims before axis), dims[axis], prod(dims after axis)]; axis -1 means one channel."""
    if axis == -1:
        return x.reshape(1, 1, -1) if x.size else x.reshape(1, 1, 0)
    pre = int(np.prod(x.shape[:axis]))
    post = int(np.prod(x.shape[axis + 1 :]))
    return x.reshape(pre, x.shape[axis], post)


def data_range(x3, per_axis: bool):
    """Per-channel (min, max) of a [pre, depth, post] view over the pre and post dims, with the NaN
    or signed zero TF's reduction keeps."""
    if per_axis:
        return order.per_axis_extremes(flush(x3))
    lo, hi = order.per_tensor_extremes(flush(x3).reshape(-1))
    return np.asarray([lo], x3.dtype), np.asarray([hi], x3.dtype)


def forward(x, input_min, input_max, *, signed_input, num_bits, range_given, round_mode, narrow_range, axis):
    """QuantizeAndDequantize after validation: per tensor (axis -1) or per channel of ``axis``."""
    x3 = channel_view(x, axis)
    t = x.dtype.type
    if range_given:
        lo = np.asarray(input_min, dtype=t).reshape(-1)
        hi = np.asarray(input_max, dtype=t).reshape(-1)
    elif x.size:
        lo, hi = data_range(x3, per_axis=axis != -1)
    else:
        return x.copy()
    lo, hi, scale, inverse = compute_range(lo, hi, signed_input, num_bits, narrow_range)
    pre, depth, post = x3.shape
    keep = order.keeps_input_nan(pre, depth, post, x.dtype, per_axis=axis != -1, range_given=range_given, round_mode=round_mode)
    keep = np.asarray(keep).reshape((pre, 1, post) if np.ndim(keep) else ())
    shape = (1, -1, 1)
    out = quantize_dequantize(
        x3, lo.reshape(shape), hi.reshape(shape), scale.reshape(shape), inverse.reshape(shape), range_given, round_mode, keep
    )
    return out.reshape(x.shape)


def check_axis_v2(op: str, x, axis: int) -> None:
    if axis < -1:
        raise OpError(op, f"Axis must be at least -1. Found {axis}")
    if axis != -1 and axis >= x.ndim:
        raise OpError(op, axis_rank_message(axis, x.ndim))


def check_given_range(op: str, x, mn, mx, axis: int) -> None:
    """Validation of input_min/input_max when range_given.

    Per tensor: scalars with min <= max. Per axis: vectors of dims[axis] values. TF 2.21 V2/V4
    also apply the scalar check per axis (so that mode can never
    work there); here it applies only per tensor, as the op's docs intend.
    """
    if axis == -1:
        for name, t in (("input_min", mn), ("input_max", mx)):
            if t.ndim != 0:
                raise OpError(op, f"{name} must be a scalar.")
        if not mn <= mx:
            raise OpError(op, f"Invalid range: input_min {format_value(mn)} > input_max {format_value(mx)}")
        return
    depth = x.shape[axis]
    for name, t in (("input_min", mn), ("input_max", mx)):
        if t.ndim != 1:
            raise OpError(op, f"Shape must be rank 1 for {name}_tensor when the axis is specified")
    for name, t in (("input_min", mn), ("input_max", mx)):
        if t.shape[0] != depth:
            raise OpError(
                op, f"{name}_tensor has incorrect size, was {t.shape[0]} expected {depth} to match dim {axis} of the input [{t.shape[0]}]"
            )


def v2_v4(op: str, input, input_min, input_max, *, signed_input, num_bits, range_given, round_mode, narrow_range, axis):  # noqa: A002
    """The shared V2/V4 kernel (TF registers the same class for both)."""
    check_num_bits(op, num_bits, signed_input, "signed_input_")
    x = np.asarray(input)
    mn = np.asarray(input_min)
    mx = np.asarray(input_max)
    check_dtypes(op, (("input", x), ("input_min", mn), ("input_max", mx)))
    if round_mode not in (HALF_TO_EVEN, HALF_UP):
        raise OpError(op, f"Value for attr 'round_mode' of \"{round_mode}\" is not in the list of allowed values: \"HALF_TO_EVEN\", \"HALF_UP\"")
    check_axis_v2(op, x, axis)
    if range_given:
        check_given_range(op, x, mn, mx, axis)
    return forward(x, mn, mx, signed_input=signed_input, num_bits=num_bits, range_given=range_given,
                   round_mode=round_mode, narrow_range=narrow_range, axis=axis)
