"""The conformance kit (ort_ops.conformance): the suite's golden tests run through the cases it exports, so the
kit and the suite cannot drift apart.

* Every golden case of every op passes on the reference evaluator (the NumPy kernels) and on ONNX Runtime with
  the library, judged by the kit's rules (ort_ops/conformance/rules.py: bits for the quantization ops, the sum
  and tolerance bounds stated there for the rest; TF's rejections with TF's words).
* A wrong output fails the runner: one flipped bit, a NaN payload or a zero's sign in a bit-exact output; a
  float output or a sum off by twice its bound (and one off by half its bound passes, so the bound itself is
  what is applied); a rejection without TF's words; an output where TF rejects.
* The directories load with onnx.backend.test's loader and pass onnx's own comparison with ONNX Runtime and
  the library as the backend (ort_ops/conformance/onnx_backend.py, the worked example of the docs).
* The command line: exit status, the table, --json, the errors of bad usage.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import ort_ops
from ort_ops.conformance import goldens, nodetest, rules, runner

OPS = goldens.golden_ops()
BACKEND_NAMES = ("reference", "ort")


def _backend(name):
    return runner.make_backend(name)


@pytest.mark.parametrize("backend_name", BACKEND_NAMES)
@pytest.mark.parametrize("op", OPS)
def test_golden_cases(exported_cases, backend_name, op):
    cases = nodetest.load(exported_cases, [op])
    assert len(cases) == len(goldens.load_cases(op)) > 20
    results = runner.run_cases(_backend(backend_name), cases)
    bad = [f"{r.case} [{next(c.note for c in cases if c.name == r.case)}]: {r.status} {r.reason}"
           for r in results if r.status != runner.PASSED]
    assert not bad, f"{len(bad)} of {len(cases)} cases:\n" + "\n".join(bad[:20])


def test_every_op_with_goldens_is_exported(exported_cases):
    manifest = nodetest.read_manifest(exported_cases)
    assert sorted({c["op"] for c in manifest["cases"]}) == OPS
    assert len(OPS) == 20  # the 19 TF ops and the fused one
    assert sum("reject" in c for c in manifest["cases"]) > 150
    for entry in manifest["cases"]:
        model = onnx.load(exported_cases / entry["dir"] / "model.onnx")
        assert model.ir_version == nodetest.IR_VERSION == ort_ops.lowest_ir_version(model) == 8


# --------------------------------------------------------------------------------- wrong outputs fail


def _copy(exported_cases, tmp_path, names):
    """A directory holding only the cases ``names`` (copied), with its own manifest."""
    manifest = nodetest.read_manifest(exported_cases)
    entries = [e for e in manifest["cases"] if e["name"] in names]
    assert len(entries) == len(names)
    for e in entries:
        shutil.copytree(exported_cases / e["dir"], tmp_path / e["dir"])
    (tmp_path / nodetest.MANIFEST).write_text(json.dumps(dict(manifest, cases=entries)))
    return tmp_path, {e["name"]: e for e in entries}


def _rewrite_output(directory, entry, k, change):
    path = directory / entry["dir"] / nodetest.DATA_SET / f"output_{k}.pb"
    tensor = onnx.load_tensor(str(path))
    value = numpy_helper.to_array(tensor).copy()
    change(value)
    path.write_bytes(numpy_helper.from_array(value, tensor.name).SerializeToString())


def _first_case(exported_cases, op, predicate):
    for case in nodetest.load(exported_cases, [op]):
        if not case.is_rejection and predicate(case):
            return case
    raise AssertionError(f"no case of {op} fits")


def _status(directory, name, backend="ort"):
    (result,) = runner.run_cases(_backend(backend), [c for c in nodetest.load(directory) if c.name == name])
    return result


def _flip_last_bit(index):
    def change(a):
        bits = a.reshape(-1).view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])
        bits[index] ^= 1
    return change


@pytest.mark.parametrize("op", ["FakeQuantWithMinMaxVars", "QuantizeAndDequantizeV4", "FusedBatchNormClipFakeQuant"])
def test_one_flipped_bit_fails(exported_cases, tmp_path, op):
    case = _first_case(exported_cases, op, lambda c: c.outputs[0].size > 3 and np.isfinite(c.outputs[0]).all())
    directory, entries = _copy(exported_cases, tmp_path, [case.name])
    assert _status(directory, case.name).status == runner.PASSED
    _rewrite_output(directory, entries[case.name], 0, _flip_last_bit(2))
    result = _status(directory, case.name)
    assert result.status == runner.FAILED and "1 of" in result.reason and "values differ" in result.reason, result


def test_a_nan_payload_or_a_zero_sign_fails(exported_cases, tmp_path):
    op = "QuantizeAndDequantizeV2"
    nan_case = _first_case(exported_cases, op, lambda c: np.isnan(c.outputs[0]).any())
    zero_case = _first_case(exported_cases, op, lambda c: (c.outputs[0] == 0).any() and c.name != nan_case.name)
    directory, entries = _copy(exported_cases, tmp_path, [nan_case.name, zero_case.name])

    def other_payload(a):
        a.reshape(-1)[np.flatnonzero(np.isnan(a))[0]] = -a.reshape(-1)[np.flatnonzero(np.isnan(a))[0]]

    def other_sign(a):
        i = np.flatnonzero(a.reshape(-1) == 0)[0]
        a.reshape(-1)[i] = -a.reshape(-1)[i]

    _rewrite_output(directory, entries[nan_case.name], 0, other_payload)
    _rewrite_output(directory, entries[zero_case.name], 0, other_sign)
    for name in (nan_case.name, zero_case.name):
        result = _status(directory, name)
        assert result.status == runner.FAILED and "values differ" in result.reason, result


@pytest.mark.parametrize("op, k", [("DepthwiseConv2dNative", 0), ("DepthwiseConv2dNativeBackpropFilter", 0),
                                   ("FusedBatchNormV3", 0), ("FusedBatchNormGrad", 0),
                                   ("FakeQuantWithMinMaxVarsGradient", 1)])
@pytest.mark.parametrize("factor, passes", [(0.5, True), (2.0, False)])
def test_an_output_off_by_more_than_its_bound_fails(exported_cases, tmp_path, op, k, factor, passes):
    def fits(c):
        return (c.outputs[k].dtype == np.float32 and c.outputs[k].size > 0 and np.isfinite(c.outputs[k]).all()
                and c.rules[k].judge in (rules.TOLERANCE, rules.SUM))

    case = _first_case(exported_cases, op, fits)
    directory, entries = _copy(exported_cases, tmp_path, [case.name])
    bound = np.broadcast_to(np.asarray(case.rules[k].bound, np.float64), case.outputs[k].shape).reshape(-1)
    i = int(np.argmax(bound))

    def move(a):
        flat = a.reshape(-1)
        flat[i] = np.float32(np.float64(flat[i]) + factor * bound[i])

    _rewrite_output(directory, entries[case.name], k, move)
    result = _status(directory, case.name)
    if passes:
        assert result.status == runner.PASSED and 0.3 < result.worst <= 0.7, result
    else:
        assert result.status == runner.FAILED and "more than the bound" in result.reason, result


def test_a_rejection_without_tfs_words_fails(exported_cases, tmp_path):
    case = next(c for c in nodetest.load(exported_cases, ["FakeQuantWithMinMaxArgs"]) if c.is_rejection)
    directory, entries = _copy(exported_cases, tmp_path, [case.name])
    assert _status(directory, case.name).status == runner.PASSED
    manifest = nodetest.read_manifest(directory)
    manifest["cases"][0]["reject"]["must_contain"].append("words no implementation says")
    (directory / nodetest.MANIFEST).write_text(json.dumps(manifest))
    result = _status(directory, case.name)
    assert result.status == runner.FAILED and "words no implementation says" in result.reason


def test_a_value_case_the_backend_rejects_fails_and_a_rejection_it_runs_fails(exported_cases):
    from ort_ops.conformance.backends import Backend, Rejected

    class Refuses(Backend):
        def run(self, case):
            raise Rejected("FakeQuantWithMinMaxArgs: no")

    class Computes(Backend):
        def run(self, case):
            return [np.zeros(1, np.float32)]

    cases = nodetest.load(exported_cases, ["FakeQuantWithMinMaxArgs"])
    value = next(c for c in cases if not c.is_rejection)
    rejection = next(c for c in cases if c.is_rejection)
    assert runner.run_case(Refuses(), value).status == runner.FAILED
    assert runner.run_case(Computes(), rejection).status == runner.FAILED


# --------------------------------------------------------------------------------- onnx.backend.test


def test_directories_load_and_pass_with_onnx_backend_test(exported_cases):
    from onnx.backend.test.loader import load_model_tests
    from onnx.backend.test.runner import Runner

    from ort_ops.conformance.onnx_backend import OrtLibraryBackend, read_data_set

    manifest = nodetest.read_manifest(exported_cases)
    tests = load_model_tests(str(exported_cases), nodetest.VALUES_KIND)
    assert len(tests) == sum("reject" not in c for c in manifest["cases"])
    assert len(load_model_tests(str(exported_cases), nodetest.REJECTIONS_KIND)) == len(manifest["cases"]) - len(tests)
    for test in tests:
        model = onnx.load(f"{test.model_dir}/model.onnx")
        inputs, expected = read_data_set(test.model_dir)
        got = OrtLibraryBackend.prepare(model, "CPU").run(inputs)
        Runner.assert_similar_outputs(expected, got, test.rtol, test.atol, test.model_dir)


# --------------------------------------------------------------------------------- command line


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "ort_ops.conformance", *args], capture_output=True, text=True)


def test_cli_run_passes_and_writes_json(exported_cases, tmp_path):
    report = tmp_path / "report.json"
    out = _cli("run", "--cases", str(exported_cases), "--ops", "QuantizeAndDequantizeV4Grad", "FusedBatchNorm",
               "--json", str(report))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "QuantizeAndDequantizeV4Grad" in out.stdout and "CPUExecutionProvider" in out.stdout
    data = json.loads(report.read_text())
    assert {r["op"] for r in data["rows"]} == {"QuantizeAndDequantizeV4Grad", "FusedBatchNorm"}
    assert all(c["status"] == "passed" for c in data["cases"]) and len(data["cases"]) == 27 + 39


def test_cli_run_without_cases_exports_the_shipped_ones():
    out = _cli("run", "--backend", "reference", "--ops", "FakeQuantWithMinMaxVarsPerChannel")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(goldens.load_cases('FakeQuantWithMinMaxVarsPerChannel'))} cases on onnx" in out.stdout


def test_cli_exit_status_1_and_the_failing_case_on_a_wrong_output(exported_cases, tmp_path):
    case = _first_case(exported_cases, "FakeQuantWithMinMaxArgs", lambda c: c.outputs[0].size > 3)
    directory, entries = _copy(exported_cases, tmp_path, [case.name])
    _rewrite_output(directory, entries[case.name], 0, _flip_last_bit(0))
    out = _cli("run", "--cases", str(directory))
    assert out.returncode == 1 and f"FAIL {case.name} (FakeQuantWithMinMaxArgs, float32): output 0 (bits)" in out.stdout


@pytest.mark.parametrize("args, message", [
    (("run", "--ops", "NoSuchOp"), "no golden cases for ['NoSuchOp']"),
    (("run", "--backend", "reference", "--provider", "CUDAExecutionProvider"), "options of the ort backend"),
    (("run", "--provider", "NoSuchExecutionProvider"), "is not in this onnxruntime"),
    (("run", "--library", "/nonexistent/libx.so"), "no such file"),
])
def test_cli_bad_usage_is_one_error_line(args, message):
    out = _cli(*args)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_export_refuses_a_directory_it_did_not_write(tmp_path):
    (tmp_path / "precious.txt").write_text("x")
    out = _cli("export", str(tmp_path))
    assert out.returncode == 2 and "is not empty" in out.stderr
    assert (tmp_path / "precious.txt").exists()


def test_the_installed_package_carries_the_cases(tmp_path):
    """pip install is all a user needs: the installed ort_ops (imported from outside the source tree) holds the
    goldens and runs the kit."""
    code = ("import ort_ops.conformance.goldens as g, sys; print(g.__file__); "
            "print(len(g.golden_ops())); sys.exit(0 if len(g.golden_ops()) == 20 else 1)")
    where = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert where.returncode == 0, where.stdout + where.stderr
    assert "site-packages" in where.stdout.splitlines()[0], where.stdout
    out = subprocess.run([sys.executable, "-m", "ort_ops.conformance", "run", "--ops", "QuantizeAndDequantizeV4Grad"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0 and "site-packages" in out.stdout, out.stdout + out.stderr


def test_a_node_that_fell_back_to_the_cpu_fails_its_case(exported_cases):
    """--provider X: a node ORT's profiler saw run on another provider fails, naming both. (The CPU build of
    onnxruntime has the Azure provider, which runs no op of the domain, so every node falls back to the CPU.)"""
    import onnxruntime as ort

    # Not a skip: without a second provider this check would prove nothing, so its absence must be seen.
    assert "AzureExecutionProvider" in ort.get_available_providers(), (
        f"this test needs a provider other than the CPU's; this onnxruntime has {ort.get_available_providers()}")
    cases = [c for c in nodetest.load(exported_cases, ["FakeQuantWithMinMaxArgs"]) if not c.is_rejection][:3]
    results = runner.run_cases(runner.make_backend("ort", "AzureExecutionProvider"), cases)
    for r in results:
        assert r.status == runner.FAILED, r
        assert "ran on CPUExecutionProvider, not on AzureExecutionProvider" in r.reason, r


def test_cuda_provider_with_a_library_without_cuda_kernels_is_refused_up_front(monkeypatch):
    import ort_ops.library

    monkeypatch.setattr(ort_ops.library, "cuda_build_info",
                        lambda path=None: {"cuda_kernels": False, "reason": "TFOPS_CUDA=OFF (the default)"})
    with pytest.raises(ValueError, match=r"has no CUDA kernels \(TFOPS_CUDA=OFF \(the default\)\); build it with TFOPS_CUDA=ON"):
        runner.make_backend("ort", "CUDAExecutionProvider")
