"""DepthwiseConv2dNative and its two backprops as grouped ONNX convolutions.

Forward: Conv with group = C and weights [C*M, 1, kh, kw] (filter[kh,kw,C,M] transposed to
[C,M,kh,kw], so output channel c*M + m, as TF). BackpropInput: ConvTranspose with the same weights
(per group: M input channels, 1 output). BackpropFilter: a Conv with the roles swapped: the input,
viewed as [1, C*N, H, W] (group c holds channel c of every batch), is correlated with out_backprop
viewed as [C*M, N, oh, ow]; the forward stride becomes the dilation and the forward dilation the
stride. Not bit-exact (summation order differs from TF's), within float tolerance.

float32 runs as is; float16/bfloat16 are cast to float32 and back (TF also computes every tap in
float); float64 cannot be lowered (ONNX Runtime's CPU Conv has no double kernel, and narrowing would
change the result), so it raises LoweringError.

What TF rejects is rejected by the spec's checks (``Lowering.validate``, rules in
``ort_ops.checks.depthwise``); the failures left here are this lowering's own limitations: float64,
sizes that must be known at conversion time, and what ConvTranspose cannot express.

TF's denormal mode (docs/semantics.md 0.3) is not emulated: ORT's Conv computes with subnormals, so a
subnormal operand times an infinite one gives +-inf where TF gives NaN, and products below the normal
range stay subnormal where TF's are zero (within the tolerance otherwise). Outputs beyond the library's
size cap (2^31 elements, from constant input_sizes/filter_sizes) are a conversion error, as in the kernels.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from converters.standard._builder import Lowering
from ort_ops.checks import depthwise as checks
from ort_ops.spec import OpError

FLOAT = TensorProto.FLOAT
CAST_TYPES = {TensorProto.FLOAT16, TensorProto.BFLOAT16}
TO_NCHW = [0, 3, 1, 2]
TO_NHWC = [0, 2, 3, 1]


class _Geometry:
    """The window of the node's (validated) attributes."""

    def __init__(self, lw: Lowering):
        win = checks.window(lw.attrs)
        self.stride, self.dilations, self.explicit, self.padding = win.stride, win.dilations, win.explicit, win.padding
        self.nhwc = lw.attrs["data_format"] == "NHWC"
        self.lw = lw

    def dim(self, size: int, k: int, axis: int):
        """(out, pad_before, pad_after) of spatial ``axis`` (0 rows, 1 cols) for a known input size; the
        spec's checks have seen every size this is called with (so out >= 0)."""
        explicit = self.explicit[axis] if self.explicit else None
        return checks.window_size(size, k, self.stride, self.dilations[axis], self.padding, explicit)

    def spatial(self, shape):
        """(H, W) of a data_format shape, -1 where unknown."""
        if shape is None or len(shape) != 4:
            return -1, -1
        return (shape[1], shape[2]) if self.nhwc else (shape[2], shape[3])

    def to_nchw(self, lw: Lowering, x: str) -> str:
        return lw.op("Transpose", x, perm=TO_NCHW) if self.nhwc else x

    def from_nchw(self, lw: Lowering, x: str) -> str:
        return lw.op("Transpose", x, perm=TO_NHWC) if self.nhwc else x


def _element_type(lw: Lowering, index: int):
    """T (the spec's checks have made the inputs agree on one of its types): all but float64."""
    t = lw.dtype(index)
    if t == TensorProto.DOUBLE:
        lw.fail("float64 is not supported: ONNX Runtime's standard Conv/ConvTranspose have no double CPU kernel")
    return t


def _f32(lw: Lowering, x: str, t: int) -> str:
    return x if t == FLOAT else lw.cast(x, FLOAT)


def _back(lw: Lowering, x: str, t: int) -> str:
    return x if t == FLOAT else lw.cast(x, t)


def _filter_dims(lw: Lowering, shape):
    if shape is None or len(shape) != 4 or any(d < 0 for d in shape):
        lw.fail("the filter shape [kh, kw, C, M] must be known at conversion time")
    return [int(d) for d in shape]


def _grouped_weights(lw: Lowering, filt: str, c: int, m: int, kh: int, kw: int) -> str:
    """filter [kh,kw,C,M] -> [C*M, 1, kh, kw], row c*M + m = filter[:, :, c, m]."""
    return lw.op("Reshape", lw.op("Transpose", filt, perm=[2, 3, 0, 1]), lw.const([c * m, 1, kh, kw], np.int64))


def _empty_output(lw: Lowering, geo: _Geometry, in_shape, oh: int, ow: int, depth: int) -> str:
    """float32 zeros of the forward output's shape when it is empty (the batch from the input)."""
    batch = in_shape[0] if in_shape[0] >= 0 else None
    return lw.zeros([batch, oh, ow, depth] if geo.nhwc else [batch, depth, oh, ow], np.float32, like=lw.inputs[0])


def _padded_zeros(lw: Lowering, in_shape, h: int, w: int, c: int, nhwc: bool) -> str:
    """float32 zeros standing for an empty input padded to h x w (the batch from the input)."""
    batch = in_shape[0] if in_shape[0] >= 0 else None
    return lw.zeros([batch, h, w, c] if nhwc else [batch, c, h, w], np.float32, like=lw.inputs[0])


def _sizes(lw: Lowering, index: int, label: str):
    """A sizes vector's value (validated by the spec's checks, the size cap included)."""
    value = lw.constant_value(index)
    if value is None:
        lw.fail(f"{label} must be a constant for the standard lowering")
    return [int(v) for v in value]


def _static_input_sizes(lw: Lowering):
    """input_sizes as a constant, or (a None batch: it is Shape(x) at run time) the output's static
    shape, whose spatial and channel dims are all this lowering reads (the batch entry becomes 0)."""
    if lw.constant_value(0) is not None:
        return _sizes(lw, 0, "input_sizes")
    shape = lw.ctx.get_shape(lw.outputs[0])
    if shape is None or len(shape) != 4 or min(shape[1:]) < 0:
        lw.fail(f"input_sizes must be a constant for the standard lowering, or the output's shape known but for "
                f"the batch (got {shape})")
    known = [None if d < 0 else d for d in shape]
    try:  # the spec's checks did not see these sizes: run the backprop's rules on them too
        checks.check_backprop(lw.op_type, checks.window(lw.attrs), lw.attrs["data_format"], known,
                              _facts(lw.shape(1)), _facts(lw.shape(2)))
    except OpError as e:
        lw.fail(e.detail)
    return [max(shape[0], 0)] + [int(v) for v in shape[1:]]


def _facts(shape):
    """A static shape as the checks take it (unknown dims None)."""
    return None if shape is None else tuple(None if d < 0 else d for d in shape)


def lower_forward(ctx, node):
    lw = Lowering(ctx, node)
    lw.validate()
    geo = _Geometry(lw)
    t = _element_type(lw, 0)
    kh, kw, c, m = _filter_dims(lw, lw.shape(1))
    in_shape = lw.shape(0)
    h, w = geo.spatial(in_shape)
    if c * m == 0 and (h < 0 or w < 0):
        lw.fail("an empty filter (no channels) needs the input's spatial size at conversion time")
    empty_input = False
    conv_attrs = dict(group=c, strides=[geo.stride, geo.stride], dilations=list(geo.dilations), kernel_shape=[kh, kw])
    if geo.padding == "SAME" and (h < 0 or w < 0):
        conv_attrs["auto_pad"] = "SAME_UPPER"  # the extra pad goes after, as TF's pad_before = total // 2
    else:
        (oh, pt, pb), (ow, pl, pr) = (geo.dim(h, kh, 0), geo.dim(w, kw, 1)) if h >= 0 and w >= 0 else ((1, 0, 0), (1, 0, 0))
        if geo.padding == "EXPLICIT":
            (pt, pb), (pl, pr) = geo.explicit
        if oh * ow * c * m == 0 or (in_shape is not None and in_shape[0] == 0):  # an empty output, or no groups
            lw.take_over()
            lw.emit(0, _back(lw, _empty_output(lw, geo, in_shape, oh, ow, c * m), t))
            return
        # An empty input that explicit padding makes non-empty: its windows see only padding, so the
        # Conv reads zeros of the padded size (0 * filter, as TF's kernel computes it), never an empty tensor.
        empty_input = h == 0 or w == 0
        conv_attrs["pads"] = [0, 0, 0, 0] if empty_input else [pt, pl, pb, pr]
    lw.take_over()
    if empty_input:
        x = _padded_zeros(lw, in_shape, h + pt + pb, w + pl + pr, c, nhwc=False)
    else:
        x = geo.to_nchw(lw, _f32(lw, lw.inputs[0], t))
    weights = _grouped_weights(lw, _f32(lw, lw.inputs[1], t), c, m, kh, kw)
    y = lw.op("Conv", x, weights, **conv_attrs)
    lw.emit(0, _back(lw, geo.from_nchw(lw, y), t))


def lower_backprop_input(ctx, node):
    lw = Lowering(ctx, node)
    lw.validate()
    geo = _Geometry(lw)
    t = _element_type(lw, 1)
    sizes = _static_input_sizes(lw)
    kh, kw, c, m = _filter_dims(lw, lw.shape(1))
    h, w = geo.spatial(sizes)
    (oh, _, _), (ow, _, _) = geo.dim(h, kh, 0), geo.dim(w, kw, 1)
    if h * w * oh * ow * c * m == 0 or (lw.constant_value(0) is not None and sizes[0] == 0):
        # An empty input or out_backprop, or no groups: the gradient is all zeros (TF sums nothing).
        lw.take_over()
        batch = sizes[0] if lw.constant_value(0) is not None else None
        dims = [batch, h, w, c] if geo.nhwc else [batch, c, h, w]
        lw.emit(0, _back(lw, lw.zeros(dims, np.float32, like=lw.inputs[2]), t))
        return
    pads, out_pad = [], []
    for axis, (size, k) in enumerate(((h, kh), (w, kw))):
        out, before, _ = geo.dim(size, k, axis)
        covered = (out - 1) * geo.stride + (k - 1) * geo.dilations[axis] + 1 if out > 0 else 0
        after = covered - before - size
        # Rows past the last window get no gradient: ConvTranspose adds them as output_padding.
        pads.append((before, max(after, 0)))
        out_pad.append(max(-after, 0))
    if any(p >= geo.stride and p >= geo.dilations[i] for i, p in enumerate(out_pad)):
        lw.fail("the input size leaves more uncovered rows than ConvTranspose's output_padding can express")
    lw.take_over()
    weights = _grouped_weights(lw, _f32(lw, lw.inputs[1], t), c, m, kh, kw)
    dy = geo.to_nchw(lw, _f32(lw, lw.inputs[2], t))
    dx = lw.op(
        "ConvTranspose",
        dy,
        weights,
        group=c,
        strides=[geo.stride, geo.stride],
        dilations=list(geo.dilations),
        kernel_shape=[kh, kw],
        pads=[pads[0][0], pads[1][0], pads[0][1], pads[1][1]],
        output_padding=out_pad,
    )
    lw.emit(0, _back(lw, geo.from_nchw(lw, dx), t))


def lower_backprop_filter(ctx, node):
    lw = Lowering(ctx, node)
    lw.validate()
    geo = _Geometry(lw)
    t = _element_type(lw, 0)
    kh, kw, c, m = _sizes(lw, 1, "filter_sizes")
    in_shape = lw.shape(0)
    h, w = geo.spatial(in_shape)
    known = h >= 0 and w >= 0
    empty = kh * kw * c * m == 0 or (in_shape is not None and len(in_shape) == 4 and in_shape[0] == 0)
    if known and not empty:
        (oh, _, _), (ow, _, _) = geo.dim(h, kh, 0), geo.dim(w, kw, 1)
        empty = oh * ow == 0
    if empty:
        # No window positions or no batch (TF sums nothing: +0), or an empty filter: zeros, and no
        # Conv with an empty kernel.
        lw.take_over()
        lw.emit(0, _back(lw, lw.zeros([kh, kw, c, m], np.float32), t))
        return
    pads = []
    for axis, (size, k) in enumerate(((h, kh), (w, kw))):
        if geo.padding == "VALID":
            pads.append((0, 0))
        elif geo.padding == "EXPLICIT":
            pads.append(geo.explicit[axis])
        else:
            if size < 0:
                lw.fail("SAME padding needs the input's spatial size at conversion time")
            _, before, after = geo.dim(size, k, axis)
            pads.append((before, after))
    # An empty input that explicit padding makes non-empty: the windows see only padding, so the
    # correlation reads zeros of the padded size (0 * out_backprop, as TF), never an empty tensor.
    empty_input = known and (h == 0 or w == 0)
    if empty_input:
        h, w = h + sum(pads[0]), w + sum(pads[1])
        pads = [(0, 0), (0, 0)]
    # With known sizes, whether the correlation (of the padded input with out_backprop dilated by the
    # stride, stepping by the dilation) runs past the last tap, which EXPLICIT padding beyond the windows'
    # reach does; it always reaches kh x kw positions, so the crop below is never out of range.
    crop = True
    if known:
        crop = False
        for size, k, (before, after), o, d in zip((h, w), (kh, kw), pads, (oh, ow), geo.dilations):
            positions = (size + before + after - ((o - 1) * geo.stride + 1)) // d + 1
            crop |= positions != k
    lw.take_over()
    if empty_input:
        x = _padded_zeros(lw, in_shape, h, w, c, nhwc=geo.nhwc)
    else:
        x = _f32(lw, lw.inputs[0], t)
    dy = _f32(lw, lw.inputs[2], t)
    to_cn = [3, 0, 1, 2] if geo.nhwc else [1, 0, 2, 3]  # channels first, then batch
    x_cn = lw.op("Transpose", x, perm=to_cn)
    dy_weights = lw.op("Transpose", dy, perm=to_cn)  # [C*M, N, oh, ow]; group c has N input channels
    if in_shape is None or in_shape[0] < 0:
        # A batch known only at run time may be 0: then one zero image each (adding 0 * 0), since the
        # batch is the Conv's channel axis here and ONNX Runtime's Conv hangs on zero channels.
        x_cn, dy_weights = lw.nonempty(x_cn, 1, 4), lw.nonempty(dy_weights, 1, 4)
    # [1, C*N, H, W], never with Reshape's 0 (see Lowering.reshape): a 1-channel transpose becomes a Reshape
    x_groups = lw.reshape(x_cn, [1, -1, h, w] if known else [1, -1, None, None], like=x_cn)
    dw = lw.op(
        "Conv",
        x_groups,
        dy_weights,
        group=c,
        strides=list(geo.dilations),
        dilations=[geo.stride, geo.stride],
        pads=[pads[0][0], pads[1][0], pads[0][1], pads[1][1]],
    )
    if crop:  # keep the first kh x kw positions
        dw = lw.op("Slice", dw, lw.const([0, 0], np.int64), lw.const([kh, kw], np.int64), lw.const([2, 3], np.int64))
    dw = lw.op("Reshape", dw, lw.const([c, m, kh, kw], np.int64))
    lw.emit(0, _back(lw, lw.op("Transpose", dw, perm=[2, 3, 0, 1]), t))


LOWERINGS = {
    "DepthwiseConv2dNative": lower_forward,
    "DepthwiseConv2dNativeBackpropInput": lower_backprop_input,
    "DepthwiseConv2dNativeBackpropFilter": lower_backprop_filter,
}
