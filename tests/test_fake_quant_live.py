"""FakeQuantWithMinMax* against the installed TensorFlow: seeded random cases on grid points, ties, bounds
and beyond, bit for bit (summed gradients to their tolerance), on the NumPy kernels and through ORT."""
from __future__ import annotations

import numpy as np
import pytest

from backends import run
from comparison import quantization_mismatch
from test_fake_quant import F32, OPS
from tf_oracle import tf_raw_op

pytestmark = pytest.mark.tensorflow


def _random_case(op, rng):
    """Random attrs and inputs that land on grid points, ties, bounds and beyond."""
    bits = int(rng.integers(2, 17))
    narrow = bool(rng.integers(0, 2))
    per_channel = "PerChannel" in op
    depth = int(rng.integers(1, 5)) if per_channel else 1
    lo = rng.uniform(-10, 2, depth)
    hi = lo + rng.choice([rng.uniform(0.01, 10), 2.0 ** rng.integers(-3, 4)], depth)
    if rng.random() < 0.1:
        lo, hi = rng.uniform(0.1, 2, depth), rng.uniform(2, 4, depth)  # min > 0
    mins, maxs = lo.astype(F32), hi.astype(F32)
    if "Args" in op:
        mins, maxs = mins[:1], maxs[:1]
    from ort_ops.reference import _fake_quant as fq

    qmin, qmax = fq.quant_bounds(bits, narrow)
    nmin, nmax, scale, _ = fq.nudge(mins, maxs, qmin, qmax)
    rows = int(rng.integers(1, 12))
    k = rng.integers(-2, qmax - qmin + 3, (rows, depth)).astype(F32)
    half = rng.choice(F32([0, 0.5, 0.49999997, 0.50000006, 0.25]), (rows, depth)).astype(F32)
    x = (nmin + (k + half) * scale).astype(F32)
    x[rng.random(x.shape) < 0.1] = np.nan
    shape = (rows, depth) if per_channel else (rows * depth,)
    x = x.reshape(shape)
    attrs = {"num_bits": bits, "narrow_range": narrow}
    if "Args" in op:
        attrs.update(min=float(mins[0]), max=float(maxs[0]))
        inputs = [x]
    elif per_channel:
        inputs = [x, mins, maxs]
    else:
        inputs = [x, mins[0], maxs[0]]
    if op.endswith("Gradient"):
        inputs = [rng.standard_normal(x.shape).astype(F32)] + inputs
    return inputs, attrs


@pytest.mark.parametrize("op", OPS)
def test_live_against_tensorflow(op, backend):
    rng = np.random.default_rng(sum(map(ord, op)))
    failures = []
    for i in range(300 if backend == "numpy" else 120):
        inputs, attrs = _random_case(op, rng)
        expected = tf_raw_op(op, inputs, attrs)
        got = run(backend, op, inputs, attrs)
        why = quantization_mismatch(op, inputs, expected, got)
        if why:
            failures.append(f"case {i} attrs={attrs}: {why}")
    assert not failures, f"{len(failures)} cases fail:\n" + "\n".join(failures[:10])


