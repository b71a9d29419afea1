"""Delta debugging of a failing graph: drop layers, unwrap branches, shrink the input, while the graph still fails the
same way (same signature, lowering and failure class). Candidates run in a worker process, so a crash or a hang is
reproduced as such."""
from __future__ import annotations

import copy
import time
from typing import Callable, Iterator, Optional

from tools.graphgen.spec import RAW, GraphSpec, InvalidGraph, check


def _layer_edits(layers: list) -> Iterator[list]:
    for i, op in enumerate(layers):
        yield layers[:i] + layers[i + 1:]  # drop it
        if op["op"] == "residual":
            yield layers[:i] + op["branch"] + layers[i + 1:]
        if op["op"] == "concat":
            for branch in op["branches"]:
                yield layers[:i] + branch + layers[i + 1:]
        for key in ("activation", "kernel_fq", "strides", "dilation", "groups"):
            if key in op:
                edited = dict(op)
                del edited[key]
                yield layers[:i] + [edited] + layers[i + 1:]
        if op["op"] in ("conv", "sepconv") and op.get("filters", 1) > 1:
            yield layers[:i] + [dict(op, filters=op.get("groups", 1))] + layers[i + 1:]  # fewest the groups allow
        if op.get("multiplier", 1) > 1:
            yield layers[:i] + [dict(op, multiplier=1)] + layers[i + 1:]


def candidates(spec: GraphSpec) -> Iterator[GraphSpec]:
    body = "raw" if spec.family == RAW else "layers"
    for edited in _layer_edits(getattr(spec, body)):
        c = spec.copy()
        setattr(c, body, copy.deepcopy(edited))
        yield c
    h, w, ch = spec.input
    for shape in ((max(1, h // 2), w, ch), (h, max(1, w // 2), ch), (h - 1, w, ch), (h, w - 1, ch), (h, w, ch - 1)):
        if min(shape) >= 1 and shape != (h, w, ch):
            c = spec.copy()
            c.input = shape
            yield c
    for field, value in (("batch", 1), ("optimizer", None), ("train_steps", 1), ("head", "flatten")):
        if getattr(spec, field) != value:
            c = spec.copy()
            setattr(c, field, value)
            yield c


def _failure(record: dict, kind: str, lowering: str) -> Optional[str]:
    for run in record["runs"]:
        if run["kind"] == kind and run["lowering"] == lowering and run["status"] == "failed":
            return run["class"]
    return None


def minimize(spec: GraphSpec, kind: str, lowering: str, failure_class: str, judge: Callable[[GraphSpec, dict], dict],
             budget: int = 60, progress=None) -> tuple:
    """(the smallest spec found that still fails ``kind``/``lowering`` with ``failure_class``, candidates tried)."""
    options = {"kinds": [kind], "lowerings": [lowering], "tf2onnx": False}
    tried = 0
    improved = True
    while improved and tried < budget:
        improved = False
        for c in candidates(spec):
            try:
                check(c)
            except InvalidGraph:
                continue
            if tried >= budget:
                break
            tried += 1
            record = judge(c, options)
            if "invalid" not in record and _failure(record, kind, lowering) == failure_class:
                spec, improved = c, True
                if progress:
                    progress(f"  smaller, still failing: {c.describe()[:200]}")
                break
    return spec, tried


def reproducer(spec: GraphSpec, kind: str, lowering: str, failure_class: str) -> str:
    """The command that replays a minimized graph."""
    return (f"# {failure_class} ({kind}, {lowering} lowering)\n"
            f"python -m tools.graphgen --replay '{spec.dumps()}' --kinds {kind} --lowerings {lowering}")


def worker_judge(timeout: float = 600.0):
    """A judge(spec, options) -> record that runs in one long-lived worker process (replaced after a crash)."""
    from tools.graphgen.campaign import Worker, _lost_record
    import json
    import os
    import tempfile

    state = {"worker": None}
    log = os.path.join(tempfile.gettempdir(), "graphgen-minimize.log")

    def judge(spec, options):
        w = state["worker"]
        if w is None or w.proc.poll() is not None:
            w = state["worker"] = Worker(log)
            json.loads(w.proc.stdout.readline())  # ready
        w.submit(spec, options)
        while True:
            line = w.proc.stdout.readline()
            if not line:
                w.kill()
                state["worker"] = None
                return _lost_record(spec, f"crashed (signal {-w.proc.returncode})" if w.proc.returncode < 0
                                    else f"exited ({w.proc.returncode})", w.last_run, time.time() - w.started)
            message = json.loads(line)
            if "started" in message:
                w.last_run = tuple(message["started"])
            elif "record" in message:
                return message["record"]

    return judge
