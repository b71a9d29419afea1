"""FusedBatchNormGrad: float32 everywhere; NHWC or NCHW.

The math is shared with the rest of the family in ``_batch_norm``.
"""
from ort_ops.reference import _batch_norm as _bn


def run(y_backprop, x, scale, reserve_space_1, reserve_space_2, *, epsilon, data_format, is_training):
    return _bn.backward(y_backprop, x, scale, reserve_space_1, reserve_space_2, epsilon, data_format, is_training)
