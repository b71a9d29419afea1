"""Building the host emulations of the CUDA kernels (tests/test_cuda_emulation_*.py).

The CUDA kernels cannot run without a GPU, but their arithmetic and indexing are TFOPS_HD code: these
programs run it on the host (over the launchers' grids where the kernel's structure matters) and compare
it with the CPU kernels. They need a C++ compiler, and nvcc for the ones that compile the .cu files
themselves; CI has both. Outputs go to a folder keyed by the sources' hash, so a rebuild happens only
when a source changed.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "cpp_ops" / "src"
# The CPU kernels' exactness flags (CMakeLists.txt).
HOST_FLAGS = ["-O2", "-std=c++17", "-fPIC", "-ffp-contract=off", "-fno-fast-math", f"-I{INCLUDE}"]


def nvcc_or_skip() -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no CUDA toolkit (nvcc) on PATH: the CUDA kernels are neither built nor emulated here")
    return nvcc


def build_folder(name: str, sources: list[Path]) -> Path:
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / f"tfops_{name}_{digest}"
    out.mkdir(parents=True, exist_ok=True)
    return out


def build_host_program(name: str, main: Path, sources: list[Path], headers: list[Path]) -> Path:
    """g++ build of `main` with `sources` (the CPU kernels it compares with); returns the executable."""
    out = build_folder(name, [main, *sources, *headers])
    exe = out / name
    if not exe.exists():
        tmp = out / f"{name}.tmp{os.getpid()}"
        subprocess.run(["g++", *HOST_FLAGS, str(main), *map(str, sources), "-o", str(tmp), "-lpthread"], check=True)
        tmp.replace(exe)
    return exe
