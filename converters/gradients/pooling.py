"""Gradients of MaxPool and AvgPool in standard ONNX, both lowerings.

MaxPoolGrad / MaxPoolGradV2 are bit-exact. TF's CPU kernel recomputes each window's argmax (it
ignores orig_output): the window's first valid element in row-major order, replaced by each later
element that is strictly greater, so a NaN first element wins its window and later NaNs never do;
then it adds each output gradient at its argmax, outputs in row-major order, onto zeros. Here ONNX
MaxPool's Indices give the argmax (first strict maximum, on a float64 key where -inf stays
selectable and NaN ranks lowest), windows whose first element is NaN are pointed at it, and
ScatterElements with reduction "add" accumulates in the same order.

AvgPoolGrad spreads each output gradient divided by its window's count of valid (unpadded)
positions with a depthwise ConvTranspose of ones; it agrees with TF within a float tolerance.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from converters.gradients._common import daz, float_type
from converters.gradients._conv import LAYOUTS, crop_full_to_input, layout, output_size, pads, spatial
from converters.gradients.registry import gradient_op
from converters.standard._builder import Lowering


def _window_params(b: Lowering, data_format: str, ksize, strides):
    return spatial(b, ksize, data_format, "ksize"), spatial(b, strides, data_format, "strides")


def _static_input(b: Lowering, index: int, data_format: str, what: str):
    shape = b.shape(index)
    if shape is None or len(shape) != 4:
        b.fail(f"input {what} ({b.inputs[index]!r}) must be 4-D, got shape {shape}")
    h, w = (shape[a] for a in LAYOUTS[data_format][2])
    channels = shape[3] if data_format == "NHWC" else shape[1]
    if h < 0 or w < 0:
        b.fail(f"input {what} ({b.inputs[index]!r}) has unknown spatial dims {shape}")
    return (h, w), channels


def _window_starts(size: int, window: int, stride: int, before: int, after: int) -> np.ndarray:
    n_out = output_size(size, window, stride, 1, before, after)
    return np.maximum(np.arange(n_out) * stride - before, 0)


def _max_pool_grad(ctx, node, ksize, strides):
    b = Lowering(ctx, node)
    t = float_type(b, 0)
    if t != np.float32:
        b.fail("only float32 is converted (the exact argmax needs a wider key type)")
    data_format = layout(b)
    (kh, kw), (sh, sw) = _window_params(b, data_format, ksize, strides)
    (height, width), channels = _static_input(b, 0, data_format, "orig_input")
    padded = pads(b, b.attr("padding"), (height, width), (kh, kw), (sh, sw), (1, 1), data_format,
                  b.attr("explicit_paddings", []) or [])
    for (before, after), k, side in zip(padded, (kh, kw), (("Top", "Bottom"), ("Left", "Right"))):
        for p, name in zip((before, after), side):
            if p >= k:  # TF's own check: a window wholly in the padding has no element to pick
                b.fail(f"{name} padding {p} needs to be smaller than the window size {k}")
    n_out = [output_size(n, k, st, 1, *p) for n, k, st, p in zip((height, width), (kh, kw), (sh, sw), padded)]
    if min(n_out) < 0:
        b.fail(f"the window ({kh}x{kw}) does not fit the input's spatial size {height}x{width}")
    if ctx.opset < 16:
        b.fail(f"needs opset 16 or later (ScatterElements with reduction), got {ctx.opset}")
    b.take_over()
    if min(n_out) == 0 or height * width == 0:
        # TF's empty output (a window that overhangs by less than a stride) or an empty input: no
        # gradient reaches the input, and no MaxPool over an empty or too small input is written.
        b.emit(0, b.zeros_like(b.inputs[0], t))
        return
    to_nchw, from_nchw, _ = LAYOUTS[data_format]
    x = b.op("Transpose", b.inputs[0], perm=to_nchw)
    grad = daz(b, b.op("Transpose", b.inputs[2], perm=to_nchw), t)
    # Key: float64 copy of x in which -inf is above ONNX MaxPool's starting value and NaN below all.
    # TF compares under DAZ: a subnormal ties with zero.
    key = b.cast(daz(b, x, t), TensorProto.DOUBLE)
    key = b.op("Where", b.op("IsInf", key, detect_positive=0), b.const(-1e300, np.float64), key)
    key = b.op("Where", b.op("IsNaN", key), b.const(-1e301, np.float64), key)
    pool_pads = [padded[0][0], padded[1][0], padded[0][1], padded[1][1]]
    _, argmax = b.op("MaxPool", key, outputs=2, kernel_shape=[kh, kw], strides=[sh, sw], pads=pool_pads)
    # Windows whose first valid element is NaN: TF keeps that element.
    rows = _window_starts(height, kh, sh, *padded[0])
    cols = _window_starts(width, kw, sw, *padded[1])
    first = (rows[:, None] * width + cols[None, :]).reshape(-1)
    flat_x = b.reshape(x, [None, channels if channels >= 0 else None, height * width])
    first_x = b.op("Gather", flat_x, b.const(first, np.int64), axis=2)
    first_x = b.reshape_to(first_x, b.op("Shape", argmax))
    plane = b.const(height * width, np.int64)
    plane_start = b.op("Sub", argmax, b.op("Mod", argmax, plane))
    first_index = b.op("Add", plane_start, b.const(first.reshape(len(rows), len(cols)), np.int64))
    argmax = b.op("Where", b.op("IsNaN", first_x), first_index, argmax)
    flat = b.const([-1], np.int64)
    zeros = b.zeros_like(b.op("Reshape", x, flat), t)
    summed = b.op("ScatterElements", zeros, b.op("Reshape", argmax, flat), b.op("Reshape", grad, flat),
                  axis=0, reduction="add")
    summed = daz(b, b.reshape_to(summed, b.op("Shape", x)), t)
    b.emit(0, b.op("Transpose", summed, perm=from_nchw) if data_format == "NHWC" else summed)


@gradient_op("MaxPoolGrad")
def max_pool_grad(ctx, node, lowering):
    _max_pool_grad(ctx, node, node.get_attr_value("ksize"), node.get_attr_value("strides"))


@gradient_op("MaxPoolGradV2")
def max_pool_grad_v2(ctx, node, lowering):
    b = Lowering(ctx, node)
    values = [b.constant_value(i) for i in (3, 4)]
    for value, what, i in zip(values, ("ksize", "strides"), (3, 4)):
        if value is None:
            b.fail(f"input {what} ({b.inputs[i]!r}) must be a constant")
    _max_pool_grad(ctx, node, [int(v) for v in values[0]], [int(v) for v in values[1]])


@gradient_op("AvgPoolGrad")
def avg_pool_grad(ctx, node, lowering):
    b = Lowering(ctx, node)
    t = float_type(b, 1)
    data_format = layout(b)
    (kh, kw), (sh, sw) = _window_params(b, data_format, b.attr("ksize"), b.attr("strides"))
    out_shape = ctx.get_shape(node.output[0])
    sizes = b.constant_value(0)
    h_axis, w_axis = LAYOUTS[data_format][2]
    c_axis = 3 if data_format == "NHWC" else 1
    if sizes is not None and sizes.size == 4:
        height, width, channels = int(sizes[h_axis]), int(sizes[w_axis]), int(sizes[c_axis])
    elif out_shape is not None and len(out_shape) == 4 and min(out_shape[1:]) >= 0:
        height, width, channels = out_shape[h_axis], out_shape[w_axis], out_shape[c_axis]
    else:
        b.fail(f"input orig_input_shape ({b.inputs[0]!r}) must be constant or the output's H, W, C known")
    padded = pads(b, b.attr("padding"), (height, width), (kh, kw), (sh, sw), (1, 1), data_format)
    n_out = [output_size(n, k, st, 1, *p) for n, k, st, p in zip((height, width), (kh, kw), (sh, sw), padded)]
    if min(n_out) < 0:
        b.fail(f"the window ({kh}x{kw}) does not fit the input's spatial size {height}x{width}")
    b.take_over()
    if min(n_out) == 0 or height * width * channels == 0:
        # TF's empty output or an empty input: zeros of the input's shape, without a ConvTranspose.
        batch = int(sizes[0]) if sizes is not None and sizes.size == 4 else None
        dims = [batch, height, width, channels] if data_format == "NHWC" else [batch, channels, height, width]
        b.emit(0, b.zeros(dims, t, like=b.inputs[1]))
        return
    counts = []
    for size, k, s, (before, after) in zip((height, width), (kh, kw), (sh, sw), padded):
        starts = np.arange(output_size(size, k, s, 1, before, after)) * s - before
        counts.append(np.minimum(starts + k, size) - np.maximum(starts, 0))
    window_sizes = (counts[0][:, None] * counts[1][None, :]).astype(t)
    to_nchw, from_nchw, _ = LAYOUTS[data_format]
    grad = b.op("Transpose", b.inputs[1], perm=to_nchw)
    grad = b.op("Div", grad, b.const(window_sizes, t))
    ones = b.const(np.ones((channels, 1, kh, kw), t), t)
    full = b.op("ConvTranspose", grad, ones, strides=[sh, sw], group=channels)
    tail = [max(before + size - ((len(c) - 1) * s + k), 0)
            for size, k, s, (before, _), c in zip((height, width), (kh, kw), (sh, sw), padded, counts)]
    crop_full_to_input(b, full, padded, height, width, tail, data_format, from_nchw)
