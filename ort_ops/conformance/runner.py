"""Running cases on a backend and judging them: a ``Result`` per case, a row per op, the report.

A value case passes when every output passes its rule (``judge.mismatch``); a rejection passes when the
backend refuses the input with a message that carries the case's phrases. A case the backend cannot express
is skipped with its reason, and never counts as passed.
"""
from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Optional

from ort_ops.conformance import judge
from ort_ops.conformance.backends import CPU_PROVIDER, Backend, OrtBackend, ReferenceBackend, Rejected

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass
class Result:
    case: str
    op: str
    dtype: str
    status: str
    reason: str = ""  # why it failed or was skipped
    worst: float = 0.0  # the largest |error| / bound over its bounded outputs
    placement: Optional[str] = None  # the provider the node ran on, where the backend can tell


def make_backend(name: str, provider: Optional[str] = None, library: Optional[str] = None) -> Backend:
    if name == "ort":
        return OrtBackend(provider or CPU_PROVIDER, library)
    if provider or library:
        raise ValueError(f"--provider and --library are options of the ort backend, not of {name}")
    if name == "reference":
        return ReferenceBackend()
    if name == "extensions":
        from ort_ops.conformance.extensions import ExtensionsBackend  # onnxruntime-extensions: only when asked

        return ExtensionsBackend()
    raise ValueError(f"unknown backend {name!r}: one of ort, reference, extensions")


def run_case(backend: Backend, case) -> Result:
    result = Result(case.name, case.op, case.dtype, PASSED)
    why = backend.not_runnable(case)
    if why:
        result.status, result.reason = SKIPPED, why
        return result
    try:
        got = backend.run(case)
    except Rejected as e:
        result.placement = backend.placement()
        if not case.is_rejection:
            result.status, result.reason = FAILED, f"rejected the input: {e}"
        else:
            why = judge.rejection_mismatch(case.phrases, str(e))
            if why:
                result.status, result.reason = FAILED, why
        return result
    except Exception as e:  # a crash of the backend itself is this case's failure, not the run's end
        result.status, result.reason = FAILED, f"{type(e).__name__}: {e}"
        return result
    result.placement = backend.placement()
    if case.is_rejection:
        result.status, result.reason = FAILED, f"no error; TF rejects this input: {case.tf_message!r}"
        return result
    why = judge.outputs_mismatch(case.rules, case.outputs, got)
    if why:
        result.status, result.reason = FAILED, why
        return result
    result.worst = max((judge.error_ratio(r, w, g) for r, w, g in zip(case.rules, case.outputs, got)), default=0.0)
    return result


def run_cases(backend: Backend, cases, progress=None) -> list:
    results = []
    for case in cases:
        results.append(run_case(backend, case))
        if progress:
            progress(results[-1])
    return results


def rows(results) -> list:
    """One row per op, in the order of the cases."""
    by_op = OrderedDict()
    for r in results:
        row = by_op.setdefault(r.op, {"op": r.op, PASSED: 0, FAILED: 0, SKIPPED: 0, "worst": 0.0, "ran_on": set()})
        row[r.status] += 1
        row["worst"] = max(row["worst"], r.worst)
        if r.placement:
            row["ran_on"].update(r.placement.split(","))
    return [dict(row, ran_on=sorted(row["ran_on"])) for row in by_op.values()]


def table(results) -> str:
    header = ("op", "passed", "failed", "skipped", "worst err/bound", "ran on")
    body = [(r["op"], str(r[PASSED]), str(r[FAILED]), str(r[SKIPPED]), f"{r['worst']:.3g}", ",".join(r["ran_on"]) or "-")
            for r in rows(results)]
    total = [sum(1 for r in results if r.status == s) for s in (PASSED, FAILED, SKIPPED)]
    body.append(("total", *map(str, total), "", ""))
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    fmt = lambda line: "  ".join(c.ljust(w) if i == 0 or i == 5 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))  # noqa: E731
    return "\n".join([fmt(header), fmt(tuple("-" * w for w in widths)), *map(fmt, body)])


def skip_reasons(results) -> list:
    """(op, reason, count) for every distinct reason a case was skipped."""
    counts = OrderedDict()
    for r in results:
        if r.status == SKIPPED:
            counts[(r.op, r.reason)] = counts.get((r.op, r.reason), 0) + 1
    return [(op, reason, n) for (op, reason), n in counts.items()]


def report_json(backend: Backend, results) -> str:
    return json.dumps({"backend": backend.name, "describe": backend.describe(), "rows": rows(results),
                       "cases": [asdict(r) for r in results]}, indent=1)
