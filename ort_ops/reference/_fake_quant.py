"""Shared float32 math of the FakeQuantWithMinMax* family, in TensorFlow's exact operation order.

Every intermediate is kept in float32 on purpose: NumPy would silently promote a float32 array
combined with a Python float to float64, which changes results in the last ulp. The clamps use
Eigen's ``cwiseMin``/``cwiseMax`` semantics (``std::min``/``std::max``: when a comparison involves
NaN, the first operand wins), so a NaN input stays NaN while a NaN bound is ignored.

The kernels run behind ``OpSpec.validate`` (the rules in ``ort_ops.checks.fake_quant``): what they get
is valid, float32 arrays included.
"""
from __future__ import annotations

import numpy as np

F32 = np.float32


def flush(a):
    """Flush subnormals to signed zero. TF runs its kernels with the CPU's flush-to-zero and
    denormals-are-zero modes on, so subnormal operands act as zeros and subnormal results become zeros."""
    a = np.asarray(a)
    tiny = np.finfo(a.dtype).tiny
    with np.errstate(invalid="ignore"):
        sub = (np.abs(a) < tiny) & (a != 0)
    return np.where(sub, np.copysign(np.zeros((), a.dtype), a), a).astype(a.dtype) if sub.any() else a


def quant_bounds(num_bits: int, narrow_range: bool):
    """The integer grid [quant_min, quant_max] as ints."""
    return (1 if narrow_range else 0), (1 << num_bits) - 1


def eigen_min(a, b):
    """``std::min(a, b)``: b if b < a, else a (so a NaN ``a`` propagates and a NaN ``b`` is ignored)."""
    return np.where(b < a, b, a)


def eigen_max(a, b):
    """``std::max(a, b)``: b if a < b, else a."""
    return np.where(a < b, b, a)


def nudge(min_val, max_val, quant_min: int, quant_max: int):
    """TF's Nudge for arrays of (min, max) pairs: returns nudged_min, nudged_max, scale, inv_scale (float32).

    The zero point is chosen on the integer grid; ``inv_scale`` is computed by its own division,
    not as ``1 / scale``, exactly as TF does.
    """
    return nudge_with_zero_point(min_val, max_val, quant_min, quant_max)[:4]


def nudge_with_zero_point(min_val, max_val, quant_min: int, quant_max: int):
    """:func:`nudge`, and the nudged zero point itself (float32 holding an integer of [quant_min, quant_max]):
    the integer that TF's grid maps to 0.0, which an integer model stores (converters.integer)."""
    mn = flush(np.asarray(min_val, dtype=F32))
    mx = flush(np.asarray(max_val, dtype=F32))
    qmin, qmax = F32(quant_min), F32(quant_max)
    with np.errstate(all="ignore"):
        span = F32(qmax - qmin)
        diff = flush((mx - mn).astype(F32))
        scale = flush((diff / span).astype(F32))
        inv_scale = flush((span / diff).astype(F32))
        zp_from_min = flush((qmin - flush((mn / scale).astype(F32))).astype(F32))
        # std::round (half away from zero) of a value already known to lie in [qmin, qmax] >= 0:
        # floor(z + 0.5) in float64 is exact there (float32 would round z + 0.5 up for z = 0.49999997).
        rounded = np.floor(zp_from_min.astype(np.float64) + 0.5)
        zp = np.where(zp_from_min < qmin, float(quant_min), np.where(zp_from_min > qmax, float(quant_max), rounded))
        # TF stores the zero point as uint16; a NaN zero point converts to 0 on x86 (cvttss2si gives
        # 0x80000000, whose low 16 bits are 0). The results are NaN in that case anyway.
        zp = np.where(np.isnan(zp), 0.0, zp).astype(F32)
        nudged_min = flush(((qmin - zp) * scale).astype(F32))
        nudged_max = flush(((qmax - zp) * scale).astype(F32))
    return nudged_min, nudged_max, scale, inv_scale, zp


def quantized_integers(x, nudged_min, nudged_max, scale, inv_scale, divide: bool):
    """The integers q of TF's forward quantization (float32 holding integers, relative to the zero point: the
    result is ``q * scale``), with (per-channel broadcastable) nudged parameters.

    ``divide``: Vars divides the shifted value by ``scale``; Args and PerChannel multiply by
    ``inv_scale`` (the two can differ by one ulp, so this is not interchangeable).
    """
    x = flush(np.asarray(x, dtype=F32))
    with np.errstate(all="ignore"):
        quant_zero = np.floor(flush(((-nudged_min) * inv_scale).astype(F32)) + F32(0.5)).astype(F32)
        clamped = eigen_max(eigen_min(x, nudged_max), nudged_min)
        shifted = flush((clamped - nudged_min).astype(F32))
        scaled = flush((shifted / scale if divide else shifted * inv_scale).astype(F32))
        return np.floor(flush(((scaled - quant_zero).astype(F32) + F32(0.5)).astype(F32)))


def fake_quant(x, nudged_min, nudged_max, scale, inv_scale, divide: bool):
    """The forward quantization of ``x`` (float32) with (per-channel broadcastable) nudged parameters:
    :func:`quantized_integers` times ``scale``."""
    q = quantized_integers(x, nudged_min, nudged_max, scale, inv_scale, divide)
    with np.errstate(all="ignore"):
        return flush((q * scale).astype(F32))


def inside_mask(x, nudged_min, nudged_max):
    """1.0 where nudged_min <= x <= nudged_max (inclusive, NaN excluded), else 0.0, as float32."""
    x = flush(np.asarray(x, dtype=F32))
    return ((x >= nudged_min) & (x <= nudged_max)).astype(F32)


def masked(g, mask):
    """``g * mask`` in float32, as TF computes it: outside the mask the result is g*0 (so -0 for a
    negative g and NaN for an infinite or NaN g), not a plain 0."""
    with np.errstate(all="ignore"):
        return flush((flush(np.asarray(g, dtype=F32)) * mask).astype(F32))


def sequential_sum(v, axis=0):
    """Float32 sum of ``v`` along ``axis`` accumulated strictly in order, starting from +0.

    ``np.cumsum`` accumulates in order; adding +0 at the end turns the all-(-0) sum into +0 as
    an accumulator starting at +0 would.
    """
    v = flush(np.asarray(v, dtype=F32))
    if v.shape[axis] == 0:
        return np.zeros(np.delete(v.shape, axis), dtype=F32)
    with np.errstate(all="ignore"):
        # cumsum does not flush partial sums; in a float32 sum a subnormal partial sum can only come
        # from cancellation of tiny terms, which flushed terms (all zero or >= FLT_MIN) cannot produce
        # except exactly, so flushing the total suffices.
        total = np.take(np.cumsum(v, axis=axis, dtype=F32), -1, axis=axis)
        return flush((total + F32(0)).astype(F32))


_PACKET = 8  # AVX float32 packet width of TF's official x86 wheels
_LEAF = 8 * 1024  # Eigen's InnerMostDimReducer splits ranges longer than this in halves


def _packet_sum(v):
    """Eigen's vectorized inner-most reduction of a short float32 range (<= _LEAF values).

    Four packet accumulators over blocks of 32 values, folded into the first in order; then the
    remaining whole packets are added to it, it is summed horizontally, and the scalar tail
    (accumulated in order from +0) is added. This order was matched against TF on 1..4000 values.
    """
    n = v.shape[0]
    whole4 = (n // (4 * _PACKET)) * 4 * _PACKET
    whole = (n // _PACKET) * _PACKET
    zero = np.zeros((1, _PACKET), dtype=F32)
    with np.errstate(all="ignore"):
        if whole4:
            blocks = v[:whole4].reshape(-1, 4, _PACKET)
            accs = [sequential_sum(np.concatenate([zero, blocks[:, k, :]]), axis=0) for k in range(4)]
            packet = (((accs[0] + accs[1]).astype(F32) + accs[2]).astype(F32) + accs[3]).astype(F32)
        else:
            packet = zero[0]
        if whole > whole4:
            packet = sequential_sum(np.concatenate([packet[None], v[whole4:whole].reshape(-1, _PACKET)]), axis=0)
        # predux: fold the 256-bit packet to 128 bits, then pairwise within the 4 lanes.
        half = (packet[:4] + packet[4:]).astype(F32)
        pair = (half[:2] + half[2:]).astype(F32)
        horizontal = F32(pair[0] + pair[1])
        tail = sequential_sum(np.concatenate([zero[0, :1], v[whole:]]), axis=0)
        return F32(tail + horizontal)


def full_sum(v):
    """Float32 sum of all of ``v`` in the order of Eigen's single-threaded full reduction.

    Exact for tensors TF reduces on one thread (small ones); larger ones may differ from TF in the
    last bits because TF then splits the work per thread (tests allow for that).
    """
    v = np.asarray(v, dtype=F32).reshape(-1)
    return _halving_sum(v)


def column_sums(v2):
    """Per-column float32 sums of a [N, d] array, each column reduced like ``full_sum``.

    TF reduces every channel separately (a chip of the [N, d] view); Eigen gathers the strided
    column into packets, so each column follows the same order as a full reduction.
    """
    v2 = np.asarray(v2, dtype=F32)
    return np.array([full_sum(v2[:, i]) for i in range(v2.shape[1])], dtype=F32).reshape(v2.shape[1])


def _halving_sum(v):
    n = v.shape[0]
    if n <= _LEAF:
        return _packet_sum(v)
    split = _PACKET * -(-((n + 1) // 2) // _PACKET)
    left = _halving_sum(v[:split])
    right = _halving_sum(v[split:])
    with np.errstate(all="ignore"):
        return F32((F32(0) + left) + right)


def vars_params(mn, mx, num_bits: int, narrow_range: bool):
    """Nudged parameters for (arrays of) tensor ranges, plus the mask of TF's ``min == max == 0`` branch."""
    quant_min, quant_max = quant_bounds(num_bits, narrow_range)
    nudged_min, nudged_max, scale, inv_scale = nudge(mn, mx, quant_min, quant_max)
    zero_range = (flush(mn) == 0) & (flush(mx) == 0)  # compared with denormals-are-zero on
    return nudged_min, nudged_max, scale, inv_scale, zero_range


def along_axis(param, rank: int, axis: int):
    """A per-channel [d] parameter shaped to broadcast along dim ``axis`` of a rank-``rank`` tensor."""
    trailing = 0 if axis == -1 else rank - 1 - axis
    return np.reshape(param, np.shape(param) + (1,) * trailing)
