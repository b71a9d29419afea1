"""QuantizeAndDequantize{V2,V3,V4} and V4Grad against the installed TensorFlow, bit for bit: seeded random
cases, NaN- and zero-heavy cases (which NaN and which signed zero TF keeps), and per-axis given ranges
against TF's per-channel results; each on the NumPy kernels and through ORT."""
from __future__ import annotations

import numpy as np
import pytest

from backends import run
from comparison import bits_mismatch, outputs_mismatch
from qdq_order_cases import nan_order_case
from test_quantize_dequantize import OPS
from tf_oracle import tf_raw_op

pytestmark = pytest.mark.tensorflow


def _random_case(op, rng):
    dtype = np.float32 if rng.random() < 0.5 else np.float64
    shape = tuple(int(d) for d in rng.integers(1, 5, int(rng.integers(1, 4))))
    axis = -1 if rng.random() < 0.6 else int(rng.integers(0, len(shape)))
    depth = 1 if axis == -1 else shape[axis]
    lo = rng.uniform(-8, 1, depth)
    hi = lo + rng.uniform(0.01, 10, depth)
    mins, maxs = lo.astype(dtype), hi.astype(dtype)
    bits = int(rng.integers(1, 17))
    # values on the half grid of a typical step, plus random ones
    step = (hi.max() - lo.min()) / (2**bits)
    x = np.where(rng.random(shape) < 0.5, (rng.integers(-20, 20, shape) + 0.5) * step, rng.uniform(-10, 10, shape)).astype(dtype)
    given = bool(rng.random() < 0.5) if axis == -1 or op.endswith("V3") else False
    if axis == -1:
        mins, maxs = mins[0], maxs[0]
    attrs = {"signed_input": bool(rng.random() < 0.6), "narrow_range": bool(rng.random() < 0.3), "axis": axis, "range_given": given}
    if op.endswith("V3"):
        return [x, mins, maxs, np.int32(bits)], attrs
    if op.endswith("Grad"):
        return [rng.standard_normal(shape).astype(dtype), x, mins, maxs], {"axis": axis}
    attrs.update(num_bits=bits, round_mode=str(rng.choice(["HALF_TO_EVEN", "HALF_UP"])))
    return [x, mins, maxs], attrs


@pytest.mark.parametrize("op", OPS)
def test_live_against_tensorflow(op, backend):
    rng = np.random.default_rng(sum(map(ord, op)))
    failures = []
    for i in range(300 if backend == "numpy" else 100):
        inputs, attrs = _random_case(op, rng)
        why = outputs_mismatch(tf_raw_op(op, inputs, attrs), run(backend, op, inputs, attrs))
        if why:
            failures.append(f"case {i} attrs={attrs}: {why}")
    assert not failures, f"{len(failures)} cases fail:\n" + "\n".join(failures[:10])


@pytest.mark.parametrize("op", OPS[:3])
def test_which_nan_and_zero_tensorflow_keeps(op, backend):
    """NaN- and zero-heavy inputs: the data range is a NaN or a signed zero, and the final multiply
    often sees two NaNs. Every output bit, NaN signs included, matches TF."""
    rng = np.random.default_rng(77 + sum(map(ord, op)))
    failures = []
    cases = [nan_order_case(op, rng) for _ in range(120)] + [nan_order_case(op, rng, long=True) for _ in range(6)]
    for i, (inputs, attrs) in enumerate(cases):
        why = outputs_mismatch(tf_raw_op(op, inputs, attrs), run(backend, op, inputs, attrs))
        if why:
            failures.append(f"case {i} shape={inputs[0].shape} attrs={attrs}: {why}")
    assert not failures, f"{len(failures)} cases fail:\n" + "\n".join(failures[:10])


@pytest.mark.parametrize("op", ["QuantizeAndDequantizeV2", "QuantizeAndDequantizeV4"])
def test_per_axis_given_range_matches_per_channel_tf(op, backend):
    """TF 2.21 rejects per-axis range_given in V2/V4 (a bug); its intent is each channel quantized on
    its own range, which TF computes correctly one channel at a time with axis=-1."""
    rng = np.random.default_rng(7)
    for trial in range(30):
        dtype = (np.float32, np.float64)[trial % 2]
        x = rng.uniform(-5, 5, (2, 3, 4)).astype(dtype)
        axis = int(rng.integers(0, 3))
        d = x.shape[axis]
        mins, maxs = rng.uniform(-4, 0, d).astype(dtype), rng.uniform(0, 4, d).astype(dtype)
        attrs = {"num_bits": int(rng.integers(2, 9)), "signed_input": bool(trial % 3), "round_mode": ("HALF_UP", "HALF_TO_EVEN")[trial % 2]}
        got = run(backend, op, [x, mins, maxs], dict(attrs, axis=axis, range_given=True))[0]
        for c in range(d):
            chan = np.take(x, c, axis=axis)
            want = tf_raw_op(op, [chan, mins[c], maxs[c]], dict(attrs, range_given=True))[0]
            assert bits_mismatch(want, np.take(got, c, axis=axis)) is None


