"""FusedBatchNormGrad: float32 everywhere; NHWC or NCHW.

The math is shared with the rest of the family in ``_batch_norm``.
"""
from ort_ops.reference import _batch_norm as _bn

OP = "FusedBatchNormGrad"


def run(y_backprop, x, scale, reserve_space_1, reserve_space_2, *, epsilon, data_format, is_training):
    _bn.check_x_dtype(OP, x, _bn.FLOAT32_ONLY)
    return _bn.backward(
        OP, _bn.FORMATS_4D, y_backprop, x, scale, reserve_space_1, reserve_space_2, epsilon, data_format, is_training
    )
