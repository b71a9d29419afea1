"""A grouped convolution with one group per input channel is a depthwise convolution: rewrite it as one.

Keras 3 writes ``DepthwiseConv2D``-like layers as ``Conv2D(groups=C)`` (ConvNeXt, keras_hub's MobileNet),
which TF runs as a ``Conv2D`` whose filter has one input channel: filter[kh, kw, 1, C*M], output channel
o = c*M + m reading input channel c. ``DepthwiseConv2dNative`` computes the same sums with
filter[kh, kw, C, M], output channel c*M + m, so filter.reshape(kh, kw, C, M) is its filter, value for
value. Rewritten (right after tf2onnx parses the TF graph, before the family is shielded), such a
convolution gets the family's lowering in both lowerings, and its two gradients too:

* ``Conv2D(x, f)``                      -> ``DepthwiseConv2dNative(x, reshape(f))``
* ``Conv2DBackpropInput(s, f, dy)``     -> ``DepthwiseConv2dNativeBackpropInput(s, reshape(f), dy)``
* ``Conv2DBackpropFilter(x, s, dy)``    -> ``reshape(DepthwiseConv2dNativeBackpropFilter(x, s', dy))``,
  s' = [kh, kw, C, M], reshaped back to TF's [kh, kw, 1, C*M]

The sums are the same taps of the same products; only their order may differ, as between any two of TF's
own kernels (the ops are judged within a float tolerance, not bit for bit). Every other group count stays a
``Conv2D`` (tf2onnx writes ONNX ``Conv`` with ``group``; the gradients are converters.gradients.bias_conv).
The rewritten node keeps the TF node's name and output names, so verification finds TF's tensors; the new nodes
are TF ops still (``skip_conversion=False``), converted by the handlers like the parsed ones.
"""
from __future__ import annotations

import numpy as np

from converters.fusions import constant_value

DEPTHWISE = {
    "Conv2D": "DepthwiseConv2dNative",
    "Conv2DBackpropInput": "DepthwiseConv2dNativeBackpropInput",
    "Conv2DBackpropFilter": "DepthwiseConv2dNativeBackpropFilter",
}
# The attributes Conv2D and DepthwiseConv2dNative share (Conv2D's use_cudnn_on_gpu has no counterpart).
_SHARED_ATTRS = ("T", "strides", "padding", "explicit_paddings", "data_format", "dilations")


def _channel_axis(node) -> int:
    data_format = node.get_attr_value("data_format", b"NHWC")
    data_format = data_format.decode() if isinstance(data_format, bytes) else data_format
    return 1 if data_format == "NCHW" else 3


def _known_4d(shape):
    return shape is not None and len(shape) == 4 and min(shape) >= 0


def _input_channels(g, node):
    """The forward convolution's input channels, where known at conversion time (else None)."""
    axis = _channel_axis(node)
    if node.type == "Conv2DBackpropInput":
        sizes = constant_value(node.inputs[0])
        if sizes is not None and sizes.size == 4:
            return int(sizes.reshape(-1)[axis])
        shape = g.get_shape(node.output[0])
    else:
        shape = g.get_shape(node.input[0])
    if shape is None or len(shape) != 4 or shape[axis] < 0:
        return None
    return shape[axis]


def _filter_shape(g, node):
    if node.type == "Conv2DBackpropFilter":
        sizes = constant_value(node.inputs[1])
        return None if sizes is None or sizes.size != 4 else [int(v) for v in sizes.reshape(-1)]
    shape = g.get_shape(node.input[1])
    return list(shape) if _known_4d(shape) else None


def is_depthwise(g, node) -> bool:
    """Whether a Conv2D (or one of its gradients) of tf2onnx graph ``g`` has one group per input channel."""
    if node.type not in DEPTHWISE:
        return False
    channels, filter_shape = _input_channels(g, node), _filter_shape(g, node)
    if channels is None or filter_shape is None or channels < 2:
        return False
    _, _, filter_in, filter_out = filter_shape
    return filter_in == 1 and filter_out % channels == 0


def _reshaped(g, name: str, tensor: str, dims) -> str:
    """``tensor`` reshaped to ``dims``: a new constant where it is one, else a TF Reshape node."""
    from tf2onnx import utils

    value = constant_value(g.get_node_by_output(tensor))
    if value is not None:
        return g.make_const(utils.make_name(name), value.reshape(dims)).output[0]
    shape = g.make_const(utils.make_name(name + "/shape"), np.array(dims, np.int32)).output[0]
    return g.make_node("Reshape", [tensor, shape], name=utils.make_name(name), shapes=[list(dims)],
                       dtypes=[g.get_dtype(tensor)], skip_conversion=False).output[0]


def rewrite_grouped_depthwise(g) -> int:
    """Rewrite every Conv2D / Conv2DBackpropInput / Conv2DBackpropFilter of tf2onnx graph ``g`` (TF op
    types, before shielding) that has one group per input channel as its depthwise op; returns how many."""
    count = 0
    for node in list(g.get_nodes()):
        if not is_depthwise(g, node):
            continue
        channels = _input_channels(g, node)
        kh, kw, _, filter_out = _filter_shape(g, node)
        dims = [kh, kw, channels, filter_out // channels]
        attrs = {a: node.get_attr_value(a) for a in _SHARED_ATTRS if node.get_attr(a) is not None}
        name, outputs = node.name, list(node.output)
        shapes, dtypes = [g.get_shape(o) for o in outputs], [g.get_dtype(o) for o in outputs]
        inputs = list(node.input)
        if node.type == "Conv2DBackpropFilter":
            inputs[1] = g.make_const(name + "/depthwise_filter_sizes", np.array(dims, np.int32)).output[0]
            g.remove_node(name)
            grad = g.make_node(DEPTHWISE[node.type], inputs, attr=attrs, name=name + "/depthwise",
                               shapes=[dims], dtypes=dtypes, skip_conversion=False)
            shape = g.make_const(name + "/filter_shape", np.array([kh, kw, 1, filter_out], np.int32)).output[0]
            g.make_node("Reshape", [grad.output[0], shape], name=name, outputs=outputs, shapes=shapes,
                        dtypes=dtypes, skip_conversion=False)
        else:
            inputs[1] = _reshaped(g, name + "/depthwise_filter", inputs[1], dims)
            g.remove_node(name)
            g.make_node(DEPTHWISE[node.type], inputs, attr=attrs, name=name, outputs=outputs, shapes=shapes,
                        dtypes=dtypes, skip_conversion=False)
        count += 1
    return count
