"""The CUDA depthwise kernels' bodies run on the host (tests/cuda_emulation/depthwise.cu) against the C++ CPU kernels.

No GPU is needed: nvcc compiles cpp_ops/src/kernels/cuda/depthwise.cu into a host library whose entry
point runs each kernel's TFOPS_HD body over the launcher's grid, block shapes and barrier phases. What
this verifies: indexing, tiles and boundaries of every path (NHWC tiles, 32- and 64-bit element
kernels), the tap order and the multiplier sum (Forward and BackpropInput bit-identical to the CPU
kernels), and BackpropFilter's chunk/tree plan (within the suite's tolerance against the CPU kernels,
under several forced plans). What it cannot verify: anything only the GPU does (its float32 .ftz
instructions, cvt rounding, the memory model, launch limits, speed).

Needs nvcc (a CUDA toolkit, no GPU); CI has one.
"""
from __future__ import annotations

import ctypes
import subprocess
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from backends import run_ort
from comparison import assert_bits_equal
from cuda_emulation.build import build_folder, nvcc_or_skip
from ort_ops.conformance.goldens import load_cases
from test_cpp_depthwise import make_attrs
from test_depthwise import assert_close

ROOT = Path(__file__).resolve().parents[1]

FWD = "DepthwiseConv2dNative"
BPI = "DepthwiseConv2dNativeBackpropInput"
BPF = "DepthwiseConv2dNativeBackpropFilter"
OP_CODE = {FWD: 0, BPI: 1, BPF: 2}
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), BF16]
DTYPE_CODE = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3}
TILES, ELEMENTS32, ELEMENTS64 = 0, 1, 2

SOURCES = [
    ROOT / "tests/cuda_emulation/depthwise.cu",
    ROOT / "cpp_ops/src/kernels/cuda/depthwise.cu",
    ROOT / "cpp_ops/src/kernels/cuda/depthwise.h",
    ROOT / "cpp_ops/src/kernels/cuda/common.cuh",
    ROOT / "cpp_ops/src/kernels/depthwise.h",
    ROOT / "cpp_ops/src/kernels/op_error.h",
    ROOT / "cpp_ops/src/kernels/depthwise.cc",
    ROOT / "cpp_ops/src/kernels/depthwise_geometry.cc",
    ROOT / "cpp_ops/src/kernels/depthwise_nchw.cc",
    ROOT / "cpp_ops/src/kernels/simd.h",
    ROOT / "cpp_ops/src/kernels/simd.cc",
    ROOT / "cpp_ops/src/kernels/device.h",
    ROOT / "cpp_ops/src/kernels/half.h",
]


def build_library() -> Path:
    nvcc = nvcc_or_skip()
    out = build_folder("dw_emu", SOURCES)
    lib = out / "libdwemu.so"
    if lib.exists():
        return lib
    out.mkdir(parents=True, exist_ok=True)
    inc = str(ROOT / "cpp_ops/src")
    host = ["-O2", "-std=c++17", "-fPIC", "-ffp-contract=off", "-fno-fast-math", f"-I{inc}"]
    cpu_objects = []
    # The CPU kernels with their geometry, NCHW path and ISA choice.
    for name in ("depthwise", "depthwise_geometry", "depthwise_nchw", "simd"):
        cpu_objects.append(str(out / f"{name}.o"))
        subprocess.run(["g++", *host, "-c", str(ROOT / f"cpp_ops/src/kernels/{name}.cc"), "-o", cpu_objects[-1]],
                       check=True)
    subprocess.run([nvcc, "-std=c++17", "-O2", "-arch=sm_75", "--fmad=false", "-ftz=true", "-Xcompiler",
                    "-fPIC,-ffp-contract=off,-fno-fast-math", f"-I{inc}", "-c", str(SOURCES[0]), "-o",
                    str(out / "emu.o")], check=True)
    subprocess.run([nvcc, "-shared", "-o", str(lib), str(out / "emu.o"), *cpu_objects], check=True)
    return lib


@pytest.fixture(scope="module")
def emu():
    lib = ctypes.CDLL(str(build_library()))
    fn = lib.dw_emu
    i64p = ctypes.POINTER(ctypes.c_int64)
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, i64p, i64p, i64p, ctypes.c_int,
                   i64p, i64p, i64p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong,
                   ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.c_int]
    fn.restype = ctypes.c_int

    def run(op, inputs, attrs, out_shape, dtype, path=-1, index_bits=-1, all_taps=-1, max_partials=1 << 24,
            positions_per_lane=16):
        def arr64(v):
            a = np.ascontiguousarray(np.array(v, np.int64).reshape(-1))
            return a, a.ctypes.data_as(i64p)

        keep = []
        shapes, ptrs = [], []
        for x in inputs:
            x = np.ascontiguousarray(x)
            keep.append(x)
            if x.dtype == np.int32:
                a, p = arr64(x)
                shapes.append(p)
                ptrs.append(None)
            else:
                a, p = arr64(x.shape)
                shapes.append(p)
                ptrs.append(x.ctypes.data)
            keep.append(a)
        while len(shapes) < 3:
            a, p = arr64([0, 0, 0, 0])
            keep.append(a)
            shapes.append(p)
            ptrs.append(None)
        pads = attrs.get("explicit_paddings", [])
        strides, s_p = arr64(attrs["strides"])
        dil, d_p = arr64(attrs.get("dilations", [1, 1, 1, 1]))
        ep, e_p = arr64(pads if pads else [0])
        out = np.zeros(out_shape, dtype)
        # Poison the output so that an element no thread writes is caught: a finite pattern where the
        # comparison is bit for bit (any NaN matches any NaN there), NaN where it is by tolerance.
        out.view(np.uint8)[...] = 0xFF if op == BPF else 0xA5
        chosen = ctypes.c_int(-9)
        err = ctypes.create_string_buffer(1024)
        rc = fn(OP_CODE[op], DTYPE_CODE[np.dtype(dtype).name], attrs.get("data_format", "NHWC").encode(),
                attrs["padding"].encode(), s_p, d_p, e_p, len(pads), shapes[0], shapes[1], shapes[2], ptrs[0],
                ptrs[1], ptrs[2], out.ctypes.data, path, index_bits, all_taps, max_partials, positions_per_lane,
                ctypes.byref(chosen), err, len(err))
        if rc != 0:
            raise ValueError(err.value.decode())
        return out, chosen.value

    return run


def nhwc(attrs):
    return attrs.get("data_format", "NHWC") == "NHWC"


def multiplier(op, inputs):
    if op == BPF:
        return int(inputs[1][3])
    return int(inputs[1].shape[3])


def check(emu, op, inputs, attrs, context):
    want = run_ort(op, inputs, attrs)[0]
    dtype = want.dtype
    if op in (FWD, BPI):
        paths = [-1, ELEMENTS32, ELEMENTS64]
        if nhwc(attrs) and (op == FWD or multiplier(op, inputs) == 1):
            paths.append(TILES)
        for path in paths:
            got, chosen = emu(op, inputs, attrs, want.shape, dtype, path=path)
            assert_bits_equal(want, got, f"{context} path={path} (launcher's choice {chosen})", nan_payloads=False)
        return
    plans = [dict(), dict(index_bits=64), dict(all_taps=0), dict(max_partials=1), dict(positions_per_lane=1),
             dict(positions_per_lane=1, index_bits=64, all_taps=0)]
    f_shape = tuple(int(v) for v in inputs[1])
    if f_shape[:2] == (3, 3):
        plans += [dict(all_taps=1, max_partials=1), dict(all_taps=1, positions_per_lane=1, index_bits=64)]
    first = None
    for plan in plans:
        got, _ = emu(op, inputs, attrs, want.shape, dtype, **plan)
        # the GPU's summation order against the CPU's, by the suite's tolerance
        assert_close(op, got, want, inputs, attrs, f"{context} plan={plan}")
        if first is None:
            first = got
            again, _ = emu(op, inputs, attrs, want.shape, dtype, **plan)
            assert_bits_equal(first, again, f"{context}: the same plan twice", nan_payloads=False)


@pytest.mark.parametrize("op", [FWD, BPI, BPF])
def test_goldens(emu, op):
    cases = [c for c in load_cases(op) if "error" not in c]
    assert len(cases) > 20
    for case in cases:
        check(emu, op, case["inputs"], case["attrs"], f"{op} [{case['note']}]")


def random_case(rng, dtype, fmt):
    n, h, w = int(rng.integers(1, 4)), int(rng.integers(1, 12)), int(rng.integers(1, 40))
    c, m = int(rng.integers(1, 40)), int(rng.choice([1, 1, 1, 2, 3, 8, 9, 17]))
    kh, kw = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    if rng.random() < 0.4:
        kh = kw = 3
    stride = int(rng.integers(1, 4))
    dil = (int(rng.integers(1, 3)), int(rng.integers(1, 3)))
    padding = str(rng.choice(["SAME", "VALID", "EXPLICIT"]))
    pads = [(int(rng.integers(0, 3)), int(rng.integers(0, 3))) for _ in range(2)]
    x = rng.standard_normal((n, h, w, c) if fmt == "NHWC" else (n, c, h, w)).astype(dtype)
    f = rng.standard_normal((kh, kw, c, m)).astype(dtype)
    return x, f, make_attrs(fmt, stride, dil, padding, pads)


def all_three(emu, x, f, attrs, seed, context):
    try:
        y = run_ort(FWD, [x, f], attrs)[0]
    except Exception:
        return  # invalid geometry: the adapter rejects it before any kernel
    check(emu, FWD, [x, f], attrs, f"{FWD} {context}")
    dy = np.random.default_rng(seed).standard_normal(y.shape).astype(x.dtype)
    check(emu, BPI, [np.array(x.shape, np.int32), f, dy], attrs, f"{BPI} {context}")
    check(emu, BPF, [x, np.array(f.shape, np.int32), dy], attrs, f"{BPF} {context}")


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_random(emu, dtype, fmt):
    rng = np.random.default_rng(zlib.crc32(f"emu-{dtype.name}-{fmt}".encode()))
    for i in range(10):
        x, f, attrs = random_case(rng, dtype, fmt)
        all_three(emu, x, f, attrs, int(rng.integers(1 << 30)), f"random {i} {x.shape} {f.shape} {attrs}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize(
    "shape, filt, stride, dil, padding, pads",
    [
        ((2, 13, 70, 40), (3, 3, 40, 1), 1, (1, 1), "SAME", None),  # 3 column tiles, 2 channel tiles
        ((1, 9, 33, 64), (3, 3, 64, 1), 2, (1, 1), "SAME", None),  # stride 2
        ((1, 10, 35, 48), (5, 5, 48, 1), 3, (1, 1), "VALID", None),  # stride 3, 5x5
        ((2, 8, 40, 16), (3, 3, 16, 2), 1, (2, 2), "SAME", None),  # multiplier 2, dilations
        ((1, 6, 37, 20), (3, 2, 20, 1), 2, (1, 3), "EXPLICIT", ((2, 1), (3, 0))),
        ((3, 5, 5, 8), (3, 3, 8, 5), 1, (1, 1), "SAME", None),  # multiplier 5 (tail only)
        ((1, 4, 6, 3), (3, 3, 3, 19), 1, (1, 1), "SAME", None),  # 2 full blocks + tail
        ((1, 2, 2, 33), (3, 3, 33, 1), 1, (1, 1), "EXPLICIT", ((3, 3), (3, 3))),  # taps over padding only
        ((2, 1, 1, 40), (4, 1, 40, 1), 1, (5, 1), "EXPLICIT", ((15, 0), (0, 0))),
    ],
)
def test_shapes(emu, dtype, shape, filt, stride, dil, padding, pads):
    rng = np.random.default_rng(5)
    for fmt in ("NHWC", "NCHW"):
        x = rng.standard_normal(shape).astype(dtype)
        if fmt == "NCHW":
            x = np.ascontiguousarray(np.transpose(x, (0, 3, 1, 2)))
        f = rng.standard_normal(filt).astype(dtype)
        all_three(emu, x, f, make_attrs(fmt, stride, dil, padding, pads), 9, f"{fmt} {shape} {filt}")


def test_special_values(emu):
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-40, 3e38, -3e38, 1.0, 6e-8, -1e-310],
                        np.float64)
    rng = np.random.default_rng(3)
    for dtype in DTYPES:
        for fmt, shape in (("NHWC", (2, 5, 9, 33)), ("NCHW", (2, 33, 5, 9))):
            with np.errstate(over="ignore"):
                x = rng.choice(specials, shape).astype(dtype)
                f = rng.choice(specials, (2, 2, 33, 1)).astype(dtype)
            all_three(emu, x, f, make_attrs(fmt, 1, (1, 1), "SAME"), 4, f"specials {dtype.name} {fmt}")


def test_subnormal_float64_flushes(emu):
    """float64 flushes subnormal operands and results explicitly (the CPU's FTZ/DAZ acts in hardware)."""
    x = np.full((1, 3, 3, 16), 1e-300, np.float64)
    x[0, 0, 0, :] = 5e-324
    f = np.full((2, 2, 16, 1), 1e-10, np.float64)
    f[0, 0, :, 0] = 1e300
    all_three(emu, x, f, make_attrs("NHWC", 1, (1, 1), "SAME"), 2, "float64 subnormals")


def test_huge_coordinates_take_64_bit_indices(emu):
    """Dilation 2^30 with matching padding: tiny tensors, coordinates past int32's range."""
    big = 1 << 30
    x = np.random.default_rng(1).standard_normal((1, 1, 1, 20)).astype(np.float32)
    f = np.random.default_rng(2).standard_normal((2, 1, 20, 1)).astype(np.float32)
    attrs = make_attrs("NHWC", 1, (big, 1), "EXPLICIT", ((big, 0), (0, 0)))
    y = run_ort(FWD, [x, f], attrs)[0]
    assert y.shape == (1, 1, 1, 20)
    got, chosen = emu(FWD, [x, f], attrs, y.shape, y.dtype)
    assert chosen == ELEMENTS64
    assert_bits_equal(y, got, "forward", nan_payloads=False)
    dy = np.ones_like(y)
    for op, ins in ((BPI, [np.array(x.shape, np.int32), f, dy]), (BPF, [x, np.array(f.shape, np.int32), dy])):
        want = run_ort(op, ins, attrs)[0]
        got, chosen = emu(op, ins, attrs, want.shape, want.dtype)
        assert chosen in (ELEMENTS64, 64)
        assert_bits_equal(want, got, op, nan_payloads=False)


def test_negative_zero_sums(emu):
    """Tap sums that round to -0 in float16 keep their sign (so BackpropInput with multiplier 1 must
    not add them to a +0 the way the multiplier sum does)."""
    dtype, tiny = np.dtype(np.float16), 1e-4
    rng = np.random.default_rng(8)
    for fmt, shape in (("NHWC", (1, 4, 9, 40)), ("NCHW", (1, 40, 4, 9))):
        x = (-tiny * rng.uniform(0.5, 1.0, shape)).astype(dtype)
        f = (tiny * rng.uniform(0.5, 1.0, (2, 2, 40, 1))).astype(dtype)
        all_three(emu, x, f, make_attrs(fmt, 1, (1, 1), "SAME"), 6, f"-0 {dtype.name} {fmt}")
        y = run_ort(FWD, [x, f], make_attrs(fmt, 1, (1, 1), "SAME"))[0]
        assert np.signbit(y).all() and not y.astype(np.float64).any(), "the case makes -0 sums"
