"""FakeQuantWithMinMax{Args,Vars,VarsPerChannel} and their gradients as standard ONNX ops.

Every step is the float32 operation TF's CPU functor performs, in the same order, so the result is
bit-identical: the nudge (scale and its separately computed inverse, the zero point rounded half away
from zero, the nudged range), the clamp, and floor(v + 0.5) rounding. For Vars and PerChannel the
nudge is computed in the graph from the runtime min/max tensors; for Args min/max are constants and
the same nodes run on them (ORT folds them).
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from converters.standard._builder import Lowering

F32 = np.float32
FLOAT = TensorProto.FLOAT


def _grid(lw: Lowering):
    """(quant_min, quant_max) integers from num_bits/narrow_range, validated as TF's kernels do."""
    num_bits = int(lw.attr("num_bits", 8))
    narrow = bool(lw.attr("narrow_range", False))
    if not 2 <= num_bits <= 16:
        lw.fail("num_bits must be between 2 and 16, inclusive")
    return (1 if narrow else 0), (1 << num_bits) - 1


def _check_float32(lw: Lowering, indices):
    for i in indices:
        if lw.dtype(i) != FLOAT:
            lw.fail(f"input {i} must be float32 (the only type TF defines for this op)")


class Nudged:
    """Tensor names of TF's nudged quantization parameters for a (min, max) pair."""

    def __init__(self, scale, inv_scale, nudged_min, nudged_max, quant_zero):
        self.scale, self.inv_scale = scale, inv_scale
        self.nudged_min, self.nudged_max, self.quant_zero = nudged_min, nudged_max, quant_zero


def _round_half_away_nonnegative(lw: Lowering, v: str) -> str:
    """std::round for v >= 0: floor(v) + (frac >= 0.5). Not ONNX Round (half to even) and not
    floor(v + 0.5), which rounds 0.49999997 up because the addition itself rounds."""
    fl = lw.op("Floor", v)
    frac = lw.op("Sub", v, fl)  # exact: the fractional part of a float is representable
    up = lw.op("GreaterOrEqual", frac, lw.const(0.5, F32))
    return lw.where(up, lw.op("Add", fl, lw.const(1.0, F32)), fl)


def nudge(lw: Lowering, mn: str, mx: str, quant_min: int, quant_max: int) -> Nudged:
    """TF's Nudge(): min/max are float32 tensors (scalars or [d]); every op is one float32 op, and
    every result is flushed like TF's (flush-to-zero) kernels do (cheap: these are scalars/vectors)."""
    f = lambda v: lw.flush(v, F32)  # noqa: E731
    mn, mx = f(mn), f(mx)
    qmin, qmax = lw.const(float(quant_min), F32), lw.const(float(quant_max), F32)
    steps = lw.const(F32(quant_max) - F32(quant_min), F32)
    span = f(lw.op("Sub", mx, mn))
    scale = f(lw.op("Div", span, steps))
    inv_scale = f(lw.op("Div", steps, span))  # separately, not 1/scale
    zp_from_min = f(lw.op("Sub", qmin, f(lw.op("Div", mn, scale))))
    # In the unclamped branch zp_from_min lies in [quant_min, quant_max], so it is >= 0.
    rounded = _round_half_away_nonnegative(lw, zp_from_min)
    zero_point = lw.where(
        lw.op("Less", zp_from_min, qmin), qmin, lw.where(lw.op("Greater", zp_from_min, qmax), qmax, rounded)
    )
    nudged_min = f(lw.op("Mul", lw.op("Sub", qmin, zero_point), scale))
    nudged_max = f(lw.op("Mul", lw.op("Sub", qmax, zero_point), scale))
    quant_zero = lw.op("Floor", lw.op("Add", f(lw.op("Mul", lw.op("Neg", nudged_min), inv_scale)), lw.const(0.5, F32)))
    return Nudged(scale, inv_scale, nudged_min, nudged_max, quant_zero)


def _clamp(lw: Lowering, x: str, lo: str, hi: str) -> str:
    """Eigen's x.cwiseMin(hi).cwiseMax(lo) (std::min/max semantics): a NaN x passes through."""
    below_hi = lw.where(lw.op("Less", hi, x), hi, x)
    return lw.where(lw.op("Less", below_hi, lo), lo, below_hi)


def fake_quant(lw: Lowering, x: str, n: Nudged, divide: bool) -> str:
    """The forward formula; ``divide``: Vars divides by scale, Args/PerChannel multiply by inv_scale."""
    # A flushed -0 and +0 give the same result below, so x's flush need not keep the sign.
    clamped = _clamp(lw, lw.flush(x, F32, keep_sign=False), n.nudged_min, n.nudged_max)
    shifted = lw.op("Sub", clamped, n.nudged_min)
    scaled = lw.op("Div", shifted, n.scale) if divide else lw.op("Mul", shifted, n.inv_scale)
    q = lw.op("Floor", lw.op("Add", lw.op("Sub", scaled, n.quant_zero), lw.const(0.5, F32)))
    return lw.flush(lw.op("Mul", q, n.scale), F32)


def _in_range_backprop(lw: Lowering, g: str, x: str, n: Nudged) -> str:
    """g * (nudged_min <= x <= nudged_max): TF multiplies by the mask, so -g*0 = -0 and inf*0 = NaN."""
    inside = lw.op("And", lw.op("LessOrEqual", n.nudged_min, x), lw.op("LessOrEqual", x, n.nudged_max))
    return lw.op("Mul", g, lw.mask_as(inside, FLOAT))


def _flushed_grad_inputs(lw: Lowering, g: str, x: str):
    """Denormals-are-zero on the kernel's inputs: g keeps its zero's sign (it reaches the output)."""
    return lw.flush(g, F32), lw.flush(x, F32, keep_sign=False)


def _both_zero(lw: Lowering, mn: str, mx: str) -> str:
    """min == max == 0, where subnormals count as zero (denormals-are-zero)."""
    zero = lw.const(0.0, F32)
    mn, mx = lw.flush(mn, F32, keep_sign=False), lw.flush(mx, F32, keep_sign=False)
    return lw.op("And", lw.op("Equal", mn, zero), lw.op("Equal", mx, zero))


def _flushed_scalar(v) -> np.float32:
    """A float32 attribute as TF's kernel sees it with denormals-are-zero on (subnormal -> signed zero)."""
    v = F32(v)
    return F32(np.copysign(F32(0), v)) if v != 0 and abs(v) < np.finfo(F32).tiny else v


def _args_range(lw: Lowering):
    # Subnormal bounds are signed zeros to TF, so min=-1e-38, max=1e-38 is rejected as "-0 >= 0".
    mn, mx = _flushed_scalar(lw.attr("min", -6.0)), _flushed_scalar(lw.attr("max", 6.0))
    if not mn < mx:
        lw.fail(f"min has to be smaller than max, was: {float(mn):g} >= {float(mx):g}")
    return mn, mx


def _check_same_shape(lw: Lowering):
    a, b = lw.shape(0), lw.shape(1)
    if a is not None and b is not None:
        if len(a) != len(b) or any(p != q and p >= 0 and q >= 0 for p, q in zip(a, b)):
            lw.fail("gradient and input must be the same size")


def _check_rank(lw: Lowering, index: int, name: str, rank: int):
    r = lw.rank(index)
    if r is not None and r != rank:
        lw.fail(f"`{name}` must be rank {rank} but is rank {r}")


def lower_args(ctx, node):
    lw = Lowering(ctx, node)
    _check_float32(lw, [0])
    qmin, qmax = _grid(lw)
    mn, mx = _args_range(lw)
    lw.take_over()
    n = nudge(lw, lw.const(mn, F32), lw.const(mx, F32), qmin, qmax)
    lw.emit(0, fake_quant(lw, lw.inputs[0], n, divide=False))


def lower_args_gradient(ctx, node):
    lw = Lowering(ctx, node)
    _check_float32(lw, [0, 1])
    _check_same_shape(lw)
    qmin, qmax = _grid(lw)
    mn, mx = _args_range(lw)
    lw.take_over()
    n = nudge(lw, lw.const(mn, F32), lw.const(mx, F32), qmin, qmax)
    lw.emit(0, _in_range_backprop(lw, *_flushed_grad_inputs(lw, lw.inputs[0], lw.inputs[1]), n))


def lower_vars(ctx, node):
    lw = Lowering(ctx, node)
    _check_float32(lw, [0, 1, 2])
    qmin, qmax = _grid(lw)
    _check_rank(lw, 1, "min", 0)
    _check_rank(lw, 2, "max", 0)
    lw.take_over()
    x, mn, mx = lw.inputs
    n = nudge(lw, mn, mx, qmin, qmax)
    out = fake_quant(lw, x, n, divide=True)
    # min == max == 0 skips the nudge and writes zeros.
    lw.emit(0, lw.where(_both_zero(lw, mn, mx), lw.const(0.0, F32), out, F32))


def lower_vars_gradient(ctx, node):
    lw = Lowering(ctx, node)
    _check_float32(lw, [0, 1, 2, 3])
    _check_same_shape(lw)
    qmin, qmax = _grid(lw)
    _check_rank(lw, 2, "min", 0)
    _check_rank(lw, 3, "max", 0)
    lw.take_over()
    raw_g, x, mn, mx = lw.inputs
    g, x = _flushed_grad_inputs(lw, raw_g, x)
    n = nudge(lw, mn, mx, qmin, qmax)
    both_zero = _both_zero(lw, mn, mx)
    zero = lw.const(0.0, F32)
    dx = _in_range_backprop(lw, g, x, n)
    below = lw.op("Mul", g, lw.mask_as(lw.op("Less", x, n.nudged_min), FLOAT))
    above = lw.op("Mul", g, lw.mask_as(lw.op("Greater", x, n.nudged_max), FLOAT))
    dmin = lw.reduce("ReduceSum", below, None, keepdims=False)
    dmax = lw.reduce("ReduceSum", above, None, keepdims=False)
    # A min == max == 0 range copies the gradient unflushed (TF's plain Eigen copy does no arithmetic).
    lw.emit(0, lw.where(both_zero, raw_g, dx, F32))
    lw.emit(1, lw.where(both_zero, zero, dmin, F32))
    lw.emit(2, lw.where(both_zero, zero, dmax, F32))


def _check_per_channel(lw: Lowering, x_index: int, min_index: int):
    r = lw.rank(x_index)
    if r is not None and r < 1:
        lw.fail("input must be at least rank 1")
    x_shape = lw.shape(x_index)
    d = x_shape[-1] if x_shape else -1
    for name, i in (("min", min_index), ("max", min_index + 1)):
        s = lw.shape(i)
        if s is None:
            continue
        if len(s) != 1:
            lw.fail(f"`{name}` must be rank 1 but is rank {len(s)}")
        if d is not None and d >= 0 and s[0] >= 0 and s[0] != d:
            lw.fail(f"{name} has incorrect size, expected {d} was {s[0]}")


def lower_vars_per_channel(ctx, node):
    lw = Lowering(ctx, node)
    _check_float32(lw, [0, 1, 2])
    qmin, qmax = _grid(lw)
    _check_per_channel(lw, 0, 1)
    lw.take_over()
    x, mn, mx = lw.inputs
    # [d]-shaped parameters broadcast along the last axis of x, i.e. per column of TF's [N, d] view.
    n = nudge(lw, mn, mx, qmin, qmax)
    out = fake_quant(lw, x, n, divide=False)
    lw.emit(0, lw.where(_both_zero(lw, mn, mx), lw.const(0.0, F32), out, F32))


def lower_vars_per_channel_gradient(ctx, node):
    lw = Lowering(ctx, node)
    _check_float32(lw, [0, 1, 2, 3])
    _check_same_shape(lw)
    qmin, qmax = _grid(lw)
    _check_per_channel(lw, 1, 2)
    lw.take_over()
    raw_g, x, mn, mx = lw.inputs
    g, x = _flushed_grad_inputs(lw, raw_g, x)
    n = nudge(lw, mn, mx, qmin, qmax)
    both_zero = _both_zero(lw, mn, mx)
    zero = lw.const(0.0, F32)
    dx = _in_range_backprop(lw, g, x, n)
    # Sum over TF's [N, d] view: flatten the leading dims and reduce axis 0.
    columns = lw.op("Concat", lw.const([-1], np.int64), lw.op("Shape", mn), axis=0)

    def column_sums(mask):
        return lw.reduce("ReduceSum", lw.op("Reshape", lw.op("Mul", g, lw.mask_as(mask, FLOAT)), columns), [0], False)

    dmin = column_sums(lw.op("Less", x, n.nudged_min))
    dmax = column_sums(lw.op("Greater", x, n.nudged_max))
    # A min == max == 0 range copies the gradient unflushed (TF's plain Eigen copy does no arithmetic).
    lw.emit(0, lw.where(both_zero, raw_g, dx, F32))
    lw.emit(1, lw.where(both_zero, zero, dmin, F32))
    lw.emit(2, lw.where(both_zero, zero, dmax, F32))


LOWERINGS = {
    "FakeQuantWithMinMaxArgs": lower_args,
    "FakeQuantWithMinMaxArgsGradient": lower_args_gradient,
    "FakeQuantWithMinMaxVars": lower_vars,
    "FakeQuantWithMinMaxVarsGradient": lower_vars_gradient,
    "FakeQuantWithMinMaxVarsPerChannel": lower_vars_per_channel,
    "FakeQuantWithMinMaxVarsPerChannelGradient": lower_vars_per_channel_gradient,
}
