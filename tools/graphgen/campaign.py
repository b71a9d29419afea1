"""A campaign: graphs ``seed/0 .. seed/N-1`` judged by a pool of worker processes, one JSONL record per graph.

Resumable: records already in the results file are kept and their graphs skipped. A worker that dies (a signal:
ONNX Runtime aborting, a segfault) or takes longer than the timeout on one graph is replaced, and the graph is
recorded as failed, in the run it had announced.
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Optional

from tools.graphgen.draw import draw_graph

ROOT = Path(__file__).resolve().parents[2]


# A worker is replaced after this many graphs: TensorFlow and Keras keep every traced function and model of a
# process, and a worker that has built a few hundred graphs grows by gigabytes until the machine swaps (two
# graphs of a 244-graph campaign "hung" that way).
GRAPHS_PER_WORKER = 40


class Worker:
    def __init__(self, log: str):
        env = dict(os.environ, GRAPHGEN_WORKER_LOG=log, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, "-m", "tools.graphgen.worker"], cwd=str(ROOT), env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.spec = None
        self.started = 0.0
        self.last_run = None
        self.ready = False
        self.judged = 0

    def submit(self, spec, options) -> None:
        self.spec, self.started, self.last_run = spec, time.time(), None
        self.judged += 1
        self.proc.stdin.write(json.dumps({"spec": spec.to_json(), "options": options}) + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _lost_record(spec, what: str, last_run, seconds: float) -> dict:
    kind, lowering = last_run or ("build", "-")
    return {"name": spec.name, "spec": spec.to_json(), "family": spec.family, "seconds": round(seconds, 2),
            "runs": [{"kind": kind, "lowering": lowering, "status": "failed", "class": what,
                      "detail": f"the worker {what} during {kind} in the {lowering} lowering"}],
            "tf2onnx": {}, "features": {}}


def done_names(path: Path) -> set:
    if not path.exists():
        return set()
    names = set()
    for line in path.read_text().splitlines():
        if line.strip():
            names.add(json.loads(line)["name"])
    return names


def run_campaign(seed: int, graphs: int, jobs: int, results: Path, options: dict, timeout: float = 600.0,
                 progress: Optional[Callable[[str], None]] = None, specs: Optional[Iterable] = None) -> list:
    """Judges the graphs not yet in ``results``; returns every record of the file afterwards."""
    results.parent.mkdir(parents=True, exist_ok=True)
    done = done_names(results)
    pending = [s for s in (specs if specs is not None else (draw_graph(seed, i) for i in range(graphs)))
               if s.name not in done]
    total, finished, failed = len(pending), 0, 0
    log = str(results.with_suffix(".worker.log"))
    workers = [Worker(log) for _ in range(max(1, min(jobs, len(pending))))] if pending else []
    t0 = time.time()
    with results.open("a") as out:
        def write(record):
            nonlocal finished, failed
            out.write(json.dumps(record, sort_keys=True) + "\n")
            out.flush()
            finished += 1
            failed += any(r["status"] == "failed" for r in record["runs"])
            if progress:
                rate = finished / max(time.time() - t0, 1e-9) * 3600
                width = 30
                bar = "#" * int(width * finished / total) + "." * (width - int(width * finished / total))
                progress(f"[{bar}] {finished}/{total} graphs, {failed} with failures, {rate:.0f} graphs/hour "
                         f"(last {record['name']} {record.get('seconds', 0):.0f} s)")

        while pending or any(w.spec is not None for w in workers):
            for i, w in enumerate(workers):
                if w.spec is None and w.ready and pending:
                    w.submit(pending.pop(0), options)
            streams = {w.proc.stdout.fileno(): w for w in workers if w.proc.poll() is None}
            readable, _, _ = select.select(list(streams), [], [], 1.0)
            for fd in readable:
                w = streams[fd]
                line = w.proc.stdout.readline()
                if not line:
                    continue
                message = json.loads(line)
                if "ready" in message:
                    w.ready = True
                elif "started" in message:
                    w.last_run = tuple(message["started"])
                elif "record" in message:
                    write(message["record"])
                    w.spec = None
                    if w.judged >= GRAPHS_PER_WORKER and pending:
                        w.proc.stdin.close()
                        w.kill()
                        workers[workers.index(w)] = Worker(log)
            for i, w in enumerate(workers):
                dead = w.proc.poll() is not None
                late = w.spec is not None and time.time() - w.started > timeout
                if not (dead or late):
                    continue
                if w.spec is not None:
                    code = w.proc.returncode
                    what = (f"hung (over {timeout:.0f} s)" if late else
                            f"crashed (signal {-code})" if code is not None and code < 0 else f"exited ({code})")
                    write(_lost_record(w.spec, what, w.last_run, time.time() - w.started))
                w.kill()
                workers[i] = Worker(log)
    for w in workers:
        w.proc.stdin.close()
        w.kill()
    return [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
