"""onnxruntime-extensions beside this project: both custom-op libraries in one ONNX Runtime session, and the
conformance kit's ``extensions`` backend (the NumPy kernels as Python ops inside ONNX Runtime).

The backend's limits (ort_ops/conformance/extensions.py) are facts about onnxruntime-extensions 0.15.2; the
tests that pin them run in a child process, because some of them abort the process and because the Python
ops the backend registers stay in the process for good: after that, no session of it can register both
libraries ("Domain already set in registry").
"""
import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ort_ops.conformance.goldens import golden_ops

ROOT = Path(__file__).resolve().parent.parent
CONTRIB = "ai.onnx.contrib"  # onnxruntime-extensions' own domain
# Every op with goldens: every family and dtype path (float and string attributes, several and summed outputs,
# float32/float64 signatures of one op type, int32 inputs, float16/bfloat16, placeholders, list attributes).
OPS = golden_ops()


def _child(*args, timeout=120):
    """Run this file's ``__main__`` part in a fresh interpreter (see the module docstring)."""
    return subprocess.run([sys.executable, __file__, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


# --------------------------------------------------------------------- (a) both libraries, one session

FQ_ATTRS = {"min": -1.0, "max": 1.5, "num_bits": 8, "narrow_range": False}
X = np.array([-3.0, -1.0, -0.7, -0.01, -0.0, 0.0, 0.004, 0.3, 0.70001, 1.5, 2.0, 1e30, -1e30], np.float32)


def both_libraries_model() -> onnx.ModelProto:
    """x -> this domain's FakeQuantWithMinMaxArgs -> y -> onnxruntime-extensions' NegPos -> neg, pos."""
    import ort_ops

    fake_quant = ort_ops.make_node("FakeQuantWithMinMaxArgs", ["x"], ["y"], name="fq", **FQ_ATTRS)
    neg_pos = helper.make_node("NegPos", ["y"], ["neg", "pos"], name="negpos", domain=CONTRIB)
    floats = lambda *names: [helper.make_tensor_value_info(n, TensorProto.FLOAT, [len(X)]) for n in names]  # noqa: E731
    graph = helper.make_graph([fake_quant, neg_pos], "both_libraries", floats("x"), floats("y", "neg", "pos"))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ort_ops.DOMAIN, 1),
                                                    helper.make_opsetid(CONTRIB, 1)])
    return ort_ops.model.set_lowest_ir_version(model)


def _both_libraries_session():
    import onnxruntime as ort
    import onnxruntime_extensions

    import ort_ops

    so = ort.SessionOptions()
    so.register_custom_ops_library(ort_ops.library_path())
    so.register_custom_ops_library(onnxruntime_extensions.get_library_path())
    return ort.InferenceSession(both_libraries_model().SerializeToString(), so, providers=["CPUExecutionProvider"])


def child_both_libraries(out_path):
    """Run the model; then let the extensions backend register its Python ops and try again."""
    y, neg, pos = _both_libraries_session().run(None, {"x": X})
    from ort_ops.conformance.extensions import ExtensionsBackend
    from ort_ops.conformance.nodetest import Case
    from ort_ops.model import make_single_op_model

    model = make_single_op_model("FakeQuantWithMinMaxArgs", [X], FQ_ATTRS)
    ExtensionsBackend().run(Case("fq", "FakeQuantWithMinMaxArgs", "", Path("."), model, [X]))
    try:
        _both_libraries_session()
        after = None
    except Exception as e:  # noqa: BLE001 -- the message is the result
        after = str(e)
    np.savez(out_path, y=y, neg=neg, pos=pos, after=np.array(json.dumps(after)))


@pytest.fixture(scope="module")
def both_libraries(tmp_path_factory):
    out = tmp_path_factory.mktemp("both") / "out.npz"
    proc = _child("both", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(out) as data:
        return {k: data[k] for k in data.files}


def test_both_libraries_in_one_session(both_libraries):
    import ort_ops
    from ort_ops.conformance.judge import bits_mismatch

    (want_y,) = ort_ops.get_spec("FakeQuantWithMinMaxArgs").run_reference([X], FQ_ATTRS)
    assert bits_mismatch(want_y, both_libraries["y"]) is None  # this project's C++ kernel, bit for bit
    assert len(np.unique(want_y)) > 5  # the inputs exercise the quantization grid, not only its ends
    # NegPos (operators/math/negpos.hpp): x > 0 goes to pos, everything else (zeros included) to neg.
    positive = want_y > 0
    assert bits_mismatch(np.where(positive, np.float32(0), want_y), both_libraries["neg"]) is None
    assert bits_mismatch(np.where(positive, want_y, np.float32(0)), both_libraries["pos"]) is None


def test_python_ops_of_the_domain_block_both_libraries(both_libraries):
    """Why (a) runs in a child process, and what extensions.py's docstring warns about."""
    after = json.loads(str(both_libraries["after"]))
    # "Domain already set in registry", or, as here, where both define the op:
    assert after is not None and "Conflicting with a registered kernel" in after, after


# --------------------------------------------------------------------- (b) the kit on the extensions backend


@pytest.fixture(scope="module")
def kit(exported_cases):
    """The suite's exported cases (tests/conftest.py), read back."""
    from ort_ops.conformance import nodetest

    return exported_cases, nodetest.load(exported_cases)


@pytest.fixture(scope="module")
def extensions_backend():
    from ort_ops.conformance.extensions import ExtensionsBackend

    return ExtensionsBackend()


def expected_reason(case):
    """What ``not_runnable`` must say for this case (a phrase of it), or None when it must run."""
    from ort_ops import get_spec

    if get_spec(case.op).family == "depthwise":
        return "list attribute 'strides'"
    for x in case.inputs:
        if x.dtype.name in ("float16", "bfloat16"):
            return f"{x.dtype.name} input"
    return None


@pytest.mark.parametrize("op", OPS)
def test_kit_on_the_extensions_backend(kit, extensions_backend, op):
    from ort_ops import get_spec
    from ort_ops.conformance import runner

    cases = [c for c in kit[1] if c.op == op]
    assert cases, f"the kit has no case of {op}"
    failures, ran = [], {}
    for case in cases:
        reason, expected = extensions_backend.not_runnable(case), expected_reason(case)
        if reason or expected:
            if not (reason and expected and expected in reason):
                failures.append(f"{case.name} ({case.dtype}): not_runnable gave {reason!r}, expected {expected!r}")
            continue
        ran[case.dtype] = ran.get(case.dtype, 0) + 1
        result = runner.run_case(extensions_backend, case)
        if result.status != runner.PASSED:
            failures.append(f"{case.name} ({case.dtype}): {result.status} {result.reason}")
    assert not failures, f"{len(failures)} of {len(cases)} cases:\n" + "\n".join(failures[:20])
    if get_spec(op).family != "depthwise":
        assert ran.get("float32"), f"no float32 case of {op} ran: {ran}"
    if op.startswith("QuantizeAndDequantize"):
        assert ran.get("float64"), f"no float64 case of {op} ran: {ran}"  # a second signature of the op type


def _fake_quant_case(min_value):
    from ort_ops.conformance.nodetest import Case
    from ort_ops.model import make_single_op_model

    x = np.linspace(-0.3, 0.6, 91, dtype=np.float32)
    model = make_single_op_model("FakeQuantWithMinMaxArgs", [x], {"min": min_value, "max": 0.5}, typed_outputs=False)
    return Case("fq", "FakeQuantWithMinMaxArgs", "", Path("."), model, [x])


def test_float_attributes_travel_with_six_digits(extensions_backend):
    """The float-attribute reason is real: run anyway, the op computes with the value rounded to 6 digits."""
    import ort_ops

    spec = ort_ops.get_spec("FakeQuantWithMinMaxArgs")
    exact = _fake_quant_case(-0.125)
    assert extensions_backend.not_runnable(exact) is None
    (got,) = extensions_backend.run(exact)
    assert np.array_equal(got, spec.run_reference(exact.inputs, {"min": -0.125, "max": 0.5})[0])
    case = _fake_quant_case(-0.123456789)
    reason = extensions_backend.not_runnable(case)
    assert reason and "'min'" in reason and "6 significant digits" in reason, reason
    (got,) = extensions_backend.run(case)
    assert not np.array_equal(got, spec.run_reference(case.inputs, {"min": -0.123456789, "max": 0.5})[0])
    assert np.array_equal(got, spec.run_reference(case.inputs, {"min": -0.123457, "max": 0.5})[0])


@pytest.mark.parametrize("dtype, message", [("float16", "Type float16 not supported by python customops api"),
                                            ("bfloat16", "Unsupported ONNX Tensor type: 16")])
def test_half_precision_aborts_the_process(kit, dtype, message):
    """The float16/bfloat16 reason is real: run anyway (in a child), the Python op kills the process."""
    proc = _child("half", kit[0], dtype)
    assert "RUNNING" in proc.stdout and "RAN" not in proc.stdout, (proc.stdout, proc.stderr[-3000:])
    assert proc.returncode == -signal.SIGABRT and message in proc.stderr, (proc.returncode, proc.stderr[-3000:])


def child_half(directory, dtype):
    from ort_ops.conformance import nodetest
    from ort_ops.conformance.extensions import ExtensionsBackend

    cases = nodetest.load(directory, ops=["FusedBatchNormV3"])
    case = next(c for c in cases if c.dtype == dtype and not c.is_rejection)
    print("RUNNING", case.name, flush=True)
    ExtensionsBackend().run(case)
    print("RAN", flush=True)


def test_missing_package_is_named(monkeypatch):
    from ort_ops.conformance import extensions

    monkeypatch.setitem(sys.modules, "onnxruntime_extensions", None)  # import fails as if not installed
    with pytest.raises(ImportError, match="pip install onnxruntime-extensions"):
        extensions.ExtensionsBackend()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # this checkout's ort_ops, not an installed copy
    {"both": child_both_libraries, "half": child_half}[sys.argv[1]](*sys.argv[2:])
