"""Classifying one case from the two sides' results.

Classes: ``match``, ``mismatch``, ``only_tf_rejects``, ``only_lib_rejects``, ``both_reject``, ``crash_tf``,
``crash_lib``, ``hang_tf``, ``hang_lib``, ``tf_not_run`` (an output too large for the oracle to allocate),
``harness_error`` (the fuzzer failed on the case), or ``documented: <name>`` for a disagreement a named
deviation explains (tools/fuzz/deviations.py).

A verdict is a finding when the library is at fault or cannot be cleared: a mismatch or a one-sided
rejection no deviation explains, a library crash or hang, a library error that does not name the op, or a
case TF crashed on (or was not run on) where the library did not give such an error. A TF crash with a clear
library error is recorded but is not a finding.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tools.fuzz import compare, deviations
from tools.fuzz.cases import Case

CLASSES = ("match", "mismatch", "only_tf_rejects", "only_lib_rejects", "both_reject", "crash_tf", "crash_lib",
           "hang_tf", "hang_lib", "tf_not_run", "harness_error")


class Verdict(NamedTuple):
    cls: str
    finding: bool
    detail: str = ""


def _clear_error(case: Case, result: dict) -> bool:
    return result["status"] == "error" and case.op in result["message"]


def _excused(case, cls, tf, lib, detail, known):
    d = deviations.find(case, cls, tf, lib, known)
    if d is not None:
        return Verdict(f"documented: {d.name}", False, detail)
    return Verdict(cls, True, detail)


def classify(case: Case, tf: dict, lib: dict, known=deviations.DEVIATIONS) -> Verdict:
    """The verdict on ``case`` given TF's result ``tf`` and the library's ``lib`` (child.py's result dicts,
    or status "crash"/"hang" from runner.py)."""
    lib_status, tf_status = lib["status"], tf["status"]
    lib_message = lib.get("message", "")
    if lib_status in ("crash", "hang"):
        return Verdict(f"{lib_status}_lib", True, lib_message[-2000:])
    if "harness" in (lib_status, tf_status):
        return Verdict("harness_error", True, lib_message if lib_status == "harness" else tf.get("message", ""))
    if tf_status in ("crash", "hang", "skipped"):
        cls = "tf_not_run" if tf_status == "skipped" else f"{tf_status}_tf"
        if _clear_error(case, lib):
            return Verdict(cls, False, f"library: {lib_message}")
        if lib_status == "error":
            return Verdict(cls, True, f"the library's error does not name the op: {lib_message}")
        return _excused(case, cls, tf, lib, "the library gave outputs where TF could not run", known)
    if lib_status == "error" and case.op not in lib_message:
        return Verdict("both_reject" if tf_status == "error" else "only_lib_rejects", True,
                       f"the library's error does not name the op: {lib_message}")
    if tf_status == "error" and lib_status == "error":
        return Verdict("both_reject", False, f"TF: {tf['message']} | library: {lib_message}")
    if tf_status == "error":
        return _excused(case, "only_tf_rejects", tf, lib, f"TF: {tf['message']}", known)
    if lib_status == "error":
        return _excused(case, "only_lib_rejects", tf, lib, f"library: {lib_message}", known)
    with np.errstate(all="ignore"):
        why = compare.mismatch(case, tf["outputs"], lib["outputs"])
    if why is None:
        return Verdict("match", False)
    return _excused(case, "mismatch", tf, lib, why, known)
