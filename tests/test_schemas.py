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


def grid(*shape, low=-8.0, high=8.0, dtype=f32):
    """Values on a 1/64 grid spread over [low, high]: they straddle every quantization range and step used
    below (so num_bits, narrow_range, min/max and round_mode all move some output), and hit exact ties."""
    count = int(np.prod(shape))
    values = np.round(np.linspace(low, high, count) * 64) / 64
    return np.random.default_rng(count).permutation(values).reshape(shape).astype(dtype)


def rand(*shape, loc=0.0, dtype=f32):
    return (np.random.default_rng(sum(shape) + 7 * len(shape)).standard_normal(shape) + loc).astype(dtype)


def _fused_sample_x():
    x = grid(2, 3, 4, 3, low=-6, high=6)
    x[0, 0, 0, 0] = f32(0.2666665)
    return x


FQ = {"num_bits": 4}
DW = {"strides": [1, 2, 2, 1], "padding": "EXPLICIT", "explicit_paddings": [0, 0, 1, 1, 1, 1, 0, 0]}  # = SAME here
BN = {"epsilon": 0.25, "exponential_avg_factor": 0.3}
QDQ_RANGE = (f32(-4), f32(127 / 32))  # a quantization step of exactly 1/32 for 8 signed bits: grid() has ties
# op -> (inputs, attrs, expected output shapes, indices of inputs given as constants). The inputs are chosen
# so that every attribute changes the result (test_every_attribute_reaches_the_kernel).
SAMPLES = {
    "FakeQuantWithMinMaxArgs": ([grid(4, 50)], {"min": -3.0, "max": 5.0, **FQ}, [(4, 50)], ()),
    "FakeQuantWithMinMaxArgsGradient": ([rand(4, 50), grid(4, 50)], {"min": -3.0, "max": 5.0, **FQ}, [(4, 50)], ()),
    "FakeQuantWithMinMaxVars": ([grid(4, 50), f32(-3), f32(5)], FQ, [(4, 50)], ()),
    "FakeQuantWithMinMaxVarsGradient": ([rand(4, 50), grid(4, 50), f32(-3), f32(5)], FQ, [(4, 50), (), ()], ()),
    "FakeQuantWithMinMaxVarsPerChannel": ([grid(50, 3), f32([-3, -1, -6]), f32([5, 2, 1])], FQ, [(50, 3)], ()),
    "FakeQuantWithMinMaxVarsPerChannelGradient": ([rand(50, 3), grid(50, 3), f32([-3, -1, -6]), f32([5, 2, 1])], FQ,
                                                  [(50, 3), (3,), (3,)], ()),
    "QuantizeAndDequantizeV2": ([grid(4, 50, low=-5, high=5), *QDQ_RANGE], {"range_given": True}, [(4, 50)], ()),
    "QuantizeAndDequantizeV3": ([grid(4, 50, low=-5, high=5, dtype=np.float64), np.float64(-4), np.float64(127 / 32),
                                 np.int32(8)], {}, [(4, 50)], ()),
    "QuantizeAndDequantizeV4": ([grid(4, 50, low=-5, high=5), *QDQ_RANGE], {"range_given": True}, [(4, 50)], ()),
    "QuantizeAndDequantizeV4Grad": ([rand(4, 50), grid(4, 50), f32(-3), f32(5)], {}, [(4, 50), (), ()], ()),
    "FusedBatchNorm": ([rand(2, 3, 3, 3, loc=1)] + [rand(3, loc=1)] * 4, BN, [(2, 3, 3, 3)] + [(3,)] * 4, ()),
    "FusedBatchNormV2": ([rand(2, 3, 3, 3, loc=1, dtype=np.float16)] + [rand(3, loc=1)] * 4,
                         {**BN, "data_format": "NCHW"}, [(2, 3, 3, 3)] + [(3,)] * 4, ()),
    "FusedBatchNormV3": ([rand(2, 3, 3, 3, 3, loc=1)] + [rand(3, loc=1)] * 4, {**BN, "data_format": "NDHWC"},
                         [(2, 3, 3, 3, 3)] + [(3,)] * 4 + [()], ()),
    "FusedBatchNormGrad": ([rand(2, 3, 3, 3), rand(2, 3, 3, 3, loc=1), rand(3, loc=1), rand(3), rand(3, loc=2)],
                           {"epsilon": 0.25}, [(2, 3, 3, 3), (3,), (3,), (0,), (0,)], ()),
    "FusedBatchNormGradV2": ([rand(2, 3, 3, 3), rand(2, 3, 3, 3, loc=1), rand(3, loc=1), rand(3), rand(3, loc=2)],
                             {"epsilon": 0.25}, [(2, 3, 3, 3), (3,), (3,), (0,), (0,)], ()),
    "FusedBatchNormGradV3": ([rand(2, 3, 3, 3), rand(2, 3, 3, 3, loc=1), rand(3, loc=1), rand(3), rand(3, loc=2), z(0)],
                             {"epsilon": 0.25, "data_format": "NCHW"}, [(2, 3, 3, 3), (3,), (3,), (0,), (0,)], ()),
    # Channel 0's batch norm is the identity (variance + epsilon = 1): its first value is one where the Vars
    # quantizer's division and the Args quantizer's multiplication give different grid points.
    "FusedBatchNormClipFakeQuant": ([_fused_sample_x(), f32([1.0, 2.0, 1.2]), f32([0.0, -0.25, 1.0]),
                                     f32([0.0, -0.2, 0.3]), f32([0.75, 1.0, 2.0]), f32(-3), f32(5)],
                                    {"epsilon": 0.25, "clip_min": 0.0, "clip_max": 6.0, **FQ}, [(2, 3, 4, 3)], ()),
    "DepthwiseConv2dNative": ([rand(1, 5, 5, 5), rand(3, 3, 5, 3)], DW, [(1, 3, 3, 15)], ()),
    "DepthwiseConv2dNativeBackpropInput": ([np.array([1, 5, 5, 5], np.int32), rand(3, 3, 5, 3), rand(1, 3, 3, 15)], DW,
                                           [(1, 5, 5, 5)], (0,)),
    "DepthwiseConv2dNativeBackpropFilter": ([rand(1, 5, 5, 5), np.array([3, 3, 5, 3], np.int32), rand(1, 3, 3, 15)], DW,
                                            [(3, 3, 5, 3)], (1,)),
}

# op -> {attribute: another value}; every attribute of every op must be listed.
_QDQ_ATTRS = {"signed_input": False, "num_bits": 6, "range_given": False, "round_mode": "HALF_UP",
              "narrow_range": True, "axis": 1}
_DW_ATTRS = {"strides": [1, 1, 1, 1], "padding": "VALID", "explicit_paddings": [0, 0, 2, 0, 0, 2, 0, 0],
             "data_format": "NCHW", "dilations": [1, 2, 2, 1]}
_FQ_ATTRS = {"num_bits": 6, "narrow_range": True}
OTHER_VALUES = {
    "FakeQuantWithMinMaxArgs": {"min": -2.0, "max": 4.0, **_FQ_ATTRS},
    "FakeQuantWithMinMaxArgsGradient": {"min": -2.0, "max": 4.0, **_FQ_ATTRS},
    "FakeQuantWithMinMaxVars": _FQ_ATTRS,
    "FakeQuantWithMinMaxVarsGradient": _FQ_ATTRS,
    # axis 0 selects the 50 rows, which the 3-vectors min/max do not fit: an error shows it arrived.
    "FakeQuantWithMinMaxVarsPerChannel": {**_FQ_ATTRS, "axis": 0},
    "FakeQuantWithMinMaxVarsPerChannelGradient": {**_FQ_ATTRS, "axis": 0},
    "QuantizeAndDequantizeV2": _QDQ_ATTRS,
    "QuantizeAndDequantizeV3": {k: v for k, v in _QDQ_ATTRS.items() if k not in ("num_bits", "round_mode")},
    "QuantizeAndDequantizeV4": _QDQ_ATTRS,
    "QuantizeAndDequantizeV4Grad": {"axis": 1},
    "FusedBatchNorm": {"epsilon": 0.5, "exponential_avg_factor": 1.0, "data_format": "NCHW", "is_training": False},
    "FusedBatchNormV2": {"epsilon": 0.5, "exponential_avg_factor": 1.0, "data_format": "NHWC", "is_training": False},
    "FusedBatchNormV3": {"epsilon": 0.5, "exponential_avg_factor": 1.0, "data_format": "NCDHW", "is_training": False},
    "FusedBatchNormGrad": {"epsilon": 0.5, "data_format": "NCHW", "is_training": False},
    "FusedBatchNormGradV2": {"epsilon": 0.5, "data_format": "NCHW", "is_training": False},
    "FusedBatchNormGradV3": {"epsilon": 0.5, "data_format": "NHWC", "is_training": False},
    "FusedBatchNormClipFakeQuant": {"epsilon": 0.5, "data_format": "NCHW", "clip_min": -1.0, "clip_max": 2.0,
                                    "fake_quant": "FakeQuantWithMinMaxArgs", **_FQ_ATTRS},
    "DepthwiseConv2dNative": _DW_ATTRS,
    "DepthwiseConv2dNativeBackpropInput": _DW_ATTRS,
    "DepthwiseConv2dNativeBackpropFilter": _DW_ATTRS,
}


def test_every_op_has_a_sample():
    assert set(SAMPLES) == set(OTHER_VALUES) == set(ort_ops.OP_NAMES)
    assert len(ort_ops.OP_SPECS) == 20


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
    assert model.ir_version == ort_ops.lowest_ir_version(model) == 8
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
    with pytest.raises(OpError, match="QuantizeAndDequantizeV2: Value for attr 'round_mode' of \"FOO\" is not in the list of allowed values: \"HALF_TO_EVEN\", \"HALF_UP\""):
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


def test_op_reference_is_current():
    from ort_ops import docs

    text = (ROOT / "docs" / "ops.md").read_text()
    start, end = text.index(docs.BEGIN), text.index(docs.END) + len(docs.END)
    assert text[start:end] == docs.render(), "run `python -m ort_ops.docs --update docs/ops.md`"


def _evaluate(op, inputs, attrs, consts):
    """The reference evaluator's outputs for a one-node model, or the exception it raised."""
    spec = ort_ops.get_spec(op)
    model = ort_ops.make_single_op_model(op, inputs, attrs, constant_inputs=consts, typed_outputs=False)
    feeds = {p.name: x for i, (p, x) in enumerate(zip(spec.inputs, inputs)) if i not in consts}
    try:
        return [np.asarray(o) for o in ort_ops.reference_evaluator(model).run(None, feeds)]
    except Exception as e:  # compared with the kernel's own error below
        return e


def _kernel(op, inputs, attrs):
    try:
        return [np.asarray(o) for o in ort_ops.get_spec(op).run_reference(inputs, attrs)]
    except OpError as e:
        return e


def _same(a, b):
    if isinstance(a, Exception) or isinstance(b, Exception):
        return isinstance(a, Exception) and isinstance(b, Exception) and (str(b) in str(a) or str(a) in str(b))
    return len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y, equal_nan=True)
                                     for x, y in zip(a, b))


@pytest.mark.parametrize("op", sorted(SAMPLES))
def test_every_attribute_reaches_the_kernel(op):
    """A dropped or misforwarded attribute shows: for each attribute, another value changes the kernel's result
    on the sample (other values or shapes, or an error), and the evaluator gives exactly the kernel's result
    (or its error) for both values. The two values differ, so at least one is not TF's default: an evaluator
    that dropped the attribute would run that one with the default and give a different result."""
    inputs, attrs, _, consts = SAMPLES[op]
    spec = ort_ops.get_spec(op)
    assert set(OTHER_VALUES[op]) == {a.name for a in spec.attrs}, "every attribute needs another value"
    base = _kernel(op, inputs, attrs)
    assert not isinstance(base, Exception), base
    assert _same(_evaluate(op, inputs, attrs, consts), base)
    for name, value in OTHER_VALUES[op].items():
        assert value != spec.with_defaults(attrs)[name], f"{op}.{name}: the other value is the sample's"
        changed = {**attrs, name: value}
        want = _kernel(op, inputs, changed)
        assert not _same(want, base), f"{op}.{name}={value!r} does not change the kernel's result on the sample"
        assert _same(_evaluate(op, inputs, changed, consts), want), f"{op}.{name}={value!r}: evaluator != kernel"
