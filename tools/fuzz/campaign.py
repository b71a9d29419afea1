"""A campaign: generate, run on both sides, classify, count; then minimize one finding of each kind."""
from __future__ import annotations

import collections
import dataclasses
import time
from typing import Optional

from tools.fuzz.cases import Case
from tools.fuzz.classify import Verdict, classify
from tools.fuzz.generate import cases
from tools.fuzz.minimize import minimize, reproducer
from tools.fuzz.runner import Runner


@dataclasses.dataclass
class Finding:
    case: Case
    verdict: Verdict
    minimized: Optional[Case] = None
    minimized_verdict: Optional[Verdict] = None

    @property
    def kind(self) -> tuple:
        return (self.case.op, self.verdict.cls)


@dataclasses.dataclass
class Report:
    seed: int
    seconds: float = 0.0
    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    by_op: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(collections.Counter))
    findings: list = dataclasses.field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def finding_kinds(self) -> collections.Counter:
        return collections.Counter(f.kind for f in self.findings)

    def text(self, reproducers: bool = True) -> str:
        lines = [f"seed {self.seed}: {self.total} cases in {self.seconds:.0f} s", "", "counts per class:"]
        lines += [f"  {cls:55s} {n}" for cls, n in self.counts.most_common()]
        kinds = self.finding_kinds()
        lines += ["", f"findings: {len(self.findings)} ({len(kinds)} kinds: op, class)"]
        lines += [f"  {op} {cls}: {n}" for (op, cls), n in sorted(kinds.items())]
        for f in self.findings:
            if f.minimized is None:
                continue
            lines += ["", f"--- {f.case.op} {f.verdict.cls}: {f.verdict.detail[:400]}",
                      f"    as generated: {f.case.describe()[:400]}"]
            if reproducers:
                lines.append(reproducer(f.minimized, f.minimized_verdict))
        return "\n".join(lines)


def run_campaign(seed: int, seconds: float, ops=None, runner: Optional[Runner] = None, max_cases: Optional[int] = None,
                 minimize_budget: int = 200, minimize_per_kind: int = 1, progress=None) -> Report:
    """Cases from ``seed`` until ``seconds`` (or ``max_cases``) are spent; then each kind of finding's first
    ``minimize_per_kind`` cases are minimized."""
    own = runner is None
    runner = runner or Runner.default()
    report = Report(seed)
    start = time.monotonic()
    try:
        for case in cases(seed, ops):
            if time.monotonic() - start > seconds or (max_cases is not None and report.total >= max_cases):
                break
            tf, lib = runner.run(case)
            verdict = classify(case, tf, lib)
            report.counts[verdict.cls] += 1
            report.by_op[case.op][verdict.cls] += 1
            if verdict.finding:
                report.findings.append(Finding(case, verdict))
            if progress and report.total % 500 == 0:
                progress(f"{report.total} cases, {len(report.findings)} findings, {time.monotonic() - start:.0f} s")
        minimized = collections.Counter()
        for f in report.findings:
            if minimized[f.kind] < minimize_per_kind:
                minimized[f.kind] += 1
                f.minimized, f.minimized_verdict, _ = minimize(f.case, lambda c: classify(c, *runner.run(c)),
                                                               minimize_budget, expected=f.verdict)
    finally:
        report.seconds = time.monotonic() - start
        if own:
            runner.close()
    return report
