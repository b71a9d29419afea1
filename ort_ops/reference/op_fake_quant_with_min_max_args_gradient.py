"""FakeQuantWithMinMaxArgsGradient: the incoming gradient where the input lies in the nudged range."""
from ort_ops.reference import _fake_quant as fq

OP = "FakeQuantWithMinMaxArgsGradient"


def run(gradients, inputs, *, min, max, num_bits, narrow_range):  # noqa: A002 -- TF's attribute names
    fq.check_args_range(OP, min, max)
    fq.check_num_bits(OP, num_bits)
    g = fq.as_float32(OP, "gradients", gradients)
    x = fq.as_float32(OP, "inputs", inputs)
    fq.check_same_size(OP, g, x)
    quant_min, quant_max = fq.quant_bounds(num_bits, narrow_range)
    nudged_min, nudged_max, _, _ = fq.nudge(min, max, quant_min, quant_max)
    return (fq.masked(g, fq.inside_mask(x, nudged_min, nudged_max)),)
