"""Child process of tests/isolated_ort.py: runs ONNX models in the ONNX Runtime of *its own* Python.

Started as ``<other python> tests/isolated_ort_worker.py``; it needs only numpy and onnxruntime (any
build: the point is to run the models in another one, e.g. onnxruntime-gpu's CPUExecutionProvider, whose
C++ library assertions abort the process on malformed nodes). It reads requests from stdin and writes
replies to stdout, each a pickle of plain Python values (arrays travel as .npy bytes, so the two sides'
NumPy versions need not match) behind an 8-byte length:

    {"op": "create", "id": int, "model": bytes, "options": {...}} -> {"inputs": [...], "outputs": [...]}
        (each input/output as name, shape, type)
    {"op": "run", "id": int, "outputs": [names] or None, "feeds": {name: npy bytes}} -> {"values": [npy bytes]}
    {"op": "close", "id": int} -> {}
    {"op": "info"} -> {"version": ..., "providers": [...], "python": ...}

An ONNX Runtime exception is replied as {"error": "<type>: <message>"}; an abort kills the process,
which the parent reports as a test failure naming the model.
"""
import io
import pickle
import struct
import sys

import numpy as np
import onnxruntime as ort


def _read(stream):
    head = stream.read(8)
    if len(head) < 8:
        return None
    (size,) = struct.unpack("<Q", head)
    return pickle.loads(stream.read(size))


def _write(stream, message):
    data = pickle.dumps(message, protocol=4)
    stream.write(struct.pack("<Q", len(data)))
    stream.write(data)
    stream.flush()


def _to_npy(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(array), allow_pickle=False)
    return buffer.getvalue()


def _from_npy(data: bytes):
    return np.load(io.BytesIO(data), allow_pickle=False)


def _args(values):
    return [{"name": v.name, "shape": list(v.shape), "type": v.type} for v in values]


def _session(model: bytes, options: dict):
    so = ort.SessionOptions()
    for key in ("intra_op_num_threads", "inter_op_num_threads"):
        if options.get(key):
            setattr(so, key, int(options[key]))
    if "graph_optimization_level" in options:
        so.graph_optimization_level = ort.GraphOptimizationLevel(int(options["graph_optimization_level"]))
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def main():
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write to the reply stream
    sessions = {}
    while True:
        request = _read(stdin)
        if request is None:
            return
        try:
            if request["op"] == "info":
                reply = {"version": ort.__version__, "providers": ort.get_available_providers(), "python": sys.executable}
            elif request["op"] == "create":
                session = _session(request["model"], request.get("options", {}))
                sessions[request["id"]] = session
                reply = {"inputs": _args(session.get_inputs()), "outputs": _args(session.get_outputs())}
            elif request["op"] == "run":
                feeds = {name: _from_npy(data) for name, data in request["feeds"].items()}
                values = sessions[request["id"]].run(request["outputs"], feeds)
                reply = {"values": [_to_npy(v) for v in values]}
            elif request["op"] == "close":
                sessions.pop(request["id"], None)
                reply = {}
            else:
                reply = {"error": f"ValueError: unknown request {request['op']!r}"}
        except Exception as e:  # ONNX Runtime's own errors go back to the test
            reply = {"error": f"{type(e).__name__}: {e}"}
        _write(stdout, reply)


if __name__ == "__main__":
    main()
