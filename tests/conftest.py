"""Suite-wide setup: TensorFlow's kernel mode is pinned, and tests that need TensorFlow are marked.

* ``TF_ENABLE_ONEDNN_OPTS=0`` is set here, before any test module imports TensorFlow, whatever the
  environment says: TF's default depends on the CPU (oneDNN on with AVX-512), and results and even output
  shapes differ between its two kernel sets. Tests that claim agreement with oneDNN run it explicitly in a
  child process (tests/tf_modes.py).
* A test module that needs TensorFlow declares ``pytestmark = pytest.mark.tensorflow``. Golden tests never
  import TensorFlow, so ``pytest tests -m "not tensorflow"`` runs them all where TF is not installed: the
  TF modules are then deselected without being imported (listed at the end of the run).
* With ``TFOPS_TEST_ORT_PYTHON=<python>`` (scripts/test_ortgpu.sh), every standard-domain model the tests
  run goes to that Python's ONNX Runtime in a child process (tests/isolated_ort.py): the assertion-enabled
  onnxruntime-gpu build, where a malformed node aborts; a run in which no model went there fails.
"""
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tf_modes import pin_eigen  # noqa: E402

pin_eigen()

from backends import BACKENDS  # noqa: E402
import isolated_ort  # noqa: E402

TENSORFLOW_MARKER = "tensorflow"
_DECLARES_TF = re.compile(r"^pytestmark\s*=.*\bmark\.tensorflow\b", re.M)
_deselected_modules = set()  # a module can be offered more than once (named on the command line and found in tests/)


def pytest_configure(config):
    config.addinivalue_line("markers", f"{TENSORFLOW_MARKER}: needs TensorFlow (live comparisons, conversions)")
    if isolated_ort.enabled():
        isolated_ort.install()


def pytest_report_header(config):
    if isolated_ort.enabled():
        return f"standard-domain models run in a child process: {isolated_ort.describe()}"
    return None


def pytest_sessionfinish(session, exitstatus):
    if not isolated_ort.enabled():
        return
    isolated_ort.shutdown()
    if isolated_ort.stats["sessions"] == 0 and session.testscollected and exitstatus == 0:
        session.exitstatus = 1  # the stage would prove nothing


def _marker_expression_excludes_tensorflow(config) -> bool:
    expression = config.getoption("markexpr", "")
    if not expression:
        return False
    from _pytest.mark.expression import Expression

    compiled = Expression.compile(expression)
    matcher = lambda name, **kwargs: name == TENSORFLOW_MARKER  # noqa: E731
    return not compiled.evaluate(matcher)


def pytest_ignore_collect(collection_path, config):
    """A TF module is not even imported when ``-m`` deselects the tensorflow marker (TF may be absent)."""
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    if not _marker_expression_excludes_tensorflow(config):
        return None
    if _DECLARES_TF.search(collection_path.read_text(encoding="utf-8")):
        _deselected_modules.add(collection_path.name)
        return True
    return None


def pytest_terminal_summary(terminalreporter):
    if isolated_ort.enabled():
        st = isolated_ort.stats
        terminalreporter.write_line(
            f"isolated ONNX Runtime ({isolated_ort.ENV}): {st['sessions']} standard-domain models, {st['runs']} runs; "
            f"{st['in_process']} other sessions in process" + ("" if st["sessions"] else " -- NO model ran there: failing"))
    if _deselected_modules:
        names = ", ".join(sorted(_deselected_modules))
        terminalreporter.write_line(f"deselected by -m, not imported: {len(_deselected_modules)} TensorFlow modules ({names})")


def _imports_tensorflow(module) -> bool:
    return any(getattr(value, "__name__", "").split(".")[0] == "tensorflow" and type(value) is type(sys)
               for value in vars(module).values())


def pytest_collection_modifyitems(config, items):
    """Every test of a module that imports TensorFlow must carry the marker, or the TF-free run breaks."""
    unmarked = [item.nodeid for item in items
                if getattr(item, "module", None) is not None and _imports_tensorflow(item.module)
                if not item.get_closest_marker(TENSORFLOW_MARKER)]
    if unmarked:
        raise pytest.UsageError("tests in modules that import TensorFlow lack pytest.mark.tensorflow: "
                                + ", ".join(sorted({u.split("::")[0] for u in unmarked})))


@pytest.fixture(params=BACKENDS)
def backend(request):
    """Each test using it runs once on the NumPy kernels and once through ONNX Runtime with the library."""
    return request.param


@pytest.fixture(scope="session")
def exported_cases(tmp_path_factory):
    """Every golden case exported once per run as the conformance kit's node tests (ort_ops.conformance)."""
    from ort_ops.conformance import nodetest

    directory = tmp_path_factory.mktemp("conformance")
    nodetest.export(directory)
    return directory
