"""Conv2DBackpropFilter/Input when tf2onnx lost the shape of ``out_backprop`` (None-batch graphs).

With a None batch, the gradient reaching a Conv2D through ZeroPadding2D or Concatenate is a Slice with
run-time begin and size, and tf2onnx's shape inference leaves it completely unknown. The handlers in
converters.gradients.bias_conv need out_backprop's spatial size, but TF fixes it: it is the forward
convolution's output size, computed from the input's spatial size, the filter and the geometry (TF's
kernels reject any other). This module wraps those two handlers: where out_backprop's spatial dims are
unknown and that size can be computed, it records the shape ``[batch, out_h, out_w, out_channels]``
(batch and channels as known, else -1) and then calls the handler, which still checks everything.
"""
from __future__ import annotations

from typing import Optional

from converters.gradients._conv import LAYOUTS, output_size, pads, spatial
from converters.gradients.registry import GRADIENT_HANDLERS
from converters.standard._builder import Lowering


def _known(dims) -> bool:
    return all(d is not None and d >= 0 for d in dims)


def _input_and_filter(b: Lowering, op_type: str):
    """((batch, height, width), (kh, kw, out_channels)) of the forward conv, or None where unknown."""
    h_axis, w_axis = LAYOUTS[b.attr("data_format", "NHWC")][2]
    if op_type == "Conv2DBackpropFilter":
        shape, sizes = b.shape(0), b.constant_value(1)
        if shape is None or len(shape) != 4 or sizes is None or sizes.size != 4:
            return None
        batch, height, width = shape[0], shape[h_axis], shape[w_axis]
        kh, kw, _, channels = (int(v) for v in sizes.reshape(-1))
    else:
        sizes, filter_shape = b.constant_value(0), b.shape(1)
        if filter_shape is None or len(filter_shape) != 4 or not _known(filter_shape[:2]):
            return None
        if sizes is not None and sizes.size == 4:
            sizes = [int(v) for v in sizes.reshape(-1)]
            batch, height, width = sizes[0], sizes[h_axis], sizes[w_axis]
        else:
            out_shape = b.ctx.get_shape(b.outputs[0])
            if out_shape is None or len(out_shape) != 4:
                return None
            batch, height, width = out_shape[0], out_shape[h_axis], out_shape[w_axis]
        kh, kw, _, channels = filter_shape
    if not _known((height, width)):
        return None
    return (batch, height, width), (kh, kw, channels)


def _out_backprop_shape(ctx, node, op_type: str) -> Optional[list]:
    b = Lowering(ctx, node)
    data_format = b.attr("data_format", "NHWC")
    if data_format not in LAYOUTS:
        return None  # the handler names the bad attribute
    geometry = _input_and_filter(b, op_type)
    if geometry is None:
        return None
    (batch, height, width), (kh, kw, channels) = geometry
    strides = spatial(b, b.attr("strides"), data_format, "strides")
    dilations = spatial(b, b.attr("dilations", [1, 1, 1, 1]), data_format, "dilations")
    padded = pads(b, b.attr("padding"), (height, width), (kh, kw), strides, dilations, data_format,
                  list(b.attr("explicit_paddings", []) or []))
    out_h, out_w = (output_size(n, k, s, d, before, after)
                    for n, k, s, d, (before, after) in zip((height, width), (kh, kw), strides, dilations, padded))
    if data_format == "NHWC":
        return [batch, out_h, out_w, channels]
    return [batch, channels, out_h, out_w]


def _with_out_backprop_shape(op_type: str, handler):
    def wrapped(ctx, node, lowering):
        out_backprop = node.input[2]
        known = ctx.get_shape(out_backprop)
        data_format = node.get_attr_value("data_format", "NHWC")
        data_format = data_format.decode() if isinstance(data_format, bytes) else data_format
        h_axis, w_axis = LAYOUTS.get(data_format, LAYOUTS["NHWC"])[2]
        if known is None or len(known) != 4 or not _known((known[h_axis], known[w_axis])):
            shape = _out_backprop_shape(ctx, node, op_type)
            if shape is not None:
                ctx.set_shape(out_backprop, shape)
        handler(ctx, node, lowering)

    wrapped.__name__ = f"{handler.__name__}_with_out_backprop_shape"
    wrapped.__module__ = __name__
    return wrapped


for _op in ("Conv2DBackpropFilter", "Conv2DBackpropInput"):
    if _op in GRADIENT_HANDLERS:
        GRADIENT_HANDLERS[_op] = _with_out_backprop_shape(_op, GRADIENT_HANDLERS[_op])
