"""FusedBatchNormGradV3: as GradV2, plus NDHWC/NCDHW; reserve_space_3 is ignored (any shape, as on TF's CPU).

The math is shared with the rest of the family in ``_batch_norm``.
"""
from ort_ops.reference import _batch_norm as _bn


def run(y_backprop, x, scale, reserve_space_1, reserve_space_2, reserve_space_3, *, epsilon, data_format, is_training):
    del reserve_space_3  # TF's CPU kernel ignores it (it carries cuDNN state on GPU)
    return _bn.backward(y_backprop, x, scale, reserve_space_1, reserve_space_2, epsilon, data_format, is_training)
