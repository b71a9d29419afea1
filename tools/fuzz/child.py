"""The child process that runs cases for one side: ``python -m tools.fuzz.child {tf|lib|numpy}``.

Protocol (pickled frames, an 8-byte little-endian length before each): the parent writes ``(index, case)``
frames on stdin (``None`` ends the child); for each the child writes ``("start", index)`` before it runs the
case and ``("result", index, result)`` after. So when the child dies or hangs, the last "start" names the
case. A result is a dict: ``status`` "ok" with ``outputs``, "error" (the side rejected the input) with
``message``, "skipped" (the oracle was not run, ``message`` says why) or "harness" (the fuzzer itself failed
on the case, ``message`` says how). The child keeps its real stdout for the frames and points file
descriptor 1 at stderr, so whatever a library prints cannot corrupt them.
"""
from __future__ import annotations

import os
import pickle
import struct
import sys
from pathlib import Path
from typing import BinaryIO, Callable, Optional

ROOT = Path(__file__).resolve().parents[2]
HEADER = struct.Struct("<Q")


def write_frame(stream: BinaryIO, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(HEADER.pack(len(data)) + data)
    stream.flush()


def read_frame(stream: BinaryIO):
    """The next object, or EOFError when the stream ends (a frame cut short counts as the end)."""
    head = stream.read(HEADER.size)
    if len(head) < HEADER.size:
        raise EOFError
    size = HEADER.unpack(head)[0]
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


def serve(run_case: Callable, stdin: Optional[BinaryIO] = None) -> None:
    """The child's loop: read cases, announce each, run it with ``run_case(case) -> result``, report."""
    frames = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    stdin = stdin or sys.stdin.buffer
    while True:
        try:
            message = read_frame(stdin)
        except EOFError:
            return
        if message is None:
            return
        index, case = message
        write_frame(frames, ("start", index))
        try:
            result = run_case(case)
        except Exception as e:  # noqa: BLE001 - a fuzzer bug must not look like a crash of the side
            result = {"status": "harness", "message": f"{type(e).__name__}: {e}"}
        write_frame(frames, ("result", index, result))


# ------------------------------------------------------------------------------------------------ sides

def tf_runner() -> Callable:
    """TensorFlow's raw op (Eigen kernels: the parent sets TF_ENABLE_ONEDNN_OPTS=0), one thread."""
    import tensorflow as tf

    from tools.fuzz.cases import ORACLE_OUTPUT_LIMIT, largest_output
    from tools.goldens._common import check_tf_mode, tf_error_message
    from tools.goldens._fused_chain import tf_op

    check_tf_mode(onednn=False)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)

    def run(case):
        size = largest_output(case)
        if size > ORACLE_OUTPUT_LIMIT:
            return {"status": "skipped", "message": f"an output of {size} elements: TF would try to allocate it"}
        try:
            # Tensors of the inputs' own types: raw ops would otherwise convert a NumPy array of the wrong
            # type to the one they expect, which a graph never does. A fused op runs TF's chain of its ops.
            out = tf_op(case.op, [tf.constant(x) for x in case.inputs], case.attrs)
        except Exception as e:  # noqa: BLE001 - every way TF refuses an input is a rejection
            return {"status": "error", "message": tf_error_message(e)}
        return {"status": "ok", "outputs": [o.numpy() for o in out]}

    return run


def _backend_runner(backend: str) -> Callable:
    """The library through ONNX Runtime (one thread), or the NumPy reference kernels."""
    sys.path.insert(0, str(ROOT / "tests"))
    from backends import BackendError, run_numpy, run_ort

    def run(case):
        try:
            if backend == "ort":
                outputs = run_ort(case.op, case.inputs, case.attrs, threads=1)
            else:
                outputs = run_numpy(case.op, case.inputs, case.attrs)
        except BackendError as e:
            return {"status": "error", "message": str(e)}
        return {"status": "ok", "outputs": list(outputs)}

    return run


RUNNERS = {"tf": tf_runner, "lib": lambda: _backend_runner("ort"), "numpy": lambda: _backend_runner("numpy")}


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] not in RUNNERS:
        raise SystemExit(f"usage: python -m tools.fuzz.child {{{'|'.join(RUNNERS)}}}")
    serve(RUNNERS[argv[0]]())


if __name__ == "__main__":
    main()
