"""FusedBatchNormV3: as V2, plus NDHWC/NCDHW and a scalar-0 reserve_space_3.

The math is shared with the rest of the family in ``_batch_norm``.
"""
import numpy as np

from ort_ops.reference import _batch_norm as _bn


def run(x, scale, offset, mean, variance, *, epsilon, exponential_avg_factor, data_format, is_training):
    outputs = _bn.forward(x, scale, offset, mean, variance, epsilon, exponential_avg_factor, data_format, is_training)
    # reserve_space_3 is a scalar 0 on TF's CPU kernel (a cuDNN workspace on GPU).
    return outputs + (np.zeros((), outputs[1].dtype),)
