"""QuantizeAndDequantizeV2: quantize to a num_bits grid and back, per tensor or per axis."""
from ort_ops.reference import _quantize_dequantize as qdq


def run(input, input_min, input_max, *, signed_input, num_bits, range_given, round_mode, narrow_range, axis):  # noqa: A002
    return (qdq.forward(input, input_min, input_max, signed_input=signed_input, num_bits=num_bits,
                        range_given=range_given, round_mode=round_mode, narrow_range=narrow_range, axis=axis),)
