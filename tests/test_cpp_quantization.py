"""The C++ kernels of the quantization ops (FakeQuant*, QuantizeAndDequantize*) against the NumPy kernels.

The NumPy kernels reproduce TensorFlow bit for bit (their own tests check them against TF), so the
C++ outputs must equal them bit for bit too: same bits for every finite value and every zero, NaN in
the same places. Random cases cover odd shapes (zero-size dims, single elements, sizes that are not a
multiple of the vector width, tensors large enough for the thread pool to split the work) and the
special values TF's math is sensitive to (grid points and half-grid points, the bounds and one ulp
beyond them, NaN, +-Inf, subnormals, +-0). Every case also runs with 1 and 4 intra-op threads,
which must agree bit for bit.
"""
import zlib

import numpy as np
import pytest

import ort_ops
from backends import BackendError, run_numpy, run_ort
from comparison import bits_mismatch

SHAPES = [(), (0,), (1,), (7,), (9,), (3, 0, 2), (17, 5), (33,), (2, 3, 4, 5), (1031,), (70001,)]
CHANNEL_SHAPES = [(1,), (3,), (0, 4), (5, 1), (7, 8), (2, 3, 17), (129, 9), (8200, 3), (20000, 16), (40, 130), (8300, 70)]


def special_values(dtype, lo, hi, step):
    """Values where rounding and clamping decide: bounds, one ulp beyond, grid and half-grid points."""
    t = np.dtype(dtype).type
    lo, hi, step = t(lo), t(hi), t(step)
    pts = [lo, hi, np.nextafter(lo, t(-np.inf)), np.nextafter(hi, t(np.inf)), t(0), t(-0.0), t(np.nan),
           t(np.inf), t(-np.inf), np.finfo(dtype).tiny / t(4), -np.finfo(dtype).tiny / t(4), np.finfo(dtype).max]
    with np.errstate(all="ignore"):
        k = np.arange(-6, 7, dtype=dtype)
        grid = lo + k * step
        half = grid + step / t(2)
        pts += list(grid) + list(half) + list(np.nextafter(half, t(np.inf))) + list(np.nextafter(half, t(-np.inf)))
    return np.array(pts, dtype=dtype)


def sample(rng, shape, dtype, lo, hi, step):
    """Random values over a bit more than [lo, hi], sprinkled with special values."""
    n = int(np.prod(shape))
    span = float(hi) - float(lo)
    if not np.isfinite(span) or span == 0:
        span = 1.0
    x = rng.uniform(float(lo) - 0.2 * span, float(hi) + 0.2 * span, n).astype(dtype)
    if n:
        specials = special_values(dtype, lo, hi, step if np.isfinite(step) and step != 0 else 1.0)
        idx = rng.choice(n, size=min(n, len(specials) * 2), replace=False)
        x[idx] = rng.choice(specials, size=len(idx))
    return x.reshape(shape)


def gradients(rng, shape, dtype):
    g = rng.normal(size=shape).astype(dtype)
    flat = g.reshape(-1)
    if flat.size > 4:
        flat[: flat.size // 10] *= -1
        flat[rng.choice(flat.size, size=min(3, flat.size), replace=False)] = [np.inf, -np.inf, np.nan][: min(3, flat.size)]
    return g


def check_parity(op, inputs, attrs):
    """NumPy vs ORT with 4 threads vs ORT with 1 thread: all bit-identical (or all reject the input)."""
    try:
        expected = run_numpy(op, inputs, attrs)
    except BackendError as e:
        with pytest.raises(BackendError) as info:
            run_ort(op, inputs, attrs, threads=4)
        assert op in str(info.value), str(info.value)
        return "error: " + str(e)
    got4 = run_ort(op, inputs, attrs, threads=4)
    got1 = run_ort(op, inputs, attrs, threads=1)
    assert len(got4) == len(expected)
    summed = ort_ops.get_spec(op).summed_outputs()
    for k, (e, a, b) in enumerate(zip(expected, got4, got1)):
        assert bits_mismatch(a, b) is None, f"{op} output {k}: 1 vs 4 threads differ"
        # A summed output (FakeQuant's backprop_wrt_min/max) of NaN terms keeps whichever NaN its
        # summation order meets first; which NaN TF's order keeps is not part of the claim.
        why = bits_mismatch(e, a, nan_payloads=k not in summed)
        assert why is None, f"{op} {attrs} output {k} shape {np.shape(e)}, ort against numpy: {why}"
    return "ok"


def fq_range(rng):
    """A random (min, max, num_bits, narrow_range) for FakeQuant, including shifted and tiny ranges."""
    num_bits = int(rng.integers(2, 17))
    narrow = bool(rng.integers(0, 2))
    kind = rng.integers(0, 4)
    if kind == 0:
        lo, hi = np.float32(-6), np.float32(6)
    elif kind == 1:
        lo = np.float32(-rng.uniform(0, 10))
        hi = np.float32(rng.uniform(0, 10))
    elif kind == 2:  # does not contain 0: the nudge shifts it
        lo = np.float32(rng.uniform(0.5, 3))
        hi = np.float32(lo + rng.uniform(0.1, 5))
    else:
        lo = np.float32(-rng.uniform(1e-4, 1e-2))
        hi = np.float32(rng.uniform(1e-4, 1e-2))
    if not lo < hi:
        hi = np.nextafter(lo, np.float32(np.inf))
    step = (float(hi) - float(lo)) / ((1 << num_bits) - 1 - int(narrow))
    return lo, hi, num_bits, narrow, step


FQ_OPS = [
    "FakeQuantWithMinMaxArgs",
    "FakeQuantWithMinMaxArgsGradient",
    "FakeQuantWithMinMaxVars",
    "FakeQuantWithMinMaxVarsGradient",
    "FakeQuantWithMinMaxVarsPerChannel",
    "FakeQuantWithMinMaxVarsPerChannelGradient",
]


def fq_case(op, rng, shape):
    lo, hi, num_bits, narrow, step = fq_range(rng)
    attrs = {"num_bits": num_bits, "narrow_range": narrow}
    per_channel = "PerChannel" in op
    x = sample(rng, shape, np.float32, lo, hi, step)
    if op.startswith("FakeQuantWithMinMaxArgs"):
        attrs.update(min=float(lo), max=float(hi))
        inputs = [x]
    elif per_channel:
        d = shape[-1]
        mins = np.array([fq_range(rng)[0] for _ in range(d)], np.float32)
        maxs = np.array([fq_range(rng)[1] for _ in range(d)], np.float32)
        maxs = np.where(maxs > mins, maxs, mins + np.float32(1))
        if d > 1:  # TF's min == max == 0 branch and a degenerate min == max channel
            mins[0] = maxs[0] = 0
            mins[-1] = maxs[-1] = np.float32(0.5)
        inputs = [x, mins, maxs]
    else:
        choice = rng.integers(0, 6)
        mn, mx = {0: (0.0, 0.0), 1: (1.5, 1.5), 2: (2.0, -1.0)}.get(int(choice), (lo, hi))
        inputs = [x, np.float32(mn), np.float32(mx)]
    if op.endswith("Gradient"):
        inputs = [gradients(rng, shape, np.float32)] + inputs
    return inputs, attrs


@pytest.mark.parametrize("op", FQ_OPS)
def test_fake_quant_parity(op):
    rng = np.random.default_rng(zlib.crc32(op.encode()) % (1 << 32))
    shapes = CHANNEL_SHAPES if "PerChannel" in op else SHAPES
    outcomes = []
    for shape in shapes:
        for _ in range(2):
            inputs, attrs = fq_case(op, rng, shape)
            outcomes.append(check_parity(op, inputs, attrs))
    assert outcomes.count("ok") >= len(outcomes) - 2, outcomes  # the cases are meant to be valid


QDQ_SHAPES = [((), -1), ((0,), -1), ((1,), -1), ((7,), -1), ((13,), 0), ((3, 0, 2), 1), ((17, 5), 1), ((17, 5), 0),
              ((2, 3, 4, 5), 2), ((1031,), -1), ((70001,), -1), ((300, 40, 3), 1)]


def qdq_case(op, rng, shape, axis, dtype):
    signed = bool(rng.integers(0, 2))
    num_bits = int(rng.choice([1, 2, 3, 4, 8, 8, 16, 23, 30, 52, 61 if signed else 62]))
    range_given = bool(rng.integers(0, 2)) if op != "QuantizeAndDequantizeV3" else bool(rng.integers(0, 4))
    attrs = {"signed_input": signed, "range_given": range_given, "narrow_range": bool(rng.integers(0, 2)), "axis": axis}
    depth = 1 if axis == -1 else shape[axis]
    lo = -rng.uniform(0, 5, depth) if signed or rng.integers(0, 2) else rng.uniform(0, 1, depth)
    hi = lo + rng.uniform(0, 6, depth)
    lo, hi = lo.astype(dtype), hi.astype(dtype)
    if depth and rng.integers(0, 3) == 0:
        lo[0] = hi[0] = 0
    step = float(np.max(hi - lo)) / max(2 ** min(num_bits, 20) - 1, 1) if depth else 1.0
    x = sample(rng, shape, dtype, float(lo.min()) if depth else -1, float(hi.max()) if depth else 1, step)
    # Sometimes a NaN-free, inf-free tensor, so that the data range is finite.
    if rng.integers(0, 3) == 0 and x.size:
        x = np.nan_to_num(x, nan=0.5, posinf=3.0, neginf=-3.0).astype(dtype)
    mn, mx = (lo.reshape(()), hi.reshape(())) if axis == -1 else (lo, hi)
    if op == "QuantizeAndDequantizeV4Grad":
        return [gradients(rng, shape, dtype), x, mn, mx], {"axis": axis}
    if op == "QuantizeAndDequantizeV3":
        return [x, mn, mx, np.int32(num_bits)], attrs
    attrs["num_bits"] = num_bits
    attrs["round_mode"] = str(rng.choice(["HALF_TO_EVEN", "HALF_UP"]))
    return [x, mn, mx], attrs


QDQ_OPS = ["QuantizeAndDequantizeV2", "QuantizeAndDequantizeV3", "QuantizeAndDequantizeV4", "QuantizeAndDequantizeV4Grad"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", QDQ_OPS)
def test_quantize_dequantize_parity(op, dtype):
    rng = np.random.default_rng((zlib.crc32(op.encode()) + np.dtype(dtype).itemsize) % (1 << 32))
    outcomes = []
    for shape, axis in QDQ_SHAPES:
        for _ in range(2):
            inputs, attrs = qdq_case(op, rng, shape, axis, dtype)
            outcomes.append(check_parity(op, inputs, attrs))
    assert outcomes.count("ok") >= len(outcomes) * 3 // 4, outcomes


def test_every_quantization_op_is_covered():
    family = {s.name for s in ort_ops.OP_SPECS if s.family in ("fake_quant", "quantize_dequantize")}
    assert family == set(FQ_OPS) | set(QDQ_OPS)


def test_half_up_and_half_to_even_differ_on_ties():
    """A tie (k + 0.5 steps) rounds differently in the two modes; both sides agree with NumPy."""
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 0.49999997], np.float32)
    mn, mx = np.float32(-4), np.float32(3)
    base = {"signed_input": True, "num_bits": 3, "range_given": True}
    even = run_ort("QuantizeAndDequantizeV2", [x, mn, mx], dict(base, round_mode="HALF_TO_EVEN"))[0]
    up = run_ort("QuantizeAndDequantizeV2", [x, mn, mx], dict(base, round_mode="HALF_UP"))[0]
    assert not np.array_equal(even, up)
    for attrs, got in ((dict(base, round_mode="HALF_TO_EVEN"), even), (dict(base, round_mode="HALF_UP"), up)):
        assert bits_mismatch(run_numpy("QuantizeAndDequantizeV2", [x, mn, mx], attrs)[0], got) is None
