"""FakeQuantWithMinMaxVarsPerChannel: each channel (last dim) on the nudged grid of its own [min[i], max[i]]."""
import numpy as np

from ort_ops.reference import _fake_quant as fq

OP = "FakeQuantWithMinMaxVarsPerChannel"


def run(inputs, min, max, *, num_bits, narrow_range):  # noqa: A002 -- TF's input names
    fq.check_num_bits(OP, num_bits)
    x = fq.as_float32(OP, "inputs", inputs)
    mn = fq.as_float32(OP, "min", min)
    mx = fq.as_float32(OP, "max", max)
    fq.check_channel_range(OP, x, mn, mx)
    nudged_min, nudged_max, scale, inv_scale, zero_range = fq.vars_params(mn, mx, num_bits, narrow_range)
    # The per-channel parameters broadcast over the last dim; channels with min == max == 0 give zeros.
    out = fq.fake_quant(x, nudged_min, nudged_max, scale, inv_scale, divide=False)
    return (np.where(zero_range, np.float32(0), out).astype(np.float32),)
