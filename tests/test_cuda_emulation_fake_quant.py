"""The FakeQuant CUDA kernels run on the host (tests/cuda_emulation/fake_quant/) against the CPU kernels, bit for
bit: every output, NaN bits and the Eigen-order dmin/dmax sums included.

fake_quant.cu is rewritten so that each `<<<...>>>` launch runs its grid on the host (block threads with a real
barrier where a kernel synchronizes) and compiled by g++ with a stand-in cuda_runtime.h; no GPU or nvcc is needed.
What it cannot check: anything only the GPU does (its instructions, memory model, launch limits, speed).
"""
from __future__ import annotations

import subprocess
import sys

from cuda_emulation.build import HOST_FLAGS, INCLUDE, ROOT, build_folder

HERE = ROOT / "tests" / "cuda_emulation" / "fake_quant"
KERNELS = INCLUDE / "kernels"


def test_fake_quant_cuda_kernels_match_the_cpu_kernels_in_emulation():
    cu = KERNELS / "cuda" / "fake_quant.cu"
    sources = [cu, KERNELS / "cuda" / "fake_quant.h", KERNELS / "fake_quant.cc", KERNELS / "fake_quant.h",
               KERNELS / "op_error.h", KERNELS / "eigen_sum.h", KERNELS / "device.h", KERNELS / "simd.h", KERNELS / "simd.cc", KERNELS / "parallel.h",
               HERE / "check.cc", HERE / "transform.py", HERE / "fake" / "cuda_runtime.h"]
    out = build_folder("fq_emu", sources)
    exe = out / "check"
    if not exe.exists():
        emu_cc = out / "fake_quant_emu.cc"
        subprocess.run([sys.executable, str(HERE / "transform.py"), str(cu), str(emu_cc)], check=True)
        emu_flags = ["-O2", "-std=c++20", "-ffp-contract=off", "-fno-fast-math", "-fno-trapping-math",
                     "-fno-math-errno", f"-I{HERE / 'fake'}", f"-I{INCLUDE}"]
        cpu_flags = [*HOST_FLAGS, "-DNDEBUG", "-fno-trapping-math", "-fno-math-errno"]
        subprocess.run(["g++", *emu_flags, "-c", str(emu_cc), "-o", str(out / "emu.o")], check=True)
        subprocess.run(["g++", *emu_flags, "-c", str(HERE / "check.cc"), "-o", str(out / "check.o")], check=True)
        subprocess.run(["g++", *cpu_flags, "-c", str(KERNELS / "fake_quant.cc"), "-o", str(out / "cpu.o")], check=True)
        subprocess.run(["g++", *cpu_flags, "-c", str(KERNELS / "simd.cc"), "-o", str(out / "simd.o")], check=True)
        subprocess.run(["g++", str(out / "check.o"), str(out / "emu.o"), str(out / "cpu.o"), str(out / "simd.o"), "-o",
                        str(exe), "-lpthread"], check=True)
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=1200)
    summary = [line for line in result.stdout.splitlines() if line.startswith("cases ")]
    assert result.returncode == 0 and summary, result.stdout[-4000:] + result.stderr[-2000:]
    cases, fails = int(summary[-1].split()[1]), int(summary[-1].split()[3])
    assert fails == 0 and cases >= 600, summary[-1]
