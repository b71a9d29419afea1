"""The onnx side of the domain: schemas, checker, shape inference, reference evaluator, docs."""
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ort_ops
from ort_ops.spec import OpError

f32 = np.float32
ROOT = Path(__file__).resolve().parent.parent


def z(*shape, dtype=f32):
    return np.zeros(shape, dtype)


DW = {"strides": [1, 2, 2, 1], "padding": "SAME"}
# op -> (inputs, attrs, expected output shapes, indices of inputs given as constants)
SAMPLES = {
    "FakeQuantWithMinMaxArgs": ([z(2, 3)], {"num_bits": 4}, [(2, 3)], ()),
    "FakeQuantWithMinMaxArgsGradient": ([z(2, 3), z(2, 3)], {}, [(2, 3)], ()),
    "FakeQuantWithMinMaxVars": ([z(2, 3), f32(-1), f32(1)], {}, [(2, 3)], ()),
    "FakeQuantWithMinMaxVarsGradient": ([z(2, 3), z(2, 3), f32(-1), f32(1)], {}, [(2, 3), (), ()], ()),
    "FakeQuantWithMinMaxVarsPerChannel": ([z(2, 3), z(3), z(3)], {}, [(2, 3)], ()),
    "FakeQuantWithMinMaxVarsPerChannelGradient": ([z(2, 3), z(2, 3), z(3), z(3)], {}, [(2, 3), (3,), (3,)], ()),
    "QuantizeAndDequantizeV2": ([z(2, 3), f32(0), f32(1)], {"round_mode": "HALF_UP"}, [(2, 3)], ()),
    "QuantizeAndDequantizeV3": ([z(2, 3, dtype=np.float64), np.float64(0), np.float64(1), np.int32(8)], {}, [(2, 3)], ()),
    "QuantizeAndDequantizeV4": ([z(2, 3), z(3), z(3)], {"axis": 1, "range_given": 1}, [(2, 3)], ()),
    "QuantizeAndDequantizeV4Grad": ([z(2, 3), z(2, 3), f32(0), f32(1)], {}, [(2, 3), (), ()], ()),
    "FusedBatchNorm": ([z(2, 4, 4, 3)] + [z(3)] * 4, {}, [(2, 4, 4, 3)] + [(3,)] * 4, ()),
    "FusedBatchNormV2": ([z(2, 3, 4, 4, dtype=np.float16)] + [z(3)] * 4, {"data_format": "NCHW"}, [(2, 3, 4, 4)] + [(3,)] * 4, ()),
    "FusedBatchNormV3": ([z(2, 2, 4, 4, 5)] + [z(5)] * 4, {"data_format": "NDHWC"}, [(2, 2, 4, 4, 5)] + [(5,)] * 4 + [()], ()),
    "FusedBatchNormGrad": ([z(2, 4, 4, 3), z(2, 4, 4, 3)] + [z(3)] * 3, {}, [(2, 4, 4, 3), (3,), (3,), (0,), (0,)], ()),
    "FusedBatchNormGradV2": ([z(2, 4, 4, 3), z(2, 4, 4, 3)] + [z(3)] * 3, {}, [(2, 4, 4, 3), (3,), (3,), (0,), (0,)], ()),
    "FusedBatchNormGradV3": ([z(2, 3, 4, 4), z(2, 3, 4, 4)] + [z(3)] * 3 + [z(0)], {"data_format": "NCHW"}, [(2, 3, 4, 4), (3,), (3,), (0,), (0,)], ()),
    "DepthwiseConv2dNative": ([z(1, 5, 5, 2), z(3, 3, 2, 3)], DW, [(1, 3, 3, 6)], ()),
    "DepthwiseConv2dNativeBackpropInput": ([np.array([1, 5, 5, 2], np.int32), z(3, 3, 2, 3), z(1, 3, 3, 6)], DW, [(1, 5, 5, 2)], (0,)),
    "DepthwiseConv2dNativeBackpropFilter": ([z(1, 5, 5, 2), np.array([3, 3, 2, 3], np.int32), z(1, 3, 3, 6)], DW, [(3, 3, 2, 3)], (1,)),
}


def test_every_op_has_a_sample():
    assert set(SAMPLES) == set(ort_ops.OP_NAMES)
    assert len(ort_ops.OP_SPECS) == 19


def test_domain_constants():
    assert ort_ops.DOMAIN == "ai.onnx.converters.tensorflow"
    assert ort_ops.OPSET_VERSION == 1


def _model(op):
    inputs, attrs, _, consts = SAMPLES[op]
    return ort_ops.make_single_op_model(op, inputs, attrs, constant_inputs=consts)


@pytest.mark.parametrize("op", sorted(SAMPLES))
def test_checker_accepts_and_rejects(op):
    ort_ops.register_schemas()
    ort_ops.register_schemas()  # idempotent
    model = _model(op)
    assert model.ir_version == ort_ops.IR_VERSION <= 13
    onnx.checker.check_model(model, full_check=True)

    extra_input = onnx.ModelProto()
    extra_input.CopyFrom(model)
    extra_input.graph.node[0].input.append(extra_input.graph.node[0].input[0])
    with pytest.raises(onnx.checker.ValidationError, match="input size"):
        onnx.checker.check_model(extra_input, full_check=True)

    unknown_attr = onnx.ModelProto()
    unknown_attr.CopyFrom(model)
    unknown_attr.graph.node[0].attribute.append(helper.make_attribute("T", 1))
    with pytest.raises(onnx.checker.ValidationError, match="Unrecognized attribute: T"):
        onnx.checker.check_model(unknown_attr, full_check=True)


@pytest.mark.parametrize("op", sorted(SAMPLES))
def test_shape_inference_types_and_shapes(op):
    ort_ops.register_schemas()
    inputs, attrs, expected, consts = SAMPLES[op]
    model = _model(op)
    del model.graph.output[:]  # make inference do the work
    spec = ort_ops.get_spec(op)
    model.graph.output.extend(helper.make_empty_tensor_value_info(p.name) for p in spec.outputs)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    by_name = {vi.name: vi for vi in inferred.graph.value_info}
    by_name.update({vi.name: vi for vi in inferred.graph.output})
    x_type = inputs[0].dtype if op != "DepthwiseConv2dNativeBackpropInput" else inputs[1].dtype
    for p, shape in zip(spec.outputs, expected):
        tt = by_name[p.name].type.tensor_type
        assert tt.elem_type != TensorProto.UNDEFINED, p.name
        dims = tuple(d.dim_value for d in tt.shape.dim)
        assert dims == shape, (p.name, dims, shape)
        if p.type == "T":
            assert helper.tensor_dtype_to_np_dtype(tt.elem_type) == x_type


def test_shape_inference_rejects_bad_input():
    ort_ops.register_schemas()
    model = ort_ops.make_single_op_model(
        "FakeQuantWithMinMaxVarsPerChannel", [z(2, 3), z(3), z(3)], {}, typed_outputs=False
    )
    model.graph.input[1].type.tensor_type.shape.dim[0].dim_value = 4
    with pytest.raises(onnx.shape_inference.InferenceError, match="FakeQuantWithMinMaxVarsPerChannel: min has incorrect size"):
        onnx.shape_inference.infer_shapes(model, strict_mode=True)


def test_spec_attribute_handling():
    spec = ort_ops.get_spec("QuantizeAndDequantizeV2")
    attrs = spec.with_defaults({"round_mode": b"HALF_UP", "narrow_range": 1})
    assert attrs["round_mode"] == "HALF_UP" and attrs["narrow_range"] is True and attrs["num_bits"] == 8
    with pytest.raises(OpError, match="QuantizeAndDequantizeV2: attribute round_mode must be one of"):
        spec.with_defaults({"round_mode": "FOO"})
    with pytest.raises(OpError, match="unknown attribute"):
        spec.with_defaults({"bogus": 1})
    with pytest.raises(OpError, match="missing required attribute 'strides'"):
        ort_ops.get_spec("DepthwiseConv2dNative").with_defaults({"padding": "SAME"})


@pytest.mark.parametrize("op", sorted(SAMPLES))
def test_reference_evaluator_runs_every_op(op):
    inputs, attrs, expected, consts = SAMPLES[op]
    model = _model(op)
    spec = ort_ops.get_spec(op)
    feeds = {p.name: x for i, (p, x) in enumerate(zip(spec.inputs, inputs)) if i not in consts}
    outs = ort_ops.reference_evaluator(model).run(None, feeds)
    assert [tuple(np.shape(o)) for o in outs] == [tuple(s) for s in expected]
    direct = spec.run_reference(inputs, attrs)
    for a, b in zip(outs, direct):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_readme_op_reference_is_current():
    from ort_ops import docs

    text = (ROOT / "README.md").read_text()
    start, end = text.index(docs.BEGIN), text.index(docs.END) + len(docs.END)
    assert text[start:end] == docs.render(), "run `python -m ort_ops.docs --update README.md`"
