"""Regenerates ort_ops/conformance/goldens/QuantizeAndDequantize*.npz by running TensorFlow over each op's attribute grid.

Run: PYTHONPATH=. python tools/goldens/gen_quantize_dequantize.py
Cases TF aborts on (V3 with axis < -1, V3 with non-scalar min/max and axis -1) are not run here;
the tests hold them. Seeds are fixed.
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
from qdq_order_cases import nan_order_case  # noqa: E402
from tools.goldens._common import check_tf_mode, neighbours, specials, tf_case  # noqa: E402

RANGES = [(-1.0, 1.0), (-6.0, 6.0), (0.5, 2.0), (-3.0, -0.5), (1.0, 1.0), (0.0, 0.0), (-0.3, 0.7)]
BITS = (1, 2, 3, 4, 8, 16, 23, 32, 52, 61)


def probe_inputs(mn, mx, dtype, rng):
    """Grid-ish values, ties, the range ends +-1 ulp, specials and random values around the range."""
    lo, hi = min(mn, mx), max(mn, mx)
    span = (hi - lo) or 1.0
    rand = rng.uniform(lo - 0.2 * span, hi + 0.2 * span, 12)
    ties = np.round(rng.uniform(-8, 8, 8)) + 0.5
    return np.concatenate([neighbours([mn, mx], dtype), specials(dtype), rand.astype(dtype), (ties * span / 16).astype(dtype)]).astype(dtype)


def forward_cases(op, rng):
    v3 = op.endswith("V3")
    cases = []
    for dtype in (np.float32, np.float64):
        for bits in BITS:
            for signed in (True, False):
                narrow_modes = (False, True) if signed else (False,)
                for narrow in narrow_modes:
                    for given in (True, False):
                        for mode in (("HALF_TO_EVEN",) if v3 else ("HALF_TO_EVEN", "HALF_UP")):
                            mn, mx = RANGES[rng.integers(len(RANGES))]
                            x = probe_inputs(mn, mx, dtype, rng)
                            if not given and rng.random() < 0.7:
                                x = x[np.isfinite(x) & (np.abs(x) < 1e30)]  # data-derived ranges without specials
                            attrs = {"signed_input": signed, "range_given": given, "narrow_range": narrow}
                            inputs = [x, dtype(mn), dtype(mx)]
                            if v3:
                                inputs.append(np.int32(bits))
                            else:
                                attrs.update(num_bits=bits, round_mode=mode)
                            note = f"{dtype.__name__} bits={bits} signed={signed} narrow={narrow} given={given} {mode} [{mn},{mx}]"
                            cases.append(tf_case(op, inputs, attrs, note))
        # per axis: data-derived everywhere; given ranges work in TF only for V3 (V2/V4 reject them, see the tests)
        for axis in (0, 1, 2):
            x = rng.uniform(-4, 4, (3, 4, 5)).astype(dtype)
            x[0, 0, 0] = 0
            depth = x.shape[axis]
            for given in ((True, False) if v3 else (False,)):
                mins = rng.uniform(-3, 0, depth).astype(dtype)
                maxs = rng.uniform(0, 3, depth).astype(dtype)
                attrs = {"axis": axis, "range_given": given}
                inputs = [x, mins, maxs] + ([np.int32(8)] if v3 else [])
                cases.append(tf_case(op, inputs, attrs, f"{dtype.__name__} per axis {axis} given={given}"))
        for x, note in (
            (np.zeros(10, dtype), "all zeros, data range"),
            (np.array([1, 2, 3], dtype), "all positive, data range"),
            (np.array([1, np.inf, -2], dtype), "inf in data range"),
            (np.zeros((0, 3), dtype), "empty"),
        ):
            attrs = {"range_given": False} if v3 else {"num_bits": 3}
            cases.append(tf_case(op, [x, dtype(0), dtype(0)] + ([np.int32(3)] if v3 else []), attrs, note))
    # which NaN or signed zero TF keeps (own seed, so the cases above stay as they were)
    order_rng = np.random.default_rng(sum(map(ord, op)))
    for i in range(40):
        inputs, attrs = nan_order_case(op, order_rng, long=i == 0)
        cases.append(tf_case(op, inputs, attrs, f"NaN/zero order {inputs[0].dtype} {inputs[0].shape} {attrs}"))
    # errors
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    f = np.float32
    nb = [np.int32(8)] if v3 else []
    errs = [
        ([x, f(2), f(1)] + nb, {"range_given": True}, "min > max"),
        ([x, f(-1), f(1)] + nb, {"axis": 2}, "axis beyond the rank"),
        ([x, f(-1), f(1)] + nb, {"axis": 1, "range_given": True}, "per axis with scalar ranges"),
    ]
    if v3:  # V2/V4 per-axis vectors hit TF's scalar-first bug (a deliberate deviation; see the tests)
        errs.append(([x, f([-1, -1]), f([1, 1, 1]), np.int32(8)], {"axis": 1, "range_given": True}, "per axis, wrong size"))
    if v3:
        errs += [
            ([x, f(-1), f(1), np.int32([8])], {}, "num_bits not a scalar"),
            ([x, f(-1), f(1), np.int32(0)], {}, "num_bits 0"),
            ([x, f(-1), f(1), np.int32(63)], {"signed_input": False}, "num_bits 63 unsigned"),
            ([x, f(-1), f(1), np.int32(8)], {"axis": -3}, "axis below -rank"),
        ]
    else:
        errs += [
            ([x, f(-1), f(1)], {"num_bits": 0}, "num_bits 0"),
            ([x, f(-1), f(1)], {"num_bits": 62}, "num_bits 62 signed"),
            ([x, f(-1), f(1)], {"axis": -2}, "axis -2"),
            ([x, f([-1]), f(1)], {"range_given": True}, "vector min"),
        ]
    for inputs, attrs, note in errs:
        cases.append(tf_case(op, inputs, attrs, note))
    cases += signed_zero_max_cases(op)
    return cases


def signed_zero_max_cases(op):
    """Issue 11: a data range whose max is a signed zero, on an unsigned grid (the zero's sign becomes the
    step's, and so every output zero's). +0 and -0 share a packet lane pair of the horizontal fold, where
    the lower half wins a tie; the longer inputs also go through the four packet accumulators."""
    cases = []
    nb = [np.int32(8)] if op.endswith("V3") else []
    attrs = {"signed_input": False, "range_given": False} | ({} if op.endswith("V3") else {"num_bits": 8})
    for dtype, width in ((np.float32, 8), (np.float64, 4)):
        half = width // 2
        for first in (0.0, -0.0):
            lanes = np.full(width, -20.0)
            lanes[0], lanes[half] = first, -first
            tiled = np.concatenate([np.array([0.0, -0.0, -20.0]), np.resize(lanes, 4 * width + 5)])
            for x in (lanes, tiled):
                x = x.astype(dtype)
                note = f"issue 11: {dtype.__name__} zero max of both signs, unsigned grid, {x.size} values from {first}"
                cases.append(tf_case(op, [x, dtype(0), dtype(0)] + nb, attrs, note))
    return cases


def grad_cases(op, rng):
    cases = []
    for dtype in (np.float32, np.float64):
        for mn, mx in RANGES:
            x = probe_inputs(mn, mx, dtype, rng)
            g = np.concatenate([specials(dtype), (rng.integers(-4, 5, x.size - 11) * 0.5).astype(dtype)])
            cases.append(tf_case(op, [g, x, dtype(mn), dtype(mx)], {}, f"{dtype.__name__} [{mn},{mx}]"))
        for axis in (0, 1, 2):
            x = rng.uniform(-4, 4, (3, 4, 5)).astype(dtype)
            d = x.shape[axis]
            g = (rng.integers(-4, 5, x.shape) * 0.5).astype(dtype)
            cases.append(tf_case(op, [g, x, rng.uniform(-3, 0, d).astype(dtype), rng.uniform(0, 3, d).astype(dtype)], {"axis": axis}, f"axis {axis}"))
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    f = np.float32
    for inputs, attrs, note in (
        ([x, x, f(-1), f(1)], {"axis": -2}, "axis -2"),
        ([x, x, f([-1, 0, 0]), f([1, 1, 1])], {"axis": 2}, "axis beyond the rank"),
        ([x[:1], x, f(-1), f(1)], {}, "gradient shape differs"),
        ([x, x, f([[-1]]), f(1)], {}, "min of rank 2"),
        ([x, x, f([-1]), f(1)], {}, "vector min, no axis"),
        ([x, x, f([-1, 0]), f([1, 1, 1])], {"axis": 1}, "min of the wrong size"),
        ([x, x, f(-1), f(1)], {"axis": 1}, "scalar min with an axis"),
    ):
        cases.append(tf_case(op, inputs, attrs, note))
    return cases


GENERATORS = {
    "QuantizeAndDequantizeV2": forward_cases,
    "QuantizeAndDequantizeV3": forward_cases,
    "QuantizeAndDequantizeV4": forward_cases,
    "QuantizeAndDequantizeV4Grad": grad_cases,
}


def main():
    check_tf_mode(onednn=False)
    for i, (op, gen) in enumerate(GENERATORS.items()):
        cases = gen(op, np.random.default_rng(2000 + i))
        path = save_cases(op, cases)
        print(f"{op}: {len(cases)} cases, {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
