"""FusedBatchNormGradV3: as GradV2, plus NDHWC/NCDHW; reserve_space_3 is ignored (any shape, as on TF's CPU).

The math is shared with the rest of the family in ``_batch_norm``.
"""
from ort_ops.reference import _batch_norm as _bn

OP = "FusedBatchNormGradV3"


def run(y_backprop, x, scale, reserve_space_1, reserve_space_2, reserve_space_3, *, epsilon, data_format, is_training):
    del reserve_space_3  # TF's CPU kernel ignores it (it carries cuDNN state on GPU)
    _bn.check_x_dtype(OP, x, _bn.MIXED)
    return _bn.backward(
        OP, _bn.FORMATS_5D, y_backprop, x, scale, reserve_space_1, reserve_space_2, epsilon, data_format, is_training
    )
