"""FusedBatchNorm: float32 x and statistics; NHWC or NCHW (a 5-D x is accepted as TF's kernel does).

The math is shared with the rest of the family in ``_batch_norm``.
"""
from ort_ops.reference import _batch_norm as _bn


def run(x, scale, offset, mean, variance, *, epsilon, exponential_avg_factor, data_format, is_training):
    return _bn.forward(x, scale, offset, mean, variance, epsilon, exponential_avg_factor, data_format, is_training)
