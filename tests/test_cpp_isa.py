"""The C++ kernels give the same bits on every vector ISA path (AVX-512, AVX2, SSE2; docs/cpu.md).

The library compiles its hot loops once per ISA and picks one per process: the CPU's best, capped by
the environment variable TFOPS_ISA. Each test here forces a path in a child process and first checks,
through ``ort_ops.library.cpu_isa()``, that the child really ran it (a cap the CPU cannot honour, or
a build without dispatch, would otherwise compare a path with itself). Paths the CPU lacks are
skipped.

* ``test_paths_agree_bit_for_bit``: a battery of every op (odd sizes around the 4-, 8- and 16-lane
  vector widths, the batch-norm channel groups, every depthwise stride/multiplier kernel, all dtypes,
  NaNs with distinct payloads and signs, infinities, subnormals, signed zeros) is run on each path
  and the outputs must equal the baseline path's bit for bit: NaN payloads and signs included for
  the quantization ops (TF's bits on every input); for batch norm and depthwise, whose spec lets any
  NaN stand for any NaN, NaNs in the same places and every other bit equal.
* ``test_conformance_suite_on_path``: the C++ conformance tests (quantization bit-identical to the
  NumPy kernels, which are TF's bits; batch norm and depthwise bit-identical to theirs) run again in a
  child pytest on each forced path.
"""
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import ort_ops
from ort_ops.library import cpu_isa

ROOT = Path(__file__).resolve().parent.parent
ISAS = ("sse2", "avx2", "avx512")
ORDER = {name: i for i, name in enumerate(ISAS)}


def _child_env(isa):
    env = dict(os.environ, TFOPS_ISA=isa, ORT_OPS_LIBRARY=ort_ops.library_path())
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    return env


def _reported_isa(isa):
    out = subprocess.run([sys.executable, "-c", "from ort_ops.library import cpu_isa; print(cpu_isa())"],
                         env=_child_env(isa), capture_output=True, text=True, check=True, cwd=ROOT)
    return out.stdout.strip()


def _best_isa():
    return cpu_isa() if "TFOPS_ISA" not in os.environ else _reported_isa("avx512")


def _require(isa):
    best = _best_isa()
    if best == "baseline":
        pytest.skip("library built without ISA dispatch (TFOPS_NO_CLONES or not x86-64)")
    if ORDER[isa] > ORDER[best]:
        pytest.skip(f"this CPU's best path is {best}")
    got = _reported_isa(isa)
    assert got == isa, f"TFOPS_ISA={isa} ran the {got} path"


def test_isa_names_and_cap():
    """The report names a known path, the CPU's best without a cap; an unknown value caps nothing."""
    best = _best_isa()
    assert best in ISAS + ("baseline",)
    if best != "baseline":
        assert _reported_isa("sse2") == "sse2"
        assert _reported_isa("no-such-isa") == best


# ---------------------------------------------------------------- the battery (runs in the child)

F32 = np.float32


def _nans(dtype):
    """Quiet NaNs with distinct payloads and both signs (float32/float64), so a swapped operand shows."""
    if dtype == np.float32:
        bits = np.array([0x7FC00001, 0xFFC00abc, 0x7FD12345, 0xFFE00007], np.uint32)
        return bits.view(np.float32)
    if dtype == np.float64:
        bits = np.array([0x7FF8000000000001, 0xFFF80000000ABCDE, 0x7FF9123456789ABC], np.uint64)
        return bits.view(np.float64)
    return np.array([np.nan, -np.nan], dtype)


def _specials(dtype):
    """float32/float64 values where the arithmetic is delicate (16-bit cases are cast from float32)."""
    tiny = np.finfo(dtype).tiny
    return np.concatenate([
        np.array([0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, 0.5, -2.5, 1e30, tiny / 4, -tiny / 4, tiny, -tiny], dtype),
        _nans(dtype),
    ])


def _values(rng, shape, dtype, scale=3.0, special_fraction=0.05):
    x = (rng.standard_normal(shape) * scale).astype(np.float64)
    x = x.astype(dtype)
    flat = x.reshape(-1)
    if flat.size:
        sp = _specials(dtype)
        k = max(1, int(flat.size * special_fraction))
        flat[rng.choice(flat.size, size=min(k, flat.size), replace=False)] = rng.choice(sp, size=min(k, flat.size))
    return x


def battery():
    """(name, op, inputs, attrs) for every op: deterministic, so every child builds the same cases."""
    rng = np.random.default_rng(20240613)
    cases = []
    # FakeQuant: sizes around the vector widths, a NaN grid (infinite range) and a normal one.
    for n in (1, 7, 15, 16, 17, 33, 100, 1031):
        x, g = _values(rng, (n,), F32), _values(rng, (n,), F32, 1.0)
        for lo, hi in ((-6.0, 6.0), (-0.3, 2.7), (-np.inf, 1.0)):
            a = {"min": lo, "max": hi, "num_bits": 8, "narrow_range": False}
            cases.append((f"args {n} {lo}", "FakeQuantWithMinMaxArgs", [x], a))
            cases.append((f"argsgrad {n} {lo}", "FakeQuantWithMinMaxArgsGradient", [g, x], a))
            v = [F32(lo), F32(hi)]
            cases.append((f"vars {n} {lo}", "FakeQuantWithMinMaxVars", [x] + v, {"num_bits": 5}))
            cases.append((f"varsgrad {n} {lo}", "FakeQuantWithMinMaxVarsGradient", [g, x] + v, {"num_bits": 5}))
    for rows, ch in ((3, 17), (40, 16), (9, 130), (300, 5)):
        x, g = _values(rng, (rows, ch), F32), _values(rng, (rows, ch), F32, 1.0)
        mins = np.linspace(-6, -0.5, ch).astype(F32)
        maxs = np.linspace(0.5, 6, ch).astype(F32)
        mins[0] = maxs[0] = 0
        if ch > 2:
            mins[1], maxs[2] = np.nan, np.inf
        a = {"num_bits": 8, "narrow_range": True}
        cases.append((f"pc {rows}x{ch}", "FakeQuantWithMinMaxVarsPerChannel", [x, mins, maxs], a))
        cases.append((f"pcgrad {rows}x{ch}", "FakeQuantWithMinMaxVarsPerChannelGradient", [g, x, mins, maxs], a))
    # QuantizeAndDequantize: per tensor and per axis, both round modes, given and data ranges.
    for dtype in (np.float32, np.float64):
        for shape, axis in (((1031,), -1), ((33, 17), 1), ((5, 130), 1), ((4, 9, 3), 1)):
            x, g = _values(rng, shape, dtype), _values(rng, shape, dtype, 1.0)
            depth = 1 if axis == -1 else shape[axis]
            lo = -np.linspace(0.5, 4, depth).astype(dtype)
            hi = np.linspace(1, 5, depth).astype(dtype)
            if depth > 2:
                hi[1] = np.nan
            mn, mx = (lo.reshape(()), hi.reshape(())) if axis == -1 else (lo, hi)
            for given in (True, False):
                for mode in ("HALF_TO_EVEN", "HALF_UP"):
                    a = {"signed_input": True, "num_bits": 8, "range_given": given, "narrow_range": False,
                         "axis": axis, "round_mode": mode}
                    cases.append((f"qdq {dtype.__name__} {shape} {given} {mode}", "QuantizeAndDequantizeV4",
                                  [x, mn, mx], a))
            cases.append((f"qdqgrad {dtype.__name__} {shape}", "QuantizeAndDequantizeV4Grad", [g, x, mn, mx],
                          {"axis": axis}))
    # Batch norm: channel counts below, at and around the 16-lane blocks and 64-channel groups.
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
        for shape in ((2, 3, 5, 8), (1, 4, 5, 17), (3, 4, 4, 64), (2, 5, 3, 72), (1, 3, 7, 130), (2, 2, 2, 128)):
            for fmt in ("NHWC", "NCHW"):
                if dtype != np.float32 and fmt == "NCHW" and shape[-1] > 64:
                    continue
                sh = shape if fmt == "NHWC" else (shape[0], shape[3], shape[1], shape[2])
                c = shape[-1]
                x = _values(rng, sh, np.float32, 2.0, 0.01).astype(dtype)
                dy = _values(rng, sh, np.float32, 1.0, 0.01).astype(dtype)
                scale = rng.uniform(0.5, 1.5, c).astype(F32)
                offset = rng.standard_normal(c).astype(F32)
                mean = rng.standard_normal(c).astype(F32)
                var = rng.random(c).astype(F32)
                scale[0] = np.nan
                for training in (True, False):
                    a = {"epsilon": 0.001, "data_format": fmt, "is_training": training,
                         "exponential_avg_factor": 0.7 if c % 2 else 1.0}
                    cases.append((f"bn {np.dtype(dtype).name} {sh} {fmt} {training}", "FusedBatchNormV3",
                                  [x, scale, offset, mean, var], a))
                    ga = {"epsilon": 0.001, "data_format": fmt, "is_training": training}
                    cases.append((f"bngrad {np.dtype(dtype).name} {sh} {fmt} {training}", "FusedBatchNormGradV3",
                                  [dy, x, scale, mean, var, np.zeros(0, F32)], ga))
    # The fused batch norm -> clip -> fake quant: rows and planes around the vector widths, both quantizers,
    # a NaN grid (infinite range) and Vars' zero range; a NaN scale where two NaNs meet (batch norm's rule).
    for shape, fmt in (((2, 3, 5, 17), "NHWC"), ((1, 4, 5, 64), "NHWC"), ((2, 17, 3, 5), "NCHW"),
                       ((1, 40, 9, 13), "NCHW"), ((3, 2, 2, 130), "NHWC")):
        c = shape[1] if fmt == "NCHW" else shape[-1]
        x = _values(rng, shape, F32, 4.0)
        stats = [rng.uniform(0.5, 1.5, c).astype(F32), rng.standard_normal(c).astype(F32),
                 rng.standard_normal(c).astype(F32), rng.random(c).astype(F32)]
        stats[0][0] = np.nan
        for quantizer in ("FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxArgs"):
            for lo, hi in ((-0.7, 5.3), (-np.inf, 6.0), (0.0, 0.0)):
                if quantizer.endswith("Args") and not lo < hi:
                    continue
                a = {"epsilon": 0.001, "data_format": fmt, "clip_min": 0.0, "clip_max": 6.0, "fake_quant": quantizer}
                cases.append((f"fused {shape} {fmt} {quantizer} {lo}", "FusedBatchNormClipFakeQuant",
                              [x] + stats + [np.array(lo, F32), np.array(hi, F32)], a))
    # Depthwise: every stride and multiplier kernel, channel counts around the 64-channel filter blocks.
    for dtype in (np.float32, np.float64, np.float16, ml_dtypes.bfloat16):
        for (h, w, c, m, stride) in ((7, 9, 16, 1, 1), (8, 8, 64, 1, 2), (9, 7, 32, 2, 1), (6, 11, 32, 2, 2),
                                     (5, 5, 3, 3, 2), (10, 10, 80, 1, 2)):
            x = _values(rng, (2, h, w, c), np.float32, 1.0, 0.02).astype(dtype)
            f = _values(rng, (3, 3, c, m), np.float32, 0.5, 0.02).astype(dtype)
            a = {"strides": [1, stride, stride, 1], "padding": "SAME"}
            ho, wo = -(-h // stride), -(-w // stride)
            dy = _values(rng, (2, ho, wo, c * m), np.float32, 1.0, 0.02).astype(dtype)
            name = f"{np.dtype(dtype).name} {h}x{w}x{c} m{m} s{stride}"
            cases.append((f"dw {name}", "DepthwiseConv2dNative", [x, f], a))
            cases.append((f"dwin {name}", "DepthwiseConv2dNativeBackpropInput", [np.array(x.shape, np.int32), f, dy], a))
            cases.append((f"dwf {name}", "DepthwiseConv2dNativeBackpropFilter", [x, np.array(f.shape, np.int32), dy], a))
    return cases


def run_battery(out_path):
    """Child side: run every case through ONNX Runtime and save the outputs' raw bytes."""
    from backends import run_ort

    results = {}
    for name, op, inputs, attrs in battery():
        outs = run_ort(op, inputs, attrs, threads=2)
        for k, o in enumerate(outs):
            o = np.ascontiguousarray(o)
            results[f"{name} | {op} | {k} | {o.dtype.name}"] = np.frombuffer(o.tobytes(), np.uint8)
    np.savez(out_path, **results)
    print(json.dumps({"isa": __import__("ort_ops.library", fromlist=["cpu_isa"]).cpu_isa(), "cases": len(results)}))


def _run_path(isa, tmp_path):
    out = tmp_path / f"{isa}.npz"
    code = f"import sys; sys.path.insert(0, {str(ROOT / 'tests')!r}); import test_cpp_isa as t; t.run_battery({str(out)!r})"
    proc = subprocess.run([sys.executable, "-c", code], env=_child_env(isa), capture_output=True, text=True,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["isa"] == isa, f"TFOPS_ISA={isa} ran the {report['isa']} path"
    return dict(np.load(out))


# Families whose spec promises bit-identical values but lets any NaN stand for any NaN
# (docs/semantics.md sections 3 and 4; their conformance tests compare that way): where two NaNs meet
# in one operation, which payload survives depends on the operand order each ISA copy's code has.
# The prefix takes in FusedBatchNormClipFakeQuant too: its quantizer passes on the batch norm's NaN.
NAN_AS_ONE = ("FusedBatchNorm", "Depthwise")


def _same(key, a, b):
    if np.array_equal(a, b):
        return True
    op, dtype = key.split(" | ")[1], key.split(" | ")[3]
    if not op.startswith(NAN_AS_ONE) or a.size != b.size:
        return False  # quantization: every bit, NaN payloads and signs included
    t = {"float16": np.float16, "float32": np.float32, "float64": np.float64, "bfloat16": ml_dtypes.bfloat16}[dtype]
    u = {2: np.uint16, 4: np.uint32, 8: np.uint64}[np.dtype(t).itemsize]
    x, y = a.view(t), b.view(t)
    nan_x, nan_y = np.isnan(x.astype(np.float64)), np.isnan(y.astype(np.float64))
    return np.array_equal(nan_x, nan_y) and np.array_equal(x.view(u)[~nan_x], y.view(u)[~nan_y])


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_paths_agree_bit_for_bit(isa, tmp_path):
    _require(isa)
    base = _run_path("sse2", tmp_path)
    got = _run_path(isa, tmp_path)
    assert base.keys() == got.keys()
    bad = [k for k in base if not _same(k, base[k], got[k])]
    assert not bad, f"{len(bad)} of {len(base)} outputs differ from the sse2 path, e.g. {bad[:5]}"
    assert len(base) > 500  # the battery ran whole


@pytest.mark.parametrize("isa", ["sse2", "avx2", "avx512"])
def test_conformance_suite_on_path(isa):
    _require(isa)
    files = ["tests/test_cpp_quantization.py", "tests/test_cpp_batch_norm.py", "tests/test_cpp_depthwise.py",
             "tests/test_cpp_fused.py"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files],
                          env=_child_env(isa), capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout
