"""QuantizeAndDequantizeV4Grad: the gradient where input_min <= input <= input_max (the given range), else 0."""
import numpy as np

from ort_ops.reference import _quantize_dequantize as qdq


def run(gradients, input, input_min, input_max, *, axis):  # noqa: A002 -- TF's input names
    g, x, mn, mx = gradients, input, input_min, input_max
    t = x.dtype.type
    # TF computes with denormals-are-zero / flush-to-zero on.
    x3 = qdq.flush(qdq.channel_view(x, axis))
    lo = qdq.flush(mn.reshape(1, -1, 1))
    hi = qdq.flush(mx.reshape(1, -1, 1))
    # TF multiplies by a 0/1 mask, so outside the range the result is g*0: -0 for negative g, NaN for inf/NaN g.
    inside = ((x3 >= lo) & (x3 <= hi)).astype(t)
    with np.errstate(all="ignore"):
        dx = qdq.flush((qdq.flush(g.reshape(x3.shape)) * inside).astype(t)).reshape(x.shape)
    return dx, np.zeros(mn.shape, dtype=t), np.zeros(mx.shape, dtype=t)
