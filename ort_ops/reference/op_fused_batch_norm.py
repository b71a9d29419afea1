"""FusedBatchNorm: float32 x and statistics; NHWC or NCHW (a 5-D x is accepted as TF's kernel does).

The math is shared with the rest of the family in ``_batch_norm``.
"""
from ort_ops.reference import _batch_norm as _bn

OP = "FusedBatchNorm"


def run(x, scale, offset, mean, variance, *, epsilon, exponential_avg_factor, data_format, is_training):
    _bn.check_x_dtype(OP, x, _bn.FLOAT32_ONLY)
    outputs = _bn.forward(
        OP, _bn.FORMATS_4D, x, scale, offset, mean, variance, epsilon, exponential_avg_factor, data_format, is_training
    )
    return outputs
