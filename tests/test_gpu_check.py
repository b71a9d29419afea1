"""scripts/gpu_check.sh, the GPU check of the CUDA kernels, in its CPU mode (what runs where there is no GPU).

The script exports the golden cases (NumPy only), builds cpp_ops/gpu_check without CUDA and runs its CPU half:
every golden case through the adapters' checks and the CPU kernels against TF's outputs by the suite's rules, the
seeded random cases of every op, type and layout on the CPU kernels (thread pool against serial), the coverage of
every registered type combination, and the judge's self-test. These tests make sure that it passes, that a wrong
expected value makes it fail (bit-exact and tolerance rules both), and that the pieces the GPU machine runs need
nothing that machine lacks. No TensorFlow, no onnxruntime, no GPU. The build (about a minute on two cores) goes to
build/gpu_check-test and is reused by later runs.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "gpu_check-test"


def _env(tmp_path, **extra):
    env = dict(os.environ)
    # cmake and ninja from the environment's own bin folder or .venv's first (scripts/setup.sh installs both)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), str(ROOT / ".venv" / "bin"), env.get("PATH", "")])
    env.update(PYTHON=sys.executable, GPU_CHECK_MODE="cpu", GPU_CHECK_BUILD=str(BUILD),
               GPU_LOG_DIR=str(tmp_path / "logs"))
    env.update(extra)
    return env


def _tools_or_skip(env):
    for tool in ("cmake", "c++"):
        if shutil.which(tool, path=env["PATH"]) is None:
            pytest.skip(f"no {tool} on PATH: the GPU check program cannot be built here")


def run_script(tmp_path, **extra):
    env = _env(tmp_path, **extra)
    _tools_or_skip(env)
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """One run of the script in CPU mode: (its output, its log folder)."""
    tmp_path = tmp_path_factory.mktemp("gpu_check")
    return run_script(tmp_path), tmp_path / "logs"


def test_cpu_half_passes(cpu_run):
    out, logs = cpu_run
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert "gpu_check: PASSED (cpu mode)" in out.stdout
    results = json.loads((logs / "gpu_check.json").read_text())
    assert results["ok"] and results["mode"] == "cpu" and results["device"] is None
    # every op and type combination of the library has a row, and every golden case was read
    assert len(results["rows"]) == 41
    golden = sum(r["golden_ran"] + r["golden_rejected"] for r in results["rows"])
    assert golden == sum(1 for _ in _golden_count())
    assert all(r["random_ran"] >= 4 for r in results["rows"]), [r for r in results["rows"] if r["random_ran"] < 4]
    assert results["self_test_checks"] == 20 and not results["self_test_problems"]
    assert not results["coverage_missing"]
    report = json.loads((logs / "gpu_check_report.json").read_text())
    assert report["ok"] and report["table"][0].startswith("| op | type |")
    # what the device tool brings back from $OUT: at most 8 files
    assert len(list(logs.iterdir())) <= 8


def _module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_gpu_mode_report_and_torch_inputs(cpu_run):
    """The GPU-only paths that can run here: the report of a GPU run (its results made from the CPU half's, with
    a device, graphs and timings filled in) and the inputs torch_times.py builds from the timing cases."""
    out, logs = cpu_run
    assert out.returncode == 0, out.stdout[-3000:]
    results = json.loads((logs / "gpu_check.json").read_text())
    tools = ROOT / "tools" / "gpu_check"
    torch_times, report = _module(tools / "torch_times.py"), _module(tools / "report.py")
    import numpy as np

    rng = np.random.default_rng(0)
    timed = 0
    for row in results["rows"]:
        assert row["timings"], row["op"]
        for entry in row["timings"]:
            inputs = torch_times.make_inputs(entry["case"], rng)
            assert [list(x.shape) for x in inputs] == [i["shape"] for i in entry["case"]["inputs"]]
            assert entry["bytes"] >= inputs[0].nbytes
            timed += 1
    assert timed >= 44  # one per op and type, three for float32 depthwise
    results.update(mode="gpu", device={"name": "a GPU", "compute_capability": "9.0", "multiprocessors": 132,
                                       "memory_gib": 79.6, "driver": "13.0", "runtime": "13.0"})
    for row in results["rows"]:
        row.update(graph="ok", graph_nodes=3)
        for entry in row["timings"]:
            entry.update(kernel_us=100.0, copy_us=80.0, torch_us=125.0)
    memcheck = {"memcheck_cases": [f"{r['op']} {r['dtype']} NHWC [case]" for r in results["rows"]]}
    table, problems = report.build(results, memcheck, "ok", "ok")
    assert not problems, problems
    assert any("| 100.0 | 80.0 | 80% | 125.0 | 0.80x |" in line for line in table)
    _, problems = report.build(results, memcheck, "errors (memcheck.log)", "ok")
    assert problems == ["memcheck: errors (memcheck.log)"]
    results["rows"][0]["graph"] = None
    _, problems = report.build(results, memcheck, "not finished in 90 s", "ok")
    assert problems == [f"{results['rows'][0]['op']} {results['rows'][0]['dtype']}: no CUDA-graph check"]


def _golden_count():
    import numpy as np

    for path in sorted((ROOT / "ort_ops" / "conformance" / "goldens").glob("*.npz")):
        with np.load(path) as data:
            yield from json.loads(bytes(data["__meta__"]).decode())


@pytest.mark.parametrize("op, rule", [("FakeQuantWithMinMaxVarsGradient", r"values differ"),
                                      ("FusedBatchNormV3", r"max abs error"),
                                      ("DepthwiseConv2dNativeBackpropFilter", r"over the bound")])
def test_wrong_expected_value_fails(tmp_path, op, rule):
    """A golden output made wrong (one bit for the bit-exact ops, 1% for the others) fails the CPU half, and the
    script's exit status says so."""
    cases = tmp_path / "cases"
    export = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check" / "export_cases.py"), "--out", str(cases),
                             "--corrupt", op], capture_output=True, text=True, timeout=300)
    assert export.returncode == 0, export.stderr
    out = run_script(tmp_path, GPU_CHECK_CASES=str(cases), GPU_CHECK_ARGS=f"--ops {op}")
    assert out.returncode == 1, out.stdout[-4000:]
    assert re.search(rf"FAIL {op} \S+ golden case \d+ .*\n\s+CPU against TF: output 0: .*{rule}", out.stdout), out.stdout[-4000:]
    assert "gpu_check: FAILED" in out.stdout


def test_exactness_flags_match_the_library():
    """cpp_ops/gpu_check builds the kernels with the library's own exactness flags."""
    def flags(path):
        text = path.read_text()
        return {name: re.search(rf"set\({name} ([^)]*)\)", text).group(1) for name in
                ("TFOPS_CXX_EXACT_FLAGS", "TFOPS_CUDA_EXACT_FLAGS")}

    assert flags(ROOT / "CMakeLists.txt") == flags(ROOT / "cpp_ops" / "gpu_check" / "CMakeLists.txt")


def _imports(path):
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_device_side_scripts_need_only_what_the_gpu_machine_has():
    """The case export needs NumPy only, the report the standard library, the PyTorch timings NumPy and torch."""
    stdlib = {"__future__", "argparse", "json", "sys", "pathlib", "importlib"}
    tools = ROOT / "tools" / "gpu_check"
    assert _imports(tools / "export_cases.py") <= stdlib | {"numpy"}
    assert _imports(tools / "report.py") <= stdlib
    assert _imports(tools / "torch_times.py") <= stdlib | {"numpy", "torch"}


def _configure(tmp_path, name, path):
    """A plain configure (TFOPS_CUDA and CUDACXX unset: AUTO) with ``path`` as PATH: (its output, its note)."""
    env = _env(tmp_path)
    env.pop("TFOPS_CUDA", None)
    env.pop("CUDACXX", None)
    env["PATH"] = path
    headers = tmp_path / "ort"
    headers.mkdir(exist_ok=True)
    (headers / "onnxruntime_c_api.h").write_text("/* configure only */\n")
    out = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(tmp_path / name), f"-DORT_INCLUDE_DIR={headers}"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout, json.loads((tmp_path / name / "libort_tf_ops.build.json").read_text())


def test_default_build_follows_the_cuda_compiler(tmp_path):
    """The kernels passed the GPU check (TFOPS_CUDA_GPU_CHECKED is ON), so a plain configure (AUTO) builds them
    wherever a CUDA compiler is on PATH and the CPU-only library where none is, and writes why beside the
    library."""
    env = _env(tmp_path)
    _tools_or_skip(env)
    without_nvcc = os.pathsep.join(d for d in env["PATH"].split(os.pathsep) if d and not (Path(d) / "nvcc").exists())
    assert shutil.which("cmake", path=without_nvcc) and shutil.which("c++", path=without_nvcc), without_nvcc
    out, note = _configure(tmp_path, "cpu", without_nvcc)
    assert "CUDA kernels: OFF (TFOPS_CUDA=AUTO and no CUDA compiler was found)" in out, out
    assert note["cuda_kernels"] is False and note["tfops_cuda"] == "AUTO" and note["gpu_checked"] is True, note
    if shutil.which("nvcc", path=env["PATH"]) is None:
        return  # the half with a compiler runs where CI runs: nvcc is on its PATH
    out, note = _configure(tmp_path, "cuda", env["PATH"])
    assert "CUDA kernels: ON (TFOPS_CUDA=AUTO and a CUDA compiler" in out, out
    assert note["cuda_kernels"] is True and note["tfops_cuda"] == "AUTO" and note["gpu_checked"] is True, note


def test_cuda_build_info_says_which_build():
    import ort_ops

    try:
        info = ort_ops.cuda_build_info()
    except (FileNotFoundError, OSError) as e:
        pytest.skip(f"no built library: {e}")
    assert info["cuda_kernels"] == ort_ops.cuda_kernels_built() == (info["cuda_kernel_count"] > 0)
    if info["reason"] is not None:
        assert info["tfops_cuda"] in ("AUTO", "ON", "OFF")
        assert ("CUDA compiler" in info["reason"]) == info["cuda_kernels"], info
