"""Finding the compiled custom-op library that ships inside this package."""
from __future__ import annotations

import os
from pathlib import Path

LIBRARY_NAME = "libort_tf_ops.so"
ENV_OVERRIDE = "ORT_OPS_LIBRARY"
DISTRIBUTION = "ort-tf-ops"  # the name in pyproject.toml


def library_path() -> str:
    """Path of the ORT custom-op library (``ORT_OPS_LIBRARY`` overrides, e.g. for a sanitizer build)."""
    override = os.environ.get(ENV_OVERRIDE)
    if override:
        if not Path(override).is_file():
            raise FileNotFoundError(f"{ENV_OVERRIDE}={override} does not name a file")
        return override
    here = Path(__file__).resolve().parent / LIBRARY_NAME
    if here.is_file():
        return str(here)
    installed = _installed_copy()
    if installed is not None:
        return installed
    raise FileNotFoundError(
        f"{LIBRARY_NAME} is not in {here.parent}: install the package with `pip install .` so that cpp_ops is built"
    )


def _installed_copy():
    """The library of the installed distribution, for code run from a source checkout (whose
    ``ort_ops`` directory shadows the installed one but holds no compiled library)."""
    from importlib import metadata

    try:
        path = Path(metadata.distribution(DISTRIBUTION).locate_file(f"ort_ops/{LIBRARY_NAME}"))
    except metadata.PackageNotFoundError:
        return None
    return str(path) if path.is_file() else None


def cuda_kernel_count(path: str | None = None) -> int:
    """How many of the library's kernels are for ONNX Runtime's CUDA execution provider (0 when it was
    built without a CUDA toolkit). Reads the library's own table; needs neither a GPU nor onnxruntime."""
    import ctypes

    return int(ctypes.CDLL(path or library_path()).TfOpsCudaKernelCount())


def cuda_kernels_built(path: str | None = None) -> bool:
    """Whether the library carries CUDA kernels (see ``cuda_kernel_count``). False for a library built without
    them: ``pip install .`` builds them where a CUDA compiler is found (``TFOPS_CUDA=AUTO``), and never with
    ``TFOPS_CUDA=OFF``; ``cuda_build_info()`` says why this library is as it is."""
    return cuda_kernel_count(path) > 0


BUILD_NOTE_SUFFIX = ".build.json"  # libort_tf_ops.so -> libort_tf_ops.build.json, written by CMakeLists.txt


def cuda_build_info(path: str | None = None) -> dict:
    """Which build the library is and why: ``{"library", "cuda_kernels", "cuda_kernel_count", "tfops_cuda",
    "gpu_checked", "reason"}``. ``cuda_kernels`` and the count come from the library itself; the rest from
    the note CMake writes beside it (``libort_tf_ops.build.json``: the TFOPS_CUDA choice, whether the CUDA
    kernels had passed a GPU check when it was built, and CMake's reason), ``None`` where there is no note
    (a library built before the note existed). Needs neither a GPU nor onnxruntime."""
    import json

    lib = Path(path or library_path())
    count = cuda_kernel_count(str(lib))
    info = {"library": str(lib), "cuda_kernels": count > 0, "cuda_kernel_count": count,
            "tfops_cuda": None, "gpu_checked": None, "reason": None}
    note = lib.with_name(lib.name.split(".so")[0] + BUILD_NOTE_SUFFIX)
    if note.is_file():
        recorded = json.loads(note.read_text())
        info.update({k: recorded.get(k) for k in ("tfops_cuda", "gpu_checked", "reason")})
        if bool(recorded.get("cuda_kernels")) != info["cuda_kernels"]:
            info["reason"] = f"(the note beside the library is stale: {note}) {info['reason']}"
    return info


def cpu_isa(path: str | None = None) -> str:
    """The vector ISA the library's CPU kernels run with in this process: "avx512", "avx2" or "sse2"
    ("baseline" for a build without ISA dispatch). The best the CPU has unless the environment
    variable ``TFOPS_ISA`` (avx512, avx2 or sse2, read once when a kernel first runs) caps it; see
    docs/cpu.md. Needs neither onnxruntime nor a session."""
    import ctypes

    fn = ctypes.CDLL(path or library_path()).TfOpsCpuIsa
    fn.restype = ctypes.c_char_p
    return fn().decode()


def session_options(**kwargs):
    """``onnxruntime.SessionOptions`` with the library registered; keyword arguments set attributes."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    for k, v in kwargs.items():
        setattr(so, k, v)
    so.register_custom_ops_library(library_path())
    return so
