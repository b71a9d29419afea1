"""FusedBatchNormGradV2: y_backprop/x float32/float16/bfloat16, the rest float32.

The math is shared with the rest of the family in ``_batch_norm``.
"""
from ort_ops.reference import _batch_norm as _bn


def run(y_backprop, x, scale, reserve_space_1, reserve_space_2, *, epsilon, data_format, is_training):
    return _bn.backward(y_backprop, x, scale, reserve_space_1, reserve_space_2, epsilon, data_format, is_training)
