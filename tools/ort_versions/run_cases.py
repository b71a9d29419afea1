"""Runs the cases tools/ort_versions/prepare.py wrote through one onnxruntime with the custom-op library, in an
environment that has only onnxruntime and NumPy (scripts/test_ort_versions.sh makes one per version).

    python run_cases.py CASES_DIR LIBRARY --write REFERENCE_DIR     # the newest version: its results
    python run_cases.py CASES_DIR LIBRARY --compare REFERENCE_DIR   # any other: the same bits, or it fails
    python run_cases.py - LIBRARY --expect-refused                  # a version the library must refuse

Each case gets a session (CPU provider, one intra-op thread, log severity LOG_LEVEL) and one run. A case's
result is its outputs (every bit, NaNs included), the output shapes the session declares (for the golden
cases' untyped outputs these come from the library's shape inference; symbolic dims compare as "?"), or the
error, from the op's name on (the library's own words, without ONNX Runtime's framing, which changes between
versions). Native stderr is captured per case, so ONNX Runtime's log lines are attributed to the case that
caused them; any "Shape mismatch" or "Error merging shape info" line (ONNX Runtime found a tensor of another
size than its declared shape, or an inferred shape that contradicts the model's: wrong shape inference) fails
the run, in --write mode too.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

DOMAIN = "ai.onnx.converters.tensorflow"
# Log lines that mean a declared shape is wrong: ONNX Runtime found a tensor of another size than its declared
# shape when reusing a buffer, or could not merge an inferred shape with the model's.
SHAPE_PROBLEMS = ("Shape mismatch", "Error merging shape info")
COLOR = re.compile(r"\x1b\[[0-9;]*m")
# A warning line of ONNX Runtime's log ([W:onnxruntime:...]); counted, not judged, apart from SHAPE_PROBLEMS.
WARNING_LINE = re.compile(r"\[W:onnxruntime")


class NativeStderr:
    """Redirects file descriptor 2 (where ONNX Runtime's logger writes) to a file while active; ``text`` holds
    what was written."""

    def __enter__(self):
        sys.stderr.flush()
        self.file = tempfile.TemporaryFile()
        self.saved = os.dup(2)
        os.dup2(self.file.fileno(), 2)
        self.text = ""
        return self

    def __exit__(self, *exc):
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.file.seek(0)
        self.text = self.file.read().decode("utf-8", "replace")
        self.file.close()
        return False


def declared_shape(shape) -> list:
    return [d if isinstance(d, int) else "?" for d in shape] if shape is not None else None


def library_words(message: str, op: str | None) -> str:
    """The library's part of an error message: from the op's name (its messages start with "<op>: ")."""
    if op and f"{op}: " in message:
        message = message[message.rindex(f"{op}: "):]
    elif "libort_tf_ops: " in message:
        message = message[message.rindex("libort_tf_ops: "):]
    return message.strip().splitlines()[0] if message.strip() else ""


def run_case(case: dict, options) -> dict:
    result = {"id": case["id"], "model": case["model"]}
    with np.load(case["inputs"]) as data:
        feeds = {k: data[k] for k in data.files}
    with NativeStderr() as log:
        try:
            sess = ort.InferenceSession(case["model"], options, providers=["CPUExecutionProvider"])
            result["declared"] = [[o.name, declared_shape(o.shape)] for o in sess.get_outputs()]
            outputs = sess.run(None, feeds)
            result["outputs"] = [np.asarray(y) for y in outputs]
        except Exception as e:  # onnxruntime's own exception classes
            result["error"] = library_words(str(e), case.get("op"))
        if "probe" in case and "error" not in result:
            try:
                result["probe"] = probe_digests(case, options, feeds)
            except Exception as e:
                result["probe_error"] = str(e).strip().splitlines()[0]
    lines = log.text.splitlines()
    result["shape_mismatch"] = [COLOR.sub("", line) for line in lines if any(p in line for p in SHAPE_PROBLEMS)]
    result["warnings"] = sum(1 for line in lines if WARNING_LINE.search(line))
    return result


def digest(y: np.ndarray) -> str:
    y = np.ascontiguousarray(y)
    return hashlib.sha1(f"{y.dtype.str}{y.shape}".encode() + y.tobytes()).hexdigest()


def probe_digests(case: dict, options, feeds: dict) -> dict:
    """A digest of every value the model's nodes compute (its probe copy outputs them all)."""
    sess = ort.InferenceSession(case["probe"]["model"], options, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return {name: digest(y) for name, y in zip(names, sess.run(None, feeds))}


def attribute(case: dict, digests: dict, reference: dict) -> tuple:
    """Which nodes compute other bits than the reference's from the same bits: (domain nodes, onnxruntime's
    own nodes, number of domain nodes whose inputs were the reference's). Graph inputs and initializers are
    the same in both runs."""
    def same(name):
        return name == "" or name not in digests or digests[name] == reference.get(name)

    library, own, checked = [], [], 0
    for op_type, domain, inputs, outputs in case["probe"]["nodes"]:
        if not all(same(name) for name in inputs):
            continue
        checked += domain == DOMAIN
        if not all(same(name) for name in outputs):
            (library if domain == DOMAIN else own).append((op_type, [o for o in outputs if not same(o)]))
    return library, own, checked


def summary(result: dict) -> dict:
    """The JSON-able part of a result (outputs are stored separately, as arrays)."""
    out = {k: result[k] for k in ("id", "declared", "error", "probe") if k in result}
    if "outputs" in result:
        out["outputs"] = [[str(y.dtype), list(y.shape)] for y in result["outputs"]]
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def compare(case: dict, result: dict, reference: dict, arrays) -> tuple:
    """What differs between this version's result and the reference's: (problems, notes). Problems fail the
    run. A model whose outputs differ in their bits only downstream of onnxruntime's own ops, where they changed
    between versions, while every domain node that got the reference's inputs gave the reference's outputs, is a
    note: the library computed the same bits from the same inputs. So is any bit difference of a model without
    domain nodes (the standard lowering's)."""
    problems, differing = compare_outputs(result, reference, arrays)
    notes = []
    if "probe" in result and "probe" in reference:
        library, own, checked = attribute(case, result["probe"], reference["probe"])
        for op_type, names in library:
            problems.append(f"domain node {op_type} (output {names[0]}) computes other bits than onnxruntime "
                            f"{REFERENCE_VERSION[0]} from the same inputs")
        domain_nodes = sum(1 for node in case["probe"]["nodes"] if node[1] == DOMAIN)
        if differing and not library and own:
            kinds = sorted({op_type for op_type, _ in own})
            notes.append(f"{len(differing)} outputs differ, all downstream of onnxruntime's own "
                         f"{', '.join(kinds)} ({len(own)} node{'s' if len(own) != 1 else ''} that give other bits "
                         f"from the same inputs in this version); the {checked} of its {domain_nodes} domain nodes "
                         f"that got {REFERENCE_VERSION[0]}'s inputs gave its bits")
            differing = []
        elif differing and domain_nodes == 0:
            # A standard-lowering model: every node is onnxruntime's own, so are its bits (the probe cannot
            # always say which node: onnxruntime fuses the probe copy's nodes differently). It must load and run.
            notes.append(f"{len(differing)} outputs differ; no domain node: onnxruntime's own ops and fusions")
            differing = []
    return problems + differing, notes


# The reference's onnxruntime version (set by main), for messages.
REFERENCE_VERSION = ["the reference"]


def compare_outputs(result: dict, reference: dict, arrays) -> tuple:
    """What differs between this version's outputs (or error) and the reference's: (problems, outputs whose
    bits differ); both empty when identical."""
    if ("error" in result) != ("error" in reference):
        got = "error: " + result["error"] if "error" in result else "outputs"
        want = "error: " + reference["error"] if "error" in reference else "outputs"
        return [f"{got}, where the reference has {want}"], []
    if "error" in result:
        if result["error"] != reference["error"]:
            return [f"error {result['error']!r}, the reference's {reference['error']!r}"], []
        return [], []
    problems, differing = [], []
    if result.get("declared") != reference.get("declared"):
        problems.append(f"declared output shapes {result.get('declared')}, the reference's {reference.get('declared')}")
    if len(result["outputs"]) != len(reference["outputs"]):
        problems.append(f"{len(result['outputs'])} outputs, the reference has {len(reference['outputs'])}")
    for k, (y, want) in enumerate(zip(result["outputs"], (arrays[f"o{k}"] for k in range(len(reference["outputs"]))))):
        if same_bits(y, want):
            continue
        name = reference["declared"][k][0] if reference.get("declared") else str(k)
        if y.shape != want.shape or y.dtype != want.dtype:
            problems.append(f"output {name}: {y.dtype}{list(y.shape)} vs {want.dtype}{list(want.shape)}")
            continue
        a = np.ascontiguousarray(y).reshape(-1).view(np.uint8).reshape(y.size, -1)
        b = np.ascontiguousarray(want).reshape(-1).view(np.uint8).reshape(want.size, -1)
        differing.append(f"output {name}: {int((a != b).any(axis=1).sum())} of {y.size} elements differ in their bits")
    return problems, differing


def expect_refused(library: str) -> int:
    options = ort.SessionOptions()
    try:
        options.register_custom_ops_library(library)
    except Exception as e:
        message = str(e)
        wanted = [f"onnxruntime {ort.__version__} is too old", "onnxruntime 1.17 or newer"]
        if all(w in message for w in wanted):
            print(f"onnxruntime {ort.__version__}: refused, as it should be: {library_words(message, None)}")
            return 0
        print(f"onnxruntime {ort.__version__}: refused, but the message does not name both versions: {message}")
        return 1
    print(f"onnxruntime {ort.__version__}: the library registered; it must refuse this version")
    return 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", help="the folder prepare.py wrote ('-' with --expect-refused)")
    parser.add_argument("library", help="the custom-op library (.so)")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", type=Path, metavar="DIR", help="write this version's results as the reference")
    mode.add_argument("--compare", type=Path, metavar="DIR", help="compare with the reference in DIR")
    mode.add_argument("--expect-refused", action="store_true", help="the library must refuse this runtime")
    parser.add_argument("--log-level", type=int, default=2, help="sessions' log severity (default 2, warnings)")
    args = parser.parse_args(argv)
    if args.expect_refused:
        return expect_refused(args.library)

    started = time.time()
    ort.set_default_logger_severity(args.log_level)
    options = ort.SessionOptions()
    options.log_severity_level = args.log_level
    options.intra_op_num_threads = 1
    try:
        options.register_custom_ops_library(args.library)
    except Exception as e:
        print(f"onnxruntime {ort.__version__}: the library does not register: {str(e).strip()}")
        return 1
    cases = json.loads((Path(args.cases) / "manifest.json").read_text())["cases"]
    version = ort.__version__
    failures, notes, mismatches, warnings, older_ir, outputs = [], [], [], 0, 0, 0
    summaries = []
    reference = None
    if args.compare:
        reference = json.loads((args.compare / "reference.json").read_text())
        REFERENCE_VERSION[0] = reference["onnxruntime"]
        if len(reference["cases"]) != len(cases):
            print(f"onnxruntime {version}: the reference has {len(reference['cases'])} cases, the manifest {len(cases)}")
            return 1
    if args.write:
        args.write.mkdir(parents=True, exist_ok=True)
    for index, case in enumerate(cases):
        result = run_case(case, options)
        warnings += result["warnings"]
        older_ir += result["model"] != case["model"]
        outputs += len(result.get("outputs", []))
        for line in result["shape_mismatch"]:
            mismatches.append(f"{case['id']}: {line.strip()}")
        if "probe_error" in result:
            failures.append(f"{case['id']}: its probe copy failed: {result['probe_error']}")
        if args.write:
            summaries.append(summary(result))
            np.savez(args.write / f"{index}.npz", **{f"o{k}": y for k, y in enumerate(result.get("outputs", []))})
        else:
            want = reference["cases"][index]
            if want["id"] != case["id"]:
                print(f"onnxruntime {version}: case {index} is {case['id']} here, {want['id']} in the reference")
                return 1
            with np.load(args.compare / f"{index}.npz") as arrays:
                problems, case_notes = compare(case, result, want, arrays)
            failures += [f"{case['id']}: {problem}" for problem in problems]
            notes += [f"{case['id']}: {note}" for note in case_notes]
    if args.write:
        (args.write / "reference.json").write_text(json.dumps({"onnxruntime": version, "cases": summaries}))
    models = sum(c["id"].startswith("model ") for c in cases)
    errors = sum(1 for s in (summaries if args.write else reference["cases"]) if "error" in s)
    what = (f"{models} bundled models (every committed lowering) and {len(cases) - models} golden cases ({outputs} outputs, {errors} "
            f"cases rejected)")
    if older_ir:
        what += f", {older_ir} of them from their IR 9 copies"
    if args.write:
        verdict = "written as the reference"
    elif failures:
        verdict = f"{len(failures)} differences from onnxruntime {reference['onnxruntime']}"
    elif notes:
        verdict = (f"bit-identical to onnxruntime {reference['onnxruntime']} but for {len(notes)} "
                   f"model{'s' if len(notes) != 1 else ''} in which onnxruntime's own ops differ (below)")
    else:
        verdict = f"bit-identical to onnxruntime {reference['onnxruntime']}"
    counts = ", ".join(f"{sum(p in line for line in mismatches)} '{p}'" for p in SHAPE_PROBLEMS)
    print(f"onnxruntime {version}: {what}: {verdict}; log lines: {counts}, {warnings} warnings in all "
          f"({time.time() - started:.1f} s)")
    for line in failures[:25]:
        print(f"  DIFFERS  {line}")
    if len(failures) > 25:
        print(f"  ... and {len(failures) - 25} more")
    for line in notes:
        print(f"  NOTE     {line}")
    mismatches.sort(key=lambda line: [p in line for p in SHAPE_PROBLEMS].index(True))  # stable: per kind
    for line in mismatches[:10]:
        print(f"  SHAPE    {line}")
    if len(mismatches) > 10:
        print(f"  ... and {len(mismatches) - 10} more shape problems")
    return 1 if failures or mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
