"""FakeQuantWithMinMaxVarsPerChannel: each channel (dim `axis`, the last by default) on the nudged grid of its
own [min[i], max[i]]."""
import numpy as np

from ort_ops.reference import _fake_quant as fq


def run(inputs, min, max, *, num_bits, narrow_range, axis):  # noqa: A002 -- TF's input names
    params = fq.vars_params(min, max, num_bits, narrow_range)
    # Each parameter as [d, 1, ..., 1], so that it broadcasts along `axis` (a no-op for the last dim).
    nudged_min, nudged_max, scale, inv_scale, zero_range = (fq.along_axis(p, inputs.ndim, axis) for p in params)
    # Channels with min == max == 0 give zeros.
    out = fq.fake_quant(inputs, nudged_min, nudged_max, scale, inv_scale, divide=False)
    return (np.where(zero_range, np.float32(0), out).astype(np.float32),)
