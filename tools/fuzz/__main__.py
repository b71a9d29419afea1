"""``python -m tools.fuzz --seed S --minutes M [--ops OP ...] [--asan]``: a differential campaign, its counts
per class and its findings, minimized, as runnable reproducers. Exit status 1 when there are findings."""
from __future__ import annotations

import argparse
import sys

import ort_ops
from tools.fuzz.campaign import run_campaign
from tools.fuzz.runner import Runner


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.fuzz", description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--minutes", type=float, default=5.0, help="time for generating and running cases")
    parser.add_argument("--max-cases", type=int, default=None)
    parser.add_argument("--ops", nargs="+", choices=ort_ops.OP_NAMES, metavar="OP", help="default: every op")
    parser.add_argument("--asan", action="store_true",
                        help="the library's ASan+UBSan build (build/sanitize, made by scripts/sanitize.sh)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds one case may take on one side")
    parser.add_argument("--minimize-budget", type=int, default=200, help="variants tried per minimized finding")
    parser.add_argument("--no-reproducers", action="store_true", help="list findings without their snippets")
    args = parser.parse_args(argv)
    runner = Runner.default(timeout=args.timeout, asan=args.asan)
    try:
        report = run_campaign(args.seed, args.minutes * 60, args.ops, runner, args.max_cases, args.minimize_budget,
                              progress=lambda line: print(line, file=sys.stderr, flush=True))
    finally:
        runner.close()
    print(report.text(reproducers=not args.no_reproducers))
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main())
