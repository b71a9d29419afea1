"""FusedBatchNormV2: x float32/float16/bfloat16, statistics float32; NHWC or NCHW.

The math is shared with the rest of the family in ``_batch_norm``.
"""
from ort_ops.reference import _batch_norm as _bn


def run(x, scale, offset, mean, variance, *, epsilon, exponential_avg_factor, data_format, is_training):
    return _bn.forward(x, scale, offset, mean, variance, epsilon, exponential_avg_factor, data_format, is_training)
