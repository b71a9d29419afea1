"""FakeQuantWithMinMaxVarsGradient: gradients with respect to the input and the scalar min and max."""
import numpy as np

from ort_ops.reference import _fake_quant as fq


def run(gradients, inputs, min, max, *, num_bits, narrow_range):  # noqa: A002 -- TF's input names
    g, x = gradients, inputs
    nudged_min, nudged_max, _, _, zero_range = fq.vars_params(min, max, num_bits, narrow_range)
    if zero_range:  # min == max == 0: everything passes through, nothing reaches min or max
        return g.copy(), np.float32(0).reshape(()), np.float32(0).reshape(())
    dx = fq.masked(g, fq.inside_mask(x, nudged_min, nudged_max))
    dmin = fq.full_sum(fq.masked(g, (fq.flush(x) < nudged_min).astype(np.float32)))
    dmax = fq.full_sum(fq.masked(g, (fq.flush(x) > nudged_max).astype(np.float32)))
    return dx, np.asarray(dmin, dtype=np.float32).reshape(()), np.asarray(dmax, dtype=np.float32).reshape(())
