"""FakeQuantWithMinMaxArgsGradient: the incoming gradient where the input lies in the nudged range."""
from ort_ops.reference import _fake_quant as fq

OP = "FakeQuantWithMinMaxArgsGradient"


def run(gradients, inputs, *, min, max, num_bits, narrow_range):  # noqa: A002 -- TF's attribute names
    fq.check_args_range(OP, min, max)
    fq.check_num_bits(OP, num_bits)
    g = fq.as_float32(OP, "gradients", gradients)
    x = fq.as_float32(OP, "inputs", inputs)
    if g.shape != x.shape:
        # TF's Args gradient is a binary element-wise kernel; this is that base class's message.
        dims = lambda a: "[" + ",".join(str(d) for d in a.shape) + "]"  # noqa: E731
        raise fq.OpError(
            OP, f"Inputs to operation {OP} of type {OP} must have the same size and shape.  Input 0: {dims(g)} != input 1: {dims(x)}"
        )
    quant_min, quant_max = fq.quant_bounds(num_bits, narrow_range)
    nudged_min, nudged_max, _, _ = fq.nudge(min, max, quant_min, quant_max)
    return (fq.masked(g, fq.inside_mask(x, nudged_min, nudged_max)),)
