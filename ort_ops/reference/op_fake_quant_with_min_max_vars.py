"""FakeQuantWithMinMaxVars: fake-quantize to the nudged grid of the scalar tensors [min, max]."""
import numpy as np

from ort_ops.reference import _fake_quant as fq

OP = "FakeQuantWithMinMaxVars"


def run(inputs, min, max, *, num_bits, narrow_range):  # noqa: A002 -- TF's input names
    fq.check_num_bits(OP, num_bits)
    x = fq.as_float32(OP, "inputs", inputs)
    mn = fq.as_float32(OP, "min", min)
    mx = fq.as_float32(OP, "max", max)
    fq.check_scalar_range(OP, mn, mx)
    nudged_min, nudged_max, scale, inv_scale, zero_range = fq.vars_params(mn, mx, num_bits, narrow_range)
    if zero_range:  # TF skips the nudge entirely for min == max == 0
        return (np.zeros_like(x),)
    # Vars divides by the scale where Args and PerChannel multiply by the inverse scale.
    return (fq.fake_quant(x, nudged_min, nudged_max, scale, inv_scale, divide=True),)
