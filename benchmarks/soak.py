"""A long soak of one custom-lowering model: N threads sharing one session, distinct inputs, periodic bit-checks.

    PYTHONPATH=. python benchmarks/soak.py [--model mobilenet_v2_qat] [--threads 8] [--minutes 10 | --runs K]
                                           [--inputs 64] [--check-every 50] [--report-every 10]
                                           [--free-dim 2] [--intra-op-threads N]

What it does: loads models/<model>/model.custom.onnx into one ONNX Runtime CPU session with the project's
custom-op library (ort_ops.session_options()), makes ``--inputs`` distinct seeded inputs (as
tests/test_concurrency.py: images in [0, 1), labels in [0, 10), free dims ``--free-dim``) and runs each once
serially: those outputs are the reference. Then ``--threads`` threads run the session at once, each cycling
through the inputs from its own offset, until ``--minutes`` have passed or ``--runs`` runs are done; every
``--check-every``-th run of each thread is compared bit for bit (NaN payloads included) with the reference.

What it reports: one row every ``--report-every`` seconds (and at the end) with the elapsed time, the runs
done, runs per second since the previous row, bit-checks done, mismatches, exceptions, and the process's
resident memory (VmRSS, and VmHWM, its peak, from /proc/self/status); then a summary: RSS after warm-up
(the first row), at the end, the growth between them and per 1,000 runs. Exit status 1 on any mismatch or
exception. It is a soak, not a timed test: run it by hand (issue 27), not in the suite.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

import ort_ops  # noqa: E402
from converters.verification import same_bits  # noqa: E402
from models.inputs import declared_inputs  # noqa: E402

def memory_kib() -> dict:
    """VmRSS and VmHWM of this process in KiB (Linux /proc/self/status)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def identical(want, got) -> bool:
    return all(w.dtype == g.dtype and w.shape == g.shape and bool(same_bits(w, g, nan_payloads=True).all())
               for w, g in zip(want, got))


class Counters:
    def __init__(self):
        self.lock = threading.Lock()
        self.runs = 0
        self.checks = 0
        self.mismatches = 0
        self.errors = 0
        self.first_problem = None

    def add(self, runs=0, checks=0, mismatches=0, errors=0, problem=None):
        with self.lock:
            self.runs += runs
            self.checks += checks
            self.mismatches += mismatches
            self.errors += errors
            if problem and self.first_problem is None:
                self.first_problem = problem


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="mobilenet_v2_qat", help="a folder under models/ with model.custom.onnx")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--minutes", type=float, default=None, help="run for this long (default 10 unless --runs)")
    ap.add_argument("--runs", type=int, default=None, help="stop after this many runs in all")
    ap.add_argument("--inputs", type=int, default=64, help="distinct inputs cycled through")
    ap.add_argument("--check-every", type=int, default=50, help="bit-check every K-th run of each thread")
    ap.add_argument("--report-every", type=float, default=10.0, help="seconds between table rows")
    ap.add_argument("--free-dim", type=int, default=2, help="size of free (symbolic) input dims")
    ap.add_argument("--intra-op-threads", type=int, default=0, help="ORT intra-op threads (0: its default)")
    args = ap.parse_args(argv)
    if args.minutes is None and args.runs is None:
        args.minutes = 10.0
    deadline = None if args.minutes is None else time.monotonic() + 60.0 * args.minutes

    path = ROOT / "models" / args.model / "model.custom.onnx"
    model = onnx.load(str(path), load_external_data=False)
    so = ort_ops.session_options()
    if args.intra_op_threads:
        so.intra_op_num_threads = args.intra_op_threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    feeds = [declared_inputs(model, seed, args.free_dim) for seed in range(args.inputs)]
    reference = [sess.run(names, feed) for feed in feeds]
    rss0 = memory_kib()
    print(f"soak: {path.relative_to(ROOT)}, {args.threads} threads, {args.inputs} distinct inputs, "
          f"bit-check every {args.check_every} runs per thread, "
          + (f"{args.minutes:g} min" if args.minutes is not None else "") + (" or " if args.minutes and args.runs else "")
          + (f"{args.runs} runs" if args.runs is not None else "")
          + f"; onnxruntime {ort.__version__}, library {ort_ops.library_path()}")
    print(f"after loading and the {args.inputs} serial reference runs: VmRSS {rss0['VmRSS'] / 1024:.1f} MiB")

    counters = Counters()
    stop = threading.Event()
    barrier = threading.Barrier(args.threads + 1)

    def worker(t):
        barrier.wait()
        k = 0
        i = t
        while not stop.is_set():
            if args.runs is not None:
                with counters.lock:
                    if counters.runs >= args.runs:
                        return
                    counters.runs += 1
            i = (i + 1) % len(feeds)
            k += 1
            try:
                got = sess.run(names, feeds[i])
            except Exception as e:  # noqa: BLE001 - counted and reported
                counters.add(runs=0 if args.runs is not None else 1, errors=1,
                             problem=f"thread {t}, input {i}: {type(e).__name__}: {e}")
                continue
            if args.runs is None:
                counters.add(runs=1)
            if k % args.check_every == 0:
                bad = not identical(reference[i], got)
                counters.add(checks=1, mismatches=int(bad),
                             problem=f"thread {t}, input {i}: outputs differ from the serial run" if bad else None)

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(args.threads)]
    for th in threads:
        th.start()
    barrier.wait()
    start = time.monotonic()
    rows = []
    header = f"{'elapsed s':>9} {'runs':>9} {'runs/s':>8} {'checks':>7} {'mismatch':>8} {'errors':>6} {'VmRSS MiB':>9} {'VmHWM MiB':>9}"
    print(header)
    print("-" * len(header))
    last_t, last_runs = start, 0

    def row():
        nonlocal last_t, last_runs
        now = time.monotonic()
        mem = memory_kib()
        with counters.lock:
            runs, checks, mism, errs = counters.runs, counters.checks, counters.mismatches, counters.errors
        rate = (runs - last_runs) / max(now - last_t, 1e-9)
        last_t, last_runs = now, runs
        rows.append((now - start, runs, mem["VmRSS"]))
        print(f"{now - start:9.1f} {runs:9d} {rate:8.1f} {checks:7d} {mism:8d} {errs:6d} "
              f"{mem['VmRSS'] / 1024:9.1f} {mem['VmHWM'] / 1024:9.1f}", flush=True)

    next_report = start + args.report_every
    while True:
        alive = any(th.is_alive() for th in threads)
        now = time.monotonic()
        if not alive or (deadline is not None and now >= deadline):
            break
        if now >= next_report:
            row()
            next_report += args.report_every
        time.sleep(min(0.2, max(0.0, next_report - now)))
    stop.set()
    for th in threads:
        th.join()
    row()

    first, last = rows[0], rows[-1]
    growth = (last[2] - first[2]) / 1024
    per_k = growth / ((last[1] - first[1]) / 1000) if last[1] > first[1] else 0.0
    print(f"summary: {last[1]} runs in {last[0]:.1f} s ({last[1] / max(last[0], 1e-9):.1f}/s), {counters.checks} bit-checks, "
          f"{counters.mismatches} mismatches, {counters.errors} exceptions; VmRSS {first[2] / 1024:.1f} MiB at the first row, "
          f"{last[2] / 1024:.1f} MiB at the end ({growth:+.1f} MiB, {per_k:+.3f} MiB per 1,000 runs after the first row), "
          f"min {min(r[2] for r in rows) / 1024:.1f}, max {max(r[2] for r in rows) / 1024:.1f} MiB")
    if counters.first_problem:
        print(f"first problem: {counters.first_problem}")
    return 1 if counters.mismatches or counters.errors else 0


if __name__ == "__main__":
    sys.exit(main())
