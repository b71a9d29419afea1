"""The example models (models/): fresh conversions and the committed ONNX files match TensorFlow.

Runs the main job's functions (models.run_all) per model and lowering instead of the whole command.
"""
from __future__ import annotations

import fnmatch
import functools
import re
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

# models/ is a package of the repository, not of the installed distribution: make it importable when this
# file runs alone (`pytest tests/test_models.py`), whatever the working directory.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import ort_ops  # noqa: E402
from models import run_all  # noqa: E402

pytestmark = pytest.mark.tensorflow

EXAMPLE_NAMES = [e.name for e in run_all.EXAMPLES]
# MobileNetV2 0.35 (0.43M parameters, 1.8 MB) with its three graphs (4.3 MB, mostly the training step's)
# is the largest; the submission must stay small.
MAX_SAVED_MODEL_BYTES = 8 << 20
# onnxruntime 1.17, the oldest the library supports, reads IR versions up to 9.
MAX_IR_VERSION = 9


@pytest.fixture(scope="module", params=EXAMPLE_NAMES)
def example_run(request):
    """(example, inputs, TF run) per model, shared by that model's tests."""
    example = run_all.EXAMPLES_BY_NAME[request.param]
    inputs = example.make_inputs(np.random.default_rng(0))
    return example, inputs, run_all.TensorFlowRun(example, inputs, repeat=1)


def _assert_matches(result):
    assert result.ok, "\n" + run_all.format_example(run_all.EXAMPLES_BY_NAME[result.model], {}, [result])


# Every example in both lowerings is converted fresh here (the quantized MobileNetV2 training step's standard
# lowering, 11.8k nodes, converts in about 35 s since the optimizer's costs became linear: converters.linear_cost).
FRESH_CONVERSIONS = [(name, lowering) for name in EXAMPLE_NAMES for lowering in run_all.LOWERINGS]


@functools.lru_cache(maxsize=1)
def _tf_run(name):
    """(example, inputs, TF run) of the last model asked for (the tests run grouped by model)."""
    example = run_all.EXAMPLES_BY_NAME[name]
    inputs = example.make_inputs(np.random.default_rng(0))
    return example, inputs, run_all.TensorFlowRun(example, inputs, repeat=1)


@pytest.mark.parametrize("name,lowering", FRESH_CONVERSIONS)
def test_fresh_conversion_matches_tensorflow(name, lowering):
    example, inputs, tf_run = _tf_run(name)
    result = run_all.check_lowering(example, lowering, tf_run, inputs, write=False, repeat=1)
    _assert_matches(result)
    names = [o.name for o in result.outputs]
    assert names == sorted(names) and set(tf_run.outputs) <= set(names)
    if example.variable_updates == "outputs":
        assert len(names) > len(tf_run.outputs)  # plus one output per variable the step assigns


def _committed(example, lowering):
    path = example.onnx_path(lowering)
    assert path.is_file(), f"{path} is missing: run `python -m models.run_all`"
    return onnx.load(str(path))


@pytest.mark.parametrize("lowering", run_all.LOWERINGS)
def test_committed_onnx_file(example_run, lowering):
    example, inputs, tf_run = example_run
    if lowering not in example.committed_lowerings:
        # Too large to commit (8-20 MB): the main job writes it, git ignores it; the fresh-conversion test
        # above checks this lowering.
        ignored = (run_all.MODELS_DIR / ".gitignore").read_text().split()
        relative = str(example.onnx_path(lowering).relative_to(run_all.MODELS_DIR))
        assert any(fnmatch.fnmatch(relative, pattern) for pattern in ignored), relative
        return
    model = _committed(example, lowering)
    # The lowest IR version the model's opsets need, as the converters write it: the shipped file runs unchanged
    # on every onnxruntime from 1.17 (scripts/test_ort_versions.sh runs it so).
    assert model.ir_version == ort_ops.lowest_ir_version(model) <= MAX_IR_VERSION, model.ir_version
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


INTEGER_EXAMPLES = [e.name for e in run_all.EXAMPLES if e.integer]


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "fresh"])
@pytest.mark.parametrize("name", INTEGER_EXAMPLES)
def test_integer_model_matches_tensorflow_in_steps(name, committed):
    """The QAT classifiers' integer models (converters.integer), the committed file and a fresh conversion: standard
    QDQ only, the lowest IR version, logits within the step bound of TF's on the example inputs and the 360 held-out
    digits, every quantized tensor within one step on TF's inputs, TF's predictions (run_all.check_integer)."""
    example, inputs, tf_run = _tf_run(name)
    model = _committed(example, run_all.INTEGER) if committed else None
    if committed:
        assert model.ir_version == ort_ops.lowest_ir_version(model) <= MAX_IR_VERSION, model.ir_version
        onnx.checker.check_model(model)
        assert {n.domain for n in model.graph.node} <= {"", "ai.onnx"}
        assert ort_ops.DOMAIN not in {imp.domain for imp in model.opset_import}
    result = run_all.check_integer(example, tf_run, inputs, onnx_model=model, write=False, repeat=1)
    _assert_matches(result)
    assert result.per_tensor is not None and len(result.per_tensor.checks) >= 5
    assert any("in integer" in line for line in result.summary)


# The custom lowering keeps one node per TF op of the family, so these say which ops each model
# actually exercises (weight fake-quant nodes are constant-folded by TF's grappler at conversion).
_TRAIN_STEP_FAMILY = {
    "FakeQuantWithMinMaxVars",
    "FakeQuantWithMinMaxVarsGradient",
    "FusedBatchNormV3",
    "FusedBatchNormGradV3",
    "DepthwiseConv2dNative",
    "DepthwiseConv2dNativeBackpropInput",
    "DepthwiseConv2dNativeBackpropFilter",
}
EXPECTED_FAMILY_OPS = {
    # Inference: each batch norm, its ReLU6 and its quantizer are one fused node (converters/fusions.py). The
    # saliency graph's batch norms keep their own nodes: its gradient reads their inputs too.
    "mobilenet_v2_qat": {"FakeQuantWithMinMaxVars", "FusedBatchNormClipFakeQuant", "DepthwiseConv2dNative"},
    "mobilenet_v2_qat_train_step": _TRAIN_STEP_FAMILY | {"FakeQuantWithMinMaxVarsPerChannelGradient"},
    "mobilenet_v2_qat_saliency": {
        "FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxVarsGradient", "FusedBatchNormV3", "FusedBatchNormGradV3",
        "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
    },
    "mobilenet_v2_float_train_step": {
        "FusedBatchNormV3", "FusedBatchNormGradV3", "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
        "DepthwiseConv2dNativeBackpropFilter",
    },
    "fourbit_cnn": {"FakeQuantWithMinMaxVars"},
    "fourbit_cnn_train_step": {"FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxVarsGradient"},
    "cnn_train_step_float": _TRAIN_STEP_FAMILY | {"FakeQuantWithMinMaxVarsPerChannelGradient"},
    "qdq": {"QuantizeAndDequantizeV2", "QuantizeAndDequantizeV3", "QuantizeAndDequantizeV4", "QuantizeAndDequantizeV4Grad"},
    # Keras 3's batch norm is not fused (no FusedBatchNorm* node); its weight quantizers are per channel.
    "keras3_qat": {"FakeQuantWithMinMaxVars", "DepthwiseConv2dNative"},
    "keras3_qat_train_step": {
        "FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxVarsGradient", "FakeQuantWithMinMaxVarsPerChannelGradient",
        "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter",
    },
    "keras3_qat_saliency": {
        "FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxVarsGradient", "DepthwiseConv2dNative",
        "DepthwiseConv2dNativeBackpropInput",
    },
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
    if example.name in ("mobilenet_v2_qat", "mobilenet_v2_qat_saliency"):
        assert batch_norms and all(_attr(n, "is_training") == 0 for n in batch_norms if n.op_type == "FusedBatchNormV3")
    if example.name in ("mobilenet_v2_qat_train_step", "cnn_train_step_float"):
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


@pytest.mark.parametrize("name", ["mobilenet_v2_qat_train_step", "cnn_train_step_float", "keras3_qat_train_step"])
def test_train_step_updates_are_outputs(name):
    """The step assigns the moving statistics (and tfmot's ranges); the committed model has an output for
    every variable TF changed, and each holds the new value, not the old one."""
    example = run_all.EXAMPLES_BY_NAME[name]
    inputs = example.make_inputs(np.random.default_rng(0))
    tf_run = run_all.TensorFlowRun(example, inputs, repeat=1)
    changed = {k for k in tf_run.variables_after
               if not np.array_equal(tf_run.variables_before[k], tf_run.variables_after[k])}
    assert any(k.endswith("moving_mean") for k in changed) and any(k.endswith("moving_variance") for k in changed)
    model = _committed(example, "custom")
    result = run_all.LoweringResult(name, "custom")
    expected = run_all.variable_update_expectations(model, tf_run, result)
    assert not result.error and set(expected) >= changed
    # The wrong answer (the value before the step) must fail the comparison the main job applies.
    judged = [v for v in sorted(changed) if not (example.judged_per_node and re.search(example.judged_per_node, v))]
    assert any(v.endswith("moving_mean") for v in judged)
    for var in judged:
        before, after = tf_run.variables_before[var], tf_run.variables_after[var]
        assert not run_all.compare_update(example, var, before, after, before).ok, var




# Inference graphs whose committed files take images: each output must depend on the image.
IMAGE_INFERENCE = [e.name for e in run_all.EXAMPLES if e.signature in ("serving_default", "saliency")
                   and e.name != "qdq" and "train_step" not in e.name]


@pytest.mark.parametrize("name,lowering", [(n, lowering) for n in IMAGE_INFERENCE for lowering in run_all.LOWERINGS]
                         + [(n, run_all.INTEGER) for n in IMAGE_INFERENCE if run_all.EXAMPLES_BY_NAME[n].integer])
def test_shipped_inference_outputs_vary_across_images(name, lowering):
    """A shipped inference model gives each of 16 real images (held-out digits and crops of the sample
    photographs) its own output: a model whose output does not depend on its input proves nothing."""
    from models import data

    example = run_all.EXAMPLES_BY_NAME[name]
    model = _committed(example, lowering)
    size = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    images = np.concatenate([data.digits(size).test_images[:8], data.photographs(8, size)])
    sess = run_all.session(model, log_severity_level=3)
    outputs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {sess.get_inputs()[0].name: images})))
    logits = outputs["logits"]
    for output, value in outputs.items():
        rows = value.reshape(len(images), -1)
        if output == "saliency":
            # An image whose top logit sits at the logits quantizer's maximum (a confident digit) has no gradient
            # to its score, in TF too: its map is all zeros. The others must each be their own.
            zero = ~rows.any(axis=1)
            top = logits.max(axis=1)
            assert np.all(top[zero] == top.max()) and zero.sum() <= len(images) // 2, (name, lowering, top, zero)
            rows = rows[~zero]
        assert len(np.unique(rows, axis=0)) == len(rows), f"{name} {lowering}: {output} repeats across images"
    assert len(np.unique(logits[:8].argmax(axis=-1))) > 2, f"{name} {lowering}: the digits get one or two classes"


# The held-out accuracy each trained classifier reaches in TF (docs/examples.md states the measured values).
MIN_HELD_OUT_ACCURACY = {"mobilenet_v2_qat": 0.9, "fourbit_cnn": 0.8, "keras3_qat": 0.9}


@pytest.mark.parametrize("name", sorted(MIN_HELD_OUT_ACCURACY))
def test_classifiers_are_trained(name):
    """Trained on the digits: far above chance (10%) on the held-out images in TF, and each lowering's
    committed file agrees with TF's predictions to the share run_all requires (its HeldOut judgment)."""
    example, _, tf_run = _tf_run(name)
    assert tf_run.held_out.accuracy >= MIN_HELD_OUT_ACCURACY[name], tf_run.held_out.describe()
    for lowering in run_all.LOWERINGS + ((run_all.INTEGER,) if example.integer else ()):
        sess = run_all.session(_committed(example, lowering), log_severity_level=3)
        held_out = tf_run.judge_held_out(example, run_all._ort_classifier(sess))
        assert held_out.ok, f"{lowering}: {held_out.describe()}"


def test_held_out_judgment_rejects_a_constant_classifier():
    """The agreement check cannot pass a model whose output ignores its input, even where TF's predictions are
    all one class; nor one that disagrees with TF."""
    labels = np.arange(20) % 10
    constant = run_all.HeldOut(np.tile(np.eye(10)[3], (20, 1)), labels, np.full(20, 3), 0.9)
    assert constant.agreement == 1.0 and not constant.ok
    varied = run_all.HeldOut(np.eye(10)[labels], labels, labels, 0.9)
    assert varied.ok and varied.accuracy == 1.0
    wrong = run_all.HeldOut(np.eye(10)[(labels + 1) % 10], labels, labels, 0.9)
    assert not wrong.ok


# Each state variable's initial value: batch norm's (0, 1), tfmot's MovingAverageQuantizer (-6, 6), and the Keras 3
# example's trainable ranges (models/keras3_qat.py: [0, 2] after each ReLU6, [-2, 2] for the logits).
_INITIAL_STATE = (
    (r"moving_mean$", (0.0,)),
    (r"moving_variance$", (1.0,)),
    (r"(post_activation|output)_(min|max)$", (-6.0, 6.0)),
    (r"(conv1|dw|pw|logits)_quant/range_max$", (2.0,)),
)


@pytest.mark.parametrize("name", sorted(MIN_HELD_OUT_ACCURACY))
def test_trained_state_moved_from_its_initial_values(name):
    """Training moved the moving statistics and the quantization ranges: a model whose ranges stayed at their
    initial values saturates (the degenerate example this replaced gave every image the same logits)."""
    import tensorflow as tf

    loaded = tf.saved_model.load(str(run_all.EXAMPLES_BY_NAME[name].saved_model))
    values = {v.name.split(":")[0]: v.numpy() for v in loaded.model_variables}
    checked = 0
    for pattern, initial in _INITIAL_STATE:
        state = {k: v for k, v in values.items() if re.search(pattern, k)}
        moved = [k for k, v in state.items() if not np.isin(v, initial).all()]
        # Most of them: a range whose gradient is 0 (beyond a ReLU, nothing below 0) keeps its initial end.
        assert len(moved) >= 0.75 * len(state), (pattern, sorted(set(state) - set(moved)))
        checked += len(state)
    assert checked >= 8, sorted(values)
