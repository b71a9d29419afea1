"""Gradients of BiasAdd and Conv2D: one standard-ONNX handler per op, used by both lowerings.

Both are sums, so they agree with TF within a float tolerance (tests/test_gradient_ops.py), not bit
for bit: ONNX Runtime's Conv and ReduceSum add in another order than TF's Eigen kernels.

Conv2DBackpropFilter is a convolution of the input with the output gradient (batch as the channel
axis, the forward stride as the dilation and the forward dilation as the stride). Conv2DBackpropInput
is a full ConvTranspose cropped by the forward padding. Both take the forward convolution's padding
and output size from the padding attribute and the input and filter sizes (converters.gradients._conv.
forward_geometry), never from out_backprop's shape, which tf2onnx loses with a None batch behind the
gradient of a Pad or Concat (tests/test_gradient_ops_extra.py); a known out_backprop shape is checked.

Why Conv2DBackpropInput replaces tf2onnx's handler (registered here, it always does, together with
tf2onnx's Conv2D+BiasAdd rewriter): tf2onnx 1.17's handler (plain tf2onnx.convert.from_function,
opset 17, run in ONNX Runtime, compared with TF and NumPy) ignores the padding attribute and derives
ConvTranspose's pads from the sizes, total = stride * (out - 1) + (k - 1) * dilation + 1 - size, the
smaller half before.
* Right: SAME (that is TF's SAME split) with any strides and dilations and odd or even sizes (9x7,
  stride 2), NHWC with constant input_sizes or input_sizes = tf.shape(x), NCHW with constant
  input_sizes; VALID with stride 1 (dilations too); VALID with stride 2 when input_sizes is
  tf.shape(x) in NHWC (its run-time crop); EXPLICIT only where the padding equals that split.
* Wrong (each a case of tests/test_gradient_ops.py::test_conv2d_backprop_input_against_tf2onnx, where
  ours matches TF):
  1. EXPLICIT padding other than that split, e.g. rows (2, 0) and columns (0, 1), stride 1 or 2, with
     or without dilations, constant or run-time input_sizes: wrong values (relative error ~1).
  2. EXPLICIT padding beyond the filter's reach, so out_backprop is larger than the input (rows (1, 1),
     columns (2, 2) with a 3x2 filter): the conversion fails ("output dims cannot be smaller than input
     dims") and leaves a model ONNX Runtime rejects.
  3. VALID with stride > 1 where the window does not end on the last row or column (a 9x7 input, 3x2
     filter, stride 2: Keras' Conv2D(strides=2, padding="valid") on an odd size) and constant
     input_sizes: negative ConvTranspose pads, which ONNX Runtime rejects.
  4. NCHW with input_sizes = tf.shape(x) (a tape gradient with a None batch): its crop slices axes 1
     and 2 as if NHWC, channels and rows, so the output has the wrong shape (SAME 9x7, stride 1 or
     stride 2 with dilation 2).
Dilations as such are right in tf2onnx (cases 1 and 4 fail with and without them).
"""
from __future__ import annotations

import numpy as np

from converters.gradients._common import float_type
from converters.gradients._conv import LAYOUTS, check_out_backprop, crop_full_to_input, forward_geometry, layout, spatial
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


def _groups(b: Lowering, channels: int, filter_in: int, filter_out: int, what: str) -> int:
    """The group count of a convolution whose input has ``channels`` channels and whose filter has
    ``filter_in`` input channels (1 when ``channels`` is unknown); TF's own rules for it."""
    if channels < 0 or channels == filter_in:
        return 1
    if filter_in <= 0 or channels % filter_in or filter_out % (channels // filter_in):
        b.fail(f"the input's {channels} channels are not a grouped convolution of {what} "
               f"({filter_in} input and {filter_out} output channels per filter): TF rejects it too")
    return channels // filter_in


def _regroup_input(b: Lowering, x: str, data_format: str, groups: int, group_channels: int, height: int,
                   width: int) -> str:
    """The forward input as the filter gradient's Conv reads it: [Cg, groups * N, H, W] (Cg =
    ``group_channels``), where channel g * N + n of batch entry c holds input channel g * Cg + c of image n,
    so that Conv group g correlates TF group g's inputs with the output gradient of its filters."""
    if groups == 1:
        return b.op("Transpose", x, perm=[3, 0, 1, 2] if data_format == "NHWC" else [1, 0, 2, 3])
    if data_format == "NHWC":
        split = b.reshape(x, [None, height, width, groups, group_channels])
        cgnhw = b.op("Transpose", split, perm=[4, 3, 0, 1, 2])
    else:
        split = b.reshape(x, [None, groups, group_channels, height, width])
        cgnhw = b.op("Transpose", split, perm=[2, 1, 0, 3, 4])
    return b.reshape(cgnhw, [group_channels, None, height, width])


@gradient_op("Conv2DBackpropFilter")
def conv2d_backprop_filter(ctx, node, lowering):
    b = Lowering(ctx, node)
    t = float_type(b, 0)
    data_format = layout(b)
    strides, dilations, padding, explicit = _geometry(b, data_format)
    (height, width), in_channels = _static_spatial(b, 0, data_format, "input")
    kh, kw, filter_in, filter_out = _constant_ints(b, 1, "filter_sizes", 4)
    groups = _groups(b, in_channels, filter_in, filter_out, "filter_sizes")
    padded, (out_h, out_w) = forward_geometry(b, padding, (height, width), (kh, kw), strides, dilations,
                                              data_format, explicit)
    check_out_backprop(b, 2, data_format, (out_h, out_w))
    x_shape = b.shape(0)
    b.take_over()
    if out_h * out_w == 0 or x_shape[0] == 0:
        # No window positions (TF's empty output) or no batch: TF sums nothing, the gradient is +0.
        b.emit(0, b.zeros([kh, kw, filter_in, filter_out], t))
        return
    x, dy = b.inputs[0], b.inputs[2]
    if x_shape[0] < 0:
        # A batch known only at run time may be 0: then one zero image each (adding 0 * 0), since the
        # batch is the Conv's channel axis here and ONNX Runtime's Conv hangs on zero channels.
        x, dy = b.nonempty(x, 0, 4), b.nonempty(dy, 0, 4)
    x = _regroup_input(b, x, data_format, groups, filter_in, height, width)
    dy = b.op("Transpose", dy, perm=[3, 0, 1, 2] if data_format == "NHWC" else [1, 0, 2, 3])
    # The padded input the forward conv read: exactly (k-1)*d + (out-1)*s + 1 rows and columns, of which the
    # first `before` are padding, then up to `size` input rows, then padding again.
    needed, used = [], []
    for size, k, s, d, (before, _), n_out in zip((height, width), (kh, kw), strides, dilations, padded, (out_h, out_w)):
        needed.append((k - 1) * d + (n_out - 1) * s + 1)
        used.append(min(size, needed[-1] - before))
    if min(used) <= 0:
        # The windows see padding only (an empty input, or leading padding beyond every window along
        # an axis): correlate zeros of the padded size (0 * out_backprop, as TF), never an empty tensor.
        x = b.zeros([None, None, needed[0], needed[1]], t, like=x)
        pads_begin, pads_end = [0, 0], [0, 0]
    else:
        if used != [height, width]:  # input rows past the last window: cropped, in range (0 < used < size)
            x = b.op("Slice", x, b.const([0, 0], np.int64), b.const(used, np.int64), b.const([2, 3], np.int64))
        pads_begin = [before for before, _ in padded]
        pads_end = [n - before - u for n, (before, _), u in zip(needed, padded, used)]
    grad = b.op("Conv", x, dy, strides=list(dilations), dilations=list(strides), pads=pads_begin + pads_end,
                group=groups)
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
    kh, kw, filter_in, filter_out = filter_shape
    channel_axis = 3 if data_format == "NHWC" else 1
    channels = -1
    if sizes is not None and sizes.size == 4:
        channels = int(sizes[channel_axis])
    elif out_shape is not None and len(out_shape) == 4:
        channels = out_shape[channel_axis]
    # The input's channels unknown (neither a constant input_sizes nor a known output shape): not grouped.
    groups = _groups(b, channels, filter_in, filter_out, "filter")
    padded, (out_h, out_w) = forward_geometry(b, padding, (height, width), (kh, kw), strides, dilations,
                                              data_format, explicit)
    check_out_backprop(b, 2, data_format, (out_h, out_w))
    batch = int(sizes[0]) if sizes is not None and sizes.size == 4 else None
    channels = filter_in * groups
    b.take_over()
    to_nchw, from_nchw, _ = LAYOUTS[data_format]
    if out_h * out_w * height * width == 0:
        # An empty input or TF's empty output: the gradient is zeros (or empty), without a ConvTranspose.
        dims = [batch, height, width, channels] if data_format == "NHWC" else [batch, channels, height, width]
        b.emit(0, b.zeros(dims, t, like=b.inputs[2]))
        return
    dy = b.op("Transpose", b.inputs[2], perm=to_nchw)
    weights = b.op("Transpose", b.inputs[1], perm=[3, 2, 0, 1])
    # [O, Cg, kh, kw]: ConvTranspose group g maps output-gradient channels g*O/G.. to input channels g*Cg..
    full = b.op("ConvTranspose", dy, weights, strides=list(strides), dilations=list(dilations), group=groups)
    # full covers padded rows 0 .. (out-1)*s + (k-1)*d; the input's rows are before .. before+size-1.
    tail = []
    for size, k, s, d, (before, _), n_out in zip((height, width), (kh, kw), strides, dilations, padded, (out_h, out_w)):
        tail.append(max(before + size - ((n_out - 1) * s + (k - 1) * d + 1), 0))
    crop_full_to_input(b, full, padded, height, width, tail, data_format, from_nchw)
