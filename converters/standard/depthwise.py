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

TF's denormal mode (docs/semantics.md 0.3) is not emulated: ORT's Conv computes with subnormals, so a
subnormal operand times an infinite one gives +-inf where TF gives NaN, and products below the normal
range stay subnormal where TF's are zero (within the tolerance otherwise). Outputs beyond the library's
size cap (2^31 elements, from constant input_sizes/filter_sizes) are a conversion error, as in the kernels.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from converters.standard._builder import Lowering
from ort_ops.spec import OpError
from ort_ops.specs.depthwise import check_attrs, output_size, output_size_message

FLOAT = TensorProto.FLOAT
CAST_TYPES = {TensorProto.FLOAT16, TensorProto.BFLOAT16}
TO_NCHW = [0, 3, 1, 2]
TO_NHWC = [0, 2, 3, 1]


class _Geometry:
    """Attributes of the op, validated with the spec's own checks."""

    def __init__(self, lw: Lowering):
        attrs = {
            "strides": list(lw.attr("strides", [])),
            "padding": lw.attr("padding", "VALID"),
            "explicit_paddings": list(lw.attr("explicit_paddings", []) or []),
            "data_format": lw.attr("data_format", "NHWC"),
            "dilations": list(lw.attr("dilations", [1, 1, 1, 1]) or [1, 1, 1, 1]),
        }
        if attrs["padding"] not in ("SAME", "VALID", "EXPLICIT"):
            lw.fail(f"padding must be SAME, VALID or EXPLICIT, got {attrs['padding']!r}")
        if attrs["data_format"] not in ("NHWC", "NCHW"):
            lw.fail(f"data_format must be NHWC or NCHW, got {attrs['data_format']!r}")
        try:
            self.stride, self.dilations, self.explicit = check_attrs(lw.op_type, attrs)
        except OpError as e:
            lw.fail(str(e))
        self.padding = attrs["padding"]
        self.nhwc = attrs["data_format"] == "NHWC"
        self.lw = lw

    def dim(self, size: int, k: int, axis: int):
        """(out, pad_before, pad_after) of spatial ``axis`` (0 rows, 1 cols) for a known input size."""
        explicit = self.explicit[axis] if self.explicit else None
        try:
            return output_size(self.lw.op_type, size, k, self.stride, self.dilations[axis], self.padding, explicit,
                               ("rows", "cols")[axis])
        except OpError as e:
            self.lw.fail(str(e))

    def spatial(self, shape):
        """(H, W) of a data_format shape, -1 where unknown."""
        if shape is None or len(shape) != 4:
            return -1, -1
        return (shape[1], shape[2]) if self.nhwc else (shape[2], shape[3])

    def to_nchw(self, lw: Lowering, x: str) -> str:
        return lw.op("Transpose", x, perm=TO_NCHW) if self.nhwc else x

    def from_nchw(self, lw: Lowering, x: str) -> str:
        return lw.op("Transpose", x, perm=TO_NHWC) if self.nhwc else x


def _element_type(lw: Lowering, indices):
    t = lw.dtype(indices[0])
    if t == TensorProto.DOUBLE:
        lw.fail("float64 is not supported: ONNX Runtime's standard Conv/ConvTranspose have no double CPU kernel")
    if t != FLOAT and t not in CAST_TYPES:
        lw.fail("T must be float16, bfloat16 or float32")
    for i in indices[1:]:
        if lw.dtype(i) != t:
            lw.fail("filter and data must have the same type")
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


def _sizes(lw: Lowering, index: int, label: str):
    value = lw.constant_value(index)
    if value is None:
        lw.fail(f"{label} must be a constant for the standard lowering")
    if value.ndim != 1:
        lw.fail(f"{label} input must be 1-dim, not {value.ndim}")
    if value.shape[0] != 4:
        lw.fail(f"{label} must have 4 entries, got {value.shape[0]}")
    if any(v < 0 for v in value):
        lw.fail(f"{label} entries must be >= 0")
    message = output_size_message(value, label)  # the library's size cap, as in the kernels
    if message:
        lw.fail(message)
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
    return [max(shape[0], 0)] + [int(v) for v in shape[1:]]


def lower_forward(ctx, node):
    lw = Lowering(ctx, node)
    t = _element_type(lw, [0, 1])
    geo = _Geometry(lw)
    kh, kw, c, m = _filter_dims(lw, lw.shape(1))
    in_shape = lw.shape(0)
    if in_shape is not None:
        if len(in_shape) != 4:
            lw.fail(f"input must be 4-dimensional{in_shape}")
        in_c = in_shape[3] if geo.nhwc else in_shape[1]
        if in_c >= 0 and in_c != c:
            lw.fail(f"input and filter must have the same depth: {in_c} vs {c}")
    h, w = geo.spatial(in_shape)
    conv_attrs = dict(group=c, strides=[geo.stride, geo.stride], dilations=list(geo.dilations), kernel_shape=[kh, kw])
    if geo.padding == "SAME" and (h < 0 or w < 0):
        conv_attrs["auto_pad"] = "SAME_UPPER"  # the extra pad goes after, as TF's pad_before = total // 2
    else:
        (_, pt, pb), (_, pl, pr) = (geo.dim(h, kh, 0), geo.dim(w, kw, 1)) if h >= 0 and w >= 0 else ((0, 0, 0), (0, 0, 0))
        if geo.padding == "EXPLICIT":
            (pt, pb), (pl, pr) = geo.explicit
        conv_attrs["pads"] = [pt, pl, pb, pr]
    lw.take_over()
    x = geo.to_nchw(lw, _f32(lw, lw.inputs[0], t))
    weights = _grouped_weights(lw, _f32(lw, lw.inputs[1], t), c, m, kh, kw)
    y = lw.op("Conv", x, weights, **conv_attrs)
    lw.emit(0, _back(lw, geo.from_nchw(lw, y), t))


def lower_backprop_input(ctx, node):
    lw = Lowering(ctx, node)
    t = _element_type(lw, [1, 2])
    geo = _Geometry(lw)
    sizes = _static_input_sizes(lw)
    kh, kw, c, m = _filter_dims(lw, lw.shape(1))
    n_c = sizes[3] if geo.nhwc else sizes[1]
    if n_c != c:
        lw.fail(f"input and filter must have the same in_depth")
    h, w = geo.spatial(sizes)
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
    t = _element_type(lw, [0, 2])
    geo = _Geometry(lw)
    kh, kw, c, m = _sizes(lw, 1, "filter_sizes")
    h, w = geo.spatial(lw.shape(0))
    pads = []
    for axis, (size, k) in enumerate(((h, kh), (w, kw))):
        if geo.padding == "VALID":
            pads.append((0, 0))
        elif geo.padding == "EXPLICIT":
            pads.append(geo.explicit[axis])  # padding after may exceed what the windows reach; sliced below
        else:
            if size < 0:
                lw.fail("SAME padding needs the input's spatial size at conversion time")
            _, before, after = geo.dim(size, k, axis)
            pads.append((before, after))
    lw.take_over()
    x, dy = _f32(lw, lw.inputs[0], t), _f32(lw, lw.inputs[2], t)
    to_cn = [3, 0, 1, 2] if geo.nhwc else [1, 0, 2, 3]  # channels first, then batch
    x_groups = lw.op("Reshape", lw.op("Transpose", x, perm=to_cn), lw.const([1, -1, 0, 0], np.int64))
    dy_weights = lw.op("Transpose", dy, perm=to_cn)  # [C*M, N, oh, ow]; group c has N input channels
    dw = lw.op(
        "Conv",
        x_groups,
        dy_weights,
        group=c,
        strides=list(geo.dilations),
        dilations=[geo.stride, geo.stride],
        pads=[pads[0][0], pads[1][0], pads[0][1], pads[1][1]],
    )
    # Padding may let the correlation run past the last tap: keep the first kh x kw positions.
    dw = lw.op("Slice", dw, lw.const([0, 0], np.int64), lw.const([kh, kw], np.int64), lw.const([2, 3], np.int64))
    dw = lw.op("Reshape", dw, lw.const([c, m, kh, kw], np.int64))
    lw.emit(0, _back(lw, lw.op("Transpose", dw, perm=[2, 3, 0, 1]), t))


LOWERINGS = {
    "DepthwiseConv2dNative": lower_forward,
    "DepthwiseConv2dNativeBackpropInput": lower_backprop_input,
    "DepthwiseConv2dNativeBackpropFilter": lower_backprop_filter,
}
