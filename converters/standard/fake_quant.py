"""FakeQuantWithMinMax{Args,Vars,VarsPerChannel} and their gradients as standard ONNX ops.

Every step is the float32 operation TF's CPU functor performs, in the same order, so the result is
bit-identical: the nudge (scale and its separately computed inverse, the zero point rounded half away
from zero, the nudged range), the clamp, and floor(v + 0.5) rounding, all under TF's
flush-to-zero/denormals-are-zero mode.

Two forms:
* constant range (Args, and Vars/PerChannel whose min/max are constants, as in a frozen inference
  graph): the nudge runs at conversion time in the NumPy reference (ort_ops.reference._fake_quant,
  bit-exact against TF), so the graph holds only the per-element work, with every step that cannot
  change a result for these parameters left out (see ``_lean_forward`` and ``_lean_gradients``);
* range computed in the graph (a training step's batch ranges): the nudge is written once per node
  on the scalar/[d] range tensors, followed by the same per-element steps with the flushes that
  run-time parameters can need.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from converters.standard._builder import Lowering
from ort_ops.reference import _fake_quant as reference

F32 = np.float32
FLOAT = TensorProto.FLOAT
TINY = np.finfo(F32).tiny
LARGEST_SUBNORMAL = np.nextafter(TINY, F32(0))
# The lean forward drops the flushes when the parameters keep subnormal values far from any rounding
# boundary: scale and nudged_min of at least this size (or a zero nudged_min), inv_scale at most its
# inverse (see _lean_forward).
LEAN_BOUND = F32(2.0**-100)


def _grid(lw: Lowering):
    """(quant_min, quant_max) integers from num_bits/narrow_range."""
    return reference.quant_bounds(lw.attrs["num_bits"], lw.attrs["narrow_range"])


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
    # TF stores the zero point as uint16: a NaN one (a range whose scale flushed to 0) becomes 0 on x86.
    zero_point = lw.op("Where", lw.op("IsNaN", zero_point), lw.const(0.0, F32), zero_point)
    nudged_min = f(lw.op("Mul", lw.op("Sub", qmin, zero_point), scale))
    nudged_max = f(lw.op("Mul", lw.op("Sub", qmax, zero_point), scale))
    quant_zero = lw.op("Floor", lw.op("Add", f(lw.op("Mul", lw.op("Neg", nudged_min), inv_scale)), lw.const(0.5, F32)))
    return Nudged(scale, inv_scale, nudged_min, nudged_max, quant_zero)


def _clamp(lw: Lowering, x: str, lo: str, hi: str) -> str:
    """Eigen's x.cwiseMin(hi).cwiseMax(lo) (std::min/max semantics): a NaN x passes through."""
    below_hi = lw.where(lw.op("Less", hi, x), hi, x)
    return lw.where(lw.op("Less", below_hi, lo), lo, below_hi)


def fake_quant(lw: Lowering, x: str, n: Nudged, divide: bool) -> str:
    """The forward formula for parameters computed in the graph; ``divide``: Vars divides by scale,
    Args/PerChannel multiply by inv_scale.

    x is flushed (denormals-are-zero) and so is clamped - nudged_min (both operands are zero or normal,
    but their difference can be subnormal for ranges near FLT_MIN). The other flushes of TF's sequence
    cannot change the result: a subnormal ``scaled`` meets the integer quant_zero and + 0.5, which absorb
    it exactly as they absorb a zero, and q * scale (q an integer, scale zero or normal) is never subnormal.
    """
    clamped = _clamp(lw, lw.flush(x, F32), n.nudged_min, n.nudged_max)
    shifted = lw.flush(lw.op("Sub", clamped, n.nudged_min), F32)
    scaled = lw.op("Div", shifted, n.scale) if divide else lw.op("Mul", shifted, n.inv_scale)
    q = lw.op("Floor", lw.op("Add", lw.op("Sub", scaled, n.quant_zero), lw.const(0.5, F32)))
    return lw.op("Mul", q, n.scale)


class ConstantNudge:
    """TF's nudged parameters of a constant range, computed at conversion time by the NumPy reference
    (float32 arrays: scalars for Args/Vars, [d] for PerChannel)."""

    def __init__(self, mn, mx, quant_min: int, quant_max: int):
        mn, mx = np.asarray(mn, F32), np.asarray(mx, F32)
        self.nudged_min, self.nudged_max, self.scale, self.inv_scale = reference.nudge(mn, mx, quant_min, quant_max)
        with np.errstate(all="ignore"):  # TF's quant_zero, as reference.fake_quant computes it
            self.quant_zero = np.floor(reference.flush((-self.nudged_min * self.inv_scale).astype(F32)) + F32(0.5)).astype(F32)
        # TF's min == max == 0 branch, compared with denormals-are-zero on.
        self.zero_range = (reference.flush(mn) == 0) & (reference.flush(mx) == 0)

    def lean_exact(self, divide: bool) -> bool:
        """Whether the flushes of TF's forward sequence can be left out for these parameters.

        A subnormal x (a zero to TF) is then absorbed like a zero: clamped - nudged_min rounds to
        -nudged_min when |nudged_min| >= 2^-100 (its half ulp exceeds every subnormal) and is x itself
        when nudged_min is 0, where quant_zero is 0 and x * inv_scale (or x / scale) < 2^-26 leaves
        floor(. + 0.5) at 0. No difference of clamped values is subnormal either (floats of magnitude
        >= 2^-100 differ by at least 2^-123), a subnormal scaled value is absorbed by - quant_zero + 0.5,
        and q * scale >= scale is normal.
        """
        params = (self.nudged_min, self.nudged_max, self.scale, self.inv_scale, self.quant_zero)
        if not all(np.all(np.isfinite(p)) for p in params):
            return False
        nmin = np.abs(self.nudged_min)
        ok = np.all(self.scale >= LEAN_BOUND) and np.all((nmin == 0) | (nmin >= LEAN_BOUND))
        return bool(ok and (divide or np.all(self.inv_scale <= 1 / LEAN_BOUND)))

    def as_graph(self, lw: Lowering) -> Nudged:
        c = lambda v: lw.const(v, F32)  # noqa: E731
        return Nudged(c(self.scale), c(self.inv_scale), c(self.nudged_min), c(self.nudged_max), c(self.quant_zero))


def _lean_forward(lw: Lowering, x: str, p: ConstantNudge, divide: bool) -> str:
    """The per-element forward for constant parameters that pass ``ConstantNudge.lean_exact``:
    clamp, (- nudged_min), * inv_scale or / scale, (- quant_zero), + 0.5, floor, * scale; the steps in
    parentheses are left out where the constant is zero (x - 0 and x - (-0) differ at most in a zero's
    sign, which + 0.5 erases). Clip (or Min/Max for [d] bounds) keeps a NaN x, as Eigen's clamp does;
    a zero's sign after the clamp cannot reach the result. No flush: see ``lean_exact``.
    5 to 7 nodes, against TF's 7 operations.
    """
    if p.nudged_min.ndim == 0:
        clamped = lw.op("Clip", x, lw.const(p.nudged_min, F32), lw.const(p.nudged_max, F32))
    else:
        clamped = lw.op("Max", lw.op("Min", x, lw.const(p.nudged_max, F32)), lw.const(p.nudged_min, F32))
    shifted = clamped if np.all(p.nudged_min == 0) else lw.op("Sub", clamped, lw.const(p.nudged_min, F32))
    if divide:
        scaled = lw.op("Div", shifted, lw.const(p.scale, F32))
    else:
        scaled = lw.op("Mul", shifted, lw.const(p.inv_scale, F32))
    if not np.all(p.quant_zero == 0):
        scaled = lw.op("Sub", scaled, lw.const(p.quant_zero, F32))
    q = lw.op("Floor", lw.op("Add", scaled, lw.const(0.5, F32)))
    return lw.op("Mul", q, lw.const(p.scale, F32))


def _daz_bounds(lw: Lowering, nudged_min: str, nudged_max: str):
    """Bounds lo, hi such that ``x >= lo`` / ``x < lo`` and ``x <= hi`` / ``x > hi`` decide what TF's
    comparisons of the flushed x with nudged_min / nudged_max decide, with x unflushed.

    nudged_min/max are zero or normal (the nudge flushes them). Against a normal bound a subnormal x
    compares like zero; against a zero bound it does not, so a zero lower bound becomes the largest
    negative subnormal (flushed x >= 0 exactly when x > -FLT_MIN) and a zero upper bound the largest
    positive one. Scalar or [d] work, once per node.
    """
    zero = lw.const(0.0, F32)
    lo = lw.op("Where", lw.op("Equal", nudged_min, zero), lw.const(-LARGEST_SUBNORMAL, F32), nudged_min)
    hi = lw.op("Where", lw.op("Equal", nudged_max, zero), lw.const(LARGEST_SUBNORMAL, F32), nudged_max)
    return lo, hi


def _constant_daz_bounds(p: ConstantNudge):
    """``_daz_bounds`` at conversion time."""
    lo = np.where(p.nudged_min == 0, -LARGEST_SUBNORMAL, p.nudged_min).astype(F32)
    hi = np.where(p.nudged_max == 0, LARGEST_SUBNORMAL, p.nudged_max).astype(F32)
    return lo, hi


def _lean_gradients(lw: Lowering, g: str, x: str, lo: str, hi: str, with_range: bool):
    """The per-element gradient work: (dx, below, above) or (dx,) where ``with_range`` is False.

    TF computes g * mask on the flushed g and x. ``g * (|g| >= FLT_MIN)`` is the flushed g with its
    zero's sign (NaN and inf kept); multiplying it by the 0/1 mask is TF's product, which is never
    subnormal. x is compared unflushed with the bounds of ``_daz_bounds``. 9 nodes for dx, 3 more per
    range-gradient product (its sum follows).
    """
    gf = lw.flush(g, F32)
    inside = lw.op("And", lw.op("GreaterOrEqual", x, lo), lw.op("LessOrEqual", x, hi))
    dx = lw.op("Mul", gf, lw.mask_as(inside, FLOAT))
    if not with_range:
        return (dx,)
    below = lw.op("Mul", gf, lw.mask_as(lw.op("Less", x, lo), FLOAT))
    above = lw.op("Mul", gf, lw.mask_as(lw.op("Greater", x, hi), FLOAT))
    return dx, below, above


def _both_zero(lw: Lowering, mn: str, mx: str) -> str:
    """min == max == 0, where subnormals count as zero (denormals-are-zero): |v| < FLT_MIN (NaN: false)."""
    tiny = lw.const(TINY, F32)
    return lw.op("And", lw.op("Less", lw.op("Abs", mn), tiny), lw.op("Less", lw.op("Abs", mx), tiny))


def _constant_range(lw: Lowering, min_index: int):
    """(min, max) as float32 arrays when both are constants in the graph, else None."""
    mn, mx = lw.constant_value(min_index), lw.constant_value(min_index + 1)
    if mn is None or mx is None:
        return None
    return np.asarray(mn, F32), np.asarray(mx, F32)


def lower_args(ctx, node):
    lw = Lowering(ctx, node)
    lw.validate()  # the spec's checks (ort_ops.checks.fake_quant): what TF rejects fails here
    qmin, qmax = _grid(lw)
    p = ConstantNudge(lw.attrs["min"], lw.attrs["max"], qmin, qmax)
    lw.take_over()
    x = lw.inputs[0]
    lw.emit(0, _lean_forward(lw, x, p, False) if p.lean_exact(False) else fake_quant(lw, x, p.as_graph(lw), False))


def lower_args_gradient(ctx, node):
    lw = Lowering(ctx, node)
    lw.validate()
    qmin, qmax = _grid(lw)
    p = ConstantNudge(lw.attrs["min"], lw.attrs["max"], qmin, qmax)
    lw.take_over()
    lo, hi = (lw.const(b, F32) for b in _constant_daz_bounds(p))
    lw.emit(0, _lean_gradients(lw, lw.inputs[0], lw.inputs[1], lo, hi, with_range=False)[0])


def lower_vars(ctx, node):
    lw = Lowering(ctx, node)
    lw.validate()
    qmin, qmax = _grid(lw)
    constant = _constant_range(lw, 1)
    lw.take_over()
    x, mn, mx = lw.inputs
    if constant is not None:
        p = ConstantNudge(*constant, qmin, qmax)
        if p.zero_range:  # min == max == 0 skips the nudge and writes zeros
            lw.emit(0, lw.zeros_like(x, F32))
        else:
            lw.emit(0, _lean_forward(lw, x, p, True) if p.lean_exact(True) else fake_quant(lw, x, p.as_graph(lw), True))
        return
    n = nudge(lw, mn, mx, qmin, qmax)
    out = fake_quant(lw, x, n, divide=True)
    # min == max == 0 skips the nudge and writes zeros. With a scalar condition and a scalar other
    # operand, ORT's Where copies the chosen tensor, -0 included (tested with -0 outputs of mn > mx).
    lw.emit(0, lw.op("Where", _both_zero(lw, mn, mx), lw.const(0.0, F32), out))


def lower_vars_gradient(ctx, node):
    lw = Lowering(ctx, node)
    lw.validate()
    qmin, qmax = _grid(lw)
    constant = _constant_range(lw, 2)
    lw.take_over()
    raw_g, x, mn, mx = lw.inputs
    zero = lw.const(0.0, F32)
    if constant is not None:
        p = ConstantNudge(*constant, qmin, qmax)
        if p.zero_range:  # TF's plain Eigen copy of g (no arithmetic, so unflushed) and zero range gradients
            lw.emit(0, raw_g)
            lw.emit(1, zero)
            lw.emit(2, zero)
            return
        lo, hi = (lw.const(b, F32) for b in _constant_daz_bounds(p))
        dx, below, above = _lean_gradients(lw, raw_g, x, lo, hi, with_range=True)
        lw.emit(0, dx)
        lw.emit(1, lw.reduce("ReduceSum", below, None, keepdims=False))
        lw.emit(2, lw.reduce("ReduceSum", above, None, keepdims=False))
        return
    n = nudge(lw, mn, mx, qmin, qmax)
    both_zero = _both_zero(lw, mn, mx)
    dx, below, above = _lean_gradients(lw, raw_g, x, *_daz_bounds(lw, n.nudged_min, n.nudged_max), with_range=True)
    dmin = lw.reduce("ReduceSum", below, None, keepdims=False)
    dmax = lw.reduce("ReduceSum", above, None, keepdims=False)
    # A min == max == 0 range copies the gradient unflushed (TF's plain Eigen copy does no arithmetic).
    # Both candidates are tensors that can hold -0, which ORT's Where may turn into +0: signed where.
    lw.emit(0, lw.where(both_zero, raw_g, dx, F32))
    lw.emit(1, lw.where(both_zero, zero, dmin, F32))
    lw.emit(2, lw.where(both_zero, zero, dmax, F32))


def _channel_axis(lw: Lowering, x_index: int) -> int:
    """How many dims of x follow its channel dim: 0 for TF's op (no `axis`, the last dim), more where
    converters.layout.absorb_channel_transposes gave the node an axis instead of a Transpose pair. The
    [d] parameters are then broadcast as [d, 1, ..., 1], the arithmetic is the same per element."""
    axis = lw.attrs["axis"]
    if axis == -1:
        return 0
    rank = lw.rank(x_index)
    if rank is None:
        lw.fail(f"axis {axis} needs the rank of the input, which is unknown at conversion time")
    return rank - 1 - axis


def _along_axis(lw: Lowering, v: str, trailing: int) -> str:
    """A [d] tensor as [d, 1, ..., 1] with ``trailing`` ones (itself for 0)."""
    return v if trailing == 0 else lw.reshape(v, [-1] + [1] * trailing)


def _constant_along_axis(p: ConstantNudge, trailing: int) -> ConstantNudge:
    """``_along_axis`` for the parameters computed at conversion time."""
    if trailing:
        for name in ("nudged_min", "nudged_max", "scale", "inv_scale", "quant_zero", "zero_range"):
            v = getattr(p, name)
            setattr(p, name, v.reshape(v.shape + (1,) * trailing))
    return p


def lower_vars_per_channel(ctx, node):
    lw = Lowering(ctx, node)
    lw.validate()
    trailing = _channel_axis(lw, 0)
    qmin, qmax = _grid(lw)
    constant = _constant_range(lw, 1)
    lw.take_over()
    x, mn, mx = lw.inputs
    if constant is not None:
        p = _constant_along_axis(ConstantNudge(*constant, qmin, qmax), trailing)
        if np.all(p.zero_range):
            lw.emit(0, lw.zeros_like(x, F32))
            return
        if not np.any(p.zero_range) and p.lean_exact(False):
            lw.emit(0, _lean_forward(lw, x, p, False))
            return
    # [d]-shaped parameters broadcast along the channel axis of x (the last: per column of TF's [N, d] view).
    mn, mx = _along_axis(lw, mn, trailing), _along_axis(lw, mx, trailing)
    n = nudge(lw, mn, mx, qmin, qmax)
    out = fake_quant(lw, x, n, divide=False)
    lw.emit(0, lw.where(_both_zero(lw, mn, mx), lw.const(0.0, F32), out, F32))


def lower_vars_per_channel_gradient(ctx, node):
    lw = Lowering(ctx, node)
    lw.validate()
    trailing = _channel_axis(lw, 1)
    rank = lw.rank(1)
    qmin, qmax = _grid(lw)
    constant = _constant_range(lw, 2)
    lw.take_over()
    raw_g, x, mn, mx = lw.inputs
    p = ConstantNudge(*constant, qmin, qmax) if constant is not None else None
    lean = p is not None and not np.any(p.zero_range)
    if lean:
        bounds = [lw.const(b, F32) for b in _constant_daz_bounds(_constant_along_axis(p, trailing))]
    else:
        n = nudge(lw, _along_axis(lw, mn, trailing), _along_axis(lw, mx, trailing), qmin, qmax)
        bounds = _daz_bounds(lw, n.nudged_min, n.nudged_max)
    dx, below, above = _lean_gradients(lw, raw_g, x, *bounds, with_range=True)
    if trailing:
        # The channel is dim rank-1-trailing: sum over every other dim (in ONNX Runtime's order, as the
        # [N, d] form below is; see converters.layout.absorb_channel_transposes).
        others = [i for i in range(rank) if i != rank - 1 - trailing]
        dmin, dmax = (lw.reduce("ReduceSum", v, others, False) for v in (below, above))
    else:
        # Sum over TF's [N, d] view: flatten the leading dims and reduce axis 0.
        if lean:
            columns = lw.const([-1, p.nudged_min.shape[0]], np.int64)
        else:
            columns = lw.op("Concat", lw.const([-1], np.int64), lw.op("Shape", mn), axis=0)
        dmin, dmax = (lw.reduce("ReduceSum", lw.op("Reshape", v, columns), [0], False) for v in (below, above))
    if lean:
        lw.emit(0, dx)
        lw.emit(1, dmin)
        lw.emit(2, dmax)
        return
    # A min == max == 0 range copies the gradient unflushed (TF's plain Eigen copy does no arithmetic).
    both_zero = _both_zero(lw, mn, mx)
    zero = lw.const(0.0, F32)
    lw.emit(0, lw.where(_along_axis(lw, both_zero, trailing), raw_g, dx, F32))
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
