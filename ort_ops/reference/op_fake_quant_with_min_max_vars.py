"""FakeQuantWithMinMaxVars: fake-quantize to the nudged grid of the scalar tensors [min, max]."""
import numpy as np

from ort_ops.reference import _fake_quant as fq


def run(inputs, min, max, *, num_bits, narrow_range):  # noqa: A002 -- TF's input names
    nudged_min, nudged_max, scale, inv_scale, zero_range = fq.vars_params(min, max, num_bits, narrow_range)
    if zero_range:  # TF skips the nudge entirely for min == max == 0
        return (np.zeros_like(inputs),)
    # Vars divides by the scale where Args and PerChannel multiply by the inverse scale.
    return (fq.fake_quant(inputs, nudged_min, nudged_max, scale, inv_scale, divide=True),)
