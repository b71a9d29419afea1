"""The CUDA batch-norm kernels run on the host (tests/cuda_emulation/batch_norm.cc) against TF and the CPU kernels.

No GPU and no nvcc needed: kernels/cuda/batch_norm.cu is compiled by g++ after its launches are rewritten
for tests/cuda_emulation/cuda_host_emu.h, which runs every block's threads as fibers over the launchers'
own grids, plans and barrier phases. What this verifies: the tiling of the two-level column sums (channels
last and first, vector and scalar widths, several tiles, groups and chunks), the fixed summation trees,
the fold's per-channel formulas, the element-wise passes and their indexing, that every output element
and every scratch value read is written (scratch starts as NaN), that every __syncthreads is reached by
the whole block, and determinism (same bits twice, and for misaligned buffers, which take the scalar
loads). Against TF's goldens the tolerances are test_batch_norm.py's; against the CPU kernels the
inference outputs (no sums) must be bit-identical and the rest within those tolerances. What it cannot
verify: anything only the GPU does (its .ftz and cvt instructions, the memory model, launch limits, speed).
"""
from __future__ import annotations

import ctypes
import hashlib
import re
import subprocess
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import ort_ops
from backends import run_ort
from comparison import assert_bits_equal
from cuda_emulation.build import HOST_FLAGS, build_folder
from ort_ops.conformance.goldens import load_cases
from test_batch_norm import ALL_OPS, FORWARD_OPS, assert_close, float64_outputs, golden_compared

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "tests" / "cuda_emulation"
CU = ROOT / "cpp_ops/src/kernels/cuda/batch_norm.cu"
COMMON = ROOT / "cpp_ops/src/kernels/cuda/common.cuh"
SOURCES = [
    HERE / "batch_norm.cc",
    HERE / "cuda_host_emu.h",
    CU,
    COMMON,
    ROOT / "cpp_ops/src/kernels/cuda/batch_norm.h",
    ROOT / "cpp_ops/src/kernels/batch_norm.h",
    ROOT / "cpp_ops/src/kernels/op_error.h",
    ROOT / "cpp_ops/src/kernels/batch_norm.cc",
    ROOT / "cpp_ops/src/kernels/simd.h",
    ROOT / "cpp_ops/src/kernels/simd.cc",
    ROOT / "cpp_ops/src/kernels/device.h",
    ROOT / "cpp_ops/src/kernels/half.h",
]
F32, F16, BF16 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
DTYPE_CODE = {F32: 0, F16: 1, BF16: 2}
LAUNCH = re.compile(r"([A-Za-z_][\w:]*(?:<[^<>;]*>)?)<<<(.*?),\s*(\w+),\s*0,\s*stream>>>\((.*?)\);", re.S)


def emulated_source(text: str) -> tuple[str, int]:
    """The .cu text for the emulator: its CUDA headers swapped, each launch a call of emu::Launch."""
    text = text.replace("#include <cuda_runtime.h>", '#include "cuda_host_emu.h"')
    text = text.replace("#include <cuda_fp16.h>\n", "")
    return LAUNCH.subn(lambda m: f"::emu::Launch(dim3({m[2]}), dim3({m[3]}), [&] {{ {m[1]}({m[4]}); }});", text)


def build_library() -> Path:
    out = build_folder("bn_emu", SOURCES)
    lib = out / "libbnemu.so"
    if lib.exists():
        return lib
    kernels, launches = emulated_source(CU.read_text())
    assert launches == len(re.findall(r"<<<", CU.read_text())) and launches >= 7, "every launch rewritten"
    (out / "batch_norm_cuda_emu.inc").write_text(kernels)
    (out / "kernels" / "cuda").mkdir(parents=True, exist_ok=True)
    (out / "kernels" / "cuda" / "common.cuh").write_text(emulated_source(COMMON.read_text())[0])
    tmp = out / f"libbnemu.tmp{hashlib.sha256(str(out).encode()).hexdigest()[:6]}.so"
    subprocess.run(["g++", f"-I{out}", f"-I{HERE}", *HOST_FLAGS, "-shared", str(HERE / "batch_norm.cc"),
                    str(ROOT / "cpp_ops/src/kernels/batch_norm.cc"), str(ROOT / "cpp_ops/src/kernels/simd.cc"), "-o",
                    str(tmp), "-lpthread"], check=True)
    tmp.replace(lib)
    return lib


@pytest.fixture(scope="module")
def emu():
    lib = ctypes.CDLL(str(build_library()))
    f32p, vp, ll = ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_longlong
    lib.bn_emu_forward.argtypes = [ctypes.c_int, ll, ll, ll, vp, f32p, f32p, f32p, f32p, ctypes.c_float,
                                   ctypes.c_float, ctypes.c_int, vp, f32p, f32p, f32p, f32p, f32p,
                                   ctypes.POINTER(ll), ctypes.c_char_p, ctypes.c_int]
    lib.bn_emu_grad.argtypes = [ctypes.c_int, ll, ll, ll, vp, vp, f32p, f32p, f32p, ctypes.c_float, ctypes.c_int,
                                vp, f32p, f32p, ctypes.POINTER(ll), ctypes.c_char_p, ctypes.c_int]
    return lib


def layout(shape, data_format):
    axis = 1 if data_format in ("NCHW", "NCDHW") else len(shape) - 1
    outer, inner = np.prod(shape[:axis], dtype=np.int64), np.prod(shape[axis + 1:], dtype=np.int64)
    return int(outer), int(shape[axis]), int(inner)


def stat_vector(v, channels):
    """A [C] float32 input as the kernel reads it (an empty unread mean/variance becomes a NaN vector)."""
    v = np.asarray(v, np.float32).reshape(-1)
    return v if v.size == channels else np.full(channels, np.nan, np.float32)


def placed(a: np.ndarray, misalign: int):
    """A copy of `a` starting `misalign` elements into its buffer (so 16-byte loads are not aligned)."""
    buf = np.zeros(a.size + 8, a.dtype)
    view = buf[misalign:misalign + a.size].reshape(a.shape)
    view[...] = a
    return view


def fptr(a):
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


def run_emu(lib, op, inputs, attrs, misalign=0):
    """The op's outputs from the emulated CUDA kernels, shaped as the adapter shapes them."""
    attrs = ort_ops.get_spec(op).with_defaults(attrs)
    fmt, eps, training = attrs["data_format"], float(attrs["epsilon"]), int(attrs["is_training"])
    err = ctypes.create_string_buffer(1024)
    launches = ctypes.c_longlong(0)
    if op in FORWARD_OPS:
        x = placed(np.asarray(inputs[0]), misalign)
        outer, c, inner = layout(x.shape, fmt)
        scale, offset, mean, var = (stat_vector(v, c) for v in inputs[1:5])
        y = placed(np.full(x.shape, np.nan, x.dtype), misalign)
        stats = [np.full(c, -7.0, np.float32) for _ in range(4)]
        rs3 = np.full((), -7.0, np.float32)
        rc = lib.bn_emu_forward(DTYPE_CODE[x.dtype], outer, c, inner, x.ctypes.data, fptr(scale), fptr(offset),
                                fptr(mean), fptr(var), eps, float(attrs["exponential_avg_factor"]), training,
                                y.ctypes.data, *map(fptr, stats), fptr(rs3), ctypes.byref(launches), err, len(err))
        assert rc == 0, err.value.decode()
        outputs = [np.array(y)] + stats + ([rs3] if op.endswith("V3") else [])
    else:
        dy, x = (placed(np.asarray(v), misalign) for v in inputs[:2])
        outer, c, inner = layout(x.shape, fmt)
        scale, rs1, rs2 = (stat_vector(v, c) for v in inputs[2:5])
        dx = placed(np.full(x.shape, np.nan, x.dtype), misalign)
        sums = [np.full(c, -7.0, np.float32) for _ in range(2)]
        rc = lib.bn_emu_grad(DTYPE_CODE[x.dtype], outer, c, inner, dy.ctypes.data, x.ctypes.data, fptr(scale),
                             fptr(rs1), fptr(rs2), eps, training, dx.ctypes.data, *map(fptr, sums),
                             ctypes.byref(launches), err, len(err))
        assert rc == 0, err.value.decode()
        outputs = [np.array(dx)] + sums + [np.zeros((0,), np.float32)] * 2
    return outputs, launches.value


def sums_free(op, attrs):
    """Outputs that involve no column sum: the CUDA kernels compute them as the CPU does, bit for bit."""
    attrs = ort_ops.get_spec(op).with_defaults(attrs)
    if attrs["is_training"]:
        return ()
    return (0, 1, 2, 3, 4) if op in FORWARD_OPS else (0,)


@pytest.mark.parametrize("op", ALL_OPS)
def test_goldens(emu, op):
    """TF's outputs within test_batch_norm.py's tolerances, as the CPU kernels are held to; the outputs
    that need no sum bit-identical to the CPU kernels'; the placeholders as the CPU adapter writes them."""
    cases = [c for c in load_cases(op) if "error" not in c]
    assert len(cases) > 20
    for case in cases:
        what = f"{op} [{case['note']}]"
        got, _ = run_emu(emu, op, case["inputs"], case["attrs"])
        cpu = run_ort(op, case["inputs"], case["attrs"])
        assert len(got) == len(cpu) == len(case["outputs"]), what
        skip = golden_compared(case["outputs"])
        for i, (g, c, w) in enumerate(zip(got, cpu, case["outputs"])):
            if i in skip:
                continue
            assert_close(g, w, f"{what} output {i} (TF)")
            assert_close(g, c, f"{what} output {i} (CPU kernels)")
            if i in sums_free(op, case["attrs"]):
                assert_bits_equal(c, g, f"{what} output {i}", nan_payloads=False)


SHAPES = [
    # channels last: 16-byte vectors or scalars, several tiles and channel groups, 5-D
    ((2, 9, 50, 40), "NHWC"), ((2, 50, 60, 24), "NHWC"), ((1, 7, 20, 128), "NHWC"), ((3, 30, 20, 3), "NHWC"),
    ((2, 40, 50, 1), "NHWC"),
    ((1, 3, 5, 1000), "NHWC"), ((1, 1, 1, 17), "NHWC"), ((16, 1, 1, 8), "NHWC"), ((2, 3, 3, 9), "NHWC"),
    ((2, 2, 3, 3, 16), "NDHWC"),
    # channels first: planes split in chunks, several planes a tile, tiny planes, spatial size 1, 5-D
    ((2, 3, 56, 56), "NCHW"), ((1, 2, 60, 150), "NCHW"), ((1, 3, 32, 64), "NCHW"), ((5, 7, 7, 7), "NCHW"),
    ((40, 6, 1, 2), "NCHW"),
    ((9, 4, 1, 1), "NCHW"), ((3, 16, 4, 4), "NCHW"), ((2, 5, 3, 3, 4), "NCDHW"),
    # empty x, no channels
    ((0, 3, 3, 4), "NHWC"), ((2, 0, 3, 3), "NCHW"), ((2, 3, 3, 0), "NHWC"),
]


def random_inputs(rng, shape, fmt, dtype, specials=False):
    c = shape[1] if fmt.startswith("NC") else shape[-1]
    x = rng.standard_normal(shape) * 4 + 2
    if specials:
        picks = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, 3e38, -1.0, 2.5])
        mask = rng.random(shape) < 0.25
        x[mask] = rng.choice(picks, int(mask.sum()))
    with np.errstate(over="ignore"):
        x = x.astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    stats = [rng.standard_normal(c).astype(np.float32) for _ in range(3)] + [rng.random(c).astype(np.float32)]
    return x, dy, stats


# Up to this many rows the CPU kernels' sequential float32 sums (TF's order) stay within the goldens'
# tolerance of the exact statistics for these inputs; past it they drift by more (about R^1.5 ulps
# for data with a large mean), while the GPU's trees do not, so larger shapes are judged against the
# float64 math instead (test_batch_norm.float64_outputs).
CPU_EXACT_ENOUGH_ROWS = 2048


def compare(op, got, cpu, inputs, attrs, what):
    outer, _, inner = layout(np.shape(inputs[1] if "Grad" in op else inputs[0]), attrs["data_format"])
    exact = float64_outputs(op, inputs, attrs) if outer * inner > CPU_EXACT_ENOUGH_ROWS else None
    for i, (g, c) in enumerate(zip(got, cpu)):
        if i in sums_free(op, attrs):
            assert_bits_equal(c, g, f"{what} {op} output {i}", nan_payloads=False)
        elif exact is None or i >= len(exact):
            assert_close(g, c, f"{what} {op} {attrs} output {i} (CPU kernels)")
        else:
            with np.errstate(all="ignore"):
                want = exact[i].astype(c.dtype)
            assert_close(g, want, f"{what} {op} {attrs} output {i} (float64 math)")


def check_against_cpu(emu, version, x, dy, stats, fmt, what, misalign=0):
    for training, factor in ((True, 1.0), (True, 0.25), (False, 1.0)):
        attrs = dict(epsilon=0.001, exponential_avg_factor=factor, data_format=fmt, is_training=training)
        op = "FusedBatchNorm" + version
        cpu = run_ort(op, [x] + stats, attrs)
        got, _ = run_emu(emu, op, [x] + stats, attrs, misalign)
        compare(op, got, cpu, [x] + stats, attrs, what)
        grad = "FusedBatchNormGrad" + version
        gattrs = dict(epsilon=0.001, data_format=fmt, is_training=training)
        gin = [dy, x, stats[0], cpu[3], cpu[4]] + ([np.zeros((0,), np.float32)] if version == "V3" else [])
        gcpu = run_ort(grad, gin, gattrs)
        ggot, _ = run_emu(emu, grad, gin, gattrs, misalign)
        compare(grad, ggot, gcpu, gin, gattrs, what)


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=lambda d: d.name)
def test_shapes_against_cpu(emu, dtype):
    rng = np.random.default_rng(zlib.crc32(f"bn-emu-{dtype.name}".encode()))
    for shape, fmt in SHAPES:
        x, dy, stats = random_inputs(rng, shape, fmt, dtype)
        check_against_cpu(emu, "V3", x, dy, stats, fmt, f"{dtype.name} {fmt} {shape}")


def test_special_values(emu):
    rng = np.random.default_rng(9)
    for dtype in (F32, F16, BF16):
        for shape, fmt in (((2, 4, 4, 10), "NHWC"), ((2, 10, 4, 4), "NCHW")):
            x, dy, stats = random_inputs(rng, shape, fmt, dtype, specials=True)
            check_against_cpu(emu, "V3", x, dy, stats, fmt, f"specials {dtype.name} {fmt}")


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=lambda d: d.name)
def test_same_bits_twice_and_misaligned(emu, dtype):
    """Deterministic, and the alignment of the buffers (which picks vector or scalar loads) changes no bit."""
    rng = np.random.default_rng(4)
    for shape, fmt in (((2, 9, 50, 40), "NHWC"), ((2, 3, 56, 56), "NCHW"), ((3, 30, 20, 3), "NHWC")):
        x, dy, stats = random_inputs(rng, shape, fmt, dtype)
        for training in (True, False):
            attrs = dict(exponential_avg_factor=0.5, data_format=fmt, is_training=training)
            first, _ = run_emu(emu, "FusedBatchNormV3", [x] + stats, attrs)
            gin = [dy, x, stats[0], first[3], first[4], np.zeros((0,), np.float32)]
            gattrs = dict(data_format=fmt, is_training=training)
            gfirst, _ = run_emu(emu, "FusedBatchNormGradV3", gin, gattrs)
            for misalign in (0, 1, 3):
                again, _ = run_emu(emu, "FusedBatchNormV3", [x] + stats, attrs, misalign)
                gagain, _ = run_emu(emu, "FusedBatchNormGradV3", gin, gattrs, misalign)
                for i, (a, b) in enumerate(zip(first + gfirst, again + gagain)):
                    assert_bits_equal(a, b, f"{dtype.name} {fmt} {shape} training={training} misalign={misalign} #{i}", nan_payloads=False)


def test_launch_counts(emu):
    """Training forward: 2 x (column sums + fold) + normalize; inference forward: one kernel; training
    gradient: sums + fold + dx; inference gradient: sums writing dx + fold; empty x: one kernel."""
    rng = np.random.default_rng(2)
    x, dy, stats = random_inputs(rng, (2, 5, 5, 8), "NHWC", F32)
    expect = {("fwd", True): 5, ("fwd", False): 1, ("grad", True): 3, ("grad", False): 2}
    for training in (True, False):
        out, n = run_emu(emu, "FusedBatchNormV3", [x] + stats, dict(is_training=training))
        assert n == expect[("fwd", training)]
        _, n = run_emu(emu, "FusedBatchNormGradV3", [dy, x, stats[0], out[3], out[4], np.zeros(0, np.float32)],
                       dict(is_training=training))
        assert n == expect[("grad", training)]
    _, n = run_emu(emu, "FusedBatchNormV3", [np.zeros((0, 2, 2, 3), np.float32)] + [s[:3] for s in stats], {})
    assert n == 1


def test_large_batch_sums_closer_to_exact_than_cpu(emu):
    """Many rows (R = 40000) with a large mean: the tree sums stay within 16 float32 ulps of the float64
    statistics. (The CPU's sequential float32 sum, TF's order, drifts further on such shapes, so the GPU
    and CPU results can differ by more than the goldens' tolerance here: compare both with float64.)"""
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((4, 100, 100, 8)) * 4 + 20).astype(np.float32)
    stats = [np.ones(8, np.float32)] * 4
    got, _ = run_emu(emu, "FusedBatchNormV3", [x] + stats, {})
    rows = x.reshape(-1, 8).astype(np.float64)
    for i, want in ((3, rows.mean(axis=0)), (4, rows.var(axis=0))):
        size = max(1.0, float(np.abs(want).max()))
        assert np.abs(got[i] - want).max() <= 16 * 2.0**-23 * size, f"output {i}"
