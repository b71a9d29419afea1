"""Shape inference with inputs of unknown rank (issue 11, item 5): unknown rank in, unknown rank out.

For every op, a model whose graph inputs carry an element type but no shape at all:
- onnx.shape_inference (the Python schemas) must not give output 0 a shape (it copies or derives
  from an input whose rank is unknown), and must not fail;
- an ONNX Runtime session (the C++ library's own shape inference) must run the model without
  ORT's warning that the model's inferred shape differs from the actual one (it used to claim a
  scalar, because ORT's C API reports an unknown rank as rank 0).
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import ort_ops
from backends import library_session
from ort_ops.conformance.goldens import load_cases
from ort_ops.model import make_single_op_model
from ort_ops.schemas import register_schemas
from ort_ops.specs import OP_SPECS

SHAPE_WARNING = "Expected shape from model"


def _first_valid_case(op):
    for case in load_cases(op):
        if "error" not in case and all(np.asarray(x).dtype.name != "bfloat16" for x in case["inputs"]):
            return case
    raise AssertionError(f"{op}: no golden case to run")


def _shapeless_model(op):
    case = _first_valid_case(op)
    model = make_single_op_model(op, case["inputs"], case["attrs"], typed_outputs=False)
    for value_info in model.graph.input:
        value_info.type.tensor_type.ClearField("shape")
    return model, case


@pytest.mark.parametrize("op", [s.name for s in OP_SPECS])
def test_onnx_shape_inference_keeps_the_rank_unknown(op):
    register_schemas()
    model, _ = _shapeless_model(op)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    out = {o.name: o for o in inferred.graph.output}[ort_ops.get_spec(op).outputs[0].name]
    tensor_type = out.type.tensor_type
    assert tensor_type.elem_type != 0, f"{op}: output 0 has no element type"
    if op.startswith("Depthwise") and tensor_type.HasField("shape"):
        assert len(tensor_type.shape.dim) == 4  # the depthwise ops always give 4-D outputs
    else:
        assert not tensor_type.HasField("shape"), f"{op}: output 0 claims shape {tensor_type.shape}"


@pytest.mark.parametrize("op", [s.name for s in OP_SPECS])
def test_ort_session_does_not_claim_a_shape(op, capfd):
    model, case = _shapeless_model(op)
    session = library_session(model, log_severity_level=2)  # warnings: ORT reports a shape mismatch at this level
    feeds = {i.name: np.asarray(x) for i, x in zip(session.get_inputs(), case["inputs"])}
    outputs = session.run(None, feeds)
    want = ort_ops.get_spec(op).run_reference([np.asarray(x) for x in case["inputs"]], case["attrs"])
    assert outputs[0].shape == want[0].shape
    err = capfd.readouterr().err
    assert SHAPE_WARNING not in err, f"{op}: {err}"


def test_the_warning_check_can_fail(capfd):
    """A model that declares a wrong output shape does make ORT print the warning this file looks for."""
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    model = make_single_op_model("FakeQuantWithMinMaxArgs", [x], {})
    model.graph.input[0].type.tensor_type.ClearField("shape")
    model.graph.output[0].type.tensor_type.shape.ClearField("dim")  # declared: a scalar, as the old inference said
    session = library_session(model, log_severity_level=2)
    session.run(None, {session.get_inputs()[0].name: x})
    assert SHAPE_WARNING in capfd.readouterr().err
