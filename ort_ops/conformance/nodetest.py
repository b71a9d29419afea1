"""The golden cases as ONNX node tests: writing them (``export``) and reading them back (``load``).

A directory written by ``export``::

    manifest.json                        every case: its op, TF's note, how each output is judged
    cases/test_<op>_<NNN>/               a case TF computes (NNN: its index in the op's golden file)
        model.onnx                       the one-node model (ir_version set, outputs typed as TF's)
        data.json                        rtol/atol for onnx.backend.test's runner (see below)
        test_data_set_0/input_K.pb       TensorProtos named after the node's inputs
        test_data_set_0/output_K.pb      TF's outputs, named after the node's outputs
        test_data_set_0/bound_K.pb       per-element bounds of output K, where its rule has them (float64)
    rejections/test_<op>_<NNN>/          input TF rejects: model.onnx and test_data_set_0/input_K.pb only;
                                         the manifest holds TF's message and what a rejection must say

``cases`` and ``rejections`` are "kinds" in the sense of ``onnx.backend.test.loader.load_model_tests``.
onnx's runner applies one rtol/atol to a whole case, so data.json gives rtol 0 and, as atol, the largest
bound of the case's outputs (0 for bit-exact cases): a weaker check than the kit's own, per output and per
element. A placeholder output (TF leaves it undefined) holds the NumPy kernels' value there, compared by
onnx's runner only.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ort_ops.conformance import goldens, rules
from ort_ops.model import elem_type_of, make_single_op_model
from ort_ops.schemas import DOMAIN, OPSET_VERSION
from ort_ops.spec import snake_case
from ort_ops.specs import get_spec

FORMAT = 1
# The IR version of every case's model: the lowest that its opset (ort_ops.model.DEFAULT_ONNX_OPSET) needs; no
# type the domain's ops take raises it (tests/test_conformance.py checks each case).
IR_VERSION = make_single_op_model("FakeQuantWithMinMaxArgs", [np.zeros(1, np.float32)], {}).ir_version
MANIFEST = "manifest.json"
VALUES_KIND, REJECTIONS_KIND = "cases", "rejections"
DATA_SET = "test_data_set_0"

JUDGES_TEXT = {
    rules.BITS: "every byte equal: signed zeros differ, NaNs must carry TF's sign and payload",
    rules.SUM: "a sum in an order TF does not fix: NaN positions equal, every value within `bound` "
               "(1e-6 * sum of |incoming gradient|)",
    rules.TOLERANCE: "NaN and infinity positions (and infinities' signs) equal, every finite value within `bound` "
                     "(a number) or `bound_file` (per element, float64)",
    rules.PLACEHOLDER: "undefined in TF: not compared",
}


@dataclass
class Case:
    """One exported case, read back: the model, its inputs and what is expected of it."""

    name: str
    op: str
    note: str
    path: Path
    model: onnx.ModelProto
    inputs: list
    outputs: Optional[list] = None  # TF's values (None for a rejection)
    rules: list = field(default_factory=list)  # a rules.Rule per output
    phrases: Optional[list] = None  # what a rejection's message must contain (None for a value case)
    tf_message: Optional[str] = None

    @property
    def is_rejection(self) -> bool:
        return self.phrases is not None

    @property
    def dtype(self) -> str:
        """The element type of the op's first floating input (or the first input), for reports."""
        floats = [x.dtype.name for x in self.inputs if x.dtype.kind == "f" or x.dtype.name == "bfloat16"]
        return floats[0] if floats else self.inputs[0].dtype.name


def case_name(op: str, index: int) -> str:
    return f"test_{snake_case(op)}_{index:03d}"


def _write_tensor(path: Path, value, name: str) -> None:
    path.write_bytes(numpy_helper.from_array(np.asarray(value), name).SerializeToString())


def _read_tensor(path: Path) -> np.ndarray:
    tensor = onnx.TensorProto()
    tensor.ParseFromString(path.read_bytes())
    return numpy_helper.to_array(tensor)


def _model(op: str, inputs, attrs, outputs: Optional[Sequence]) -> onnx.ModelProto:
    """The one-node model: inputs typed as given; outputs typed as ``outputs``. A rejection's outputs are left
    untyped, so that the implementation, not a shape function, judges the input (onnx's checker wants types
    on graph outputs, so only value cases are checked)."""
    model = make_single_op_model(op, inputs, attrs, typed_outputs=False)  # at the lowest IR version it needs
    if outputs is not None:
        graph = model.graph
        names = [o.name for o in graph.output]
        del graph.output[:]
        for name, value in zip(names, outputs):
            value = np.asarray(value)
            graph.output.append(helper.make_tensor_value_info(name, elem_type_of(value.dtype), list(value.shape)))
        onnx.checker.check_model(model)
    return model


def _prepare(out_dir: Path) -> None:
    if out_dir.exists() and any(out_dir.iterdir()):
        if not (out_dir / MANIFEST).is_file():
            raise FileExistsError(f"{out_dir} is not empty and holds no {MANIFEST}: export writes into an empty "
                                  "directory or replaces an earlier export")
        for kind in (VALUES_KIND, REJECTIONS_KIND):
            shutil.rmtree(out_dir / kind, ignore_errors=True)
        (out_dir / MANIFEST).unlink()
    out_dir.mkdir(parents=True, exist_ok=True)


def _export_case(out_dir: Path, op: str, index: int, case: dict) -> dict:
    spec = get_spec(op)
    attrs, inputs = case["attrs"], [np.asarray(x) for x in case["inputs"]]
    name = case_name(op, index)
    entry = {"name": name, "op": op, "note": case.get("note", ""), "attrs": attrs}
    rejected = "error" in case
    kind = REJECTIONS_KIND if rejected else VALUES_KIND
    case_dir = out_dir / kind / name
    data_dir = case_dir / DATA_SET
    data_dir.mkdir(parents=True)
    entry["dir"] = f"{kind}/{name}"
    for k, (param, value) in enumerate(zip(spec.inputs, inputs)):
        _write_tensor(data_dir / f"input_{k}.pb", value, param.name)
    if rejected:
        onnx.save(_model(op, inputs, attrs, None), case_dir / "model.onnx")
        entry["reject"] = {"tf_message": case["error"], "must_contain": rules.rejection_phrases(op, case["error"])}
        return entry
    wants = list(case["outputs"])
    output_rules = rules.output_rules(op, inputs, attrs, wants)
    written = list(wants)
    if any(r.judge == rules.PLACEHOLDER for r in output_rules):
        reference = spec.run_reference(inputs, attrs)
        written = [reference[k] if r.judge == rules.PLACEHOLDER else w for k, (r, w) in enumerate(zip(output_rules, wants))]
    onnx.save(_model(op, inputs, attrs, written), case_dir / "model.onnx")
    entry["outputs"], atol = [], 0.0
    for k, (param, rule, value) in enumerate(zip(spec.outputs, output_rules, written)):
        _write_tensor(data_dir / f"output_{k}.pb", value, param.name)
        item = {"name": param.name, "judge": rule.judge}
        if isinstance(rule.bound, np.ndarray):
            bound = np.asarray(rule.bound, dtype=np.float64)
            _write_tensor(data_dir / f"bound_{k}.pb", bound, f"{param.name}_bound")
            item["bound_file"] = f"{DATA_SET}/bound_{k}.pb"
            finite = bound[np.isfinite(bound)]
            atol = max(atol, float(finite.max()) if finite.size else 0.0)
        elif rule.bound is not None:
            item["bound"] = rule.bound
            atol = max(atol, rule.bound)
        entry["outputs"].append(item)
    (case_dir / "data.json").write_text(json.dumps({"rtol": 0.0, "atol": atol}))
    return entry


def export(out_dir, ops: Optional[Sequence[str]] = None, golden_dir: Path = goldens.GOLDEN_DIR) -> dict:
    """Write the golden cases of ``ops`` (default: every op with goldens) as node tests under ``out_dir``.
    Returns the manifest."""
    out_dir = Path(out_dir)
    available = goldens.golden_ops(golden_dir)
    ops = list(ops) if ops else available
    unknown = [op for op in ops if op not in available]
    if unknown:
        raise ValueError(f"no golden cases for {unknown}; the ops with goldens are {available}")
    _prepare(out_dir)
    entries = []
    for op in ops:
        for index, case in enumerate(goldens.load_cases(op, golden_dir)):
            entries.append(_export_case(out_dir, op, index, case))
    manifest = {
        "kit": "ort_ops.conformance",
        "format": FORMAT,
        "domain": DOMAIN,
        "opset_version": OPSET_VERSION,
        "ir_version": IR_VERSION,
        "oracle": "TensorFlow 2.21 (CPU, Eigen kernels unless a case's note names oneDNN)",
        "judges": JUDGES_TEXT,
        "rejection": "the implementation refuses the input with a message containing every `must_contain` phrase",
        "cases": entries,
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def read_manifest(directory) -> dict:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is {directory} a directory written by "
                                "`python -m ort_ops.conformance export`?")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: format {manifest.get('format')!r}, this kit reads format {FORMAT}")
    return manifest


def _load_case(directory: Path, entry: dict) -> Case:
    case_dir = directory / entry["dir"]
    data_dir = case_dir / DATA_SET
    model = onnx.load(case_dir / "model.onnx")
    n_inputs = len(model.graph.input)
    inputs = [_read_tensor(data_dir / f"input_{k}.pb") for k in range(n_inputs)]
    case = Case(entry["name"], entry["op"], entry.get("note", ""), case_dir, model, inputs)
    if "reject" in entry:
        case.phrases = list(entry["reject"]["must_contain"])
        case.tf_message = entry["reject"]["tf_message"]
        return case
    case.outputs, case.rules = [], []
    for k, item in enumerate(entry["outputs"]):
        case.outputs.append(_read_tensor(data_dir / f"output_{k}.pb"))
        bound = _read_tensor(case_dir / item["bound_file"]) if "bound_file" in item else item.get("bound")
        case.rules.append(rules.Rule(item["judge"], bound))
    return case


def load(directory, ops: Optional[Sequence[str]] = None) -> list:
    """The cases of an exported directory (those of ``ops``, if given), in manifest order."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    entries = manifest["cases"]
    if ops:
        known = {e["op"] for e in entries}
        unknown = [op for op in ops if op not in known]
        if unknown:
            raise ValueError(f"{directory} holds no case of {unknown}; it has {sorted(known)}")
        entries = [e for e in entries if e["op"] in set(ops)]
    return [_load_case(directory, e) for e in entries]
