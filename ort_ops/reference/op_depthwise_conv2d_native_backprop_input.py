"""DepthwiseConv2dNativeBackpropInput: the gradient of DepthwiseConv2dNative with respect to its input.

dX[b, y, x, c] = sum over m and taps (r, s) of filter[r, s, c, m] * dY[b, i, j, c*M + m] where
y = i*S + r*dh - pt and x = j*S + s*dw - pl (taps that land on padding contribute nothing).
"""
import numpy as np

from ort_ops.checks.depthwise import shape_to_nhwc
from ort_ops.reference import _depthwise as dw


def run(input_sizes, filter, out_backprop, *, strides, padding, explicit_paddings, data_format, dilations):  # noqa: A002
    attrs = dict(strides=strides, padding=padding, explicit_paddings=explicit_paddings, data_format=data_format, dilations=dilations)
    filter, out_backprop = np.asarray(filter), np.asarray(out_backprop)  # noqa: A001
    g = dw.geometry(attrs, shape_to_nhwc([int(v) for v in input_sizes], data_format), filter.shape)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf and overflow follow IEEE, as in TF
        dx = dw.backprop_input(filter, dw.to_nhwc(out_backprop, data_format), g)
    return (dw.from_nhwc(dx, data_format),)
