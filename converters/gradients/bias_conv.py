"""Gradients of BiasAdd and Conv2D: one standard-ONNX handler per op, used by both lowerings.

Both are sums, so they agree with TF within a float tolerance (tests/test_gradient_ops.py), not bit
for bit: ONNX Runtime's Conv and ReduceSum add in another order than TF's Eigen kernels.

Conv2DBackpropFilter is a convolution of the input with the output gradient (batch as the channel
axis, the forward stride as the dilation and the forward dilation as the stride). Conv2DBackpropInput
is a full ConvTranspose cropped by the forward padding; being registered here, it always replaces
tf2onnx's handler (and tf2onnx's Conv2D+Add rewriter), so one code path covers SAME/VALID/EXPLICIT,
strides and dilations (tests/test_gradient_ops.py checks them against TF or, where TF's CPU kernel
has no dilation/NCHW support, against NumPy).
"""
from __future__ import annotations

import numpy as np

from converters.gradients._common import float_type
from converters.gradients._conv import LAYOUTS, check_out_backprop, forward_geometry, layout, spatial
from converters.gradients.registry import gradient_op
from converters.standard._builder import Lowering


@gradient_op("BiasAddGrad")
def bias_add_grad(ctx, node, lowering):
    b = Lowering(ctx, node)
    float_type(b, 0)
    data_format = layout(b)
    rank = b.rank(0)
    if rank is None or rank < 2:
        b.fail(f"input out_backprop ({b.inputs[0]!r}) needs a known rank of at least 2, got {rank}")
    channel = 1 if data_format == "NCHW" and rank >= 3 else rank - 1
    axes = [a for a in range(rank) if a != channel]
    b.take_over()
    b.emit(0, b.reduce("ReduceSum", b.inputs[0], axes, keepdims=False))


def _static_spatial(b: Lowering, index: int, data_format: str, what: str):
    shape = b.shape(index)
    if shape is None or len(shape) != 4:
        b.fail(f"input {what} ({b.inputs[index]!r}) must be 4-D with a known shape, got {shape}")
    h, w = (shape[a] for a in LAYOUTS[data_format][2])
    if h < 0 or w < 0:
        b.fail(f"input {what} ({b.inputs[index]!r}) has unknown spatial dims {shape}")
    channel = shape[3] if data_format == "NHWC" else shape[1]
    return (h, w), channel


def _constant_ints(b: Lowering, index: int, what: str, count: int):
    value = b.constant_value(index)
    if value is None or value.size != count:
        b.fail(f"input {what} ({b.inputs[index]!r}) must be a constant of {count} ints")
    return [int(v) for v in value.reshape(-1)]


def _geometry(b: Lowering, data_format: str):
    strides = spatial(b, b.attr("strides"), data_format, "strides")
    dilations = spatial(b, b.attr("dilations", [1, 1, 1, 1]), data_format, "dilations")
    return strides, dilations, b.attr("padding"), list(b.attr("explicit_paddings", []) or [])


@gradient_op("Conv2DBackpropFilter")
def conv2d_backprop_filter(ctx, node, lowering):
    b = Lowering(ctx, node)
    t = float_type(b, 0)
    data_format = layout(b)
    strides, dilations, padding, explicit = _geometry(b, data_format)
    (height, width), in_channels = _static_spatial(b, 0, data_format, "input")
    kh, kw, filter_in, _ = _constant_ints(b, 1, "filter_sizes", 4)
    if in_channels >= 0 and filter_in != in_channels:
        b.fail(f"grouped convolution (input has {in_channels} channels, filter_sizes {filter_in}) is not supported")
    padded, (out_h, out_w) = forward_geometry(b, padding, (height, width), (kh, kw), strides, dilations,
                                              data_format, explicit)
    check_out_backprop(b, 2, data_format, (out_h, out_w))
    b.take_over()
    x, dy = b.inputs[0], b.inputs[2]
    to_cnhw = [3, 0, 1, 2] if data_format == "NHWC" else [1, 0, 2, 3]
    x = b.op("Transpose", x, perm=to_cnhw)
    dy = b.op("Transpose", dy, perm=to_cnhw)
    # The padded input the forward conv read: exactly (k-1)*d + (out-1)*s + 1 rows and columns.
    conv_pads_begin, conv_pads_end, crop_end = [], [], []
    for size, k, s, d, (before, after), n_out in zip((height, width), (kh, kw), strides, dilations, padded, (out_h, out_w)):
        needed = (k - 1) * d + (n_out - 1) * s + 1
        extra = needed - size - before
        conv_pads_begin.append(before)
        conv_pads_end.append(max(extra, 0))
        crop_end.append(size + min(extra, 0))
    if crop_end != [height, width]:
        x = b.op("Slice", x, b.const([0, 0], np.int64), b.const(crop_end, np.int64), b.const([2, 3], np.int64))
    grad = b.op("Conv", x, dy, strides=list(dilations), dilations=list(strides),
                pads=conv_pads_begin + conv_pads_end)
    b.emit(0, b.op("Transpose", grad, perm=[2, 3, 0, 1]))


@gradient_op("Conv2DBackpropInput")
def conv2d_backprop_input(ctx, node, lowering):
    b = Lowering(ctx, node)
    t = float_type(b, 1)
    data_format = layout(b)
    strides, dilations, padding, explicit = _geometry(b, data_format)
    out_shape = ctx.get_shape(node.output[0])
    sizes = b.constant_value(0)
    h_axis, w_axis = LAYOUTS[data_format][2]
    if sizes is not None and sizes.size == 4:
        height, width = int(sizes[h_axis]), int(sizes[w_axis])
    elif out_shape is not None and len(out_shape) == 4 and out_shape[h_axis] >= 0 and out_shape[w_axis] >= 0:
        height, width = out_shape[h_axis], out_shape[w_axis]
    else:
        b.fail(f"input input_sizes ({b.inputs[0]!r}) must be constant or the output's spatial size known")
    filter_shape = b.shape(1)
    if filter_shape is None or len(filter_shape) != 4 or min(filter_shape) < 0:
        b.fail(f"input filter ({b.inputs[1]!r}) must have a known 4-D shape, got {filter_shape}")
    kh, kw, filter_in, _ = filter_shape
    if out_shape is not None and len(out_shape) == 4:
        channels = out_shape[3] if data_format == "NHWC" else out_shape[1]
        if channels >= 0 and channels != filter_in:
            b.fail(f"grouped convolution (input has {channels} channels, filter {filter_in}) is not supported")
    padded, (out_h, out_w) = forward_geometry(b, padding, (height, width), (kh, kw), strides, dilations,
                                              data_format, explicit)
    check_out_backprop(b, 2, data_format, (out_h, out_w))
    b.take_over()
    to_nchw, from_nchw, _ = LAYOUTS[data_format]
    dy = b.op("Transpose", b.inputs[2], perm=to_nchw)
    weights = b.op("Transpose", b.inputs[1], perm=[3, 2, 0, 1])
    full = b.op("ConvTranspose", dy, weights, strides=list(strides), dilations=list(dilations))
    # full covers padded rows 0 .. (out-1)*s + (k-1)*d; the input's rows are before .. before+size-1.
    tail = []
    for size, k, s, d, (before, _), n_out in zip((height, width), (kh, kw), strides, dilations, padded, (out_h, out_w)):
        tail.append(max(before + size - ((n_out - 1) * s + (k - 1) * d + 1), 0))
    if any(tail):
        full = b.op("Pad", full, b.const([0, 0, 0, 0, 0, 0, tail[0], tail[1]], np.int64))
    starts = [padded[0][0], padded[1][0]]
    cropped = b.op("Slice", full, b.const(starts, np.int64),
                   b.const([starts[0] + height, starts[1] + width], np.int64), b.const([2, 3], np.int64))
    b.emit(0, b.op("Transpose", cropped, perm=from_nchw) if data_format == "NHWC" else cropped)
