"""Bad input never crashes the library, and concurrent use of one session is safe.

1. Every golden case TensorFlow rejects (tests/golden/*.npz entries with "error") runs through ONNX
   Runtime with the library in a child process (so a crash cannot take the test run down with it):
   each must end in an ORT error whose message names the op, unless the NumPy kernels accept the
   input too (a documented deviation where TF is broken). A crash names the case that caused it.
2. Several Python threads calling run() on one session get bit-identical results to one thread.
"""
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from golden_io import golden_ops, load_cases  # noqa: E402


# ---------------------------------------------------------------- child process side

def _feed(x):
    import onnxruntime as ort
    from onnx import TensorProto

    x = np.asarray(x)
    if x.dtype.name == "bfloat16":
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.ascontiguousarray(x).view(np.uint16).reshape(x.shape),
                                                               TensorProto.BFLOAT16)
    return ort.OrtValue.ortvalue_from_numpy(np.array(x, order="C", copy=True))


def run_error_cases(op):
    """Runs every error case of ``op`` through ORT; one JSON line per case, a START line before each."""
    import onnxruntime as ort

    import ort_ops

    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.register_custom_ops_library(ort_ops.library_path())
    spec = ort_ops.get_spec(op)
    for i, case in enumerate(load_cases(op)):
        if "error" not in case:
            continue
        print(f"START {i}", flush=True)
        result = {"case": i}
        try:
            model = ort_ops.make_single_op_model(op, case["inputs"], case["attrs"], typed_outputs=False)
        except Exception as e:  # the node cannot even be written (e.g. an attribute of the wrong kind)
            result.update(status="unbuildable", message=f"{type(e).__name__}: {e}")
            print(json.dumps(result), flush=True)
            continue
        try:
            sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            feed = {p.name: _feed(x) for p, x in zip(spec.inputs, case["inputs"])}
            sess.run_with_ort_values(None, feed)
            result.update(status="ok", message="")
        except Exception as e:
            result.update(status="error", message=str(e))
        print(json.dumps(result), flush=True)


# ---------------------------------------------------------------- test side

def _numpy_accepts(op, case):
    import ort_ops

    try:
        ort_ops.get_spec(op).run_reference([np.asarray(x) for x in case["inputs"]], case["attrs"])
        return True
    except Exception:
        return False


def _error_ops():
    return [op for op in golden_ops() if any("error" in c for c in load_cases(op))]


# (Only the test process lists the ops: the child runs one op and must not read the other goldens.)
@pytest.mark.parametrize("op", _error_ops() if __name__ != "__main__" else [])
def test_every_golden_error_case_is_a_clean_ort_error(op):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, __file__, op], capture_output=True, text=True, env=env, timeout=600)
    lines = proc.stdout.splitlines()
    started = [int(line.split()[1]) for line in lines if line.startswith("START ")]
    results = [json.loads(line) for line in lines if line.startswith("{")]
    if proc.returncode != 0:
        last = started[-1] if started else None
        note = load_cases(op)[last]["note"] if last is not None else ""
        pytest.fail(f"{op}: the child process died (exit {proc.returncode}) during error case {last} ({note!r}):\n"
                    f"{proc.stderr[-3000:]}")
    cases = load_cases(op)
    expected = [i for i, c in enumerate(cases) if "error" in c]
    assert [r["case"] for r in results] == expected
    problems = []
    for r in results:
        case = cases[r["case"]]
        if r["status"] == "error":
            if op not in r["message"]:
                problems.append(f"case {r['case']} ({case['note']}): error does not name the op: {r['message']}")
        elif _numpy_accepts(op, case):
            pass  # a documented deviation: TF rejects (or crashes on) input whose intent is clear
        else:
            problems.append(f"case {r['case']} ({case['note']}): TF says {case['error']!r} but ORT gave "
                            f"{r['status']} {r['message']}")
    assert not problems, "\n".join(problems)


def _session(op, inputs, attrs, threads):
    import onnxruntime as ort

    import ort_ops

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 4
    so.register_custom_ops_library(ort_ops.library_path())
    model = ort_ops.make_single_op_model(op, inputs, attrs, typed_outputs=False)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _concurrent_cases():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(400, 257)).astype(np.float32) * 4
    g = rng.normal(size=x.shape).astype(np.float32)
    return [
        ("FakeQuantWithMinMaxVarsGradient", [g, x, np.array(-3, np.float32), np.array(2.5, np.float32)], {"num_bits": 5}),
        ("FakeQuantWithMinMaxVarsPerChannel", [x, np.full(257, -1, np.float32), np.full(257, 3, np.float32)], {}),
        ("QuantizeAndDequantizeV4", [x.astype(np.float64), np.zeros(257), np.zeros(257)], {"axis": 1, "num_bits": 6}),
        ("QuantizeAndDequantizeV4Grad", [g, x, np.array(-1, np.float32), np.array(1, np.float32)], {}),
    ]


@pytest.mark.parametrize("case", _concurrent_cases(), ids=lambda c: c[0])
def test_threads_sharing_one_session_get_the_single_thread_result(case):
    import ort_ops

    op, inputs, attrs = case
    spec = ort_ops.get_spec(op)
    feed = {p.name: np.asarray(x) for p, x in zip(spec.inputs, inputs)}
    reference = _session(op, inputs, attrs, threads=1).run(None, feed)
    shared = _session(op, inputs, attrs, threads=2)
    results, errors = [], []

    def worker():
        try:
            for _ in range(5):
                results.append(shared.run(None, feed))
        except Exception as e:  # reported below; an exception in a thread would otherwise vanish
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 30
    for outs in results:
        for a, b in zip(reference, outs):
            assert a.tobytes() == b.tobytes()


if __name__ == "__main__":
    run_error_cases(sys.argv[1])
