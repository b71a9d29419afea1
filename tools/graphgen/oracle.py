"""The oracle: one SavedModel signature through the project's CLI in one lowering, judged as a user would judge it.

A run is ``verified`` when the CLI exits 0 with ``--verify --verify-nodes`` (the integer lowering: ``--verify``,
which adds its per-tensor check) and the written file passes the static checks below; ``refused`` when the CLI
exits 1 with a ``ConversionError`` (one ``error:`` line, counted by its reason with names and numbers masked);
anything else is ``failed`` with a class: a traceback (the CLI's "unexpected" error), verification that could not
run the model, an output outside its bound (end to end only after TF's own spread was measured: the CLI judges
an output within twice TF's Eigen-vs-oneDNN spread as ok), a checker or shape-inference disagreement, an IR
version too new for onnxruntime 1.17. A crash or a hang is classed by the worker's parent (``campaign``).

A refusal is a failure too where the README says the graph is covered: every refusal is, but for those
``DOCUMENTED_REFUSALS`` lists (each with the page that documents it).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import tempfile
from typing import Optional

import numpy as np

from tools.graphgen.spec import INFERENCE, TRAIN_STEP

VERIFIED, REFUSED, FAILED = "verified", "refused", "failed"
ORT_117_IR_VERSION = 9  # the newest IR onnxruntime 1.17 reads
ORT_117_OPSET = 20  # the newest ai.onnx opset onnxruntime 1.17 implements

# Refusals the docs name as outside what a lowering covers: (lowerings, regex on the reason, the page saying so).
DOCUMENTED_REFUSALS = (
    (("integer",), r"TF quantizes it over each batch's own range", "docs/integer.md"),
    (("integer",), r"-bit quantizer; the integer lowering writes 8 bits or fewer", "docs/integer.md"),
    (("integer",), r"found no quantizer in this graph", "docs/integer.md"),
    (("integer",), r"per-channel activation grid narrower than uint8", "docs/integer.md"),
    (("custom", "standard", "integer"), r"TensorFlow cannot freeze this function: its graph optimizer fails on its float8",
     "README.md (Keras 3's float8), docs/graphgen.md"),
)


def mask(text: str) -> str:
    """A reason with node names, paths and numbers masked, so that one cause is counted once."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text)
    text = re.sub(r"/[\w./-]+", "…", text)
    text = re.sub(r"\b\d+(\.\d+)?(e-?\d+)?\b", "N", text)
    return text.strip()[:160]


def documented(lowering: str, reason: str) -> Optional[str]:
    for lowerings, pattern, page in DOCUMENTED_REFUSALS:
        if lowering in lowerings and re.search(pattern, reason):
            return page
    return None


def _cli(argv) -> tuple:
    """(exit status, stdout, stderr) of ``python -m converters ARGV``, in this process."""
    from converters.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as e:  # argparse
            status = e.code if isinstance(e.code, int) else 2
        except Exception as e:  # noqa: BLE001 - the CLI must never raise: that is the finding
            print(f"error: unexpected {type(e).__name__} escaped the CLI: {e}", file=err)
            status = 99
    return status, out.getvalue(), err.getvalue()


def _error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    if not lines:
        return stderr.strip().splitlines()[-1] if stderr.strip() else "no error line"
    first = lines[0][len("error:"):].strip()
    if "could not be converted" in first:  # UnconvertedOpsError: the op types follow, one per line
        ops = sorted({m.group(1) for m in re.finditer(r"^  (\w+):", stderr, re.M)})
        first += " " + ", ".join(ops)
    return first


def _failed_parts(report_path: str) -> list:
    """Which of end_to_end / per_node / per_tensor failed in the CLI's --verify-json report."""
    try:
        with open(report_path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return ["report missing"]
    parts = []
    if "outputs" in data and not data.get("ok", True):
        parts.append("end_to_end")
    for key in ("per_node", "per_tensor"):
        if key in data and not data[key].get("ok", True):
            parts.append(key)
    if not parts and not data.get("ok", True):
        parts.append("end_to_end" if "outputs" in data else "per_node")
    return parts


def static_checks(path: str) -> Optional[str]:
    """None, or what is wrong with the written file: ONNX's checker, strict shape inference against the shapes ONNX
    Runtime gives on the verifier's inputs, and the IR version and opset onnxruntime 1.17 reads."""
    import onnx

    import ort_ops
    from converters.verification import random_inputs, run_onnx

    model = onnx.load(path)
    if model.ir_version > ORT_117_IR_VERSION:
        return f"IR version {model.ir_version} (onnxruntime 1.17 reads up to {ORT_117_IR_VERSION})"
    default = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if default and default[0] > ORT_117_OPSET:
        return f"opset {default[0]} (onnxruntime 1.17 implements up to {ORT_117_OPSET})"
    ort_ops.register_schemas()
    try:
        onnx.checker.check_model(model, full_check=True)
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except Exception as e:  # noqa: BLE001 - the checker's message is the finding
        return f"checker: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    declared = {o.name: o.type.tensor_type for o in inferred.graph.output}
    actual = run_onnx(model, random_inputs(model, 0))
    for name, value in actual.items():
        tt = declared.get(name)
        if tt is None or not tt.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        shape = np.shape(value)
        if len(dims) != len(shape) or any(d is not None and d != s for d, s in zip(dims, shape)):
            return f"shape inference says {name} is {dims}, ONNX Runtime gives {list(shape)}"
    return None


def run_signature(saved_model: str, key: str, lowering: str, workdir: str, variable_updates: bool,
                  opset: int = 17) -> dict:
    """One run: {"status", "class" (failures), "reason" (refusals), "detail"}. ``opset``: the CLI's --opset (17,
    its default; 19 for Keras 3's float8 models, which the README converts at opset 19 only)."""
    out = os.path.join(workdir, f"{key}.{lowering}.onnx")
    report = os.path.join(workdir, f"{key}.{lowering}.json")
    argv = ["--saved-model", saved_model, "--signature-key", key, "--output", out, "--lowering", lowering,
            "--opset", str(opset), "--verify", "--no-tf-spread", "--verify-json", report]
    if lowering != "integer":
        argv.append("--verify-nodes")
    if key == TRAIN_STEP and variable_updates:
        argv.append("--variable-update-outputs")
    status, stdout, stderr = _cli(argv)
    if status == 1:
        line = _error_line(stderr)
        if "unexpected" in line:
            return {"status": FAILED, "class": "unexpected error", "detail": line[:400]}
        if line.startswith("verification could not run"):
            return {"status": FAILED, "class": "verification could not run", "detail": line[:400]}
        reason = mask(line)
        if documented(lowering, line):
            return {"status": REFUSED, "reason": reason, "detail": line[:400]}
        return {"status": FAILED, "class": f"refused in the {lowering} lowering", "reason": reason,
                "detail": line[:400]}
    if status == 3:
        parts = _failed_parts(report)
        if parts == ["end_to_end"]:
            # Outside its bound: the CLI then compares with TF's own spread (its oneDNN kernels, a child process).
            status, stdout, stderr = _cli([a for a in argv if a not in ("--no-tf-spread", "--verify-nodes")])
            if status == 0:
                return {"status": VERIFIED, "note": "end to end within TF's own spread"}
            parts = _failed_parts(report)
        return {"status": FAILED, "class": "outside its bound: " + "+".join(parts),
                "detail": failing_detail(report) or _first_failing_rows(stdout)}
    if status != 0:
        return {"status": FAILED, "class": f"exit status {status}", "detail": _error_line(stderr)[:400]}
    problem = static_checks(out)
    if problem:
        return {"status": FAILED, "class": "static check: " + problem.split(":")[0].split(" (")[0][:40],
                "detail": problem}
    return {"status": VERIFIED}


def failing_detail(report_path: str) -> str:
    """The failing rows of the CLI's JSON report: output or node, TF op, error against its bound."""
    try:
        with open(report_path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return ""
    rows = []
    for o in data.get("outputs", []):
        if not o.get("ok", True):
            rows.append(f"output {o['name']}: {o.get('verdict')} (error {o.get('error_at_bound')} bound {o.get('bound')},"
                        f" max abs {o.get('max_abs_err')})")
    first = (data.get("per_node") or {}).get("first_failure")
    if first:
        rows.append(f"node {first.get('tf_tensor')} ({first.get('tf_type')}, {first.get('group')}): {first.get('verdict')}"
                    f" (error {first.get('error_at_bound')} bound {first.get('bound')})")
    per_tensor = data.get("per_tensor") or {}
    for t in per_tensor.get("tensors", []):
        if not t.get("ok", True):
            rows.append(f"tensor {t['name']}: {t['max_steps']:g} steps")
    if per_tensor and not per_tensor.get("ok", True) and not per_tensor.get("tensors"):
        rows.append(f"per tensor: nothing judged ({len(per_tensor.get('unmatched', []))} unmatched)")
    return " | ".join(rows[:4])[:700]


def _first_failing_rows(stdout: str) -> str:
    rows = [line.strip() for line in stdout.splitlines() if "FAIL" in line]
    return " | ".join(rows[:4])[:600]


def tf2onnx_baseline(saved_model: str, key: str, workdir: str) -> dict:
    """tf2onnx 1.17 alone on the same signature: {"converted", "loads", "matches"} (booleans) and why not."""
    import logging

    import tf2onnx
    from tf2onnx import tf_loader

    from converters.verification import verify_saved_model

    logging.getLogger("tf2onnx").setLevel(logging.CRITICAL)
    result = {"converted": False, "loads": False, "matches": False}
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            graph_def, ins, outs, renames = tf_loader.from_saved_model(
                saved_model, None, None, "serve", [key], return_tensors_to_rename=True)
            model, _ = tf2onnx.convert.from_graph_def(graph_def, input_names=ins, output_names=outs, opset=17,
                                                      tensors_to_rename=renames)
    except Exception as e:  # noqa: BLE001 - tf2onnx's failure is the baseline's result
        result["why"] = f"conversion: {type(e).__name__}: {mask(str(e).splitlines()[0] if str(e) else '')}"
        return result
    result["converted"] = True
    try:
        import onnxruntime as ort

        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        result["why"] = f"load: {mask(str(e)[-160:])}"
        return result
    result["loads"] = True
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            report = verify_saved_model(saved_model, model, key, spread=False)
        result["matches"] = bool(report.ok)
        if not report.ok:
            result["why"] = "outside the verifier's bounds"
    except Exception as e:  # noqa: BLE001
        result["why"] = f"run: {type(e).__name__}: {mask(str(e).splitlines()[0] if str(e) else '')}"
    return result


def new_workdir(root: Optional[str] = None) -> str:
    return tempfile.mkdtemp(prefix="graphgen-", dir=root)


__all__ = ["VERIFIED", "REFUSED", "FAILED", "INFERENCE", "run_signature", "tf2onnx_baseline", "static_checks", "mask"]
