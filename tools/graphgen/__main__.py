"""``python -m tools.graphgen --graphs N --seed S --jobs J``: a campaign of seeded random graphs around the family,
each built in TF, converted by the CLI in every lowering and signature, verified, and judged (tools.graphgen).

Results go to OUT/results.jsonl (one record per graph; a rerun resumes), the summary to OUT/summary.md and stdout.
``--minimize`` shrinks one graph of each failure class and prints a replay command for it;
``--replay SPEC_JSON`` judges one graph (a minimized reproducer). Exit status 1 when any graph failed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from tools.graphgen.campaign import ROOT, run_campaign
from tools.graphgen.report import summarize
from tools.graphgen.spec import KINDS, GraphSpec


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m tools.graphgen", description=__doc__.split("\n\n")[0])
    p.add_argument("--graphs", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1, help="worker processes (each imports TensorFlow once)")
    p.add_argument("--out", type=Path, default=None, help="results folder (default build/graphgen/seed-S)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one graph may take before it counts as hung")
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    p.add_argument("--lowerings", nargs="+", choices=("custom", "standard", "integer"),
                   default=["custom", "standard", "integer"])
    p.add_argument("--no-tf2onnx", action="store_true", help="skip the tf2onnx baseline")
    p.add_argument("--retry-failed", action="store_true",
                   help="judge again the graphs of the results file that failed (after a fix), keeping the others")
    p.add_argument("--minimize", action="store_true", help="minimize one graph of each failure class")
    p.add_argument("--minimize-budget", type=int, default=60, help="candidate graphs tried per minimization")
    p.add_argument("--replay", metavar="SPEC_JSON", help="judge this one graph (a spec as JSON, or a file of one)")
    return p.parse_args(argv)


def _replay(args) -> int:
    from tools.graphgen.minimize import worker_judge

    text = Path(args.replay).read_text() if os.path.isfile(args.replay) else args.replay
    spec = GraphSpec.from_json(json.loads(text))
    print(spec.describe())
    record = worker_judge(args.timeout)(spec, {"kinds": args.kinds, "lowerings": args.lowerings,
                                                "tf2onnx": not args.no_tf2onnx})
    if "invalid" in record:
        print(f"not a valid graph: {record['invalid_detail']}")
        return 2
    for run in record["runs"]:
        print(f"{run['kind']:16s} {run['lowering']:9s} {run['status']:9s} {run.get('class', run.get('reason', ''))}"
              f"  {run.get('detail', '')[:300]}")
    return 1 if any(r["status"] == "failed" for r in record["runs"]) else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.replay:
        return _replay(args)
    out = args.out or ROOT / "build" / "graphgen" / f"seed-{args.seed}"
    options = {"kinds": args.kinds, "lowerings": args.lowerings, "tf2onnx": not args.no_tf2onnx}
    if args.retry_failed:
        print(f"judging again {drop_failed(out / 'results.jsonl')} graph(s) that failed", file=sys.stderr)
    t = time.time()
    records = run_campaign(args.seed, args.graphs, args.jobs, out / "results.jsonl", options, args.timeout,
                           progress=lambda line: print("\r" + line, end="", file=sys.stderr, flush=True))
    print(file=sys.stderr)
    wanted = {f"s{args.seed}-g{i:05d}" for i in range(args.graphs)}
    records = [r for r in records if r["name"] in wanted]
    summary = summarize(records)
    print(f"(this run: {time.time() - t:.0f} s wall with {args.jobs} job(s))")
    if args.minimize:
        summary += "\n\n" + _minimize_failures(records, args)
    (out / "summary.md").write_text(summary + "\n")
    print(summary)
    return 1 if any(run["status"] == "failed" for r in records for run in r["runs"]) else 0


def drop_failed(results: Path) -> int:
    """Removes the records with a failed run from ``results``; returns how many."""
    if not results.exists():
        return 0
    lines = [line for line in results.read_text().splitlines() if line.strip()]
    keep = [line for line in lines if not any(r["status"] == "failed" for r in json.loads(line)["runs"])]
    results.write_text("".join(line + "\n" for line in keep))
    return len(lines) - len(keep)


def _minimize_failures(records, args) -> str:
    from tools.graphgen.minimize import minimize, reproducer, worker_judge

    judge = worker_judge(args.timeout)
    seen, out = set(), ["### Minimized reproducers"]
    for r in records:
        for run in r["runs"]:
            key = (run["lowering"], run.get("class"))
            if run["status"] != "failed" or key in seen:
                continue
            seen.add(key)
            print(f"minimizing {r['name']}: {run['class']} ({run['kind']}, {run['lowering']})", file=sys.stderr)
            spec, tried = minimize(GraphSpec.from_json(r["spec"]), run["kind"], run["lowering"], run["class"], judge,
                                   args.minimize_budget, progress=lambda line: print(line, file=sys.stderr))
            out += ["", f"{r['name']}, {tried} candidates tried: {spec.describe()}", "```",
                    reproducer(spec, run["kind"], run["lowering"], run["class"]), "```"]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
