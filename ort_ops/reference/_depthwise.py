"""Shared math of the DepthwiseConv2dNative family: the tap geometry and the three kernels.

The kernels run behind the spec's checks (``OpSpec.validate``, rules in ``ort_ops.checks.depthwise``),
so they take valid inputs. Everything works on NHWC arrays; NCHW is transposed in and out by the
per-op files (the layout is pure data movement, so it changes no arithmetic). Each kernel loops over
the kh*kw filter taps only and handles whole arrays per tap. The order of the float additions follows
TF's Eigen kernels (docs/semantics.md section 4) so float32 results are bit-exact against TF with
oneDNN off; oneDNN sums in other orders, which the tests cover with a tolerance.

Dilations are honoured (the true dilated convolution and its exact gradients), as TF's default
oneDNN build does. Taps that fall on padding are skipped, i.e. contribute an exact zero.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ort_ops.checks.depthwise import window, window_size
from ort_ops.reference._fake_quant import flush as _flush


def is_low_precision(dtype) -> bool:
    """float16 and bfloat16: TF computes each tap in float32 and rounds the accumulator back to T."""
    return np.dtype(dtype).name in ("float16", "bfloat16")


def accumulator_dtype(dtype) -> np.dtype:
    return np.dtype(np.float32) if is_low_precision(dtype) else np.dtype(dtype)


def to_nhwc(x, data_format):
    return np.transpose(x, (0, 2, 3, 1)) if data_format == "NCHW" else x


def from_nhwc(x, data_format):
    return np.ascontiguousarray(np.transpose(x, (0, 3, 1, 2)) if data_format == "NCHW" else x)


@dataclasses.dataclass(frozen=True)
class Geometry:
    """Where every filter tap lands: input row of output row i and tap r is i*stride + r*dil_h - pad_top."""

    batch: int
    in_rows: int
    in_cols: int
    depth: int
    filter_rows: int
    filter_cols: int
    multiplier: int
    out_rows: int
    out_cols: int
    stride: int
    dil_rows: int
    dil_cols: int
    pad_top: int
    pad_left: int

    def tap_slices(self, r, s):
        """For tap (r, s): the output index ranges that read real input, and the input slices they read.

        Returns None when the tap only ever reads padding (then it contributes nothing).
        """
        rows = _valid_range(self.out_rows, self.in_rows, self.stride, r * self.dil_rows - self.pad_top)
        cols = _valid_range(self.out_cols, self.in_cols, self.stride, s * self.dil_cols - self.pad_left)
        if rows is None or cols is None:
            return None
        out_r, in_r = rows
        out_c, in_c = cols
        return out_r, out_c, in_r, in_c


def _valid_range(out_n, in_n, stride, offset):
    """Output indices o with 0 <= o*stride + offset < in_n, as (output slice, input slice), or None."""
    first = (-offset + stride - 1) // stride if offset < 0 else 0  # ceil(-offset / stride)
    last = min(out_n, (in_n - 1 - offset) // stride + 1) if in_n - 1 - offset >= 0 else 0
    if first >= last:
        return None
    start = first * stride + offset
    stop = (last - 1) * stride + offset + 1
    return slice(first, last), slice(start, stop, stride)


def geometry(attrs, input_nhwc, filter_shape) -> Geometry:
    """The tap geometry of valid attributes and shapes (input as (N, H, W, C), filter [kh, kw, C, M])."""
    win = window(attrs)
    n, h, w, c = input_nhwc
    kh, kw, _, m = filter_shape
    explicit = win.explicit or (None, None)
    oh, pt, _ = window_size(h, kh, win.stride, win.dilations[0], win.padding, explicit[0])
    ow, pl, _ = window_size(w, kw, win.stride, win.dilations[1], win.padding, explicit[1])
    return Geometry(n, h, w, c, kh, kw, m, oh, ow, win.stride, win.dilations[0], win.dilations[1], pt, pl)


def _ftz(a):
    """TF's denormal mode (docs/semantics.md section 4): its CPU kernels run with denormals-are-zero and
    flush-to-zero on, so a subnormal operand (float32, float64, or a bfloat16 widened bit for bit) acts
    as a signed zero and a subnormal product or sum becomes one. float16 values widen to normal float32s.
    Applied to the widened operands, to each tap's product and to each accumulation (a running sum by
    cumsum is flushed at its end: a partial sum of flushed terms turns subnormal only by an exact
    cancellation of values below 2 * the smallest normal)."""
    return _flush(a)


def _round_to(acc_region, dtype):
    """Round a float32 accumulator region to T (float16/bfloat16) in place, as TF does after every tap."""
    acc_region[...] = acc_region.astype(dtype).astype(np.float32)


def _accumulate(region, term):
    """region += term in place, with the product-sum flushed as TF's mode does."""
    region[...] = _ftz(region + _ftz(term))


def forward(x, w, g: Geometry):
    """out[b, i, j, c*M + m] = sum over taps (r, s), row-major, of w[r, s, c, m] * x[b, i*S + r*dh - pt, ...]."""
    dtype = x.dtype
    acc_t = accumulator_dtype(dtype)
    acc = np.zeros((g.batch, g.out_rows, g.out_cols, g.depth, g.multiplier), acc_t)
    if acc.size:
        wt = _ftz(w.astype(acc_t))
        xt = _ftz(x.astype(acc_t))
        for r in range(g.filter_rows):
            for s in range(g.filter_cols):
                where = g.tap_slices(r, s)
                if where is None:
                    continue
                out_r, out_c, in_r, in_c = where
                region = acc[:, out_r, out_c]
                # product rounded, then sum rounded: no fused multiply-add, as TF's x86 wheels
                _accumulate(region, xt[:, in_r, in_c, :, None] * wt[r, s])
                if acc_t != dtype:
                    _round_to(region, dtype)
    return acc.reshape(g.batch, g.out_rows, g.out_cols, g.depth * g.multiplier).astype(dtype)


def _sum_over_multiplier(a, dtype):
    """dX[..., c] from the per-output-channel partial sums a[..., c, m], in TF's Eigen order.

    M == 1 passes a through. Otherwise full blocks of W m's are reduced the way Eigen reduces one AVX
    register and added to a zero accumulator, then the remaining m's are added one by one.
    float32 (W = 8): h_i = v_i + v_{i+4}, block = (h_0 + h_2) + (h_1 + h_3).
    float64 (W = 4): block = (v_0 + v_2) + (v_1 + v_3).
    float16/bfloat16 (W = 8): the float32 tree on the widened values, rounded to T once; every addition
    to the accumulator is done in float32 and rounded to T.
    """
    m_count = a.shape[-1]
    if m_count == 1:
        return a[..., 0]
    low = is_low_precision(dtype)
    acc = np.zeros(a.shape[:-1], a.dtype)
    width = 4 if a.dtype == np.float64 else 8
    full = width * (m_count // width)
    for b in range(0, full, width):
        v = a[..., b : b + width]
        h = _ftz(v[..., 0:4] + v[..., 4:8]) if width == 8 else v
        block = _ftz(_ftz(h[..., 0] + h[..., 2]) + _ftz(h[..., 1] + h[..., 3]))
        if low:
            block = block.astype(dtype).astype(np.float32)
        acc = _ftz(acc + block)
        if low:
            acc = acc.astype(dtype).astype(np.float32)
    for m in range(full, m_count):
        acc = _ftz(acc + a[..., m])
        if low:
            acc = acc.astype(dtype).astype(np.float32)
    return acc


def backprop_input(w, dy, g: Geometry):
    """dX[b, y, x, c]: for each output channel c*M+m the taps in ascending order, then the sum over m."""
    dtype = dy.dtype
    acc_t = accumulator_dtype(dtype)
    a = np.zeros((g.batch, g.in_rows, g.in_cols, g.depth, g.multiplier), acc_t)
    if a.size and dy.size:
        dy5 = _ftz(dy.reshape(g.batch, g.out_rows, g.out_cols, g.depth, g.multiplier).astype(acc_t))
        wt = _ftz(w.astype(acc_t))
        for r in range(g.filter_rows):
            for s in range(g.filter_cols):
                where = g.tap_slices(r, s)
                if where is None:
                    continue
                out_r, out_c, in_r, in_c = where
                # each input position receives at most one term per tap, so this is a per-element
                # running sum in ascending tap order
                region = a[:, in_r, in_c]
                _accumulate(region, dy5[:, out_r, out_c] * wt[r, s])
                if acc_t != dtype:
                    _round_to(region, dtype)
    return _sum_over_multiplier(a, dtype).astype(dtype)


def backprop_filter(x, dy, g: Geometry):
    """dW[r, s, c, m]: per batch a row-major running sum over output positions, then the batches in order."""
    dtype = dy.dtype
    acc_t = accumulator_dtype(dtype)
    cm = g.depth * g.multiplier
    dw = np.zeros((g.filter_rows, g.filter_cols, cm), acc_t)
    if dw.size and dy.size:
        dy4 = _ftz(dy.reshape(g.batch, g.out_rows, g.out_cols, g.depth, g.multiplier).astype(acc_t))
        xt = _ftz(x.astype(acc_t))
        for r in range(g.filter_rows):
            for s in range(g.filter_cols):
                where = g.tap_slices(r, s)
                if where is None:
                    continue
                out_r, out_c, in_r, in_c = where
                products = _ftz(dy4[:, out_r, out_c] * xt[:, in_r, in_c, :, None]).reshape(g.batch, -1, cm)
                dw[r, s] = _sequential_sum_per_batch(products, dtype)
    return dw.reshape(g.filter_rows, g.filter_cols, g.depth, g.multiplier).astype(dtype)


def _sequential_sum_per_batch(products, dtype):
    """((0 + buf_0) + buf_1) + ..., where buf_b = ((0 + p_b0) + p_b1) + ... over positions in order.

    float32/float64: np.cumsum adds strictly left to right (NumPy's pairwise summation is only used by
    np.sum), so its last element is the sequential sum; "+ 0" turns an all-(-0) sum into TF's +0.
    float16/bfloat16 round the running sum to T after every addition, which needs an explicit loop.
    """
    if not is_low_precision(dtype):
        per_batch = _ftz(np.cumsum(products, axis=1)[:, -1])
        return _ftz(np.cumsum(per_batch + 0, axis=0)[-1] + 0)
    buf = np.zeros((products.shape[0], products.shape[2]), np.float32)
    for p in range(products.shape[1]):
        buf = _ftz(buf + products[:, p]).astype(dtype).astype(np.float32)
    total = np.zeros(products.shape[2], np.float32)
    for b in range(products.shape[0]):
        total = _ftz(total + buf[b]).astype(dtype).astype(np.float32)
    return total
