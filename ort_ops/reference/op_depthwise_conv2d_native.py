"""DepthwiseConv2dNative: out[b, i, j, c*M + m] = sum over taps of filter[r, s, c, m] * input[b, i*S + r*dh - pt, j*S + s*dw - pl, c]."""
import numpy as np

from ort_ops.checks.depthwise import shape_to_nhwc
from ort_ops.reference import _depthwise as dw


def run(input, filter, *, strides, padding, explicit_paddings, data_format, dilations):  # noqa: A002 (TF's names)
    attrs = dict(strides=strides, padding=padding, explicit_paddings=explicit_paddings, data_format=data_format, dilations=dilations)
    input, filter = np.asarray(input), np.asarray(filter)  # noqa: A001
    g = dw.geometry(attrs, shape_to_nhwc(input.shape, data_format), filter.shape)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf and overflow follow IEEE, as in TF
        out = dw.forward(dw.to_nhwc(input, data_format), filter, g)
    return (dw.from_nhwc(out, data_format),)
