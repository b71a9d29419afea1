"""TensorFlow in its other kernel mode, in a child process, for the verifier.

TF picks its CPU kernels once, at import, from ``TF_ENABLE_ONEDNN_OPTS``: Eigen (``0``, the kernels the
project's exactness claims are made against) or oneDNN (``1``; TF's default on CPUs with AVX-512). The
verifier runs the function in one mode in its own process and in the other mode here, on the same inputs:
the oneDNN run measures TF's own spread; where the caller's TF was imported with oneDNN, the Eigen run is the
reference.

The child gets a description of the function it can load on its own (``source``):

* ``{"kind": "saved_model", "path", "signature_key", "tags"}``: one signature of a SavedModel;
* ``{"kind": "keras", "path"}``: a tf_keras model file, called with training=False;
* ``{"kind": "graph_def", "graph_def": bytes, "inputs": [...], "outputs": [...]}``: a GraphDef from
  input to output tensor names (a GraphDef file, or an in-memory function frozen by :func:`frozen_source`).

It answers with the function's flattened outputs (``tf.nest.flatten`` order) as NumPy arrays. One child per
mode is started on first use and kept for later calls (a TF import costs seconds); it ends with this process.
Run as ``python -m converters.verify_tf_child``: requests and answers travel pickled over its stdin and a
private copy of its stdout (anything TF prints goes to stderr, which is kept in a file for error messages).
"""
from __future__ import annotations

import atexit
import logging
import os
import pickle
import select
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Optional

ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
MODES = ("eigen", "onednn")
REQUEST_TIMEOUT_S = 900
_ROOT = Path(__file__).resolve().parent.parent


def onednn_enabled() -> bool:
    """Whether the TF imported in this process runs its oneDNN kernels."""
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def process_mode() -> Optional[str]:
    """This process's TF kernel mode, or None when TF is not imported yet."""
    if "tensorflow" not in sys.modules:
        return None
    return "onednn" if onednn_enabled() else "eigen"


def frozen_source(concrete_func) -> dict:
    """A ``graph_def`` source for an in-memory ConcreteFunction: frozen by converters.variable_state.freeze,
    which gives the reads that TF orders after an assignment the assigned value (as the converted model does).
    Call it before running the function in this process: a training step assigns its variables."""
    from converters.frontends import _io_names
    from converters.variable_state import freeze

    inputs, outputs = _io_names(concrete_func)
    quiet = [logging.getLogger(n) for n in ("converters.variable_state", "tf2onnx")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)  # the variable updates left out are the converter's news, not the verifier's
    try:
        frozen = freeze(concrete_func, inputs, outputs)
    finally:
        for logger, level in zip(quiet, levels):
            logger.setLevel(level)
    return {"kind": "graph_def", "graph_def": frozen.graph_def.SerializeToString(),
            "inputs": list(frozen.input_names), "outputs": list(frozen.output_names)}


# ---------------------------------------------------------------- parent side


class ChildError(RuntimeError):
    """The child could not run the function; the message is one line."""


class _Worker:
    def __init__(self, mode: str):
        env = dict(os.environ)
        env[ONEDNN_ENV] = "1" if mode == "onednn" else "0"
        env["TF_CPP_MIN_LOG_LEVEL"] = "3"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p)
        self.mode = mode
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "converters.verify_tf_child"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, env=env)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def call(self, request) -> object:
        try:
            _send(self.proc.stdin, request)
            ready, _, _ = select.select([self.proc.stdout], [], [], REQUEST_TIMEOUT_S)
            if not ready:
                raise ChildError(f"no answer in {REQUEST_TIMEOUT_S} s")
            status, payload = _receive(self.proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError, struct.error) as e:
            self.close()
            raise ChildError(self._last_error() or f"{type(e).__name__}: {e}") from None
        if status != "ok":
            raise ChildError(payload)
        return payload

    def _last_error(self) -> str:
        try:
            self.stderr.seek(0)
            lines = [ln.strip() for ln in self.stderr.read().decode(errors="replace").splitlines() if ln.strip()]
        except (OSError, ValueError):
            return ""
        code = self.proc.poll()
        last = lines[-1] if lines else ""
        return f"child exited ({code}): {last}" if code is not None else last

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


_WORKERS: Dict[str, _Worker] = {}


def run_in_mode(mode: str, source: dict, inputs: dict) -> list:
    """The function of ``source`` run by TF in ``mode`` ("eigen" or "onednn") in the child for that mode, on
    ``inputs`` (NumPy arrays by input name, in the function's input order). Returns the flattened outputs.
    Raises :class:`ChildError` with a one-line message when the child fails."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    worker = _WORKERS.get(mode)
    if worker is None or not worker.alive():
        worker = _WORKERS[mode] = _Worker(mode)
    return worker.call({"mode": mode, "source": source, "inputs": inputs})


@atexit.register
def shutdown() -> None:
    """End the children this process started."""
    while _WORKERS:
        _, worker = _WORKERS.popitem()
        worker.close()


def _send(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)))
    stream.write(data)
    stream.flush()


def _read_exactly(stream, n: int) -> bytes:
    chunks = []
    while n:
        chunk = stream.read(n)
        if not chunk:
            raise EOFError("the child closed its output")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _receive(stream):
    (n,) = struct.unpack("<Q", _read_exactly(stream, 8))
    return pickle.loads(_read_exactly(stream, n))


# ---------------------------------------------------------------- child side


def _function(source: dict, inputs: dict):
    """(callable ConcreteFunction, objects to keep alive while it runs)."""
    kind = source["kind"]
    if kind == "saved_model":
        import tensorflow as tf

        loaded = tf.saved_model.load(source["path"], tags=source.get("tags"))  # as verify_saved_model loads it
        return loaded.signatures[source.get("signature_key", "serving_default")], loaded
    if kind == "keras":
        import tf_keras

        from converters.verify_tf import concrete_function

        model = tf_keras.models.load_model(source["path"], compile=False)
        return concrete_function(model, inputs), model
    if kind == "graph_def":
        import tensorflow as tf

        from converters.verify_tf import graph_def_function

        graph_def = tf.compat.v1.GraphDef()
        graph_def.ParseFromString(source["graph_def"])
        return graph_def_function(graph_def, source["inputs"], source["outputs"]), None
    raise ValueError(f"unknown source kind {kind!r}")


def _serve(request) -> list:
    import numpy as np
    import tensorflow as tf

    from converters.verify_tf import run_tf

    mode = "onednn" if onednn_enabled() else "eigen"
    if mode != request["mode"]:
        raise RuntimeError(f"TF runs its {mode} kernels here, {request['mode']} was asked for")
    inputs = request["inputs"]
    function, keep = _function(request["source"], inputs)
    with tf.device("/cpu:0"):
        result = run_tf(function, inputs)
    del keep
    return [np.asarray(v) for v in tf.nest.flatten(result)]


def main() -> None:
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever TF or a library prints goes to stderr, never into the answers
    requests = sys.stdin.buffer
    while True:
        try:
            request = _receive(requests)
        except EOFError:
            return
        try:
            reply = ("ok", _serve(request))
        except BaseException as e:  # noqa: BLE001 - every failure is an answer, in one line
            message = " ".join(f"{type(e).__name__}: {e}".split())
            reply = ("error", message[:500])
        _send(replies, reply)


if __name__ == "__main__":
    main()
