"""A worker: a child process that builds and judges graphs, TensorFlow imported once.

Protocol (``python -m tools.graphgen.worker``): one JSON request per stdin line, ``{"spec": ..., "options": ...}``;
for each, the worker writes JSON lines to its protocol pipe: ``{"started": [signature, lowering]}`` before each run
(so that the parent knows which run a crash or a hang belongs to) and finally ``{"record": ...}``. TF's and ONNX
Runtime's own output goes to the worker's log, never to the pipe.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
import traceback

PROTOCOL_FD_ENV = "GRAPHGEN_PROTOCOL_FD"


def runs_of(spec, options: dict) -> list:
    """The (signature, lowering) pairs a graph is judged in."""
    from tools.graphgen.spec import INFERENCE, KINDS, QAT_FAMILIES

    lowerings = [lo for lo in options.get("lowerings", ("custom", "standard", "integer"))]
    pairs = []
    for key in options.get("kinds", KINDS):
        for lowering in lowerings:
            if lowering == "integer" and not (key == INFERENCE and spec.family in QAT_FAMILIES):
                continue
            pairs.append((key, lowering))
    return pairs


def judge_graph(spec, options: dict, announce=lambda *a: None) -> dict:
    """Builds ``spec``, runs every (signature, lowering) and tf2onnx's baseline; the campaign's record."""
    from tools.graphgen import oracle
    from tools.graphgen.build import build_saved_model
    from tools.graphgen.spec import InvalidGraph

    record = {"name": spec.name, "spec": spec.to_json(), "family": spec.family, "runs": [], "tf2onnx": {}}
    started = time.time()
    workdir = oracle.new_workdir(options.get("tmp"))
    try:
        saved = os.path.join(workdir, "saved_model")
        try:
            record["features"] = build_saved_model(spec, saved)
        except InvalidGraph as e:
            record["invalid"] = oracle.mask(str(e))
            record["invalid_detail"] = str(e)[:400]
            return record
        except Exception as e:  # noqa: BLE001 - TF, Keras or tfmot failing to build or train a model is theirs
            where = traceback.extract_tb(e.__traceback__)[-1]
            record["invalid"] = oracle.mask(f"building it raised {type(e).__name__}: {e}")
            record["invalid_detail"] = f"{type(e).__name__}: {e} (at {where.filename}:{where.lineno})"[:600]
            return record
        for key, lowering in runs_of(spec, options):
            announce(key, lowering)
            result = oracle.run_signature(saved, key, lowering, workdir, variable_updates=spec.optimizer is not None,
                                          opset=19 if spec.quantize_mode == "float8" else 17)
            record["runs"].append({"kind": key, "lowering": lowering, **result})
        if options.get("tf2onnx", True):
            for key in options.get("kinds", record["features"]):
                announce(key, "tf2onnx")
                record["tf2onnx"][key] = oracle.tf2onnx_baseline(saved, key, workdir)
    finally:
        record["seconds"] = round(time.time() - started, 2)
        if not options.get("keep"):
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            record["workdir"] = workdir
    return record


def main() -> int:
    # The protocol gets its own copy of stdout; fds 1 and 2 go to the log (TF and ORT write there directly).
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    log = os.environ.get("GRAPHGEN_WORKER_LOG", os.devnull)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"  # the verifier's oracle: TF's Eigen kernels
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from converters.quiet_tf import import_tensorflow_quietly

    import_tensorflow_quietly()
    from tools.graphgen.spec import GraphSpec

    def send(message):
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    send({"ready": True})
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        spec = GraphSpec.from_json(request["spec"])
        record = judge_graph(spec, request.get("options", {}), lambda k, lo: send({"started": [k, lo]}))
        send({"record": record})
    return 0


if __name__ == "__main__":
    sys.exit(main())
