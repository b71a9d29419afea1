"""FakeQuantWithMinMaxVarsPerChannel: each channel (last dim) on the nudged grid of its own [min[i], max[i]]."""
import numpy as np

from ort_ops.reference import _fake_quant as fq


def run(inputs, min, max, *, num_bits, narrow_range):  # noqa: A002 -- TF's input names
    nudged_min, nudged_max, scale, inv_scale, zero_range = fq.vars_params(min, max, num_bits, narrow_range)
    # The per-channel parameters broadcast over the last dim; channels with min == max == 0 give zeros.
    out = fq.fake_quant(inputs, nudged_min, nudged_max, scale, inv_scale, divide=False)
    return (np.where(zero_range, np.float32(0), out).astype(np.float32),)
