"""FusedBatchNorm{,V2,V3} and FusedBatchNormGrad{,V2,V3} as reductions and element-wise ONNX ops.

Not bit-exact (TF's column sums and its RSQRTPS-based rsqrt have their own rounding), but the same
formulas in float32: x of half/bfloat16 is cast to float, computed there and cast back as TF does.
Channels are the last axis (NHWC/NDHWC) or axis 1 (NCHW/NCDHW); per-channel vectors are reshaped to
broadcast along that axis.

TF's denormal mode (denormals-are-zero, flush-to-zero; docs/semantics.md 0.3) is not emulated: ORT's
ops compute with subnormals, and flushing every intermediate would multiply the graph. Where it decides
NaN or Inf (an inference variance of 1e-45 with epsilon 0: TF inf, here 2.7e22) the result differs.

What TF rejects is rejected by the spec's checks (``Lowering.validate``); the one limitation of this
lowering is that the rank of x must be known at conversion time.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from converters.standard._builder import Lowering
from ort_ops.checks.batch_norm import channel_axis

F32 = np.float32
FLOAT = TensorProto.FLOAT


class _Layout:
    def __init__(self, lw: Lowering, x_index: int):
        rank = lw.rank(x_index)
        if rank is None:
            lw.fail("the rank of x must be known at conversion time")
        self.rank = rank
        self.channel_axis = channel_axis(rank, lw.attrs["data_format"])
        self.reduce_axes = [a for a in range(rank) if a != self.channel_axis]

    def per_channel(self, lw: Lowering, v: str) -> str:
        """A [C] vector shaped to broadcast along the channel axis."""
        if self.channel_axis == self.rank - 1:
            return v
        return lw.op("Reshape", v, lw.const([-1] + [1] * (self.rank - 2), np.int64))


def _to_float(lw: Lowering, x: str, t: int) -> str:
    return x if t == FLOAT else lw.cast(x, FLOAT)


def _from_float(lw: Lowering, y: str, t: int) -> str:
    return y if t == FLOAT else lw.cast(y, t)


def _rsqrt(lw: Lowering, v: str) -> str:
    """1/sqrt(v): correctly rounded sqrt then division (TF's scalar path)."""
    return lw.op("Div", lw.const(1.0, F32), lw.op("Sqrt", v))


def _rows(lw: Lowering, x: str, layout: _Layout) -> str:
    """R = elements per channel, as float32 (computed from the runtime shape)."""
    shape = lw.op("Shape", x)
    dims = lw.op("Gather", shape, lw.const(layout.reduce_axes, np.int64), axis=0)
    return lw.cast(lw.reduce("ReduceProd", dims, None, keepdims=False), FLOAT)


def _lower_forward(ctx, node, version: int):
    lw = Lowering(ctx, node)
    lw.validate()
    t = lw.dtype(0)
    layout = _Layout(lw, 0)
    epsilon = F32(lw.attrs["epsilon"])
    factor = F32(lw.attrs["exponential_avg_factor"])
    training = lw.attrs["is_training"]
    lw.take_over()
    x_in, scale, offset, mean_in, var_in = lw.inputs
    x = _to_float(lw, x_in, t)
    eps = lw.const(epsilon, F32)
    axes = layout.reduce_axes
    if training:
        rows = _rows(lw, x, layout)
        inv_rows = lw.op("Div", lw.const(1.0, F32), rows)  # TF multiplies by f32(1/R)
        mean = lw.op("Mul", lw.reduce("ReduceSum", x, axes, keepdims=False), inv_rows)
        centered = lw.op("Sub", x, layout.per_channel(lw, mean))
        var = lw.op("Mul", lw.reduce("ReduceSum", lw.op("Mul", centered, centered), axes, keepdims=False), inv_rows)
        k = lw.op("Mul", _rsqrt(lw, lw.op("Add", var, eps)), scale)
        y = lw.op("Add", lw.op("Mul", centered, layout.per_channel(lw, k)), layout.per_channel(lw, offset))
        # Bessel factor R / max(R-1, 1) for the running variance.
        bessel = lw.op("Div", rows, lw.op("Max", lw.op("Sub", rows, lw.const(1.0, F32)), lw.const(1.0, F32)))
        if factor == F32(1.0):
            out_mean, out_var = mean, lw.op("Mul", var, bessel)
        else:
            keep = lw.const(F32(1.0) - factor, F32)
            out_mean = lw.op("Add", lw.op("Mul", keep, mean_in), lw.op("Mul", lw.const(factor, F32), mean))
            out_var = lw.op("Add", lw.op("Mul", keep, var_in), lw.op("Mul", lw.op("Mul", lw.const(factor, F32), bessel), var))
        saved_mean, saved_var = mean, var
    else:
        k = lw.op("Mul", _rsqrt(lw, lw.op("Add", var_in, eps)), scale)
        centered = lw.op("Sub", x, layout.per_channel(lw, mean_in))
        y = lw.op("Add", lw.op("Mul", centered, layout.per_channel(lw, k)), layout.per_channel(lw, offset))
        out_mean, out_var = mean_in, var_in
        saved_mean, saved_var = mean_in, var_in  # as oneDNN does; the Eigen kernel leaves them unwritten
    lw.emit(0, _from_float(lw, y, t))
    lw.emit(1, out_mean)
    lw.emit(2, out_var)
    lw.emit(3, saved_mean)
    lw.emit(4, saved_var)
    if version == 3:
        lw.emit(5, lw.const(0.0, F32))  # scalar placeholder, as TF's CPU kernel


def _lower_grad(ctx, node):
    lw = Lowering(ctx, node)
    lw.validate()
    t = lw.dtype(1)
    layout = _Layout(lw, 1)
    epsilon = F32(lw.attrs["epsilon"])
    training = lw.attrs["is_training"]
    lw.take_over()
    dy_in, x_in, scale, saved_mean, saved_var = lw.inputs[:5]
    dy, x = _to_float(lw, dy_in, t), _to_float(lw, x_in, t)
    axes = layout.reduce_axes
    pc = lambda v: layout.per_channel(lw, v)  # noqa: E731
    eps = lw.const(epsilon, F32)
    c0 = _rsqrt(lw, lw.op("Add", saved_var, eps))
    centered = lw.op("Sub", x, pc(saved_mean))
    d_offset = lw.reduce("ReduceSum", dy, axes, keepdims=False)
    if training:
        rows = _rows(lw, x, layout)
        d_scale = lw.reduce("ReduceSum", lw.op("Mul", dy, lw.op("Mul", centered, pc(c0))), axes, keepdims=False)
        dy_mean = lw.op("Mul", d_offset, lw.op("Div", lw.const(1.0, F32), rows))
        m = lw.op("Div", lw.reduce("ReduceSum", lw.op("Mul", dy, centered), axes, keepdims=False), rows)
        coef1 = lw.op("Mul", scale, c0)
        coef2 = lw.op("Mul", lw.op("Mul", c0, c0), m)
        dx = lw.op("Mul", pc(coef1), lw.op("Sub", lw.op("Sub", dy, pc(dy_mean)), lw.op("Mul", centered, pc(coef2))))
    else:
        s2 = lw.reduce("ReduceSum", lw.op("Mul", dy, centered), axes, keepdims=False)
        dx = lw.op("Mul", dy, pc(lw.op("Mul", c0, scale)))
        d_scale = lw.op("Mul", s2, c0)
    lw.emit(0, _from_float(lw, dx, t))
    lw.emit(1, d_scale)
    lw.emit(2, d_offset)
    empty = lw.const(np.zeros([0], F32), F32)  # placeholders of shape [0], as TF's CPU kernel
    lw.emit(3, empty)
    lw.emit(4, empty)


LOWERINGS = {
    "FusedBatchNorm": lambda ctx, node: _lower_forward(ctx, node, 1),
    "FusedBatchNormV2": lambda ctx, node: _lower_forward(ctx, node, 2),
    "FusedBatchNormV3": lambda ctx, node: _lower_forward(ctx, node, 3),
    "FusedBatchNormGrad": _lower_grad,
    "FusedBatchNormGradV2": _lower_grad,
    "FusedBatchNormGradV3": _lower_grad,
}
