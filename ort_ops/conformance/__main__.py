"""python -m ort_ops.conformance {export,run}: the golden cases as ONNX node tests, and a runner for them.

    python -m ort_ops.conformance export DIR [--ops OP ...]
    python -m ort_ops.conformance run [--cases DIR] [--backend ort|reference|extensions] [--provider NAME]
                                      [--library PATH] [--ops OP ...] [--json FILE] [--show N]

``run`` without ``--cases`` exports the shipped cases to a temporary directory first and runs those, so it
always runs what ``export`` writes. Exit status: 0 when every case ran passed (skipped ones are listed with
their reason), 1 when one failed, 2 for bad usage.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from ort_ops.conformance import nodetest, runner


def _export(args) -> int:
    start = time.monotonic()
    manifest = nodetest.export(args.dir, args.ops)
    cases = manifest["cases"]
    rejections = sum("reject" in c for c in cases)
    size = sum(p.stat().st_size for p in Path(args.dir).rglob("*") if p.is_file())
    print(f"export: {len(cases)} cases of {len({c['op'] for c in cases})} ops ({len(cases) - rejections} computed, "
          f"{rejections} rejected by TF) -> {args.dir} ({size / 2**20:.1f} MiB, {time.monotonic() - start:.0f} s)")
    return 0


def _run(args) -> int:
    backend = _backend(args)
    if args.cases:
        return _run_dir(args, backend, Path(args.cases))
    with tempfile.TemporaryDirectory(prefix="tfops-conformance-") as tmp:
        nodetest.export(tmp, args.ops)
        return _run_dir(args, backend, Path(tmp))


def _backend(args):
    return runner.make_backend(args.backend, args.provider, args.library)


def _run_dir(args, backend, directory: Path) -> int:
    cases = nodetest.load(directory, args.ops)
    start = time.monotonic()
    results = runner.run_cases(backend, cases)
    print(f"conformance: {len(cases)} cases on {backend.describe()} ({time.monotonic() - start:.0f} s)")
    print(runner.table(results))
    for op, reason, n in runner.skip_reasons(results):
        print(f"not runnable on {backend.name}: {op}, {n} case(s): {reason}")
    failed = [r for r in results if r.status == runner.FAILED]
    for r in failed[: args.show]:
        print(f"FAIL {r.case} ({r.op}, {r.dtype}): {r.reason}")
    if len(failed) > args.show:
        print(f"... and {len(failed) - args.show} more failures (--show N, or --json FILE for all)")
    if args.json:
        Path(args.json).write_text(runner.report_json(backend, results))
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ort_ops.conformance", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export", help="write every golden case as an ONNX node test, with a manifest")
    exp.add_argument("dir", help="an empty directory, or one an earlier export wrote (replaced)")
    exp.add_argument("--ops", nargs="+", metavar="OP", help="only these ops (default: all)")
    run = sub.add_parser("run", help="run the cases on a backend and judge them")
    run.add_argument("--cases", metavar="DIR", help="a directory `export` wrote (default: the shipped cases)")
    run.add_argument("--backend", default="ort", choices=("ort", "reference", "extensions"))
    run.add_argument("--provider", help="ort: the execution provider (default CPUExecutionProvider)")
    run.add_argument("--library", help="ort: a custom-op library to test instead of the installed one")
    run.add_argument("--ops", nargs="+", metavar="OP", help="only these ops (default: all)")
    run.add_argument("--json", metavar="FILE", help="write every case's result as JSON")
    run.add_argument("--show", type=int, default=20, metavar="N", help="print at most N failing cases (default 20)")
    args = parser.parse_args(argv)
    try:
        return _export(args) if args.command == "export" else _run(args)
    except (ValueError, FileNotFoundError, FileExistsError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
