"""Shared math of FusedBatchNorm{,V2,V3} and FusedBatchNormGrad{,V2,V3} (docs/semantics.md section 3).

The per-op files only name the op; everything else is here. The kernels run behind the spec's checks
(``OpSpec.validate``, rules in ``ort_ops.checks.batch_norm``), so they take valid inputs. The math is
dtype-generic: it computes in float32 (TF's U) unless x is float64, which only the finite-difference
tests use, so the very same formulas can be differentiated numerically.

TF views x as a matrix X[R, C]: R = every dim but the channel dim, C = channels. NCHW/NCDHW are
transposed to channels-last, computed identically and transposed back (TF does the same, so the
results are bit-identical), and a 5-D x is just more rows.
"""
from __future__ import annotations

import functools

import numpy as np

from ort_ops.checks.batch_norm import channel_axis
from ort_ops.reference._fake_quant import flush as _flush

# Eigen's vectorised column sum handles channels in packets of 8 floats (AVX build) and splits
# the rows over 4 accumulators once there are at least 16 rows (docs/semantics.md section 3.3).
_PACKET = 8
_MIN_ROWS_FOR_SPLIT = 16


def compute_dtype(x: np.ndarray):
    """float32 (TF's U for every CPU kernel) unless x is float64 (finite-difference tests only)."""
    return np.float64 if x.dtype == np.float64 else np.float32


def to_rows(x: np.ndarray, axis: int):
    """X[R, C] with channels last, and the function that puts an [R, C] result back in x's layout."""
    moved = np.moveaxis(x, axis, -1)
    rows = np.ascontiguousarray(moved).reshape(-1, moved.shape[-1])

    def restore(m: np.ndarray) -> np.ndarray:
        return np.moveaxis(m.reshape(moved.shape), -1, axis)

    return rows, restore


def sequential_sum(m: np.ndarray) -> np.ndarray:
    """Per column, ((0 + m[0]) + m[1]) + ... in m's dtype: TF's ReduceOuterDimensions on one thread."""
    acc = np.zeros(m.shape[1:], m.dtype)
    if m.shape[0] == 0:
        return acc
    # np.add.accumulate is defined as a running sum, so the order is fixed (np.sum is pairwise).
    return np.add.accumulate(np.concatenate([acc[None], m]), axis=0)[-1]


def column_sum(m: np.ndarray) -> np.ndarray:
    """Eigen's column sum in the training forward pass (docs/semantics.md section 3.3, "Column-sum order S").

    Channels in whole packets of 8, with at least 16 rows: four partial sums take rows round-robin,
    are combined as ((p0 + p1) + p2) + p3, then the leftover rows are added in order. Every other
    channel, and every channel when there are fewer than 16 rows: a plain running sum.
    """
    rows, channels = m.shape
    out = sequential_sum(m)
    vector_channels = _PACKET * (channels // _PACKET)
    if rows >= _MIN_ROWS_FOR_SPLIT and vector_channels:
        quads = rows // 4
        head = m[: 4 * quads, :vector_channels].reshape(quads, 4, vector_channels)
        p = sequential_sum(head)  # [4, V]: p[k] sums rows j with j % 4 == k
        acc = ((p[0] + p[1]) + p[2]) + p[3]
        for r in range(4 * quads, rows):
            acc = acc + m[r, :vector_channels]
        out[:vector_channels] = acc
    return out


def rsqrt(a: np.ndarray) -> np.ndarray:
    """Correctly rounded 1/sqrt(a). TF's vector path uses RSQRTPS plus a Newton step instead, which is
    CPU-vendor dependent in the last bit (documented deviation); its scalar path is exactly this."""
    return a.dtype.type(1) / np.sqrt(a)


def _ftz(*arrays):
    """TF's denormal mode (docs/semantics.md section 3.7): its CPU kernels compute with denormals-are-zero
    and flush-to-zero on, so a subnormal float32/float64 operand acts as a signed zero and a subnormal
    result becomes one. The kernels here flush their widened operands and every intermediate whose
    flush can change a later NaN, Inf or zero (variance + epsilon, means, products, sums). float16 values
    widen to normal float32s, so only bfloat16 (widened bit for bit) and float32/float64 are affected."""
    out = tuple(_flush(a) for a in arrays)
    return out if len(out) > 1 else out[0]


def _ieee(kernel):
    """Run ``kernel`` with NumPy's floating-point warnings off: NaN, Inf and overflow follow IEEE rules
    exactly as in TF (a negative variance gives NaN, Inf - Inf gives NaN), which is intended, not an error."""
    @functools.wraps(kernel)
    def wrapper(*args, **kwargs):
        with np.errstate(all="ignore"):
            return kernel(*args, **kwargs)

    return wrapper


@_ieee
def forward(x, scale, offset, mean, variance, epsilon, exponential_avg_factor, data_format, is_training):
    """FusedBatchNorm{,V2,V3}: (y, batch_mean, batch_variance, reserve_space_1, reserve_space_2).

    mean/variance are read only in inference or when averaging (``checks.reads_statistics``)."""
    x, scale, offset, mean, variance = (np.asarray(a) for a in (x, scale, offset, mean, variance))
    axis = channel_axis(x.ndim, data_format)
    channels = x.shape[axis]
    f = exponential_avg_factor

    ct = compute_dtype(x)
    scale, offset = scale.astype(ct), offset.astype(ct)
    eps = ct(epsilon)
    if x.size == 0:
        # TF sets the statistics to NaN and leaves the reserve spaces uninitialized; they are
        # zeros here (documented deviation).
        nan = np.full(channels, np.nan, ct)
        zeros = np.zeros(channels, ct)
        return np.empty(x.shape, x.dtype), nan, nan.copy(), zeros, zeros.copy()

    rows, restore = to_rows(x.astype(ct), axis)
    rows, scale, offset, eps = _ftz(rows, scale, offset, eps)
    if not is_training:
        est_mean, est_var = mean.astype(ct), variance.astype(ct)
        k = _ftz(rsqrt(_ftz(_ftz(est_var) + eps)) * scale)  # once per channel
        y = _ftz(_ftz(_ftz(rows - _ftz(est_mean)) * k) + offset)
        # TF copies the given statistics to batch_mean/batch_variance (a copy, so unflushed); its Eigen
        # kernel leaves reserve_space_1/2 unwritten and they get the same statistics here.
        return restore(y).astype(x.dtype), est_mean.copy(), est_var.copy(), est_mean.copy(), est_var.copy()

    r = rows.shape[0]
    inv = ct(1) / ct(r)
    batch_mean = _ftz(_ftz(column_sum(rows)) * inv)
    centered = _ftz(rows - batch_mean)
    batch_var = _ftz(_ftz(column_sum(_ftz(centered * centered))) * inv)  # two-pass, biased
    k = _ftz(rsqrt(_ftz(batch_var + eps)) * scale)
    y = _ftz(_ftz(centered * k) + offset)
    bessel = ct(r) / ct(max(r - 1, 1))
    if f == 1.0:
        running_mean, running_var = batch_mean, _ftz(batch_var * bessel)
    else:
        f = ct(f)
        keep = ct(1) - f
        mean, variance = _ftz(mean.astype(ct), variance.astype(ct))
        running_mean = _ftz(_ftz(keep * mean) + _ftz(f * batch_mean))
        running_var = _ftz(_ftz(keep * variance) + _ftz(_ftz(f * bessel) * batch_var))
    return restore(y).astype(x.dtype), running_mean, running_var, batch_mean.copy(), batch_var.copy()


@_ieee
def backward(y_backprop, x, scale, reserve_space_1, reserve_space_2, epsilon, data_format, is_training):
    """FusedBatchNormGrad{,V2,V3}: (x_backprop, scale_backprop, offset_backprop, empty, empty)."""
    dy, x, scale, saved_mean, saved_var = (np.asarray(a) for a in (y_backprop, x, scale, reserve_space_1, reserve_space_2))
    axis = channel_axis(x.ndim, data_format)
    channels = x.shape[axis]

    ct = compute_dtype(x)
    spare = (np.zeros((0,), ct), np.zeros((0,), ct))  # TF's Eigen kernel returns shape-[0] placeholders
    if x.size == 0:
        return (np.empty(x.shape, x.dtype), np.zeros(channels, ct), np.zeros(channels, ct)) + spare

    scale, saved_mean, saved_var = _ftz(scale.astype(ct), saved_mean.astype(ct), saved_var.astype(ct))
    eps = _ftz(ct(epsilon))
    raw_dys, _ = to_rows(dy.astype(ct), axis)
    rows, restore = to_rows(x.astype(ct), axis)
    dys, rows = _ftz(raw_dys, rows)
    r = rows.shape[0]
    c0 = _ftz(rsqrt(_ftz(saved_var + eps)))
    centered = _ftz(rows - saved_mean)
    offset_backprop = _ftz(sequential_sum(dys))
    if r == 1:
        offset_backprop = raw_dys[0].copy()  # TF's sum over a single row is a copy: nothing is flushed
    if is_training:
        # reserve_space_1/2 are the batch mean and the biased batch variance of the forward pass.
        scale_backprop = _ftz(sequential_sum(_ftz(dys * _ftz(centered * c0))))
        dy_mean = _ftz(_ftz(sequential_sum(dys)) * (ct(1) / ct(r)))
        m = _ftz(_ftz(sequential_sum(_ftz(dys * centered))) / ct(r))  # TF divides here but multiplies by 1/R above
        coef1 = _ftz(scale * c0)
        coef2 = _ftz(_ftz(c0 * c0) * m)
        dx = _ftz(coef1 * _ftz(_ftz(dys - dy_mean) - _ftz(centered * coef2)))
    else:
        # "Freeze" gradient: the statistics are constants, y is affine in x.
        s2 = _ftz(sequential_sum(_ftz(dys * centered)))
        dx = _ftz(dys * _ftz(c0 * scale))
        scale_backprop = _ftz(s2 * c0)
    return (restore(dx).astype(x.dtype), scale_backprop, offset_backprop) + spare
