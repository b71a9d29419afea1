"""DepthwiseConv2dNativeBackpropFilter: the gradient of DepthwiseConv2dNative with respect to its filter.

dW[r, s, c, m] = sum over b, i, j of dY[b, i, j, c*M + m] * input[b, i*S + r*dh - pt, j*S + s*dw - pl, c]
(positions on padding contribute nothing). An empty out_backprop gives zeros (TF returns uninitialized memory).
"""
import numpy as np

from ort_ops.checks.depthwise import shape_to_nhwc
from ort_ops.reference import _depthwise as dw


def run(input, filter_sizes, out_backprop, *, strides, padding, explicit_paddings, data_format, dilations):  # noqa: A002
    attrs = dict(strides=strides, padding=padding, explicit_paddings=explicit_paddings, data_format=data_format, dilations=dilations)
    input, out_backprop = np.asarray(input), np.asarray(out_backprop)  # noqa: A001
    g = dw.geometry(attrs, shape_to_nhwc(input.shape, data_format), [int(v) for v in filter_sizes])
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf and overflow follow IEEE, as in TF
        dwt = dw.backprop_filter(dw.to_nhwc(input, data_format), dw.to_nhwc(out_backprop, data_format), g)
    return (dwt,)
