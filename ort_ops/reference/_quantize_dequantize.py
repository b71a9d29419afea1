"""Shared math of QuantizeAndDequantize{V2,V3,V4} and V4Grad, in TensorFlow's order and element type T.

T is float32 or float64 and every intermediate stays in T (NumPy would otherwise promote a
float32 array combined with a Python number). Clamps follow Eigen's ``cwiseMin``/``cwiseMax``
(``std::min``/``std::max``: a NaN first operand wins, a NaN bound is ignored).

The kernels run behind ``OpSpec.validate`` (the rules in ``ort_ops.checks.quantize_dequantize``): what
they get is valid.
"""
from __future__ import annotations

import numpy as np

from ort_ops.reference import _qdq_eigen_order as order
from ort_ops.reference._fake_quant import eigen_max, eigen_min, flush

HALF_TO_EVEN = "HALF_TO_EVEN"
HALF_UP = "HALF_UP"


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


def quantized_integers(x, min_range, max_range, scale, range_given: bool, round_mode: str):
    """The integers q of the quantization (in T; the output is ``q * inverse``): with a given range the input is
    clamped to the adjusted range first, then scaled and rounded. Parameters broadcast against ``x``."""
    t = x.dtype.type
    with np.errstate(all="ignore"):
        x = flush(x)
        if range_given:
            x = eigen_max(eigen_min(x, max_range), min_range).astype(t)
        return round_values(flush((x * scale).astype(t)), round_mode)


def quantize_dequantize(x, min_range, max_range, scale, inverse, range_given: bool, round_mode: str, keep_input_nan=True):
    """The output: :func:`quantized_integers` times ``inverse``.

    Where both the rounded input and ``inverse`` are NaN, the result is the rounded input's NaN
    where ``keep_input_nan`` (broadcast against x) holds, else ``inverse``'s (see _qdq_eigen_order).
    """
    t = x.dtype.type
    rounded = quantized_integers(x, min_range, max_range, scale, range_given, round_mode)
    with np.errstate(all="ignore"):
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
    """The QuantizeAndDequantize kernel (V2 and V4 are one TF class; V3 passes HALF_TO_EVEN): per tensor
    (axis -1) or per channel of ``axis``."""
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

