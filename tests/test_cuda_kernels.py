"""The CUDA kernels (issue 10) against the CPU kernels of the same library: every golden case and seeded random
cases of every op, type and layout, run in a CUDAExecutionProvider session and in a CPU session.

What is compared (tests/cuda_support.py holds the rules):

* Quantization ops (FakeQuant*, QuantizeAndDequantize*): every output bit for bit, NaN payloads and signs and
  signed zeros included, the summed min/max gradients too (the CUDA kernels reproduce the CPU's Eigen order).
* FusedBatchNormClipFakeQuant (family "fused"): bit for bit, NaN payloads included, as the quantization ops.
  Where two NaNs meet in its batch norm the CUDA kernel keeps the written operand order, as the CPU kernel's
  AVX2 and AVX-512 copies do (not its SSE2 copy); the random cases never put a NaN variance and a NaN scale
  in one channel, where the CPU's own order depends on the channel (tests/cuda_emulation/fused/check.cc).
* DepthwiseConv2dNative and ...BackpropInput: bit for bit (the CUDA kernels run the CPU's tap sequence per
  output element); NaN positions must agree, NaN payloads need not: x86 and the GPU give different NaN bits
  for an invalid operation (0 * inf) and propagate payloads differently in float arithmetic.
* ...BackpropFilter and the batch-norm ops sum in another (deterministic) order: within the tolerances the
  suite holds the CPU kernels to against TF (test_depthwise.assert_close; for batch norm the kit's
  rules.batch_norm_output_bound, which judges the gradients' scale/offset sums against their terms).
* Rejections: both reject, with the same message (ORT's status prefix and the provider's name aside).
* Golden cases are also judged against TF exactly as the suite's golden tests judge the CPU kernels.
* Placement: ORT's profiler must show every node of the run on CUDAExecutionProvider, and the sessions
  set ``session.disable_cpu_ep_fallback``, so a kernel ORT did not pick fails session creation instead of
  running on the CPU unseen.

I/O: inputs and outputs live on the GPU (io_binding with CUDA OrtValues); a second pass feeds host arrays.
Also: a CUDA-graph test (``enable_cuda_graph`` with io_binding: capture, then replays on new data written in
place) and a determinism test (repeated runs and a second session give the same bits).

Without a GPU every CUDA test skips with the reason ("no CUDAExecutionProvider in this onnxruntime",
"library built without CUDA kernels", or a CUDA EP that cannot start); ``TFOPS_REQUIRE_CUDA=1`` (set by
scripts/gpu.sh) turns those skips into failures. The ``test_self_*`` tests run everywhere: they drive the same
code with the CPU EP on both sides, through io_binding, and with doctored results that must fail.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import warnings
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import cuda_support as cs
import ort_ops
from comparison import bits_mismatch
from ort_ops.conformance.goldens import golden_ops, load_cases
from qdq_order_cases import nan_order_case

ROOT = Path(__file__).resolve().parent.parent
SEED = 20261123
F32, F64, F16, BF16 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
ALL_OPS = ort_ops.OP_NAMES


@pytest.fixture(scope="module")
def cuda():
    reason = cs.unavailable_reason()
    if reason is not None:
        if os.environ.get("TFOPS_REQUIRE_CUDA") == "1":
            pytest.fail(f"TFOPS_REQUIRE_CUDA=1, but {reason}")
        pytest.skip(reason)
    return cs.CUDA


def _report(op, problems, total):
    lines = [f"{note}: {why}" for note, whys in problems for why in whys]
    return f"{op}: {len(problems)} of {total} cases fail:\n" + "\n".join(lines[:25])


def check_cases(op, cases, target, reference=cs.CPU, golden=False, counts=None):
    """Run every case on ``target`` and on ``reference``; the failures, as (note, problems) pairs.
    ``counts`` (a dict), if given, gets how many cases the reference ran and rejected."""
    failures = []
    for case in cases:
        want = cs.run(reference, op, case["inputs"], case["attrs"])
        got = cs.run(target, op, case["inputs"], case["attrs"])
        problems = cs.judge(op, case["inputs"], case["attrs"], target, want, got, case if golden else None)
        if problems:
            failures.append((case["note"], problems))
        if counts is not None:
            key = "rejected" if want.error is not None else "ran"
            counts[key] = counts.get(key, 0) + 1
    return failures


# ============================================================================================ random cases


def _rng(*key):
    return np.random.default_rng([SEED, zlib.crc32("/".join(map(str, key)).encode())])


_BITS = {F32: (np.uint32, 23, 0xFF), F64: (np.uint64, 52, 0x7FF)}


def nans(rng, n, dtype, signaling=False):
    """NaNs of both signs with random payloads (quiet, or signaling: quiet bit clear, payload nonzero)."""
    uint, mant, exp_all = _BITS[np.dtype(dtype)]
    quiet = uint(1) << uint(mant - 1)
    payload = rng.integers(1, int(quiet), n, dtype=uint, endpoint=False)
    bits = (uint(exp_all) << uint(mant)) | payload | (uint(0) if signaling else quiet)
    bits |= rng.integers(0, 2, n).astype(uint) << uint(8 * np.dtype(dtype).itemsize - 1)
    return bits.view(dtype)


def specials(rng, dtype, lo=-1.0, hi=1.0, signaling=False):
    """Values whose bits a kernel can get wrong: signed zeros, infinities, subnormals, extremes, the range's
    ends and their neighbours, NaNs with payloads."""
    dtype = np.dtype(dtype)
    info = np.finfo(dtype)
    tiny_sub = np.array(info.smallest_subnormal, dtype)
    lo, hi = dtype.type(lo), dtype.type(hi)
    base = np.array([0.0, -0.0, np.inf, -np.inf, info.max, -info.max, info.tiny, -info.tiny, tiny_sub, -tiny_sub,
                     tiny_sub * 7, lo, hi, np.nextafter(lo, -np.inf), np.nextafter(lo, np.inf),
                     np.nextafter(hi, -np.inf), np.nextafter(hi, np.inf)], dtype)
    return np.concatenate([base, nans(rng, 8, dtype), nans(rng, 4, dtype, signaling=True) if signaling else base[:0]])


def sprinkle(rng, x, pool, fraction=0.05):
    """``x`` with about ``fraction`` of its elements replaced by draws from ``pool`` (at least one when not empty)."""
    x = np.array(x, copy=True)
    if x.size == 0 or len(pool) == 0:
        return x
    flat = x.reshape(-1)
    k = max(1, int(flat.size * fraction))
    idx = rng.choice(flat.size, min(k, flat.size), replace=False)
    flat[idx] = rng.choice(pool, idx.size)
    return x


def grid_values(rng, shape, dtype, lo, hi, levels):
    """Values over [lo, hi] widened by a quarter on both sides; a third of them on grid points or halfway
    between two (the rounding ties), for a grid of ``levels`` steps."""
    size = int(np.prod(shape, dtype=np.int64))
    lo, hi = min(float(lo), float(hi)), max(float(lo), float(hi))
    width = (hi - lo) if hi > lo else 1.0
    x = rng.uniform(lo - width / 4, hi + width / 4, size)
    step = width / max(levels, 1)
    k = rng.integers(0, max(levels, 1) + 1, size)
    pick = rng.random(size)
    x = np.where(pick < 0.2, lo + k * step, x)
    x = np.where((pick >= 0.2) & (pick < 0.35), lo + (k + 0.5) * step, x)
    return x.astype(dtype).reshape(shape)


def _case(note, inputs, attrs):
    return {"note": note, "inputs": inputs, "attrs": attrs}


# ----------------------------------------------------------------------------------------------- FakeQuant

FQ_RANGES = [  # (min, max, num_bits, narrow_range)
    (-6.0, 6.0, 8, False), (-1.0, 3.0, 2, False), (0.25, 4.0, 8, True), (-10.0, -0.5, 16, False),
    (-0.3, 0.7, 5, True), (-2.5, 2.5, 4, True),
]
FQ_BAD = [(0.0, 0.0, 8, False), (1.0, -1.0, 8, False), (-2.0, 2.0, 1, False), (-2.0, 2.0, 17, False)]
FQ_SHAPES = [(), (0,), (7,), (3, 5), (2, 5, 6, 3), (4, 3, 33), (2, 0, 3)]
FQ_LARGE = [(1031, 1029), (3, 1_000_003)]  # over a million elements: many leaves of the Eigen-order sums


def fake_quant_cases(op):
    rng = _rng(op)
    grad = op.endswith("Gradient")
    per_channel = "PerChannel" in op
    by_attr = op.startswith("FakeQuantWithMinMaxArgs")
    cases = []

    def make(note, shape, lo, hi, bits, narrow, signaling=False, payload_grads=True, axis=-1):
        levels = (1 << bits) - 1 - int(narrow) if 1 < bits < 20 else 255
        x = sprinkle(rng, grid_values(rng, shape, F32, lo, hi, levels), specials(rng, F32, lo, hi, signaling))
        inputs = [x]
        if grad:
            g = rng.standard_normal(shape).astype(F32)
            if payload_grads:
                g = sprinkle(rng, g, specials(rng, F32, signaling=signaling), 0.01)
            inputs = [g, x]
        attrs = {"num_bits": bits, "narrow_range": narrow}
        if by_attr:
            attrs.update(min=lo, max=hi)
        elif per_channel:
            d = shape[axis] if len(shape) else 1
            if axis != -1:
                attrs["axis"] = axis
            # each channel its own range, drawn around (lo, hi); a few zero and inverted ranges too
            los = (lo + rng.uniform(-1, 1, d) * 0.5 * (hi - lo + 1)).astype(F32)
            his = (los + rng.uniform(0.05, 2.0, d) * (abs(hi - lo) + 0.1)).astype(F32)
            if d > 3:
                his[1], los[2], his[2] = los[1], 0.0, 0.0
            inputs += [los, his]
        else:
            inputs += [np.array(lo, F32), np.array(hi, F32)]
        cases.append(_case(note, inputs, attrs))

    for i, shape in enumerate(FQ_SHAPES):  # (a scalar is rejected per channel: rank 0)
        lo, hi, bits, narrow = FQ_RANGES[i % len(FQ_RANGES)]
        make(f"shape {shape}, range [{lo}, {hi}], {bits} bits{' narrow' if narrow else ''}", shape, lo, hi, bits, narrow)
    for lo, hi, bits, narrow in FQ_RANGES:
        make(f"(5, 3, 17) range [{lo}, {hi}], {bits} bits{' narrow' if narrow else ''}", (5, 3, 17), lo, hi, bits, narrow)
    for lo, hi, bits, narrow in FQ_BAD:
        make(f"odd range [{lo}, {hi}], {bits} bits", (4, 6), lo, hi, bits, narrow)
    make("signaling NaN payloads", (6, 40), -6.0, 6.0, 8, False, signaling=True)
    for shape in FQ_LARGE if grad else FQ_LARGE[:1]:
        make(f"large {shape}", shape, -3.0, 5.0, 8, False, payload_grads=False)
    if grad:
        make(f"large {FQ_LARGE[0]} with NaN payloads in the gradients", FQ_LARGE[0], -3.0, 5.0, 8, False)
    if per_channel:  # the domain's axis before the last dim (an NCHW tensor's channels), forward and gradient
        for shape, axis in [((2, 6, 5, 7), 1), ((3, 40, 33), 0), ((2, 16, 300, 9), 1)]:
            make(f"{shape} axis {axis}", shape, -3.0, 5.0, 8, False, axis=axis)
    return cases


# ------------------------------------------------------------------------------------ QuantizeAndDequantize


def qdq_cases(op):
    rng = _rng(op)
    cases = []
    if op != "QuantizeAndDequantizeV4Grad":
        # which NaN and which signed zero TF's order keeps (tests/qdq_order_cases.py), short and long views
        for k in range(14):
            inputs, attrs = nan_order_case(op, rng, long=k >= 11)
            cases.append(_case(f"NaN/zero order {k}: {inputs[0].dtype} {inputs[0].shape} {attrs}", inputs, attrs))
    for dtype in (F32, F64):
        for k, (shape, axis) in enumerate([((), -1), ((0,), -1), ((7,), -1), ((4, 9), 1), ((3, 5, 8), 0),
                                           ((2, 3, 4, 6), 3), ((1000, 1001), -1), ((517, 3, 129), 2)]):
            given = bool(k % 2) or op == "QuantizeAndDequantizeV4Grad"
            signed = k % 3 != 0
            bits = int(rng.choice([1, 2, 4, 8, 16] + ([40] if dtype == F64 else [23])))
            depth = 1 if axis == -1 else shape[axis]
            lo = -rng.uniform(0.1, 4.0, depth) if signed else np.zeros(depth)
            hi = rng.uniform(0.1, 4.0, depth)
            levels = (1 << min(bits, 12)) - 1
            x = grid_values(rng, shape, dtype, float(lo.min()), float(hi.max()), levels)
            x = sprinkle(rng, x, specials(rng, dtype, float(lo.min()), float(hi.max())), 0.03)
            rmin = (lo if axis != -1 else lo[0]).astype(dtype)
            rmax = (hi if axis != -1 else hi[0]).astype(dtype)
            rmin, rmax = np.asarray(rmin, dtype), np.asarray(rmax, dtype)
            note = f"{dtype} {shape} axis {axis}, {'given' if given else 'data'} range, {bits} bits"
            if op == "QuantizeAndDequantizeV4Grad":
                g = sprinkle(rng, rng.standard_normal(shape).astype(dtype), specials(rng, dtype), 0.02)
                cases.append(_case(note, [g, x, rmin, rmax], {"axis": axis}))
                continue
            attrs = {"signed_input": signed, "range_given": given, "narrow_range": bool(k % 4 == 1), "axis": axis}
            if op == "QuantizeAndDequantizeV3":
                cases.append(_case(note, [x, rmin, rmax, np.int32(bits)], attrs))
            else:
                attrs.update(num_bits=bits, round_mode="HALF_UP" if k % 2 else "HALF_TO_EVEN")
                cases.append(_case(note, [x, rmin, rmax], attrs))
    # an inverted given range (rejected per tensor) and a range around a lone value
    x = rng.standard_normal((3, 4)).astype(F32)
    inverted = [x, np.float32(1), np.float32(-1)]
    if op == "QuantizeAndDequantizeV4Grad":
        cases.append(_case("inverted range", [x] + inverted, {}))
        cases.append(_case("gradient of another shape", [x[:2], x, np.float32(-1), np.float32(1)], {}))
        cases.append(_case("axis past the rank", [x, x, np.zeros(4, F32), np.ones(4, F32)], {"axis": 2}))
    elif op == "QuantizeAndDequantizeV3":
        cases.append(_case("inverted given range", inverted + [np.int32(8)], {"range_given": True}))
    else:
        cases.append(_case("inverted given range", inverted, {"range_given": True}))
    return cases


# ---------------------------------------------------------------------------------------------- batch norm

BN_SHAPES_4D = [(2, 5, 7, 6), (1, 1, 1, 3), (3, 4, 4, 17), (0, 2, 2, 3), (8, 32, 32, 16), (2, 3, 3, 300)]
BN_SHAPES_5D = [(2, 3, 4, 5, 6), (1, 2, 3, 4, 9)]


def _bn_channels(shape, fmt):
    return shape[1] if fmt in ("NCHW", "NCDHW") else shape[-1]


def _bn_stats(x, fmt):
    axes = tuple(i for i in range(x.ndim) if i != (1 if fmt in ("NCHW", "NCDHW") else x.ndim - 1))
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an empty batch: NaN statistics, as TF's
        return x64.mean(axis=axes).astype(F32), x64.var(axis=axes).astype(F32)


def batch_norm_cases(op):
    rng = _rng(op)
    spec = ort_ops.get_spec(op)
    grad = "Grad" in op
    formats = spec.attr("data_format").choices
    t_types = [np.dtype(ort_ops.spec.numpy_dtype(k["T"])) for k in spec.kernels]
    cases = []
    k = 0
    for t in t_types:
        for fmt in formats:
            five = fmt in ("NDHWC", "NCDHW")
            shapes = BN_SHAPES_5D if five else BN_SHAPES_4D
            if t != F32:
                shapes = shapes[:3]  # float16/bfloat16: the layouts and the rounding, not the sizes again
            for shape in shapes:
                if fmt in ("NCHW", "NCDHW"):  # shape lists N, spatial..., C: move C to position 1
                    shape = (shape[0], shape[-1]) + tuple(shape[1:-1])
                for is_training in (True, False):
                    k += 1
                    c = _bn_channels(shape, fmt)
                    x = (rng.standard_normal(shape) * 1.5 + 0.3).astype(F32)
                    if k % 5 == 0 and x.size:
                        x.reshape(-1)[rng.integers(x.size)] = [np.nan, np.inf, -np.inf][k % 3]
                    scale = rng.uniform(0.5, 1.5, c).astype(F32)
                    offset = rng.standard_normal(c).astype(F32)
                    mean, var = rng.standard_normal(c).astype(F32) * 0.3, rng.uniform(0.5, 2.0, c).astype(F32)
                    eps = float(np.float32(rng.choice([1e-4, 1e-3, 0.01])))
                    note = f"{t} {fmt} {shape} {'training' if is_training else 'inference'}"
                    if not grad:
                        factor = 1.0 if k % 3 else 0.3
                        attrs = {"epsilon": eps, "exponential_avg_factor": factor, "data_format": fmt,
                                 "is_training": is_training}
                        cases.append(_case(f"{note}, avg factor {factor}", [x.astype(t), scale, offset, mean, var], attrs))
                        continue
                    if is_training:  # the gradient op gets the forward op's batch mean and biased variance
                        mean, var = _bn_stats(x.astype(t), fmt)
                    dy = rng.standard_normal(shape).astype(t)
                    inputs = [dy, x.astype(t), scale, mean, var]
                    if op.endswith("V3"):
                        inputs.append(np.zeros((), F32))
                    attrs = {"epsilon": eps, "data_format": fmt, "is_training": is_training}
                    cases.append(_case(note, inputs, attrs))
    # rejected: a scale with one channel too few
    x = rng.standard_normal((2, 3, 3, 4)).astype(F32)
    c4, c3 = np.ones(4, F32), np.ones(3, F32)
    inputs = ([x, x, c3, c4, c4] + ([c4] if op.endswith("V3") else [])) if grad else [x, c3, c4, c4, c4]
    cases.append(_case("scale of 3 channels for 4", inputs, {}))
    return cases


# ----------------------------------------------------------------------------------------------- depthwise

DW_CONFIGS = [
    # (N, H, W, C, kh, kw, M, stride, (dil_h, dil_w), padding, explicit (top, bottom, left, right))
    (2, 9, 8, 3, 3, 3, 1, 1, (1, 1), "SAME", None),
    (1, 11, 10, 4, 3, 3, 2, 2, (1, 1), "SAME", None),
    (2, 8, 9, 5, 5, 3, 3, 1, (2, 1), "VALID", None),
    (1, 7, 7, 2, 3, 2, 1, 3, (1, 2), "EXPLICIT", (2, 1, 0, 3)),
    (3, 6, 5, 8, 1, 1, 1, 1, (1, 1), "VALID", None),
    (0, 5, 5, 3, 3, 3, 1, 1, (1, 1), "SAME", None),  # empty batch
    (1, 2, 2, 3, 3, 3, 1, 1, (1, 1), "VALID", None),  # output size 0
]
DW_LARGE = (4, 28, 28, 32, 3, 3, 1, 1, (1, 1), "SAME", None)  # many blocks along W and C


def depthwise_cases(op):
    rng = _rng(op)
    cases = []
    for dtype in (F32, F64, F16, BF16):
        for fmt in ("NHWC", "NCHW"):
            configs = DW_CONFIGS + ([DW_LARGE] if dtype in (F32, F16) else [])
            for j, (n, h, w_, c, kh, kw, m, s, dil, pad, ex) in enumerate(configs):
                attr4 = (lambda a, b: [1, 1, a, b]) if fmt == "NCHW" else (lambda a, b: [1, a, b, 1])
                ep = []
                if ex:
                    ep = [0, 0, 0, 0, *ex] if fmt == "NCHW" else [0, 0, *ex, 0, 0]
                attrs = {"strides": attr4(s, s), "padding": pad, "explicit_paddings": ep, "data_format": fmt,
                         "dilations": attr4(*dil)}
                xshape = (n, c, h, w_) if fmt == "NCHW" else (n, h, w_, c)
                x = rng.standard_normal(xshape)
                filt = rng.standard_normal((kh, kw, c, m))
                if j == 1:  # specials: NaN and infinities reach the outputs; signed zeros
                    x = sprinkle(rng, x, np.array([np.nan, np.inf, -np.inf, 0.0, -0.0]), 0.02)
                x, filt = x.astype(dtype), filt.astype(dtype)
                (y,) = ort_ops.get_spec(cs.DW_FWD).run_reference([x, filt], attrs)
                dy = rng.standard_normal(y.shape).astype(dtype)
                note = f"{dtype} {fmt} x{xshape} filter{filt.shape} stride {s} dil {dil} {pad}"
                if op == cs.DW_FWD:
                    inputs = [x, filt]
                elif op == cs.DW_BPI:
                    inputs = [np.array(x.shape, np.int32), filt, dy]
                else:
                    inputs = [x, np.array(filt.shape, np.int32), dy]
                cases.append(_case(note, inputs, attrs))
    # rejected: a filter for 2 channels on an input of 3
    x, filt = rng.standard_normal((1, 5, 5, 3)).astype(F32), rng.standard_normal((3, 3, 2, 1)).astype(F32)
    dy = rng.standard_normal((1, 5, 5, 3)).astype(F32)
    inputs = {cs.DW_FWD: [x, filt], cs.DW_BPI: [np.array(x.shape, np.int32), filt, dy],
              cs.DW_BPF: [x, np.array(filt.shape, np.int32), dy]}[op]
    cases.append(_case("filter depth 2 for 3 channels", inputs, {"strides": [1, 1, 1, 1], "padding": "SAME"}))
    return cases


# ------------------------------------------------------------------------------------ fused (batch norm ...)

# (shape with the channels last, data_format); channels-first formats move C to position 1. Channel counts and
# spatial sizes on both sides of the kernel's 4-float vectors, a plane of more than 2048 vectors (several
# chunks), an empty batch, many blocks.
FUSED_SHAPES = [
    ((2, 5, 7, 6), "NHWC"), ((1, 1, 1, 3), "NHWC"), ((3, 4, 4, 17), "NHWC"), ((0, 2, 2, 3), "NHWC"),
    ((8, 32, 32, 16), "NHWC"), ((2, 3, 3, 300), "NHWC"),
    ((2, 5, 7, 6), "NCHW"), ((2, 7, 9, 19), "NCHW"), ((2, 8, 8, 4), "NCHW"), ((1, 100, 100, 3), "NCHW"),
    ((4, 28, 28, 32), "NCHW"),
    ((2, 3, 4, 5, 6), "NDHWC"), ((1, 2, 3, 4, 9), "NCDHW"),
]
# (quantizer, min, max, num_bits, narrow_range), (clip_min, clip_max): taken in turn.
FUSED_RANGES = [("FakeQuantWithMinMaxVars", 0.0, 6.0, 8, False), ("FakeQuantWithMinMaxArgs", -6.0, 6.0, 8, False),
                ("FakeQuantWithMinMaxVars", -1.0, 3.0, 4, True), ("FakeQuantWithMinMaxArgs", -0.5, 2.5, 16, False),
                ("FakeQuantWithMinMaxVars", -2.5, 2.5, 5, True)]
FUSED_CLIPS = [(0.0, 6.0), (-np.inf, np.inf), (-1.0, 2.0)]


def fused_cases(op):
    """FusedBatchNormClipFakeQuant: both quantizers, every layout, the usual clip bounds, special inputs (NaN
    payloads, infinities, subnormals, signed zeros), a zero and a NaN grid, NaN statistics, and rejections."""
    rng = _rng(op)
    cases = []

    def stats(c, nan_stats=False):
        scale, offset = rng.uniform(0.5, 1.5, c).astype(F32), rng.standard_normal(c).astype(F32)
        mean, var = (rng.standard_normal(c) * 0.3).astype(F32), rng.uniform(0.5, 2.0, c).astype(F32)
        if nan_stats and c > 2:  # a NaN k (negative variance, NaN scale) and a NaN offset meet NaN inputs
            var[0], scale[1], offset[2] = -1.0, nans(rng, 1, F32)[0], nans(rng, 1, F32)[0]
        return [scale, offset, mean, var]

    def make(note, shape, fmt, quantizer, lo, hi, bits, narrow, clip, nan_stats=False, values=None):
        """``values(shape)``, if given, makes x (of the shape with C moved for the channels-first formats)."""
        if fmt.startswith("NC"):
            shape = (shape[0], shape[-1]) + tuple(shape[1:-1])
        c = shape[1] if fmt.startswith("NC") else shape[-1]
        if values is None:
            levels = (1 << bits) - 1 - int(narrow)
            x = grid_values(rng, shape, F32, lo - 2.0, hi + 2.0, levels)  # spread past the range and the clip
            x = sprinkle(rng, x, specials(rng, F32, lo, hi, signaling=True), 0.05)
        else:
            x = values(shape)
        attrs = {"epsilon": float(np.float32(0.001)), "data_format": fmt, "clip_min": clip[0], "clip_max": clip[1],
                 "fake_quant": quantizer, "num_bits": bits, "narrow_range": narrow}
        inputs = [x] + stats(c, nan_stats) + [np.array(lo, F32), np.array(hi, F32)]
        cases.append(_case(f"{note}: {fmt} {shape} {quantizer} [{lo}, {hi}] {bits} bits clip {clip}", inputs, attrs))

    for i, (shape, fmt) in enumerate(FUSED_SHAPES):
        for j in range(2):
            quantizer, lo, hi, bits, narrow = FUSED_RANGES[(2 * i + j) % len(FUSED_RANGES)]
            make("layout", shape, fmt, quantizer, lo, hi, bits, narrow, FUSED_CLIPS[(i + j) % len(FUSED_CLIPS)])
    for fmt in ("NHWC", "NCHW"):
        make("zero range (Vars: zeros)", (2, 5, 7, 6), fmt, "FakeQuantWithMinMaxVars", 0.0, 0.0, 8, False, (0.0, 6.0),
             values=lambda shape: sprinkle(rng, rng.standard_normal(shape).astype(F32), specials(rng, F32), 0.1))
        make("NaN grid (infinite min)", (2, 5, 7, 6), fmt, "FakeQuantWithMinMaxVars", -np.inf, 6.0, 8, False,
             (-np.inf, np.inf), values=lambda shape: sprinkle(rng, grid_values(rng, shape, F32, -3.0, 8.0, 255),
                                                               specials(rng, F32, -3.0, 8.0, signaling=True), 0.1))
        for quantizer in ("FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxArgs"):
            make("NaN statistics", (3, 4, 5, 8), fmt, quantizer, -1.0, 5.0, 8, False, (0.0, 6.0), nan_stats=True)
    # rejected: statistics for 3 channels of 4, an Args range with min >= max, clip bounds out of order
    x = rng.standard_normal((2, 3, 3, 4)).astype(F32)
    c3, c4, lo, hi = np.ones(3, F32), np.ones(4, F32), np.array(-1.0, F32), np.array(1.0, F32)
    base = {"data_format": "NHWC", "fake_quant": "FakeQuantWithMinMaxVars"}
    cases.append(_case("scale of 3 channels for 4", [x, c3, c4, c4, c4, lo, hi], base))
    cases.append(_case("Args range min >= max", [x, c4, c4, c4, c4, hi, lo],
                       dict(base, fake_quant="FakeQuantWithMinMaxArgs")))
    cases.append(_case("clip_min > clip_max", [x, c4, c4, c4, c4, lo, hi], dict(base, clip_min=6.0, clip_max=0.0)))
    return cases


def random_cases(op):
    if op in cs.FAKE_QUANT_OPS:
        return fake_quant_cases(op)
    if op in cs.QDQ_OPS:
        return qdq_cases(op)
    if op in cs.BATCH_NORM_OPS:
        return batch_norm_cases(op)
    if op in cs.FUSED_OPS:
        return fused_cases(op)
    return depthwise_cases(op)


# ============================================================================================== CUDA tests


@pytest.mark.parametrize("op", golden_ops())
def test_goldens_on_cuda(cuda, op):
    """Every golden case (error cases included): CUDA against the CPU kernels and against TF."""
    cases = load_cases(op)
    failures = check_cases(op, cases, cuda, golden=True)
    assert not failures, _report(op, failures, len(cases))


@pytest.mark.parametrize("op", ALL_OPS)
def test_random_cases_on_cuda(cuda, op):
    cases = random_cases(op)
    failures = check_cases(op, cases, cuda)
    assert not failures, _report(op, failures, len(cases))


@pytest.mark.parametrize("op", ALL_OPS)
def test_host_io_on_cuda(cuda, op):
    """The same kernels fed from host memory (ORT copies in and out): a sample of the random cases."""
    cases = random_cases(op)[::4]
    failures = check_cases(op, cases, cs.CUDA_HOST_IO)
    assert not failures, _report(op, failures, len(cases))


# A few ops in a CUDA graph: (op, variable input indices, inputs A, attrs). Inputs not listed as variable are
# initializers (constant ranges, shapes: what the host reads stays fixed in a captured graph).
def graph_configs():
    rng = _rng("graph")
    x = (rng.standard_normal((8, 20, 20, 24)) * 3).astype(F32)
    g = rng.standard_normal(x.shape).astype(F32)
    c = x.shape[-1]
    lo, hi = np.linspace(-6, -1, c).astype(F32), np.linspace(1, 6, c).astype(F32)
    scale, offset = rng.uniform(0.5, 1.5, c).astype(F32), rng.standard_normal(c).astype(F32)
    mean, var = _bn_stats(x, "NHWC")
    filt = (rng.standard_normal((3, 3, c, 2)) / 3).astype(F32)
    same2 = {"strides": [1, 2, 2, 1], "padding": "SAME"}
    (y,) = ort_ops.get_spec(cs.DW_FWD).run_reference([x, filt], same2)
    dy = rng.standard_normal(y.shape).astype(F32)
    return [
        ("FakeQuantWithMinMaxArgs", (0,), [x], {"min": -5.0, "max": 4.0, "num_bits": 8}),
        ("FakeQuantWithMinMaxVars", (0,), [x, np.float32(-5), np.float32(4)], {"narrow_range": True}),
        ("FakeQuantWithMinMaxVarsPerChannelGradient", (0, 1), [g, x, lo, hi], {}),
        ("QuantizeAndDequantizeV2", (0,), [x, np.float32(0), np.float32(0)], {"range_given": False}),
        ("QuantizeAndDequantizeV3", (0,), [x, lo, hi, np.int32(8)], {"range_given": True, "axis": 3}),
        ("FusedBatchNormV3", (0,), [x, scale, offset, mean, var], {"is_training": True, "epsilon": 0.001}),
        ("FusedBatchNormGradV3", (0, 1), [g, x, scale, mean, var, np.zeros((), F32)], {"is_training": True}),
        (cs.DW_FWD, (0, 1), [x, filt], same2),
        (cs.DW_BPF, (0, 2), [x, np.array(filt.shape, np.int32), dy], same2),
    ]


def _perturbed(inputs, variable, rng):
    """Input set B: every variable input replaced by new values of the same shape and type."""
    out = list(inputs)
    for i in variable:
        out[i] = (rng.standard_normal(np.shape(inputs[i])) * 2).astype(np.asarray(inputs[i]).dtype)
    return out


def graph_check(target, config):
    """Problems of running ``config`` as A, A, B, A in one session with fixed bindings (on the CUDA EP: a
    captured graph replayed): each run against the CPU kernels, and the last A run bit-identical to the first."""
    op, variable, inputs_a, attrs = config
    inputs_b = _perturbed(inputs_a, variable, _rng("graph-b", op))
    want_a, want_b = cs.run(cs.CPU, op, inputs_a, attrs), cs.run(cs.CPU, op, inputs_b, attrs)
    assert want_a.error is None and want_b.error is None, (want_a.error, want_b.error)
    got = cs.run_bound_sequence(target, op, [inputs_a, inputs_a, inputs_b, inputs_a], attrs, variable, want_a.outputs)
    if got.error is not None:
        return [f"{target}: {got.error}"]
    problems = []
    for k, (outs, inputs, want) in enumerate(zip(got.outputs, ["A", "A", "B", "A"], [want_a, want_a, want_b, want_a])):
        why = cs.outputs_mismatch(op, inputs_a if inputs == "A" else inputs_b, attrs, want.outputs, outs)
        if why:
            problems.append(f"run {k} (inputs {inputs}): {why}")
    for j, (first, last) in enumerate(zip(got.outputs[0], got.outputs[3])):
        why = bits_mismatch(first, last)
        if why:
            problems.append(f"output {j} of the replay differs from the first run: {why}")
    return problems


@pytest.mark.parametrize("config", graph_configs(), ids=lambda c: c[0])
def test_cuda_graph(cuda, config):
    problems = graph_check(cs.CUDA_GRAPH, config)
    assert not problems, "\n".join(problems)


def determinism_configs():
    """Reduction-heavy cases, large enough for many blocks per reduction."""
    rng = _rng("determinism")
    x = (rng.standard_normal((16, 28, 28, 64)) * 3).astype(F32)
    g = rng.standard_normal(x.shape).astype(F32)
    c = x.shape[-1]
    scale, offset = rng.uniform(0.5, 1.5, c).astype(F32), rng.standard_normal(c).astype(F32)
    mean, var = _bn_stats(x, "NHWC")
    x_nchw = np.ascontiguousarray(np.transpose(x, (0, 3, 1, 2)))
    filt = (rng.standard_normal((3, 3, c, 1)) / 3).astype(F32)
    same = {"strides": [1, 1, 1, 1], "padding": "SAME"}
    return [
        ("FakeQuantWithMinMaxVarsGradient", [g, x, np.float32(-4), np.float32(3)], {}),
        ("FakeQuantWithMinMaxVarsPerChannelGradient", [g, x, np.full(c, -4, F32), np.full(c, 3, F32)], {}),
        ("QuantizeAndDequantizeV4", [x, np.zeros(c, F32), np.zeros(c, F32)], {"range_given": False, "axis": 3}),
        ("QuantizeAndDequantizeV2", [x.astype(F64), np.float64(0), np.float64(0)], {"range_given": False}),
        ("FusedBatchNormV3", [x, scale, offset, mean, var], {"is_training": True, "exponential_avg_factor": 0.3}),
        ("FusedBatchNormV3", [x_nchw.astype(BF16), scale, offset, mean, var], {"data_format": "NCHW"}),
        ("FusedBatchNormGradV3", [g, x, scale, mean, var, np.zeros((), F32)], {"is_training": True}),
        ("FusedBatchNormGrad", [g, x, scale, mean, var], {"is_training": False}),
        (cs.DW_BPF, [x, np.array(filt.shape, np.int32), g], same),
        (cs.DW_BPF, [x_nchw.astype(F16), np.array(filt.shape, np.int32), np.transpose(g, (0, 3, 1, 2)).astype(F16)],
         {**same, "data_format": "NCHW"}),
    ]


def determinism_check(target, config):
    op, inputs, attrs = config
    first = cs.run(target, op, inputs, attrs, repeat=3)
    again = cs.run(target, op, inputs, attrs)
    if first.error or again.error:
        return [f"rejected: {first.error or again.error}"]
    runs = list(first.outputs) + [again.outputs]
    problems = []
    for k, outs in enumerate(runs[1:], 1):
        for j, (a, b) in enumerate(zip(runs[0], outs)):
            why = bits_mismatch(a, b)
            if why:
                problems.append(f"{'run' if k < 3 else 'a second session, run'} {k}, output {j}: {why}")
    return problems


@pytest.mark.parametrize("config", determinism_configs(), ids=lambda c: c[0])
def test_deterministic(cuda, config):
    problems = determinism_check(cuda, config)
    assert not problems, "\n".join(problems)


# The fused op in a captured CUDA graph (x varies; the statistics and the host-read range are initializers) and
# run repeatedly (an element-wise kernel: the same bits every time whatever the grid).
def fused_configs():
    rng = _rng("fused-graph")
    x = (rng.standard_normal((8, 20, 20, 24)) * 3).astype(F32)
    x = sprinkle(rng, x, specials(rng, F32, -1.0, 5.0), 0.01)
    c = x.shape[-1]
    stats = [rng.uniform(0.5, 1.5, c).astype(F32), rng.standard_normal(c).astype(F32),
             (rng.standard_normal(c) * 0.3).astype(F32), rng.uniform(0.5, 2.0, c).astype(F32)]
    rng_ = [np.float32(-1), np.float32(5)]
    vars_relu6 = {"clip_min": 0.0, "clip_max": 6.0, "narrow_range": True}
    args_nchw = {"data_format": "NCHW", "fake_quant": "FakeQuantWithMinMaxArgs", "num_bits": 4}
    x_nchw = np.ascontiguousarray(np.transpose(x, (0, 3, 1, 2)))
    return [("FusedBatchNormClipFakeQuant", (0,), [x, *stats, *rng_], vars_relu6),
            ("FusedBatchNormClipFakeQuant", (0,), [x_nchw, *stats, *rng_], args_nchw)]


@pytest.mark.parametrize("config", fused_configs(), ids=lambda c: c[3].get("data_format", "NHWC"))
def test_fused_cuda_graph(cuda, config):
    problems = graph_check(cs.CUDA_GRAPH, config)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("config", fused_configs(), ids=lambda c: c[3].get("data_format", "NHWC"))
def test_fused_deterministic(cuda, config):
    op, _, inputs, attrs = config
    problems = determinism_check(cuda, (op, inputs, attrs))
    assert not problems, "\n".join(problems)


# ======================================================================== self-tests (run without a GPU)


def test_self_fused_procedures_on_cpu():
    """The fused op's graph and determinism procedures on the CPU EP, and its bit-for-bit rule: a changed NaN
    payload or a changed last bit fails."""
    for op, variable, inputs, attrs in fused_configs():
        assert graph_check(cs.CPU_BOUND, (op, variable, inputs, attrs)) == []
        assert determinism_check(cs.CPU_BOUND, (op, inputs, attrs)) == []
        want = cs.run(cs.CPU, op, inputs, attrs)
        got = cs.run(cs.CPU_BOUND, op, inputs, attrs)
        assert cs.judge(op, inputs, attrs, cs.CPU_BOUND, want, got) == []
        nan_at = _first(want.outputs[0], np.isnan)
        num_at = _first(want.outputs[0], lambda a: np.isfinite(a) & (a != 0))
        assert nan_at is not None and num_at is not None
        for where in (nan_at, num_at):
            assert cs.judge(op, inputs, attrs, cs.CPU_BOUND, want, _doctored(got, 0, lambda a: _flip_low_bit(a, where)))


def test_self_skip_reasons(monkeypatch):
    """The two reasons the brief names, from the uncached probe."""
    import onnxruntime as ort

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert cs.probe() == "no CUDAExecutionProvider in this onnxruntime"
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort_ops, "cuda_kernels_built", lambda: False)
    assert cs.probe() == "library built without CUDA kernels"


def test_self_sessions_never_list_the_cpu_ep_with_fallback_off():
    """A GPU session disables the CPU fallback and so must not list the CPU EP: onnxruntime 1.31 refuses that
    pair ("Conflicting session configuration"), which failed every CUDA test on the first H200 run. Where the
    onnxruntime has the Azure provider (the CPU build; it runs none of the domain's ops) a session on it must
    fail on the placement guard itself, naming the disabled fallback, never on the configuration; onnxruntime-gpu
    has no Azure provider, and there the CUDA tests open such sessions themselves."""
    import onnxruntime as ort

    for target in (cs.CUDA, cs.CUDA_HOST_IO, cs.CUDA_GRAPH):
        assert all(p != cs.CPU_EP and p[0] != cs.CPU_EP for p in cs.session_providers(target)), target
    assert cs.session_providers(cs.CUDA_GRAPH) == [(cs.CUDA_EP, {"device_id": "0", "enable_cuda_graph": "1"})]
    providers = ort.get_available_providers()
    x = np.linspace(-1, 1, 12, dtype=np.float32)
    model = cs.single_op_model("FakeQuantWithMinMaxArgs", [x], {"min": -1.0, "max": 1.0})
    if "AzureExecutionProvider" not in providers:
        assert cs.CUDA_EP in providers, f"neither the Azure nor the CUDA provider in {providers}"
        return
    with pytest.raises(Exception) as info:
        cs.open_session(cs.Target("AzureExecutionProvider", "cpu", io="host"), model, profile=False)
    message = str(info.value)
    assert "Conflicting session configuration" not in message, message
    assert "fallback" in message.lower(), message


def test_self_this_machine_reason_is_stated():
    """Here either everything is there (a GPU machine) or the reason is one of the stated ones."""
    reason = cs.unavailable_reason()
    assert reason is None or reason.startswith(("no CUDAExecutionProvider in this onnxruntime",
                                                "library built without CUDA kernels",
                                                "CUDAExecutionProvider is in this onnxruntime but cannot start",
                                                "onnxruntime is not installed")), reason


@pytest.mark.parametrize("family", ["fake_quant", "quantize_dequantize", "batch_norm", "depthwise", "fused"])
def test_self_goldens_cpu_against_cpu(family):
    """The golden comparison path with the CPU kernels on both sides, one through io_binding: every problem
    list is empty (a sample of each op's cases: every error case and every other one of the rest)."""
    for op in (s.name for s in ort_ops.OP_SPECS if s.family == family):
        cases = load_cases(op)
        sample = [c for i, c in enumerate(cases) if "error" in c or i % 2 == 0]
        failures = check_cases(op, sample, cs.CPU_BOUND, golden=True)
        assert not failures, _report(op, failures, len(sample))


@pytest.mark.parametrize("op", ALL_OPS)
def test_self_random_cases_cpu_against_cpu(op):
    cases = random_cases(op)
    assert len(cases) >= 12
    counts = {}
    failures = check_cases(op, cases, cs.CPU_BOUND, counts=counts)
    assert not failures, _report(op, failures, len(cases))
    assert counts.get("ran", 0) >= 10, counts
    assert counts.get("rejected", 0) >= 1, f"{op}: no random case is rejected"


def test_self_random_cases_cover_the_grid():
    """Every type combination of every op and every layout occur (rejections: the test above)."""
    for op in ALL_OPS:
        spec = ort_ops.get_spec(op)
        cases = random_cases(op)
        seen = {tuple(np.asarray(x).dtype for x in c["inputs"]) for c in cases}
        for kernel in spec.kernels:
            t = np.dtype(ort_ops.spec.numpy_dtype(kernel["T"])) if "T" in kernel else F32
            assert any(types[0 if op != cs.DW_BPI else 1] == t for types in seen), (op, t)
        if any(a.name == "data_format" for a in spec.attrs):
            formats = {c["attrs"].get("data_format", "NHWC") for c in cases}
            assert formats == set(spec.attr("data_format").choices), (op, formats)


def _doctored(outcome, k, fn):
    outs = list(outcome.outputs)
    outs[k] = fn(np.array(outs[k], copy=True))
    return cs.Outcome(tuple(outs), None, dict(outcome.providers))


def _flip_low_bit(a, where=0):
    uint = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    a.reshape(-1).view(uint)[where] ^= uint(1)
    return a


def _first(a, predicate):
    idx = np.flatnonzero(predicate(a.astype(np.float64)).reshape(-1))
    return int(idx[0]) if idx.size else None


def test_self_doctored_results_fail():
    """The judge catches what a wrong kernel would do, and lets pass what the rules allow."""
    rng = _rng("doctored")
    target = cs.CPU_BOUND
    # quantization: one ulp, a NaN payload, a signed zero, a summed gradient's last bit
    x = sprinkle(rng, grid_values(rng, (6, 50), F32, -6, 6, 255), specials(rng, F32, -6, 6), 0.1)
    x.reshape(-1)[:3] = [0.0, -0.0, 0.5]
    g = rng.standard_normal(x.shape).astype(F32)
    g.reshape(-1)[2] = nans(rng, 1, F32)[0]  # in range: the NaN (and its payload) reaches backprops_wrt_input
    op = "FakeQuantWithMinMaxVarsGradient"
    inputs = [g, x, np.float32(-6), np.float32(6)]
    want = cs.run(cs.CPU, op, inputs, {})
    got = cs.run(target, op, inputs, {})
    assert cs.judge(op, inputs, {}, target, want, got) == []
    nan_at = _first(want.outputs[0], np.isnan)
    finite_at = _first(want.outputs[0], lambda a: np.isfinite(a) & (a != 0))
    assert nan_at is not None and finite_at is not None
    for k, where in ((0, finite_at), (0, nan_at), (1, 0), (2, 0)):
        bad = _doctored(got, k, lambda a: _flip_low_bit(a, where))
        assert cs.judge(op, inputs, {}, target, want, bad), (k, where)
    zero = cs.run(target, "FakeQuantWithMinMaxArgs", [x], {})
    z_want = cs.run(cs.CPU, "FakeQuantWithMinMaxArgs", [x], {})
    zero_at = _first(z_want.outputs[0], lambda a: a == 0)
    flip_sign = lambda a: (a.reshape(-1).__setitem__(zero_at, -a.reshape(-1)[zero_at]), a)[1]  # noqa: E731
    assert cs.judge("FakeQuantWithMinMaxArgs", [x], {}, target, z_want, _doctored(zero, 0, flip_sign))

    # depthwise forward: bit-exact, but a NaN's payload may differ; the filter gradient: a tolerance
    xd = sprinkle(rng, rng.standard_normal((1, 6, 6, 3)), np.array([np.nan]), 0.05).astype(F32)
    fd = rng.standard_normal((3, 3, 3, 1)).astype(F32)
    same = {"strides": [1, 1, 1, 1], "padding": "SAME"}
    want = cs.run(cs.CPU, cs.DW_FWD, [xd, fd], same)
    got = cs.run(target, cs.DW_FWD, [xd, fd], same)
    assert cs.judge(cs.DW_FWD, [xd, fd], same, target, want, got) == []
    at_nan, at_num = _first(want.outputs[0], np.isnan), _first(want.outputs[0], np.isfinite)
    assert not cs.judge(cs.DW_FWD, [xd, fd], same, target, want, _doctored(got, 0, lambda a: _flip_low_bit(a, at_nan)))
    assert cs.judge(cs.DW_FWD, [xd, fd], same, target, want, _doctored(got, 0, lambda a: _flip_low_bit(a, at_num)))
    xf = rng.standard_normal((2, 8, 8, 3)).astype(F32)
    dy = rng.standard_normal((2, 8, 8, 3)).astype(F32)
    bpf_in = [xf, np.array(fd.shape, np.int32), dy]
    want = cs.run(cs.CPU, cs.DW_BPF, bpf_in, same)
    got = cs.run(target, cs.DW_BPF, bpf_in, same)
    assert not cs.judge(cs.DW_BPF, bpf_in, same, target, want, _doctored(got, 0, lambda a: _flip_low_bit(a, 0)))
    assert cs.judge(cs.DW_BPF, bpf_in, same, target, want, _doctored(got, 0, lambda a: a * np.float32(1.001)))

    # batch norm: a few ulps pass, a relative 1e-4 does not
    xb = rng.standard_normal((2, 4, 4, 5)).astype(F32)
    c5 = np.ones(5, F32)
    bn_in = [xb, c5, c5 * 0.5, c5 * 0, c5]
    want = cs.run(cs.CPU, "FusedBatchNormV3", bn_in, {})
    got = cs.run(target, "FusedBatchNormV3", bn_in, {})
    assert not cs.judge("FusedBatchNormV3", bn_in, {}, target, want, _doctored(got, 0, lambda a: _flip_low_bit(a, 3)))
    assert cs.judge("FusedBatchNormV3", bn_in, {}, target, want, _doctored(got, 0, lambda a: a * np.float32(1.0001) + 1e-4))

    # rejections: a different message, an acceptance, a rejection; and the placement
    bad_in, bad_attrs = [x], {"min": 1.0, "max": -1.0}
    rejected = cs.run(cs.CPU, "FakeQuantWithMinMaxArgs", bad_in, bad_attrs)
    assert rejected.error and "FakeQuantWithMinMaxArgs" in rejected.error
    assert cs.judge("FakeQuantWithMinMaxArgs", bad_in, bad_attrs, target, rejected,
                    cs.run(target, "FakeQuantWithMinMaxArgs", bad_in, bad_attrs)) == []
    other = cs.Outcome(None, rejected.error.replace("min", "lower end"))
    assert cs.judge("FakeQuantWithMinMaxArgs", bad_in, bad_attrs, target, rejected, other)
    assert cs.judge("FakeQuantWithMinMaxArgs", bad_in, bad_attrs, target, rejected, z_want)
    assert cs.judge("FakeQuantWithMinMaxArgs", [x], {}, target, z_want, rejected)
    elsewhere = cs.Outcome(zero.outputs, None, {"FakeQuantWithMinMaxArgs": {cs.CPU_EP}})
    assert cs.judge("FakeQuantWithMinMaxArgs", [x], {}, cs.CUDA, z_want, elsewhere)
    unseen = cs.Outcome(zero.outputs, None, {})
    assert cs.judge("FakeQuantWithMinMaxArgs", [x], {}, target, z_want, unseen)


def test_self_golden_check_catches_tf_disagreement():
    """A result equal to the CPU's but not TF's (a doctored golden) fails the golden part of the judge."""
    op = "FakeQuantWithMinMaxArgs"
    case = next(c for c in load_cases(op) if "error" not in c and c["outputs"][0].size)
    got = cs.run(cs.CPU_BOUND, op, case["inputs"], case["attrs"])
    assert cs.judge(op, case["inputs"], case["attrs"], cs.CPU_BOUND, got, got, case) == []
    doctored = dict(case, outputs=[_flip_low_bit(np.array(case["outputs"][0], copy=True))])
    assert cs.judge(op, case["inputs"], case["attrs"], cs.CPU_BOUND, got, got, doctored)


def test_self_messages_normalized():
    a = ("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Non-zero status code returned while running "
         "FakeQuantWithMinMaxArgs node. Name:'FakeQuantWithMinMaxArgs' Status Message: FakeQuantWithMinMaxArgs: "
         "min has to be smaller than max, was: 1 >= -1")
    assert cs.normalized_message(a) == "FakeQuantWithMinMaxArgs: min has to be smaller than max, was: 1 >= -1"
    assert cs.normalized_message("x on CUDAExecutionProvider") == cs.normalized_message("x on CPUExecutionProvider")


@pytest.mark.parametrize("config", graph_configs()[::3] + graph_configs()[-1:], ids=lambda c: c[0])
def test_self_graph_procedure_on_cpu(config):
    """The CUDA-graph test's procedure (fixed bindings, inputs overwritten in place, A A B A) on the CPU EP."""
    assert graph_check(cs.CPU_BOUND, config) == []


def test_self_determinism_procedure_on_cpu():
    assert determinism_check(cs.CPU_BOUND, determinism_configs()[0]) == []


def test_self_backends_cuda_runner_is_registered():
    import backends

    assert "cuda" not in backends.BACKENDS  # it needs a GPU: not in the fixture that every machine runs
    assert backends.run_cuda is not None


# ====================================================================================== the GPU benchmark


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_cuda", ROOT / "benchmarks" / "bench_cuda.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)  # the import check: needs neither torch nor a GPU
    return module


def test_bench_cuda_help_runs_without_a_gpu():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_cuda.py"), "--help"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "16x56x56x128" in out.stdout and "--suite" in out.stdout and "without a gpu" in out.stdout.lower()


def test_bench_cuda_cpu_side():
    """The benchmark's cases, byte counts and table, which need no GPU."""
    bench = _bench_module()
    cases = bench.make_cases(quick=True)
    assert {c.op for c in cases} == set(ALL_OPS)
    assert {c.config.split()[0] for c in cases} == {"2x8x8x16", "MobileNetV2"}
    fq = next(c for c in cases if c.op == "FakeQuantWithMinMaxVars")
    assert fq.constant_inputs == (1, 2) and fq.bytes_moved == 2 * fq.inputs[0].nbytes + 8  # x, y, min, max
    dw = next(c for c in cases if c.op == cs.DW_BPI)
    assert dw.constant_inputs == (0, 1)  # input_sizes and the (small) filter are initializers
    assert dw.bytes_moved == dw.inputs[1].nbytes + dw.inputs[2].nbytes + 4 * int(np.prod(dw.inputs[0]))
    assert {c.goal for c in cases if c.op.startswith("FusedBatchNormV3")} == {"bandwidth", "torch"}
    fast = bench.Row(fq, kernel_us=10.0, copy_us=9.0, ort_call_us=40.0, torch_us=12.0, torch_what="fq", check="ok")
    slow = bench.Row(fq, kernel_us=10.0, copy_us=8.0, ort_call_us=40.0, torch_us=9.0, torch_what="fq", check="ok")
    assert fast.goal == "met" and slow.goal.startswith("MISSED") and "80%" in slow.goal and "torch" in slow.goal
    table = bench.markdown_table([fast, slow, bench.Row(dw, None, None, None, check="ERROR x")])
    lines = table.splitlines()
    assert lines[0].startswith("| op | config |") and len(lines) == 5
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    if bench.missing_requirements() is not None:
        assert bench.main(["--quick"]) == 2  # says what is missing and stops
