"""TensorFlow's two CPU kernel sets, chosen explicitly: Eigen (the suite's pinned mode) and oneDNN.

TF 2.21 picks its kernels at import time from ``TF_ENABLE_ONEDNN_OPTS``; unset, it turns oneDNN on for
CPUs with AVX-512 and leaves it off elsewhere. The two sets differ in results (oneDNN sums in its own order)
and even in shapes (placeholder outputs, empty batches), so a suite that inherited the CPU's default would
pass on one machine and fail on another. ``tests/conftest.py`` therefore pins Eigen for the test process
before anything imports TF, and the tests that claim agreement with oneDNN too run TF in a child process
with oneDNN forced on (:func:`call_in_mode`), whatever the CPU.

This module imports TensorFlow only inside the functions that need it.
"""
from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
MODES = ("eigen", "onednn")
_TESTS = Path(__file__).resolve().parent


def pin_eigen() -> None:
    """Make TF run its Eigen kernels in this process. Must run before TensorFlow is imported."""
    if "tensorflow" in sys.modules and os.environ.get(ONEDNN_ENV) != "0":
        raise RuntimeError(f"TensorFlow was imported before {ONEDNN_ENV} was pinned to 0")
    os.environ[ONEDNN_ENV] = "0"


def onednn_enabled() -> bool:
    """Whether the TF imported in this process runs its oneDNN kernels."""
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def assert_mode(mode: str) -> None:
    """Fail loudly if this process's TF is not in ``mode`` (a test must never compare against the wrong kernels)."""
    if onednn_enabled() != (mode == "onednn"):
        raise RuntimeError(f"TensorFlow runs {'oneDNN' if onednn_enabled() else 'Eigen'} kernels, expected {mode}")


def call_in_mode(mode: str, function: str, *args):
    """``module:function(*args)`` with TF in ``mode``: in this process for "eigen" (pinned by conftest), in a
    child process with ``TF_ENABLE_ONEDNN_OPTS=1`` for "onednn". ``module`` is imported from tests/; arguments
    and result travel pickled, so they must be plain data (NumPy arrays, lists, dicts)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "eigen":
        assert_mode("eigen")
        module, name = function.split(":")
        return getattr(importlib.import_module(module), name)(*args)
    env = dict(os.environ, **{ONEDNN_ENV: "1", "TF_CPP_MIN_LOG_LEVEL": "2"})
    env["PYTHONPATH"] = os.pathsep.join([str(_TESTS), str(_TESTS.parent), env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory() as tmp:
        request, reply = Path(tmp, "request.pkl"), Path(tmp, "reply.pkl")
        request.write_bytes(pickle.dumps((mode, function, args)))
        proc = subprocess.run([sys.executable, __file__, str(request), str(reply)], env=env,
                              capture_output=True, text=True, timeout=1200)
        if proc.returncode != 0 or not reply.exists():
            raise RuntimeError(f"TF ({mode}) child for {function} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        return pickle.loads(reply.read_bytes())


def _child(request: str, reply: str) -> None:
    mode, function, args = pickle.loads(Path(request).read_bytes())
    assert_mode(mode)
    module, name = function.split(":")
    result = getattr(importlib.import_module(module), name)(*args)
    Path(reply).write_bytes(pickle.dumps(result))


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
