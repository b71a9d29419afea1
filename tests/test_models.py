"""The example models (models/): fresh conversions and the committed ONNX files match TensorFlow.

Runs the main job's functions (models.run_all) per model and lowering instead of the whole command.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import ort_ops
from models import run_all

EXAMPLE_NAMES = [e.name for e in run_all.EXAMPLES]
MAX_SAVED_MODEL_BYTES = 1 << 20
# ONNX Runtime 1.31 reads IR versions up to 13.
MAX_IR_VERSION = 13


@pytest.fixture(scope="module", params=EXAMPLE_NAMES)
def example_run(request):
    """(example, inputs, TF run) per model, shared by that model's tests."""
    example = run_all.EXAMPLES_BY_NAME[request.param]
    inputs = example.make_inputs(np.random.default_rng(0))
    return example, inputs, run_all.TensorFlowRun(example, inputs, repeat=1)


def _assert_matches(result):
    assert result.ok, "\n" + run_all.format_example(run_all.EXAMPLES_BY_NAME[result.model], {}, [result])


@pytest.mark.parametrize("lowering", run_all.LOWERINGS)
def test_fresh_conversion_matches_tensorflow(example_run, lowering):
    example, inputs, tf_run = example_run
    result = run_all.check_lowering(example, lowering, tf_run, inputs, write=False, repeat=1)
    _assert_matches(result)
    assert [o.name for o in result.outputs] == sorted(tf_run.outputs)


def _committed(example, lowering):
    path = example.onnx_path(lowering)
    assert path.is_file(), f"{path} is missing: run `python -m models.run_all`"
    return onnx.load(str(path))


@pytest.mark.parametrize("lowering", run_all.LOWERINGS)
def test_committed_onnx_file(example_run, lowering):
    example, inputs, tf_run = example_run
    model = _committed(example, lowering)
    assert model.ir_version <= MAX_IR_VERSION
    onnx.checker.check_model(model)
    domains = {n.domain for n in model.graph.node}
    imported = {imp.domain for imp in model.opset_import}
    if lowering == "custom":
        assert ort_ops.DOMAIN in domains and ort_ops.DOMAIN in imported
        assert domains <= {"", "ai.onnx", ort_ops.DOMAIN}
    else:
        assert domains <= {"", "ai.onnx"}, f"non-standard domains {domains - {'', 'ai.onnx'}}"
        assert ort_ops.DOMAIN not in imported
    _assert_matches(run_all.check_lowering(example, lowering, tf_run, inputs, onnx_model=model, write=False, repeat=1))


# The custom lowering keeps one node per TF op of the family, so these say which ops each model
# actually exercises (weight fake-quant nodes are constant-folded by TF's grappler at conversion).
EXPECTED_FAMILY_OPS = {
    "qat_cnn": {"FakeQuantWithMinMaxVars", "FusedBatchNormV3", "DepthwiseConv2dNative"},
    "qat_cnn_train_step": {
        "FakeQuantWithMinMaxVars",
        "FakeQuantWithMinMaxVarsGradient",
        "FakeQuantWithMinMaxVarsPerChannelGradient",
        "FusedBatchNormV3",
        "FusedBatchNormGradV3",
        "DepthwiseConv2dNative",
        "DepthwiseConv2dNativeBackpropInput",
        "DepthwiseConv2dNativeBackpropFilter",
    },
    "cnn_train_step_float": {
        "FakeQuantWithMinMaxVars",
        "FakeQuantWithMinMaxVarsGradient",  # the depthwise kernels' per-tensor weight quantizers
        "FakeQuantWithMinMaxVarsPerChannelGradient",
        "FusedBatchNormV3",
        "FusedBatchNormGradV3",
        "DepthwiseConv2dNative",
        "DepthwiseConv2dNativeBackpropInput",
        "DepthwiseConv2dNativeBackpropFilter",
    },
    "qdq": {"QuantizeAndDequantizeV2", "QuantizeAndDequantizeV3", "QuantizeAndDequantizeV4", "QuantizeAndDequantizeV4Grad"},
}


def _attr(node, name):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return None


def test_custom_onnx_holds_the_family_ops(example_run):
    example, _, _ = example_run
    nodes = [n for n in _committed(example, "custom").graph.node if n.domain == ort_ops.DOMAIN]
    assert {n.op_type for n in nodes} == EXPECTED_FAMILY_OPS[example.name]
    batch_norms = [n for n in nodes if n.op_type.startswith("FusedBatchNorm")]
    if example.name == "qat_cnn":
        assert batch_norms and all(_attr(n, "is_training") == 0 for n in batch_norms)
    if example.name.endswith("train_step") or example.name == "cnn_train_step_float":
        assert batch_norms and all(_attr(n, "is_training") == 1 for n in batch_norms)
        strides = {tuple(_attr(n, "strides")) for n in nodes if n.op_type == "DepthwiseConv2dNative"}
        assert strides == {(1, 1, 1, 1), (1, 2, 2, 1)}
    if example.name == "qdq":
        modes = {_attr(n, "round_mode") for n in nodes if n.op_type == "QuantizeAndDequantizeV4"}
        assert modes == {b"HALF_TO_EVEN", b"HALF_UP"}
        axes = {_attr(n, "axis") for n in nodes if n.op_type == "QuantizeAndDequantizeV4"}
        assert {-1, 1, 3} <= axes


def test_saved_model_is_small(example_run):
    example, _, _ = example_run
    size = sum(f.stat().st_size for f in example.saved_model.rglob("*") if f.is_file())
    assert 0 < size < MAX_SAVED_MODEL_BYTES


def test_qdq_inputs_hit_rounding_ties():
    """The qdq inputs must make the two rounding modes disagree, or the model would not test them."""
    example = run_all.EXAMPLES_BY_NAME["qdq"]
    inputs = example.make_inputs(np.random.default_rng(0))
    tf_run = run_all.TensorFlowRun(example, inputs, repeat=1)
    even, up = tf_run.outputs["tensor_given_half_even"], tf_run.outputs["tensor_given_half_up"]
    assert np.count_nonzero(even != up) >= 10


def test_train_step_inputs_train_the_batch_norms():
    """The training step's batch statistics come from the batch (is_training=True), not the moving ones."""
    example = run_all.EXAMPLES_BY_NAME["qat_cnn_train_step"]
    inputs = example.make_inputs(np.random.default_rng(0))
    tf_run = run_all.TensorFlowRun(example, inputs, repeat=1)
    x = inputs["images"]
    assert np.isfinite(tf_run.outputs["loss"]) and tf_run.outputs["loss"] > 0
    # Layer bn1 sees conv1(input_quant(images)); its batch mean must change with the batch.
    other = dict(inputs, images=np.ascontiguousarray(x[::-1] * np.float32(0.5)))
    tf_other = run_all.TensorFlowRun(example, other, repeat=1)
    assert not np.array_equal(tf_run.outputs["bn1_batch_mean"], tf_other.outputs["bn1_batch_mean"])
