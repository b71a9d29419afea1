"""FusedBatchNormV2: x float32/float16/bfloat16, statistics float32; NHWC or NCHW.

The math is shared with the rest of the family in ``_batch_norm``.
"""
from ort_ops.reference import _batch_norm as _bn

OP = "FusedBatchNormV2"


def run(x, scale, offset, mean, variance, *, epsilon, exponential_avg_factor, data_format, is_training):
    _bn.check_x_dtype(OP, x, _bn.MIXED)
    outputs = _bn.forward(
        OP, _bn.FORMATS_4D, x, scale, offset, mean, variance, epsilon, exponential_avg_factor, data_format, is_training
    )
    return outputs
