"""Run the suite's standard-ONNX models in another ONNX Runtime build, in a child process.

Some ONNX Runtime wheels (onnxruntime-gpu 1.31.1, whose CPUExecutionProvider needs no GPU) are built
with C++ library assertions: a node with an empty or inverted range (a Conv whose dilated kernel is
larger than its padded input, a Slice of a dim of size -3 or of an empty dim with a negative step, ...)
aborts the whole process there, where a build without assertions runs on and returns something. Such
a build cannot share an environment with the onnxruntime the suite (and TensorFlow, the oracle) uses,
so scripts/test_ortgpu.sh keeps it in its own venv and runs the lowering tests with

    TFOPS_TEST_ORT_PYTHON=<that venv's python>

Then tests/conftest.py calls ``install()``, which replaces ``onnxruntime.InferenceSession``: a model
whose nodes are all in the standard domains is created and run by tests/isolated_ort_worker.py under
that Python, on its CPUExecutionProvider, and the outputs come back bit for bit (as .npy bytes), so
every comparison with TensorFlow holds as written. Models of the custom domain need the library
built for this environment's onnxruntime and stay in process.

A worker that dies (abort, segfault) fails the test that was running it with the model named (the
pytest node id and the graph's name), the signal, the tail of its stderr (the assertion message), and
the model and inputs saved for reproduction; the next model starts a new worker.
"""
from __future__ import annotations

import io
import os
import pickle
import re
import select
import signal
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

ENV = "TFOPS_TEST_ORT_PYTHON"
FAILED_DIR_ENV = "TFOPS_TEST_ORT_FAILED_DIR"
TIMEOUT_ENV = "TFOPS_TEST_ORT_TIMEOUT"  # seconds one request may take before the worker counts as hung
WORKER = Path(__file__).resolve().parent / "isolated_ort_worker.py"
STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")

stats = {"sessions": 0, "runs": 0, "in_process": 0}


class WorkerDied(AssertionError):
    """The child ONNX Runtime process died while creating or running a model."""


class IsolatedOrtError(RuntimeError):
    """ONNX Runtime raised in the child process (the message starts with its exception type)."""


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def _to_npy(array) -> bytes:
    array = np.asarray(array)
    if array.dtype.kind == "V":
        raise TypeError(f"{array.dtype} cannot be sent to the isolated ONNX Runtime (a plain NumPy dtype is needed)")
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _from_npy(data: bytes):
    return np.load(io.BytesIO(data), allow_pickle=False)


class _Worker:
    def __init__(self, python: str):
        self.python = python
        self.stderr = tempfile.TemporaryFile()
        self.hung = False
        self.proc = subprocess.Popen([python, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, env=os.environ.copy())

    def _read(self, size: int, deadline: float):
        chunks, fd = [], self.proc.stdout.fileno()
        while size:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.hung = True
                self.proc.kill()
                return None
            chunk = os.read(fd, min(size, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def request(self, message: dict):
        """The reply, or None when the process died or hung (then ``death()`` says how)."""
        data = pickle.dumps(message, protocol=4)
        deadline = time.monotonic() + float(os.environ.get(TIMEOUT_ENV) or 300)
        try:
            self.proc.stdin.write(struct.pack("<Q", len(data)))
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
            head = self._read(8, deadline)
            if head is None:
                return None
            body = self._read(struct.unpack("<Q", head)[0], deadline)
            return None if body is None else pickle.loads(body)
        except (BrokenPipeError, ConnectionResetError):
            return None

    def death(self):
        """(how it ended, the tail of its stderr)."""
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        if self.hung:
            how = f"hung (no reply in {os.environ.get(TIMEOUT_ENV) or 300} s; killed)"
        elif code < 0:
            try:
                how = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
        else:
            how = f"exited with status {code}"
        self.stderr.seek(0)
        tail = self.stderr.read().decode("utf-8", "replace").strip().splitlines()[-8:]
        return how, ("\nits stderr ends with:\n    " + "\n    ".join(tail) if tail else "")

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001 - best effort at exit
            self.proc.kill()


_worker = None
_next_id = 0


def _get_worker() -> _Worker:
    global _worker
    if _worker is None or _worker.proc.poll() is not None:
        _worker = _Worker(os.environ[ENV])
    return _worker


def shutdown():
    global _worker
    if _worker is not None:
        _worker.close()
        _worker = None


def describe() -> str:
    """One line: which ONNX Runtime the worker runs (for the test report)."""
    reply = _get_worker().request({"op": "info"})
    if reply is None:
        how, tail = _get_worker().death()
        raise WorkerDied(f"the isolated ONNX Runtime ({os.environ[ENV]}) did not start: {how}{tail}")
    return f"onnxruntime {reply['version']} in {reply['python']} (providers {', '.join(reply['providers'])})"


def _label(model_bytes: bytes) -> str:
    test = os.environ.get("PYTEST_CURRENT_TEST", "outside a test").rsplit(" (", 1)[0]
    try:
        import onnx

        graph = onnx.load_from_string(model_bytes).graph.name
    except Exception:  # noqa: BLE001
        graph = "?"
    return f"{test}, graph {graph!r}"


def _save_failure(label: str, model_bytes: bytes, feeds=None) -> Path:
    folder = Path(os.environ.get(FAILED_DIR_ENV) or Path(tempfile.gettempdir()) / "tfops-ort-failures")
    folder.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", label)[-120:]
    path = folder / f"{stem}.onnx"
    path.write_bytes(model_bytes)
    if feeds is not None:
        np.savez(folder / f"{stem}.inputs.npz", **{k: np.asarray(v) for k, v in feeds.items()})
    return path


class _Arg:
    def __init__(self, d):
        self.name, self.shape, self.type = d["name"], d["shape"], d["type"]

    def __repr__(self):
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape})"


class IsolatedSession:
    """The part of onnxruntime.InferenceSession the lowering tests use, run in the worker."""

    def __init__(self, model_bytes: bytes, options: dict):
        global _next_id
        self._bytes = model_bytes
        self._label = _label(model_bytes)
        _next_id += 1
        self._id = _next_id
        self._worker = _get_worker()
        reply = self._request({"op": "create", "id": self._id, "model": model_bytes, "options": options}, None)
        self._inputs = [_Arg(a) for a in reply["inputs"]]
        self._outputs = [_Arg(a) for a in reply["outputs"]]
        stats["sessions"] += 1

    def _request(self, message, feeds):
        if self._worker.proc.poll() is not None:  # an earlier model killed the worker this session lives in
            self._worker = _get_worker()
            reply = self._worker.request({"op": "create", "id": self._id, "model": self._bytes, "options": {}})
            if reply is not None and "error" in reply:
                raise IsolatedOrtError(reply["error"])
        else:
            reply = True
        if reply is not None:
            reply = self._worker.request(message)
        if reply is None:
            path = _save_failure(self._label, self._bytes, feeds)
            what = "creating a session for" if message["op"] == "create" else "running"
            how, tail = self._worker.death()
            raise WorkerDied(f"ONNX Runtime ({self._worker.python}, CPUExecutionProvider) {how} while {what} the "
                             f"model of {self._label} (saved as {path}){tail}")
        if "error" in reply:
            raise IsolatedOrtError(f"{reply['error']} (isolated ONNX Runtime, model of {self._label})")
        return reply

    def get_inputs(self):
        return list(self._inputs)

    def get_outputs(self):
        return list(self._outputs)

    def get_providers(self):
        return ["CPUExecutionProvider"]

    def run(self, output_names, input_feed, run_options=None):
        feeds = {name: np.asarray(value) for name, value in input_feed.items()}
        reply = self._request({"op": "run", "id": self._id, "outputs": list(output_names) if output_names else None,
                               "feeds": {name: _to_npy(v) for name, v in feeds.items()}}, feeds)
        stats["runs"] += 1
        return [_from_npy(v) for v in reply["values"]]

    def __del__(self):
        worker = getattr(self, "_worker", None)
        if worker is not None and worker is _worker and worker.proc.poll() is None:
            try:
                worker.request({"op": "close", "id": self._id})
            except Exception:  # noqa: BLE001 - at interpreter exit the pipes may be gone
                pass


def _standard_only(model_bytes: bytes) -> bool:
    import onnx

    model = onnx.load_from_string(model_bytes)
    if any(imp.domain not in STANDARD_DOMAINS for imp in model.opset_import):
        return False
    if model.functions:
        return False

    def graph_ok(graph):
        for node in graph.node:
            if node.domain not in STANDARD_DOMAINS:
                return False
            for attr in node.attribute:
                subgraphs = list(attr.graphs) + ([attr.g] if attr.HasField("g") else [])
                if not all(graph_ok(g) for g in subgraphs):
                    return False
        return True

    return graph_ok(model.graph)


def _options(sess_options) -> dict:
    if sess_options is None:
        return {}
    out = {key: getattr(sess_options, key) for key in ("intra_op_num_threads", "inter_op_num_threads")}
    out["graph_optimization_level"] = int(sess_options.graph_optimization_level)
    return out


def install():
    """Route standard-domain models of every later ``onnxruntime.InferenceSession(...)`` to the worker."""
    import onnxruntime

    real = onnxruntime.InferenceSession
    if getattr(real, "_tfops_isolated", False):
        return

    def session(path_or_bytes, sess_options=None, providers=None, provider_options=None, **kwargs):
        model_bytes = path_or_bytes
        if isinstance(path_or_bytes, (str, os.PathLike)):
            model_bytes = Path(path_or_bytes).read_bytes()
        if (isinstance(model_bytes, bytes) and not provider_options and not kwargs
                and providers in (None, ["CPUExecutionProvider"], ("CPUExecutionProvider",))
                and _standard_only(model_bytes)):
            return IsolatedSession(model_bytes, _options(sess_options))
        stats["in_process"] += 1
        return real(path_or_bytes, sess_options, providers, provider_options, **kwargs)

    session._tfops_isolated = True
    session.real = real
    onnxruntime.InferenceSession = session
