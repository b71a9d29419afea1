"""The one table of scripts/gpu_check.sh, from gpu_check's results (and the memcheck and PyTorch stages).

    python3 tools/gpu_check/report.py RESULTS.json [--memcheck MEMCHECK.json --memcheck-status ok|errors|...]
                                      [--torch-status ok|...] [--json-out REPORT.json] [--markdown TABLE.md]

Prints a markdown table, one row per op and type (and one per further timing configuration): the cases run
(golden, random, large) and rejected, the cases that failed, the CUDA-graph check, memcheck, and the timings
(the library's kernels, a device-to-device copy of the same bytes, the copy's share, PyTorch's equivalent), then
the failures. Writes the whole report as JSON (--json-out). Exit status 1 when anything failed: a case, the
coverage, the judge's self-test, a harness error, a CUDA error, a missing graph check or timing in a GPU run, or
memcheck errors. Python's standard library only.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _us(v):
    return "" if v is None or v < 0 else f"{v:.1f}"


def _counts(ran, rejected):
    return f"{ran}" + (f" ({rejected})" if rejected else "")


def build(results: dict, memcheck: dict | None, memcheck_status: str, torch_status: str):
    gpu = results.get("mode") == "gpu"
    problems = []
    if results.get("failures_total"):
        problems.append(f"{results['failures_total']} cases failed")
    problems += [f"coverage: {m}" for m in results.get("coverage_missing", [])]
    problems += [f"self-test: {m}" for m in results.get("self_test_problems", [])]
    problems += [f"error: {m}" for m in results.get("errors", [])]
    if results.get("device_broken"):
        problems.append("a CUDA error left the context unusable: later GPU runs did not happen")
    memcheck_rows = {}
    for entry in (memcheck or {}).get("memcheck_cases", []):
        op, dtype = entry.split(" ")[:2]
        memcheck_rows[(op, dtype)] = memcheck_rows.get((op, dtype), 0) + 1
    # memcheck runs where the time allows; once it ran, anything but a clean exit is a problem
    if gpu and memcheck_status != "ok" and not memcheck_status.startswith(("not run", "not finished")):
        problems.append(f"memcheck: {memcheck_status}")
    header = ["op", "type", "golden (rejected)", "random (rejected)", "large", "failed", "graph", "memcheck",
              "kernel us", "copy us", "copy/kernel", "torch us", "ours/torch", "timed config"]
    lines = []
    for row in results.get("rows", []):
        key = (row["op"], row["dtype"])
        graph = row.get("graph")
        if gpu and graph is None:
            problems.append(f"{row['op']} {row['dtype']}: no CUDA-graph check")
        graph_text = "" if graph is None else ("ok" if graph == "ok" else "FAILED")
        if graph == "ok" and row.get("graph_nodes"):
            graph_text = f"ok ({row['graph_nodes']} nodes)"
        if not gpu:
            mc = ""
        elif memcheck_status == "ok":
            mc = f"ok ({memcheck_rows[key]})" if key in memcheck_rows else "-"
        else:
            mc = memcheck_status if key in memcheck_rows or memcheck_status != "ok" else "-"
        timings = row.get("timings") or [None]
        if gpu and results.get("timing", True) and timings == [None]:
            problems.append(f"{row['op']} {row['dtype']}: no timing")
        for i, t in enumerate(timings):
            cells = [row["op"], row["dtype"]] if i == 0 else ["", ""]
            if i == 0:
                cells += [_counts(row["golden_ran"], row["golden_rejected"]),
                          _counts(row["random_ran"], row["random_rejected"]), str(row["large_ran"]),
                          str(row["failed"]) if row["failed"] else "0", graph_text, mc]
            else:
                cells += [""] * 6
            if t is None:
                cells += [""] * 6
            else:
                if t.get("error"):
                    problems.append(f"{row['op']} {row['dtype']} timing: {t['error']}")
                k, c, tt = t.get("kernel_us"), t.get("copy_us"), t.get("torch_us")
                share = f"{100 * c / k:.0f}%" if k and c and k > 0 and c > 0 else ""
                ratio = f"{k / tt:.2f}x" if k and tt and k > 0 else ""
                cells += [_us(k), _us(c), share, _us(tt), ratio, t.get("config", "")]
            lines.append(cells)
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    table += ["| " + " | ".join(cells) + " |" for cells in lines]
    return table, problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--memcheck", type=Path)
    parser.add_argument("--memcheck-status", default="not run")
    parser.add_argument("--torch-status", default="not run")
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    if not args.results.is_file():
        print(f"report: no results file {args.results} (gpu_check did not finish)")
        return 1
    results = json.loads(args.results.read_text())
    memcheck = json.loads(args.memcheck.read_text()) if args.memcheck and args.memcheck.is_file() else None
    table, problems = build(results, memcheck, args.memcheck_status, args.torch_status)
    device = results.get("device")
    if device:
        head = (f"GPU check on {device['name']} (sm_{device['compute_capability'].replace('.', '')}, "
                f"{device['multiprocessors']} SMs, {device['memory_gib']:.0f} GiB; driver {device['driver']}, "
                f"CUDA runtime {device['runtime']})")
    else:
        head = f"GPU check, CPU half only ({results.get('no_device', 'no GPU')})"
    torch = results.get("torch")
    head += (f"; CPU kernels {results.get('cpu_isa')}, {results.get('threads')} threads; "
             f"{results.get('seconds', 0):.0f} s; memcheck: {args.memcheck_status}; PyTorch: "
             + (f"{torch['version']} (CUDA {torch['cuda']})" if torch else args.torch_status))
    print()
    print(head)
    print()
    print("\n".join(table))
    print()
    for f in results.get("failures", [])[:30]:
        print(f"FAILED {f['op']} {f['dtype']} {f['source']} case {f['index']} [{f['note']}]: {f['problems'][0]}")
    for p in problems:
        print(f"PROBLEM {p}")
    ok = not problems and results.get("ok", False)
    print(f"gpu_check: {'PASSED' if ok else 'FAILED'} ({results.get('mode')} mode)")
    report = {"ok": ok, "head": head, "table": table, "problems": problems, "results": results,
              "memcheck": memcheck, "memcheck_status": args.memcheck_status, "torch_status": args.torch_status}
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=1))
    if args.markdown:
        args.markdown.write_text(head + "\n\n" + "\n".join(table) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
