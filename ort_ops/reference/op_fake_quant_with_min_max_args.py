"""FakeQuantWithMinMaxArgs: fake-quantize to the nudged grid of the attribute range [min, max]."""
from ort_ops.reference import _fake_quant as fq


def run(inputs, *, min, max, num_bits, narrow_range):  # noqa: A002 -- TF's attribute names
    quant_min, quant_max = fq.quant_bounds(num_bits, narrow_range)
    nudged_min, nudged_max, scale, inv_scale = fq.nudge(min, max, quant_min, quant_max)
    return (fq.fake_quant(inputs, nudged_min, nudged_max, scale, inv_scale, divide=False),)
