"""The QuantizeAndDequantize CUDA kernels' arithmetic and reductions, run on the host
(tests/cuda_emulation/qdq.cc) against the CPU kernels, bit for bit.

What it checks: ExplicitArith (the GPU's arithmetic policy: x86's flush-to-zero and NaN rules written out)
with the FPU in its default mode against NativeArith under FTZ/DAZ; the kernels' index division; the device
range reductions emulated with random groupings against the CPU's Eigen-order reductions; the emulated
forward and V4Grad (per-axis chunking included) against the CPU kernels. What it cannot check: anything only
the GPU does (its instructions, memory model, launch limits).
"""
from __future__ import annotations

import subprocess

from cuda_emulation.build import INCLUDE, ROOT, build_host_program

KERNELS = INCLUDE / "kernels"


def test_qdq_cuda_arithmetic_and_reductions_match_the_cpu_kernels():
    exe = build_host_program(
        "qdq_emulation",
        ROOT / "tests" / "cuda_emulation" / "qdq.cc",
        [KERNELS / "quantize_dequantize.cc", KERNELS / "simd.cc"],
        [KERNELS / "quantize_dequantize.h", KERNELS / "op_error.h", KERNELS / "qdq_eigen_order.h",
         KERNELS / "cuda" / "quantize_dequantize.h", KERNELS / "simd.h", KERNELS / "device.h", KERNELS / "parallel.h"],
    )
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    lines = [line for line in result.stdout.splitlines() if "checks," in line]
    assert len(lines) >= 4, result.stdout  # arithmetic, divmod, reductions, forward
    for line in lines:
        assert line.rstrip().endswith(" 0 failures"), line
