"""QuantizeAndDequantizeV3: as V2 with num_bits given as a scalar int32 tensor and HALF_TO_EVEN rounding."""
from ort_ops.reference import _quantize_dequantize as qdq


def run(input, input_min, input_max, num_bits, *, signed_input, range_given, narrow_range, axis):  # noqa: A002
    return (qdq.forward(input, input_min, input_max, signed_input=signed_input, num_bits=int(num_bits),
                        range_given=range_given, round_mode=qdq.HALF_TO_EVEN, narrow_range=narrow_range, axis=axis),)
