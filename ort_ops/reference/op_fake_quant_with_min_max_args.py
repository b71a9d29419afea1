"""FakeQuantWithMinMaxArgs: fake-quantize to the nudged grid of the attribute range [min, max]."""
from ort_ops.reference import _fake_quant as fq

OP = "FakeQuantWithMinMaxArgs"


def run(inputs, *, min, max, num_bits, narrow_range):  # noqa: A002 -- TF's attribute names
    fq.check_args_range(OP, min, max)
    fq.check_num_bits(OP, num_bits)
    x = fq.as_float32(OP, "inputs", inputs)
    quant_min, quant_max = fq.quant_bounds(num_bits, narrow_range)
    nudged_min, nudged_max, scale, inv_scale = fq.nudge(min, max, quant_min, quant_max)
    return (fq.fake_quant(x, nudged_min, nudged_max, scale, inv_scale, divide=False),)
