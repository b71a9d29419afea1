"""QuantizeAndDequantizeV4Grad: the gradient where input_min <= input <= input_max (the given range), else 0."""
import numpy as np

from ort_ops.reference import _quantize_dequantize as qdq
from ort_ops.spec import OpError

OP = "QuantizeAndDequantizeV4Grad"


def run(gradients, input, input_min, input_max, *, axis):  # noqa: A002 -- TF's input names
    g = np.asarray(gradients)
    x = np.asarray(input)
    mn = np.asarray(input_min)
    mx = np.asarray(input_max)
    t = qdq.check_dtypes(OP, (("gradients", g), ("input", x), ("input_min", mn), ("input_max", mx))).type
    if axis < -1:
        raise OpError(OP, f"Axis must be at least -1. Found {axis}")
    if axis != -1 and axis >= x.ndim:
        # TF's message, missing space included.
        raise OpError(OP, f"Axis should be -1 or 0 or a positive value less than {x.ndim}but given axis value was {axis}")
    if g.shape != x.shape:
        raise OpError(OP, "gradient and input must be the same size")
    for label, tensor in (("min", mn), ("max", mx)):
        if tensor.ndim not in (0, 1):
            raise OpError(OP, f"Input {label} tensor must have dimension 0 or 1. Received {tensor.ndim}.")
    if axis != -1:
        depth = x.shape[axis]
        for label, tensor in (("min", mn), ("max", mx)):
            if tensor.ndim != 1:
                raise OpError(OP, f"Shape must be rank 1 for input_{label}_tensor when the axis is specified")
        for label, tensor in (("min", mn), ("max", mx)):
            if tensor.shape[0] != depth:
                raise OpError(OP, f"{label} has incorrect size, expected {depth} was {tensor.shape[0]}")
    else:
        for label, tensor in (("min", mn), ("max", mx)):
            if tensor.ndim != 0:
                raise OpError(OP, f"input_{label} must be a scalar if axis is unspecified")
    # TF computes with denormals-are-zero / flush-to-zero on.
    x3 = qdq.flush(qdq.channel_view(x, axis))
    lo = qdq.flush(mn.reshape(1, -1, 1))
    hi = qdq.flush(mx.reshape(1, -1, 1))
    # TF multiplies by a 0/1 mask, so outside the range the result is g*0: -0 for negative g, NaN for inf/NaN g.
    inside = ((x3 >= lo) & (x3 <= hi)).astype(t)
    with np.errstate(all="ignore"):
        dx = qdq.flush((qdq.flush(g.reshape(x3.shape)) * inside).astype(t)).reshape(x.shape)
    return dx, np.zeros(mn.shape, dtype=t), np.zeros(mx.shape, dtype=t)
