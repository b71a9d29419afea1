"""A campaign's tables, from its JSONL records: outcomes per lowering and signature, failures by class, refusals by
reason, tf2onnx alone as the baseline, and the coverage of the family's ops and attribute values (with the values a
campaign should reach and did not)."""
from __future__ import annotations

import collections

from tools.graphgen import raw_ops
from tools.graphgen.spec import COVERED_ATTRS, KINDS

LOWERING_ORDER = ("custom", "standard", "integer")

# The attribute values TF accepts, per op and attribute, that a campaign should reach (the coverage table's
# "unreached" list). Depthwise NCHW and dilations > 1 are left out: TF's CPU kernel rejects both (docs/graphgen.md).
_BOOL = (True, False)


def expected_values() -> dict:
    out = {}
    for op, attrs in COVERED_ATTRS.items():
        for attr in attrs:
            values = None
            if attr == "num_bits":
                values = raw_ops.FAKE_QUANT_BITS if op.startswith("FakeQuant") else raw_ops.QDQ_BITS
            elif attr in ("narrow_range", "signed_input", "range_given", "is_training", "exponential_avg_factor_set"):
                values = _BOOL
            elif attr == "round_mode":
                values = raw_ops.ROUND_MODES
            elif attr == "axis":
                values = (-1, 0, 1, 2, 3)
            elif attr == "data_format":
                values = ("NHWC",) if op.startswith("Depthwise") else raw_ops.DATA_FORMATS
            elif attr == "strides":
                values = (1, 2)
            elif attr == "dilations":
                values = (1,)  # TF's CPU kernel rejects dilations > 1 (docs/graphgen.md)
            elif attr == "padding":
                values = raw_ops.PADDINGS
            elif attr == "multiplier":
                values = (1, 2, 3)
            if values is not None:
                out[(op, attr)] = tuple(values)
    return out


def _table(header, rows) -> str:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(v).ljust(w) for v, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows])


def _converted(run: dict) -> bool:
    """The CLI wrote a model (it may still have failed verification)."""
    if run["status"] == "verified":
        return True
    cls = run.get("class", "")
    return cls.startswith(("outside its bound", "static check", "verification could not run"))


def summarize(records: list, seconds: float = None) -> str:
    valid = [r for r in records if "invalid" not in r]
    invalid = [r for r in records if "invalid" in r]
    out = [f"## Campaign: {len(records)} graphs, {len(valid)} valid, {len(invalid)} rejected by TF, Keras or tfmot"]
    total_s = seconds if seconds is not None else sum(r.get("seconds", 0) for r in records)
    if total_s:
        out.append(f"\n{len(records) / total_s * 3600:.0f} graphs per hour ({total_s:.0f} s of worker time"
                   f"{'' if seconds is None else ' wall'}).")
    failing = [r for r in valid if any(run["status"] == "failed" for run in r["runs"])]
    out.append(f"\n**Graphs with a failure: {len(failing)}.**")

    by_family = collections.Counter(r["family"] for r in records)
    rows = [[f, by_family[f], sum(1 for r in invalid if r["family"] == f),
             sum(1 for r in failing if r["family"] == f)] for f in sorted(by_family)]
    out += ["", "### Graphs per family", "", _table(["family", "graphs", "rejected by TF/Keras/tfmot", "with a failure"], rows)]

    outcome = collections.defaultdict(collections.Counter)
    for r in valid:
        for run in r["runs"]:
            outcome[(run["lowering"], run["kind"])][run["status"]] += 1
    rows = [[lo, kind, c["verified"], c["refused"], c["failed"]]
            for lo in LOWERING_ORDER for kind in KINDS if (c := outcome.get((lo, kind)))]
    out += ["", "### Runs per lowering and graph kind", "",
            _table(["lowering", "graph", "verified", "refused (documented)", "failed"], rows)]

    failures = collections.defaultdict(list)
    refusals = collections.defaultdict(list)
    for r in records:
        for run in r["runs"]:
            if run["status"] == "failed":
                failures[(run["lowering"], run["class"])].append(r["name"])
            elif run["status"] == "refused":
                refusals[(run["lowering"], run["reason"])].append(r["name"])
    if failures:
        rows = [[lo, cls, len(names), ", ".join(names[:3])] for (lo, cls), names in
                sorted(failures.items(), key=lambda kv: -len(kv[1]))]
        out += ["", "### Failures by class", "", _table(["lowering", "class", "runs", "first graphs"], rows)]
    if refusals:
        rows = [[lo, reason, len(names)] for (lo, reason), names in sorted(refusals.items(), key=lambda kv: -len(kv[1]))]
        out += ["", "### Refusals by reason", "", _table(["lowering", "reason (names and numbers masked)", "runs"], rows)]
    if invalid:
        reasons = collections.Counter(r["invalid"][:110] for r in invalid)
        rows = [[reason, n] for reason, n in reasons.most_common(12)]
        out += ["", "### Graphs TF, Keras or tfmot rejected (not counted as runs)", "", _table(["reason", "graphs"], rows)]

    base = collections.defaultdict(collections.Counter)
    ours = collections.defaultdict(collections.Counter)
    for r in valid:
        for kind, b in r.get("tf2onnx", {}).items():
            base[kind]["graphs"] += 1
            base[kind].update(k for k in ("converted", "loads", "matches") if b.get(k))
        for run in r["runs"]:
            if run["lowering"] == "custom":
                ours[run["kind"]]["verified"] += run["status"] == "verified"
    if base:
        rows = [[kind, base[kind]["graphs"], base[kind]["converted"], base[kind]["loads"], base[kind]["matches"],
                 ours[kind]["verified"]] for kind in KINDS if kind in base]
        out += ["", "### tf2onnx alone on the same graphs", "",
                _table(["graph", "graphs", "tf2onnx converts", "ONNX Runtime loads it", "matches TF", "custom lowering verified"], rows)]
    out += ["", coverage_table(valid)]
    return "\n".join(out)


def coverage_table(valid: list) -> str:
    reached = collections.defaultdict(set)  # feature -> graph names
    runs = collections.defaultdict(collections.Counter)  # (feature, lowering) -> statuses
    for r in valid:
        features_by_kind = r.get("features", {})
        for kind, features in features_by_kind.items():
            for f in features:
                reached[f].add(r["name"])
        for run in r["runs"]:
            for f in features_by_kind.get(run["kind"], ()):
                c = runs[(f, run["lowering"])]
                c["runs"] += 1
                c["converted"] += _converted(run)
                c[run["status"]] += 1
    header = ["op / attribute value", "graphs"] + [f"{lo}: runs / converted / verified / refused / failed"
                                                   for lo in LOWERING_ORDER]
    rows = []
    for f in sorted(reached):
        row = [f, len(reached[f])]
        for lo in LOWERING_ORDER:
            c = runs.get((f, lo))
            row.append(f"{c['runs']} / {c['converted']} / {c['verified']} / {c['refused']} / {c['failed']}" if c else "-")
        rows.append(row)
    out = ["### Coverage: the family's ops and attribute values", "", _table(header, rows) if rows else "(none reached)"]
    missing = []
    for (op, attr), values in expected_values().items():
        for v in values:
            if f"{op} {attr}={v}" not in reached:
                missing.append(f"{op} {attr}={v}")
    ops_missing = [op for op in COVERED_ATTRS if op not in reached]
    out += ["", f"Ops never reached: {', '.join(ops_missing) if ops_missing else 'none'}.",
            f"Attribute values never reached ({len(missing)}): {', '.join(missing) if missing else 'none'}."]
    return "\n".join(out)
