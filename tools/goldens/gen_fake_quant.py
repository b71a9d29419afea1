"""Regenerates ort_ops/conformance/goldens/FakeQuant*.npz by running TensorFlow over each op's attribute grid.

Run: PYTHONPATH=. python tools/goldens/gen_fake_quant.py
Inputs are edge values around the nudged grid (grid points, exact ties, the nudged bounds and one
ulp beyond them) plus special floats; expected outputs are TF's. Seeds are fixed. The cases TF
aborts on (a scalar input to the PerChannel ops) are not run here; the tests hold them.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

# TF's Eigen kernels, whatever the CPU's default (oneDNN on with AVX-512): see tools/goldens/_common.py.
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

import numpy as np  # noqa: E402

from ort_ops.conformance.goldens import save_cases  # noqa: E402
from ort_ops.reference import _fake_quant as fq  # noqa: E402
from tools.goldens._common import check_tf_mode, neighbours, specials, tf_case  # noqa: E402

F32 = np.float32
RANGES = [(-6.0, 6.0), (-1.0, 1.0), (0.0, 1.0), (1.0, 3.0), (-3.0, -1.0), (-0.1, 0.25), (-127.5, 127.5)]


def edge_inputs(mn, mx, num_bits, narrow, rng, count=24):
    """Values that probe the quantizer of [mn, mx]: grid points, ties, bounds +-1 ulp, specials, random."""
    quant_min, quant_max = fq.quant_bounds(num_bits, narrow)
    nmin, nmax, scale, _ = fq.nudge(F32(mn), F32(mx), quant_min, quant_max)
    steps = rng.integers(0, quant_max - quant_min + 1, size=count // 2)
    grid = (nmin + steps.astype(F32) * scale).astype(F32)
    ties = (grid + F32(0.5) * scale).astype(F32)
    bounds = neighbours([nmin, nmax, mn, mx], F32)
    lo, hi = min(mn, mx), max(mn, mx)
    spread = (hi - lo) * 0.1 + 0.01
    rand = rng.uniform(lo - spread, hi + spread, size=count // 2).astype(F32)
    return np.concatenate([grid, ties, bounds, specials(F32), rand]).astype(F32)


def channel_edges(mins, maxs, num_bits, narrow, rng, rows=None):
    cols = [edge_inputs(a, b, num_bits, narrow, rng) for a, b in zip(mins, maxs)]
    n = min(len(c) for c in cols)
    return np.stack([c[:n] for c in cols], axis=-1)


def grads(rng, shape):
    """Incoming gradients: small multiples of 0.5 (compress well, signs of both kinds)."""
    return (rng.integers(-4, 5, size=shape) * 0.5).astype(F32)


def args_cases(op, rng):
    cases = []
    for bits in range(2, 17):
        for narrow in (False, True):
            for mn, mx in RANGES[:: (1 if bits in (2, 3, 8, 16) else 3)]:
                x = edge_inputs(mn, mx, bits, narrow, rng)
                attrs = {"min": mn, "max": mx, "num_bits": bits, "narrow_range": narrow}
                inputs = [x] if op.endswith("Args") else [grads(rng, x.shape), x]
                cases.append(tf_case(op, inputs, attrs, f"bits={bits} narrow={narrow} range=[{mn},{mx}]"))
    x = edge_inputs(-6, 6, 8, False, rng)[:42].reshape(2, 3, 7)
    inputs = [x] if op.endswith("Args") else [grads(rng, x.shape), x]
    cases.append(tf_case(op, inputs, {}, "defaults, rank 3"))
    empty = np.zeros((0, 3), F32)
    cases.append(tf_case(op, [empty] if op.endswith("Args") else [empty, empty], {}, "empty input"))
    x = np.linspace(-2, 2, 5, dtype=F32)
    one = [x] if op.endswith("Args") else [np.ones(5, F32), x]
    for attrs, note in (
        ({"min": 1.0, "max": 1.0}, "min == max"),
        ({"min": 2.0, "max": -1.0}, "min > max"),
        ({"num_bits": 1}, "num_bits too small"),
        ({"num_bits": 17}, "num_bits too large"),
        ({"min": 0.1, "max": 0.1}, "min == max, not exactly printable"),
    ):
        cases.append(tf_case(op, one, attrs, note))
    if op.endswith("Gradient"):
        cases.append(tf_case(op, [np.ones(4, F32), x], {}, "gradient and input shapes differ"))
        cases.append(tf_case(op, [np.ones((5, 1), F32), x], {}, "gradient and input ranks differ"))
    # issue 11: subnormal bounds are zeros to TF (rejected as "-0 >= 0", or flushed before the nudge)
    for attrs, note in (
        ({"min": -1e-38, "max": 1e-38}, "issue 11: subnormal min and max"),
        ({"min": 0.0, "max": 1e-40}, "issue 11: subnormal max above min 0"),
        ({"min": -1e-40, "max": 1.0}, "issue 11: subnormal min"),
    ):
        cases.append(tf_case(op, one, attrs, note))
    if op.endswith("Gradient"):
        cases.append(tf_case(op, [SUBNORMAL_GRADIENTS, np.full(5, 0.5, F32)], {"min": -1.0, "max": 1.0},
                             "issue 11: subnormal gradients inside the range"))
    return cases


# issue 11: TF flushes subnormal gradients to signed zeros where it multiplies them by the mask
SUBNORMAL_GRADIENTS = F32([1e-45, -1e-40, 1.0, -1e-45, 1e-39])


def vars_ranges():
    return RANGES + [(0.0, 0.0), (1.0, 1.0), (2.0, -1.0), (-0.0, 0.0), (np.nan, 1.0), (-1.0, np.inf), (-np.inf, 1.0)]


def vars_cases(op, rng):
    grad = op.endswith("Gradient")
    cases = []
    for bits in range(2, 17):
        for narrow in (False, True):
            ranges = vars_ranges() if bits in (2, 8, 16) else RANGES[::3]
            for mn, mx in ranges:
                x = edge_inputs(mn if np.isfinite(mn) else -1, mx if np.isfinite(mx) else 1, bits, narrow, rng)
                attrs = {"num_bits": bits, "narrow_range": narrow}
                inputs = [x, F32(mn), F32(mx)]
                if grad:
                    inputs = [grads(rng, x.shape)] + inputs
                cases.append(tf_case(op, inputs, attrs, f"bits={bits} narrow={narrow} range=[{mn},{mx}]"))
    g_special = specials(F32)
    x = np.concatenate([np.full(11, -100, F32), np.full(11, 100, F32), np.zeros(11, F32)])
    if grad:
        g = np.concatenate([g_special] * 3)
        cases.append(tf_case(op, [g, x, F32(-1), F32(1)], {}, "special gradients below, above and inside"))
        for n in (7, 8, 33, 100, 300):
            xs = rng.uniform(-3, 3, n).astype(F32)
            cases.append(tf_case(op, [rng.standard_normal(n).astype(F32), xs, F32(-1), F32(1)], {}, f"sums over {n}"))
    x = np.linspace(-2, 2, 5, dtype=F32)
    pre = [np.ones(5, F32)] if grad else []
    for inputs, attrs, note in (
        ([x, F32([-1]), F32(1)], {}, "min of rank 1"),
        ([x, F32(-1), F32([[1]])], {}, "max of rank 2"),
        ([x, F32(-1), F32(1)], {"num_bits": 1}, "num_bits too small"),
        ([x, F32(-1), F32(1)], {"num_bits": 17}, "num_bits too large"),
    ):
        cases.append(tf_case(op, pre + inputs, attrs, note))
    if grad:
        cases.append(tf_case(op, [np.ones(4, F32), x, F32(-1), F32(1)], {}, "gradient and input shapes differ"))
        # issue 11: subnormal gradients are flushed inside the range and copied when min == max == 0
        x = F32([0.5, 0.5, 5.0, -5.0, 0.5])
        for mn, mx in ((-1.0, 1.0), (0.0, 0.0), (-1e-40, 1e-40)):
            cases.append(tf_case(op, [SUBNORMAL_GRADIENTS, x, F32(mn), F32(mx)], {}, f"issue 11: subnormal gradients, range [{mn},{mx}]"))
    return cases


def per_channel_cases(op, rng):
    grad = op.endswith("Gradient")
    cases = []
    for bits in range(2, 17):
        for narrow in (False, True):
            if bits in (2, 8, 16):
                picks = vars_ranges()
            else:
                picks = [RANGES[i] for i in rng.choice(len(RANGES), 3, replace=False)]
            mins = F32([p[0] for p in picks])
            maxs = F32([p[1] for p in picks])
            finite_min = np.where(np.isfinite(mins), mins, -1)
            finite_max = np.where(np.isfinite(maxs), maxs, 1)
            x = channel_edges(finite_min, finite_max, bits, narrow, rng)
            attrs = {"num_bits": bits, "narrow_range": narrow}
            inputs = [x, mins, maxs]
            if grad:
                inputs = [grads(rng, x.shape)] + inputs
            cases.append(tf_case(op, inputs, attrs, f"bits={bits} narrow={narrow} {len(picks)} channels"))
    # rank 1 and rank 3 inputs
    for shape in ((4,), (2, 3, 4), (0, 4)):
        x = rng.uniform(-2, 2, shape).astype(F32)
        mins, maxs = F32([-1, -0.5, 0, 0]), F32([1, 0.5, 0, 2])
        inputs = [x, mins, maxs] if not grad else [grads(rng, shape), x, mins, maxs]
        cases.append(tf_case(op, inputs, {}, f"shape {shape}"))
    x = rng.uniform(-2, 2, (5, 3)).astype(F32)
    pre = [np.ones((5, 3), F32)] if grad else []
    for inputs, attrs, note in (
        ([x, F32(-1), F32([1, 1, 1])], {}, "min of rank 0"),
        ([x, F32([-1, -1, -1]), F32([[1, 1, 1]])], {}, "max of rank 2"),
        ([x, F32([-1, -1]), F32([1, 1, 1])], {}, "min of the wrong size"),
        ([x, F32([-1, -1, -1]), F32([1, 1, 1, 1])], {}, "max of the wrong size"),
        ([x, F32([-1, -1, -1]), F32([1, 1, 1])], {"num_bits": 1}, "num_bits too small"),
        ([x, F32([-1, -1, -1]), F32([1, 1, 1])], {"num_bits": 17}, "num_bits too large"),
    ):
        cases.append(tf_case(op, pre + inputs, attrs, note))
    if grad:
        cases.append(tf_case(op, [np.ones((3, 3), F32), x, F32([-1] * 3), F32([1] * 3)], {}, "gradient shape differs"))
        # issue 11: subnormal gradients are flushed inside the range and copied in a min == max == 0 channel
        g = np.stack([SUBNORMAL_GRADIENTS] * 4, axis=-1)
        x = np.stack([F32([0.5, 0.5, 5.0, -5.0, 0.5])] * 4, axis=-1)
        mins, maxs = F32([-1, 0, -1e-40, -1]), F32([1, 0, 1e-40, 0.25])
        cases.append(tf_case(op, [g, x, mins, maxs], {}, "issue 11: subnormal gradients per channel"))
        issue_case = [SUBNORMAL_GRADIENTS[None, :3], np.full((1, 3), 0.5, F32), F32([-1] * 3), F32([1] * 3)]
        cases.append(tf_case(op, issue_case, {}, "issue 11: the issue's case"))
    return cases


GENERATORS = {
    "FakeQuantWithMinMaxArgs": args_cases,
    "FakeQuantWithMinMaxArgsGradient": args_cases,
    "FakeQuantWithMinMaxVars": vars_cases,
    "FakeQuantWithMinMaxVarsGradient": vars_cases,
    "FakeQuantWithMinMaxVarsPerChannel": per_channel_cases,
    "FakeQuantWithMinMaxVarsPerChannelGradient": per_channel_cases,
}


def main():
    check_tf_mode(onednn=False)
    for i, (op, gen) in enumerate(GENERATORS.items()):
        cases = gen(op, np.random.default_rng(1000 + i))
        path = save_cases(op, cases)
        print(f"{op}: {len(cases)} cases, {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
