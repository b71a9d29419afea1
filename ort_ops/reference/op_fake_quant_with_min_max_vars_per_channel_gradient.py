"""FakeQuantWithMinMaxVarsPerChannelGradient: gradients w.r.t. the input and the per-channel min and max."""
import numpy as np

from ort_ops.reference import _fake_quant as fq


def run(gradients, inputs, min, max, *, num_bits, narrow_range, axis):  # noqa: A002 -- TF's input names
    # The channel dim moved last: for axis -1 nothing moves. For another axis each channel's elements are
    # then in the order they have in memory (outer dims, then the dims after `axis`), which is the order
    # the sums take: the result is TF's op on the input transposed so that `axis` is last.
    g, x = np.moveaxis(gradients, axis, -1), np.moveaxis(inputs, axis, -1)
    depth = x.shape[-1]
    nudged_min, nudged_max, _, _, zero_range = fq.vars_params(min, max, num_bits, narrow_range)
    # TF views the input as [N, d] and reduces each column (a chip) with Eigen's packet reduction.
    rows = int(np.prod(x.shape[:-1]))
    g2 = g.reshape(rows, depth)
    x2 = x.reshape(rows, depth)
    dx = fq.masked(g2, fq.inside_mask(x2, nudged_min, nudged_max))
    dmin = fq.column_sums(fq.masked(g2, (fq.flush(x2) < nudged_min).astype(np.float32)))
    dmax = fq.column_sums(fq.masked(g2, (fq.flush(x2) > nudged_max).astype(np.float32)))
    # Channels with min == max == 0 pass the whole gradient and send nothing to min/max.
    dx = np.where(zero_range, g2, dx).astype(np.float32)
    dmin = np.where(zero_range, np.float32(0), dmin).astype(np.float32)
    dmax = np.where(zero_range, np.float32(0), dmax).astype(np.float32)
    return np.ascontiguousarray(np.moveaxis(dx.reshape(x.shape), -1, axis)), dmin, dmax
