"""FakeQuantWithMinMaxArgsGradient: the incoming gradient where the input lies in the nudged range."""
from ort_ops.reference import _fake_quant as fq


def run(gradients, inputs, *, min, max, num_bits, narrow_range):  # noqa: A002 -- TF's attribute names
    quant_min, quant_max = fq.quant_bounds(num_bits, narrow_range)
    nudged_min, nudged_max, _, _ = fq.nudge(min, max, quant_min, quant_max)
    return (fq.masked(gradients, fq.inside_mask(inputs, nudged_min, nudged_max)),)
