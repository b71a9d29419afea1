"""Both sides in child processes: each child runs many cases, one at a time, under a per-case timeout.

A child that exits while a case runs has crashed on it (result status "crash", with the end of its stderr,
where ASan, UBSan and TF's CHECK failures write); one that takes longer than the timeout is killed and has
hung (status "hang"). Either way the next case gets a fresh child. The TF child and the library child run
the same case at the same time.
"""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Optional, Sequence

from tools.fuzz.cases import Case
from tools.fuzz.child import read_frame, write_frame

ROOT = Path(__file__).resolve().parents[2]
SANITIZED_LIBRARY = ROOT / "build" / "sanitize" / "libort_tf_ops.so"
STARTUP_SECONDS = 180  # importing TensorFlow on a loaded 2-core machine


def base_env() -> dict:
    env = dict(os.environ)
    env.update(TF_ENABLE_ONEDNN_OPTS="0", TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return env


def sanitizer_env() -> dict:
    """The environment scripts/sanitize.sh runs the library in: its ASan+UBSan build, runtimes preloaded."""
    if not SANITIZED_LIBRARY.is_file():
        raise SystemExit(f"no sanitizer build at {SANITIZED_LIBRARY.relative_to(ROOT)}: run scripts/sanitize.sh first")
    cxx = os.environ.get("CXX", "c++")
    runtimes = [subprocess.run([cxx, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
                for name in ("libasan.so", "libubsan.so")]
    return {"ORT_OPS_LIBRARY": str(SANITIZED_LIBRARY), "LD_PRELOAD": " ".join(runtimes),
            "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1", "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}


class Side:
    """One side's child process, restarted after a crash or a hang."""

    def __init__(self, name: str, argv: Sequence[str], env: Optional[dict] = None, timeout: float = 60.0,
                 startup: float = STARTUP_SECONDS):
        self.name = name
        self.argv = list(argv)
        self.env = env or base_env()
        self.timeout = timeout
        self.startup = startup  # extra seconds a fresh child gets for its first case (imports)
        self.proc = None
        self.restarts = 0

    @classmethod
    def kind(cls, kind: str, timeout: float = 60.0, asan: bool = False) -> "Side":
        env = base_env()
        if asan and kind == "lib":
            env.update(sanitizer_env())
        return cls(kind, [sys.executable, "-m", "tools.fuzz.child", kind], env, timeout)

    def _start(self):
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     env=self.env, cwd=ROOT, start_new_session=True)
        self.messages = queue.Queue()
        self.fresh = True
        threading.Thread(target=self._read, args=(self.proc.stdout, self.messages), daemon=True).start()

    @staticmethod
    def _read(stream, messages):
        while True:
            try:
                messages.put(read_frame(stream))
            except (EOFError, OSError, ValueError):
                messages.put(("eof",))
                return

    def submit(self, index: int, case: Case) -> None:
        if self.proc is None:
            self._start()
        try:
            write_frame(self.proc.stdin, (index, case))
        except (BrokenPipeError, OSError):
            pass  # the child is gone: collect() reports it

    def collect(self, index: int) -> dict:
        """The result of case ``index``; a crash or a hang ends this child."""
        started = False
        while True:
            limit = self.startup + self.timeout if self.fresh and not started else self.timeout
            try:
                message = self.messages.get(timeout=limit)
            except queue.Empty:
                self._stop(kill=True)
                where = "" if started else " (never started)"
                return {"status": "hang", "message": f"no result after {limit:.0f} s{where}"}
            if message[0] == "start" and message[1] == index:
                started = True
            elif message[0] == "result" and message[1] == index:
                self.fresh = False
                return message[2]
            elif message[0] == "eof":
                code = self.proc.wait()
                tail = self._stderr_tail()
                self._stop(kill=False)
                return {"status": "crash", "message": f"exit {code}: {tail}"}

    def _stderr_tail(self, size: int = 4000) -> str:
        self.stderr.seek(0, os.SEEK_END)
        end = self.stderr.tell()
        self.stderr.seek(max(0, end - size))
        return self.stderr.read().decode(errors="replace")

    def _stop(self, kill: bool) -> None:
        if self.proc is None:
            return
        if kill and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the child's own session: it and anything it started
        self.proc.wait()
        self.stderr.close()
        self.proc = None
        self.restarts += 1

    def close(self) -> None:
        if self.proc is not None:
            try:
                write_frame(self.proc.stdin, None)
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            self.stderr.close()
            self.proc = None


class Runner:
    """The oracle side and the library side; ``run(case)`` gives both results."""

    def __init__(self, oracle: Side, library: Side):
        self.oracle, self.library = oracle, library
        self.count = 0

    @classmethod
    def default(cls, timeout: float = 60.0, asan: bool = False, oracle: str = "tf") -> "Runner":
        return cls(Side.kind(oracle, timeout), Side.kind("lib", timeout, asan))

    def run(self, case: Case):
        self.count += 1
        for side in (self.oracle, self.library):
            side.submit(self.count, case)
        return self.oracle.collect(self.count), self.library.collect(self.count)

    def close(self) -> None:
        self.oracle.close()
        self.library.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def has_tensorflow() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorflow") is not None

