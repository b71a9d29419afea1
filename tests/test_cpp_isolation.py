"""Bad input never crashes the library, and concurrent use of one session is safe.

1. Every golden case TensorFlow rejects (ort_ops/conformance/goldens/*.npz entries with "error") runs through ONNX
   Runtime with the library in a child process (so a crash cannot take the test run down with it):
   each must end in an ORT error whose message names the op, unless the case is one of
   DOCUMENTED_DEVIATIONS: named entries (op, the golden case notes they cover, and the spec deviation that
   documents why the input is accepted). A crash names the case that caused it.
2. Several Python threads calling run() on one session get bit-identical results to one thread.
"""
import json
import os
import subprocess
import sys
import threading
from typing import NamedTuple
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from comparison import assert_bits_equal  # noqa: E402
from ort_ops.conformance.goldens import golden_ops, load_cases  # noqa: E402


class Deviation(NamedTuple):
    """A TF-rejected golden input that the library accepts on purpose."""

    name: str
    op: str
    note_contains: str  # selects the golden error cases it covers, by their note
    documented: str  # a prefix of one of the op spec's ``deviations`` (shown in docs/ops.md)


# Every TF-rejected golden case currently ends in an ORT error, so none is needed. An entry added here must
# cover at least one golden case and quote a documented deviation of its op (test_deviations_are_current).
DOCUMENTED_DEVIATIONS: tuple = ()


# ---------------------------------------------------------------- child process side

def run_error_cases(op):
    """Runs every error case of ``op`` through ORT; one JSON line per case, a START line before each."""
    import ort_ops
    from backends import library_session, ort_value

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
            sess = library_session(model, log_severity_level=4)
            feed = {p.name: ort_value(np.asarray(x)) for p, x in zip(spec.inputs, case["inputs"])}
            sess.run_with_ort_values(None, feed)
            result.update(status="ok", message="")
        except Exception as e:
            result.update(status="error", message=str(e))
        print(json.dumps(result), flush=True)


# ---------------------------------------------------------------- test side

def deviation_for(op, case, deviations=DOCUMENTED_DEVIATIONS):
    """The documented deviation covering this golden error case, or None."""
    return next((d for d in deviations if d.op == op and d.note_contains in case["note"]), None)


def judge(op, cases, results, deviations=DOCUMENTED_DEVIATIONS):
    """Problems with the child's results for the error cases of ``op`` (empty when all is well)."""
    problems = []
    for r in results:
        case = cases[r["case"]]
        if r["status"] == "error":
            if op not in r["message"]:
                problems.append(f"case {r['case']} ({case['note']}): error does not name the op: {r['message']}")
        elif r["status"] != "ok" or deviation_for(op, case, deviations) is None:
            problems.append(f"case {r['case']} ({case['note']}): TF says {case['error']!r} but ORT gave "
                            f"{r['status']} {r['message']} (not a documented deviation)")
    return problems


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
    problems = judge(op, cases, results)
    assert not problems, "\n".join(problems)


def test_deviations_are_current():
    """No stale entry: each covers at least one golden error case of its op and quotes its op's spec."""
    import ort_ops

    names = [d.name for d in DOCUMENTED_DEVIATIONS]
    assert len(names) == len(set(names)), "deviation names must be unique"
    for d in DOCUMENTED_DEVIATIONS:
        covered = [c for c in load_cases(d.op) if "error" in c and d.note_contains in c["note"]]
        assert covered, f"{d.name}: no golden error case of {d.op} has {d.note_contains!r} in its note"
        documented = ort_ops.get_spec(d.op).deviations
        assert any(text.startswith(d.documented) for text in documented), f"{d.name}: not a documented deviation of {d.op}"


def test_an_accepted_error_case_fails_unless_documented():
    """The judgment itself: ORT accepting a TF-rejected case is a problem, unless a deviation names it."""
    op = "FakeQuantWithMinMaxVarsPerChannel"
    cases = load_cases(op)
    index = next(i for i, c in enumerate(cases) if "error" in c)
    accepted = [{"case": index, "status": "ok", "message": ""}]
    assert judge(op, cases, accepted, deviations=())
    assert judge(op, cases, [{"case": index, "status": "unbuildable", "message": "TypeError: x"}], deviations=())
    assert judge(op, cases, [{"case": index, "status": "error", "message": "some other op failed"}], deviations=())
    assert not judge(op, cases, [{"case": index, "status": "error", "message": f"{op}: bad input"}], deviations=())
    named = Deviation("example", op, cases[index]["note"], _first_documented_deviation(op))
    assert not judge(op, cases, accepted, deviations=(named,))
    assert judge(op, cases, accepted, deviations=(named._replace(op="QuantizeAndDequantizeV2"),))


def _first_documented_deviation(op):
    import ort_ops

    return ort_ops.get_spec(op).deviations[0]


def _session(op, inputs, attrs, threads):
    import ort_ops
    from backends import library_session

    model = ort_ops.make_single_op_model(op, inputs, attrs, typed_outputs=False)
    return library_session(model, threads, log_severity_level=4)


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
            assert_bits_equal(a, b, "an output computed beside 29 other threads")


if __name__ == "__main__":
    run_error_cases(sys.argv[1])
