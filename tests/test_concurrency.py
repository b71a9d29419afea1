"""Concurrency: the custom-op library under several threads, as a server runs it (issue 27). No TensorFlow.

* One ONNX Runtime session per bundled custom-lowering model (models/*/model.custom.onnx), run from several
  threads at once on distinct seeded inputs (started together at a barrier): every output of every run is
  bit-identical (NaN payloads included) to the same session's serial run of the same inputs. The sessions
  keep ONNX Runtime's default intra-op thread pool, which concurrent runs share. The MobileNetV2 models
  (96x96, the training steps at batch 8) get one run per thread; the small ones several.
* Threads creating and destroying sessions at once, each with its own session options registering the
  library (ort_ops.session_options()), each session run once and checked against a reference: no failure,
  the same bits.

benchmarks/soak.py is the long version (minutes, resident memory over time).
"""
from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest

ROOT = Path(__file__).resolve().parent.parent
# models/ is a package of the repository, not of the installed distribution (as in test_models.py).
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import ort_ops  # noqa: E402
from comparison import bits_mismatch  # noqa: E402
from models.inputs import declared_inputs  # noqa: E402

MODEL_PATHS = sorted((ROOT / "models").glob("*/model.custom.onnx"))
THREADS = 4
RUNS_PER_THREAD = 3
BIG = "mobilenet_v2"  # models whose name contains this get one run per thread
FREE_DIM = 2
# The untrained quantized MobileNetV2's logits quantize to 0 for every image here.
INPUT_INDEPENDENT = {"mobilenet_v2_qat"}
CHURN_THREADS = 8
CHURN_SESSIONS = 10  # per thread
CHURN_MODELS = ("fourbit_cnn", "qdq")


def model_inputs(path: Path, seed: int, free_dim: int = FREE_DIM) -> dict:
    """Seeded inputs from the model's input declarations, as models/run_all.py feeds them (models/inputs.py)."""
    return declared_inputs(onnx.load(str(path), load_external_data=False), seed, free_dim)


def make_session(path: Path, **options) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), ort_ops.session_options(**options), providers=["CPUExecutionProvider"])


def _runs_per_thread(path: Path) -> int:
    return 1 if BIG in path.parent.name else RUNS_PER_THREAD


def _mismatch(want: list, got: list, names: list) -> str | None:
    for name, w, g in zip(names, want, got):
        why = bits_mismatch(w, g)
        if why is not None:
            return f"output {name}: {why}"
    return None


@pytest.mark.parametrize("path", MODEL_PATHS, ids=[p.parent.name for p in MODEL_PATHS])
def test_threads_share_a_session(path):
    sess = make_session(path)
    names = [o.name for o in sess.get_outputs()]
    runs = _runs_per_thread(path)
    feeds = [model_inputs(path, seed) for seed in range(THREADS * runs)]
    serial = [sess.run(names, feed) for feed in feeds]

    barrier = threading.Barrier(THREADS)

    def worker(t):
        barrier.wait()
        return [(i, sess.run(names, feeds[i])) for i in range(t, len(feeds), THREADS)]

    with ThreadPoolExecutor(THREADS) as pool:
        results = [r for rs in pool.map(worker, range(THREADS)) for r in rs]
    assert sorted(i for i, _ in results) == list(range(len(feeds)))
    for i, got in results:
        why = _mismatch(serial[i], got, names)
        assert why is None, f"{path.parent.name}, input {i} run concurrently: {why}"
    # Distinct inputs give distinct results (the check above is not comparing one run with itself), except
    # where the model's outputs do not depend on these inputs.
    if path.parent.name not in INPUT_INDEPENDENT:
        assert any(_mismatch(serial[0], s, names) for s in serial[1:])


def test_threads_create_and_destroy_sessions():
    paths = [ROOT / "models" / name / "model.custom.onnx" for name in CHURN_MODELS]
    feeds = {p: model_inputs(p, 100) for p in paths}
    reference = {}
    for p in paths:
        sess = make_session(p)
        reference[p] = sess.run(None, feeds[p])
        del sess

    barrier = threading.Barrier(CHURN_THREADS)
    failures = []

    def worker(t):
        barrier.wait()
        for k in range(CHURN_SESSIONS):
            p = paths[(t + k) % len(paths)]
            try:
                sess = make_session(p, intra_op_num_threads=1)
                got = sess.run(None, feeds[p])
                del sess
            except Exception as e:  # noqa: BLE001 - every failure is reported below
                failures.append(f"thread {t}, session {k} ({p.parent.name}): {type(e).__name__}: {e}")
                continue
            why = _mismatch(reference[p], got, [str(i) for i in range(len(got))])
            if why is not None:
                failures.append(f"thread {t}, session {k} ({p.parent.name}): {why}")

    with ThreadPoolExecutor(CHURN_THREADS) as pool:
        list(pool.map(worker, range(CHURN_THREADS)))
    assert not failures, "\n".join(failures[:10])
