"""The C++ op table cannot drift from the specs (ort_ops/specs/).

(a) cpp_ops/src/ort/op_table.generated.h is what ``python -m ort_ops.codegen`` writes from the specs now;
(b) the built library registers exactly the specs' ops and type combinations, and its adapters read the
specs' attribute defaults: both read from the library's TfOpsOpTable export (no ORT session needed).
The library also refuses to load into ORT when its registrations and the table differ
(op_table::CheckRegisteredOps), which test_cpp_library's sessions would show.
"""
from __future__ import annotations

import ctypes
import json
from pathlib import Path

import numpy as np
import pytest

import ort_ops
from ort_ops import codegen
from ort_ops.spec import BFLOAT16, DOUBLE, FLOAT, FLOAT16, INT32
from ort_ops.specs import OP_SPECS

# The repository's committed header (ort_ops may be imported from an installed copy, which has no cpp_ops/).
HEADER = Path(__file__).resolve().parent.parent / "cpp_ops" / "src" / "ort" / "op_table.generated.h"

# ONNX TensorProto element type numbers.
ONNX_TYPE_NUMBERS = {FLOAT: 1, INT32: 6, FLOAT16: 10, DOUBLE: 11, BFLOAT16: 16}


def test_committed_header_is_what_codegen_writes_from_the_specs():
    assert HEADER.read_text() == codegen.generate(), "stale op table: run python -m ort_ops.codegen"


@pytest.fixture(scope="module")
def library_table():
    fn = ctypes.CDLL(ort_ops.library_path()).TfOpsOpTable
    fn.restype = ctypes.c_char_p
    return json.loads(fn().decode())


def _expected_combinations():
    return sorted(
        (spec.name, tuple(ONNX_TYPE_NUMBERS[t] for t in ins), tuple(ONNX_TYPE_NUMBERS[t] for t in outs))
        for spec in OP_SPECS
        for ins, outs in codegen.type_combinations(spec)
    )


def test_library_registers_exactly_the_specs_type_combinations_on_the_cpu(library_table):
    cpu = sorted(
        (r["op"], tuple(r["inputs"]), tuple(r["outputs"]))
        for r in library_table["registered"]
        if r["provider"] == "CPUExecutionProvider"
    )
    assert cpu == _expected_combinations()


def test_cuda_kernels_are_only_spec_combinations(library_table):
    expected = set(_expected_combinations())
    for r in library_table["registered"]:
        assert (r["op"], tuple(r["inputs"]), tuple(r["outputs"])) in expected, r


def _spec_default(attr):
    if attr.required:
        return None
    if attr.kind == "float":
        return float(np.float32(attr.default))
    if attr.kind == "ints":
        return [int(v) for v in attr.default]
    return attr.default


def test_library_attributes_and_defaults_are_the_specs(library_table):
    expected = {
        spec.name: [
            {
                "name": a.name,
                "kind": a.kind,
                "required": a.required,
                "default": _spec_default(a),
                "choices": list(a.choices or ()),
            }
            for a in spec.attrs
        ]
        for spec in OP_SPECS
    }
    got = library_table["attributes"]
    for attrs in got.values():
        for a in attrs:
            if a["kind"] == "float" and a["default"] is not None:
                a["default"] = float(np.float32(a["default"]))
    assert got == expected


def test_a_changed_default_is_caught(monkeypatch):
    """The check itself can fail: a spec whose default differs from the header's is reported."""
    import dataclasses

    from ort_ops.specs import batch_norm

    spec = batch_norm.SPECS[0]
    changed = dataclasses.replace(spec.attr("epsilon"), default=0.001)
    attrs = tuple(changed if a.name == "epsilon" else a for a in spec.attrs)
    specs = tuple(dataclasses.replace(s, attrs=attrs) if s is spec else s for s in OP_SPECS)
    assert codegen.generate(specs) != HEADER.read_text()
