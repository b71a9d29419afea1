"""The FusedBatchNormClipFakeQuant CUDA kernel runs on the host (tests/cuda_emulation/fused/) against the CPU
kernel, bit for bit: every output, NaN payloads included, for both layouts, both quantizers, several clip
bounds, zero and NaN grids, special inputs and statistics, odd sizes and misaligned buffers.

fused.cu is rewritten so that each `<<<...>>>` launch runs its whole grid on the host (fused/fake/cuda_runtime.h,
flush-to-zero on) and compiled by g++ five times over (check.cc says how each copy differs): as written; with
the hardware arithmetic replaced by a model of the GPU's, whose NaN results are all the canonical NaN (the
host's are x86's, so without the model a kernel that let a hardware NaN through would pass); that with tiny
grid caps; and two wrong kernels that must fail (no x86 recompute of NaN results; the recompute through
fused.h's BatchNormClipFakeQuantElement<kDivide, FakeQuantX86Ops>, whose Normalize gives the GPU's NaN), plus
the real kernel with its clip bounds dropped, which must fail too. The CPU kernel is compiled with the
library's flags and the check runs once per CPU ISA copy (TFOPS_ISA), since the CPU kernel has one per ISA.
Two kinds of elements are counted apart instead of failed, and only where the CUDA kernel's bits are the
written operand order's: two NaNs meeting in the CPU kernel's k (its vectorized loop swaps the product) and,
on the SSE2 copy only, in its batch norm (check.cc, CpuSwappedOperands). No GPU and no nvcc are needed.
What it cannot check: anything only the GPU does (its instructions, memory model, launch limits, speed).
"""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from cuda_emulation.build import HOST_FLAGS, INCLUDE, ROOT, build_folder

HERE = ROOT / "tests" / "cuda_emulation" / "fused"
KERNELS = INCLUDE / "kernels"
CU = KERNELS / "cuda" / "fused.cu"
LAUNCH = re.compile(r"([A-Za-z_][\w:]*(?:<[^<>;]*>)?)<<<(.*?),\s*(\w+),\s*0,\s*stream>>>\((.*?)\);", re.S)

# The CPU kernel's object files, compiled as CMakeLists.txt compiles the library (Release).
CPU_FLAGS = ["-O3", "-DNDEBUG", "-std=c++17", "-fPIC", "-ffp-contract=off", "-fno-fast-math", "-fno-trapping-math",
             "-fno-math-errno", f"-I{INCLUDE}"]
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
CPU_SOURCES = [KERNELS / "fused.cc", KERNELS / "fake_quant.cc", KERNELS / "fake_quant_checks.cc", KERNELS / "simd.cc"]

# Each emulated copy of fused.cu: (namespace, [(old, new), ...]); each `old` must occur exactly once.
GPU_NAN = [
    ("fused::BatchNormClipFakeQuantElement<kDivide>(", "::emu_gpu::BatchNormClipFakeQuantElement<kDivide>("),
    ("batch_norm::ScaleFactor(", "::emu_gpu::ScaleFactor("),
]
VARIANTS = {
    "main": [],
    "gpu_nan": GPU_NAN,
    "gpu_nan_small_grids": GPU_NAN + [
        ("constexpr i64 kMaxBlocksX = i64(1) << 20;", "constexpr i64 kMaxBlocksX = 3;"),
        ("constexpr i64 kMaxGridY = 65535;", "constexpr i64 kMaxGridY = 2;"),
    ],
    "no_recompute": GPU_NAN + [("if (!FakeQuantIsNan(y)) return y;", "return y;")],
    "header_recompute": GPU_NAN + [("return ExactElement<kDivide>(", "return ::emu_gpu::HeaderX86Element<kDivide>(")],
}
MUST_PASS = ("main", "gpu_nan", "gpu_nan_small_grids")
MUST_FAIL = ("no_recompute", "header_recompute", "clip_skipped")


def emulated_source(text: str, name: str) -> str:
    """fused.cu for the emulator: each launch a call of emu::Launch, the variant's changes, its own namespace."""
    text, launches = LAUNCH.subn(lambda m: f"::emu::Launch(dim3({m[2]}), dim3({m[3]}), [&] {{ {m[1]}({m[4]}); }});",
                                 text)
    assert launches == text.count("::emu::Launch(") == 2 and "<<<" not in text, "every launch rewritten"
    changes = list(VARIANTS[name])
    if name != "main":
        changes += [("namespace cuda {\n", f"namespace cuda {{\nnamespace {name} {{\n"),
                    ("}  // namespace cuda\n", f"}}  // namespace {name}\n}}  // namespace cuda\n")]
    for old, new in changes:
        assert text.count(old) == 1, f"{name}: {old!r} must occur once in fused.cu"
        text = text.replace(old, new)
    return text


def build() -> os.PathLike:
    sources = [CU, KERNELS / "cuda" / "fused.h", KERNELS / "cuda" / "common.cuh", *CPU_SOURCES, KERNELS / "fused.h",
               KERNELS / "fake_quant.h", KERNELS / "batch_norm.h", KERNELS / "eigen_sum.h", KERNELS / "op_error.h",
               KERNELS / "device.h", KERNELS / "simd.h", KERNELS / "parallel.h", KERNELS / "half.h",
               HERE / "check.cc", HERE / "fake" / "cuda_runtime.h", ROOT / "tests" / "test_cuda_emulation_fused.py"]
    out = build_folder("fused_emu", sources)
    exe = out / "check"
    if exe.exists():
        return exe
    cu = CU.read_text()
    for name in VARIANTS:
        (out / f"fused_emu_{name}.inc").write_text(emulated_source(cu, name))
    objects = []
    for src in CPU_SOURCES:
        obj = out / f"cpu_{src.stem}.o"
        subprocess.run(["g++", *CPU_FLAGS, "-c", str(src), "-o", str(obj)], check=True)
        objects.append(obj)
    # The emulated kernels: the fake runtime's directory first, so that <cuda_runtime.h> is the fake one.
    # -fno-strict-aliasing: the kernels read floats through float4 pointers, as CUDA code does. AddressSanitizer
    # and UBSan: a kernel reading past x or the statistics, or overflowing an index, stops the program.
    emu_flags = [*HOST_FLAGS, "-DNDEBUG", "-fno-strict-aliasing", "-fno-trapping-math", "-fno-math-errno",
                 *SANITIZE, f"-I{HERE / 'fake'}", f"-I{out}"]
    subprocess.run(["g++", *emu_flags, "-c", str(HERE / "check.cc"), "-o", str(out / "check.o")], check=True)
    tmp = out / f"check.tmp{os.getpid()}"
    subprocess.run(["g++", *SANITIZE, str(out / "check.o"), *map(str, objects), "-o", str(tmp), "-lpthread"],
                   check=True)
    tmp.replace(exe)
    return exe


@pytest.fixture(scope="module")
def check_program():
    return build()


@pytest.mark.parametrize("isa", ["avx512", "avx2", "sse2"])
def test_fused_cuda_kernel_matches_the_cpu_kernel_in_emulation(check_program, isa):
    """Every case bit-identical to the CPU kernel's ISA copy `isa` (capped by TFOPS_ISA: on a CPU without it
    the program reports the copy it ran); the wrong variants caught."""
    env = dict(os.environ, TFOPS_ISA=isa)
    result = subprocess.run([str(check_program)], capture_output=True, text=True, timeout=1200, env=env)
    out = result.stdout
    summary = re.findall(r"^cases (\d+) fails (\d+)$", out, re.M)
    found = re.findall(r"^variant (\w+) cases (\d+) fails (\d+) k_swapped (\d+) sse2_swapped (\d+)$", out, re.M)
    variants = {name: (int(c), int(f)) for name, c, f, _, _ in found}
    sse2_swapped = {name: int(s) for name, _, _, _, s in found}
    assert summary and set(variants) == set(MUST_PASS + MUST_FAIL), out[-4000:] + result.stderr[-2000:]
    cases, fails = map(int, summary[-1])
    assert result.returncode == 0 and fails == 0, out[-6000:] + result.stderr[-2000:]
    assert cases >= 400, summary[-1]
    for name in MUST_PASS:
        assert variants[name] == (cases, 0), (name, variants[name])
    # Only the CPU kernel's SSE2 copy commutes Normalize's operands where two NaNs meet (check.cc,
    # CpuSwappedOperands); the AVX2 and AVX-512 copies and the CUDA kernel keep the written order.
    if "isa sse2" not in out:
        assert sse2_swapped["main"] == 0, sse2_swapped
    for name in MUST_FAIL:
        assert variants[name][1] > 0, f"the wrong variant {name} was not caught: {variants[name]}"
