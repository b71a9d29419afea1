"""QuantizeAndDequantizeV3: as V2 with num_bits given as a scalar int32 tensor and HALF_TO_EVEN rounding."""
import numpy as np

from ort_ops.reference import _quantize_dequantize as qdq
from ort_ops.spec import OpError

OP = "QuantizeAndDequantizeV3"


def run(input, input_min, input_max, num_bits, *, signed_input, range_given, narrow_range, axis):  # noqa: A002
    x = np.asarray(input)
    mn = np.asarray(input_min)
    mx = np.asarray(input_max)
    bits = np.asarray(num_bits)
    qdq.check_dtypes(OP, (("input", x), ("input_min", mn), ("input_max", mx)))
    if not -x.ndim <= axis < x.ndim:
        raise OpError(OP, f"Axis requested is larger than input dimensions. Axis: {axis} Input Dimensions: {x.ndim}")
    if axis < -1:
        # TF 2.21 aborts the process here (CHECK failure, TF issue #94116); its shape function says this.
        raise OpError(OP, f"axis should be at least -1, got {axis}")
    if bits.ndim != 0:
        raise OpError(OP, f"Invalid shape. The `num_bits` tensor should be a scalar. Got dimensions: {bits.ndim}")
    if bits.dtype != np.int32:
        raise OpError(OP, f"num_bits must be int32, got {bits.dtype}")
    bits = int(bits)
    qdq.check_num_bits(OP, bits, signed_input, "`signed_input_`")
    if range_given:
        qdq.check_given_range(OP, x, mn, mx, axis)
    return (qdq.forward(x, mn, mx, signed_input=signed_input, num_bits=bits, range_given=range_given,
                        round_mode=qdq.HALF_TO_EVEN, narrow_range=narrow_range, axis=axis),)
