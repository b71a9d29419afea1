"""Per-node verification tells the truth (converters.node_verification): every converted op is judged on TF's own
input values, a quantized gradient is held to TF's bits, and a fault in one node is found and named first.

The model is a quantization-aware training step with every kind of node the issue names: a weight quantizer
(FakeQuantWithMinMaxVars, narrow range) and an activation quantizer (8 bits, range [0, 8]) with their gradients, a
training-mode FusedBatchNormV3 and its gradient, ReLU6 and its gradient, a depthwise convolution (stride 1,
SAME, multiplier 1: its input and its output gradient have one shape) and both its backprops. Its inputs are
scaled so that ReLU6 saturates and the activation quantizer clips.

Mutation tests change one node of the converted step the way a conversion goes wrong, in both lowerings:
the batch-norm gradient's epsilon, the activation quantizer's num_bits, the depthwise filter backprop's two
data inputs swapped, ReLU6's gradient made ReLU's (no upper bound). ``--verify-model`` must fail naming that
node's TF op first; the same file unmutated passes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import tensorflow as tf
from onnx import numpy_helper

import converters
from converters.node_verification import verify_nodes
from ort_ops.schemas import DOMAIN

pytestmark = pytest.mark.tensorflow

ROOT = Path(__file__).resolve().parent.parent
BATCH, SIZE, CHANNELS, CLASSES = 4, 6, 4, 4
EPSILON = 0.01
A_MAX = 8.0  # above ReLU6's 6: the activation quantizer passes the gradient of saturated elements to Relu6Grad


class QatStep(tf.Module):
    def __init__(self, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.w = tf.Variable(rng.standard_normal((3, 3, 3, CHANNELS)).astype(np.float32) * 0.5, name="w")
        self.dw = tf.Variable(rng.standard_normal((3, 3, CHANNELS, 1)).astype(np.float32) * 0.5, name="dw")
        self.gamma = tf.Variable(np.full(CHANNELS, 3.0, np.float32), name="gamma")
        self.beta = tf.Variable(np.full(CHANNELS, 0.5, np.float32), name="beta")
        self.dense = tf.Variable(rng.standard_normal((CHANNELS, CLASSES)).astype(np.float32), name="dense")
        self.w_min, self.w_max = tf.Variable(-1.0, name="w_min"), tf.Variable(1.0, name="w_max")
        self.a_min, self.a_max = tf.Variable(0.0, name="a_min"), tf.Variable(A_MAX, name="a_max")

    @tf.function(input_signature=[tf.TensorSpec((BATCH, SIZE, SIZE, 3), tf.float32, name="images"),
                                  tf.TensorSpec((BATCH,), tf.int32, name="labels")])
    def __call__(self, images, labels):
        variables = [self.w, self.dw, self.gamma, self.beta, self.dense, self.w_min, self.w_max, self.a_min, self.a_max]
        with tf.GradientTape() as tape:
            w = tf.quantization.fake_quant_with_min_max_vars(self.w, self.w_min, self.w_max, narrow_range=True)
            x = tf.nn.conv2d(images, w, 1, "SAME")
            x, _, _ = tf.compat.v1.nn.fused_batch_norm(x, self.gamma, self.beta, epsilon=EPSILON, is_training=True)
            x = tf.nn.relu6(x)
            x = tf.quantization.fake_quant_with_min_max_vars(x, self.a_min, self.a_max, num_bits=8)
            x = tf.nn.depthwise_conv2d(x, self.dw, [1, 1, 1, 1], "SAME")
            logits = tf.matmul(tf.reduce_mean(x, axis=[1, 2]), self.dense)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
        grads = tape.gradient(loss, variables)
        out = {"loss": loss}
        out.update({"grad_" + v.name.split(":")[0]: g for v, g in zip(variables, grads)})
        return out


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    return {"images": rng.standard_normal((BATCH, SIZE, SIZE, 3)).astype(np.float32),
            "labels": rng.integers(0, CLASSES, BATCH).astype(np.int32)}


@pytest.fixture(scope="module")
def step():
    return QatStep()


@pytest.fixture(scope="module")
def converted(step):
    concrete = step.__call__.get_concrete_function()
    return {lowering: converters.from_concrete_function(concrete, lowering=lowering)
            for lowering in converters.LOWERINGS}


def _verify(model, step, seed=0):
    return verify_nodes(model, step.__call__.get_concrete_function(), inputs=_batch(seed), print_table=False)


def _op(model_step, op_type):
    """The name of the one TF op of this type in the step's frozen graph."""
    from converters.node_verification import freeze_like_converter

    frozen, _ = freeze_like_converter(model_step.__call__.get_concrete_function(), onnx.ModelProto())
    names = [n.name for n in frozen.graph_def.node if n.op == op_type]
    assert len(names) == 1, (op_type, names)
    return names[0]


# ---------------------------------------------------------------- the right model passes


@pytest.mark.parametrize("lowering", converters.LOWERINGS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_training_step_passes_per_node(step, converted, lowering, seed):
    report = _verify(converted[lowering], step, seed)
    assert report.ok, report.table()
    kinds = report.by_type()
    for op_type in ("FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxVarsGradient", "FusedBatchNormV3",
                    "FusedBatchNormGradV3", "Relu6Grad", "DepthwiseConv2dNativeBackpropFilter",
                    "DepthwiseConv2dNativeBackpropInput"):
        assert kinds.get(op_type, {}).get("checked"), (op_type, report.table())
    # The quantized gradients' masked incoming gradients are bit-exact on TF's inputs, in both lowerings.
    masked = [c for c in report.checks if c.value in ("gradient_tape/FakeQuantWithMinMaxVarsGradient:0", "grad_w")]
    assert len(masked) == 2 and all(c.check.exact and c.check.n_differing == 0 for c in masked), report.table()
    assert all(c.check.exact for c in report.checks if c.tf_type in ("Relu6Grad", "FakeQuantWithMinMaxVars"))
    data = json.loads(report.to_json())
    assert data["ok"] and data["first_failure"] is None and data["checked"] == len(report.checks)


def test_end_to_end_judges_quantized_gradients_by_their_cone(step, converted):
    """End to end, the weight quantizer's gradient (fed by Conv2DBackpropFilter) is a sum: not held to bits."""
    report = converters.verify(converted["custom"], step.__call__.get_concrete_function(), inputs=_batch(),
                               print_table=False, spread=False)
    checks = {c.name: c for c in report.outputs}
    assert not checks["grad_w"].exact and checks["grad_w"].kind == "sum", report.table()
    assert report.ok, report.table()


# ---------------------------------------------------------------- mutations are found and named


def _nodes_of(model, tf_op):
    return [n for n in model.graph.node if n.name == tf_op or n.name.startswith(tf_op + "__")]


def _replace_constant(model, tf_op, old, new):
    """Rewire the nodes of ``tf_op`` from each scalar initializer equal to ``old`` to a new one holding ``new``;
    returns the names of the nodes changed."""
    inits = {t.name: t for t in model.graph.initializer}
    changed = []
    for node in _nodes_of(model, tf_op):
        for k, name in enumerate(node.input):
            if name in inits:
                value = numpy_helper.to_array(inits[name])
                if value.size == 1 and value.dtype.kind == "f" and np.isclose(value.item(), old, rtol=1e-6):
                    fresh = name + "/mutated"
                    if fresh not in inits:
                        inits[fresh] = numpy_helper.from_array(np.full_like(value, new), fresh)
                        model.graph.initializer.append(inits[fresh])
                    node.input[k] = fresh
                    changed.append(node.name)
    return changed


def _set_attr(model, tf_op, attr_name, value):
    changed = []
    for node in _nodes_of(model, tf_op):
        if node.domain == DOMAIN:
            for attr in node.attribute:
                if attr.name == attr_name:
                    if attr.type == onnx.AttributeProto.FLOAT:
                        attr.f = value
                    else:
                        attr.i = value
                    changed.append(node.name)
    return changed


def mutate(model, step, what):
    """(the mutated copy, the TF op whose node was changed, the names of the ONNX nodes changed)."""
    wrong = onnx.ModelProto()
    wrong.CopyFrom(model)
    if what == "batch_norm_grad_epsilon":
        op = _op(step, "FusedBatchNormGradV3")
        changed = _set_attr(wrong, op, "epsilon", 0.0) + _replace_constant(wrong, op, EPSILON, 0.0)
    elif what == "quantizer_num_bits":
        op = "FakeQuantWithMinMaxVars_1"  # the activation quantizer (the second one the step creates)
        assert op in _all_ops(step, "FakeQuantWithMinMaxVars")
        op = _in_model(wrong, op)
        # Custom: the attribute. Standard: the constants the lowering computed from num_bits (the range is a
        # frozen variable, so the nudged scale and its inverse are constants too).
        changed = _set_attr(wrong, op, "num_bits", 7)
        for old, new in ((255.0, 127.0), (A_MAX / 255, A_MAX / 127), (255 / A_MAX, 127 / A_MAX)):
            changed += _replace_constant(wrong, op, np.float32(old), np.float32(new))
    elif what == "depthwise_backprop_input_order":
        op = _op(step, "DepthwiseConv2dNativeBackpropFilter")
        changed = _swap_data_inputs(wrong, step, op)
    elif what == "relu6_grad_as_relu_grad":
        op = _op(step, "Relu6Grad")
        changed = _replace_constant(wrong, op, 6.0, np.float32(np.finfo(np.float32).max))
    else:
        raise ValueError(what)
    assert changed, f"{what}: nothing changed"
    return wrong, op, set(changed)


def _in_model(model, tf_op):
    """The op's name as the model's nodes carry it (a SavedModel's ops are under StatefulPartitionedCall/)."""
    for n in model.graph.node:
        base = n.name.split("__")[0]
        if base == tf_op or base.endswith("/" + tf_op):
            return base
    raise AssertionError(f"no node of {tf_op} in the model")


def _all_ops(step, op_type):
    from converters.node_verification import freeze_like_converter

    frozen, _ = freeze_like_converter(step.__call__.get_concrete_function(), onnx.ModelProto())
    return [n.name for n in frozen.graph_def.node if n.op == op_type]


def _swap_data_inputs(model, step, tf_op):
    """Swap the ONNX values that hold the op's input and out_backprop (equal shapes here) where the op's nodes read
    them: which values those are, the per-node report of the unmutated model says."""
    from converters.node_verification import freeze_like_converter

    frozen, _ = freeze_like_converter(step.__call__.get_concrete_function(), onnx.ModelProto())
    tf_node = next(n for n in frozen.graph_def.node if n.name == tf_op)
    x_tf, dy_tf = (t if ":" in t else t + ":0" for t in (tf_node.input[0], tf_node.input[2]))
    report = _verify(model, step)
    check = next(c for c in report.checks if c.tf_op == tf_op)
    fed = dict(reversed(s.split(" <- TF ")) for s in check.sources if " <- TF " in s)
    x, dy = fed[x_tf], fed[dy_tf]
    nodes = {n.split(" (")[0] for n in check.onnx_nodes}
    changed = []
    for n in model.graph.node:
        if n.name in nodes:
            for k, name in enumerate(n.input):
                if name in (x, dy):
                    n.input[k] = dy if name == x else x
                    changed.append(n.name)
    return changed


MUTATIONS = ("batch_norm_grad_epsilon", "quantizer_num_bits", "depthwise_backprop_input_order",
             "relu6_grad_as_relu_grad")


@pytest.mark.parametrize("lowering", converters.LOWERINGS)
@pytest.mark.parametrize("what", MUTATIONS)
def test_a_mutated_node_fails_first(step, converted, lowering, what):
    wrong, op, changed = mutate(converted[lowering], step, what)
    report = _verify(wrong, step)
    assert not report.ok, report.table()
    first = report.first_failure
    # The first failure is computed by the changed node. tf2onnx merges duplicate nodes: in the standard lowering
    # the batch norm's gradient shares its sqrt(variance + epsilon) with the forward batch norm, so changing that
    # node's epsilon fails the forward op first; it is named among the first failure's nodes all the same.
    assert changed & {n.split(" (")[0] for n in first.onnx_nodes}, (changed, report.table())
    shared = {n.name for n in wrong.graph.node if n.name in changed and _read_by_other_ops(wrong, n, op)}
    if not shared:
        assert first.tf_op == op, report.table()


def _read_by_other_ops(model, node, tf_op):
    """Whether a value ``node`` computes reaches a node that is not one of ``tf_op``'s (through its consumers)."""
    mine = {n.name for n in _nodes_of(model, tf_op)}
    consumers = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    todo, seen = list(node.output), set()
    while todo:
        value = todo.pop()
        for n in consumers.get(value, []):
            if n.name not in mine:
                return True
            if n.name not in seen:
                seen.add(n.name)
                todo.extend(n.output)
    return False


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_ENABLE_ONEDNN_OPTS", None)
    return subprocess.run([sys.executable, "-m", "converters", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


def test_cli_verify_nodes_and_verify_model(step, tmp_path):
    tf.saved_model.save(step, str(tmp_path / "sm"), signatures={"serving_default": step.__call__})
    model_path = tmp_path / "step.onnx"
    proc = _cli("--saved-model", tmp_path / "sm", "--output", model_path, "--verify-nodes", "--no-tf-spread",
                "--lowering", "standard")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "per-node verification passed" in proc.stdout and "Traceback" not in proc.stderr

    wrong, op, _ = mutate(onnx.load(str(model_path)), step, "quantizer_num_bits")
    wrong_path = tmp_path / "wrong.onnx"
    onnx.save(wrong, str(wrong_path))
    report_path = tmp_path / "report.json"
    proc = _cli("--saved-model", tmp_path / "sm", "--verify-model", wrong_path, "--verify-json", report_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr[-3000:]
    assert "without converting" in proc.stdout
    assert "per-node verification FAILED" in proc.stdout and f"TF op {op!r}" in proc.stdout
    data = json.loads(report_path.read_text())
    assert data["per_node"]["first_failure"]["tf_op"] == op
    assert "outputs" in data  # the end-to-end report ran too

    proc = _cli("--saved-model", tmp_path / "sm", "--verify-model", model_path, "--verify-nodes")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    proc = _cli("--saved-model", tmp_path / "sm", "--verify-model", model_path, "--output", tmp_path / "x.onnx")
    assert proc.returncode == 2 and "leave out --output" in proc.stderr


# ---------------------------------------------------------------- names tf2onnx moves


def _keras3_bn_step():
    """A Keras 3 step whose batch norm is plain ops (moments: SquaredDifference, which tf2onnx writes as a Sub that
    keeps the TF name, then a Mul inserted on its output) with a residual Add (AddN in the gradient, across which
    the layout optimizer moves Transposes)."""
    import keras

    from converters.keras_models import training_step_function

    keras.utils.set_random_seed(3)
    inputs = keras.Input((SIZE, SIZE, 3))
    x = keras.layers.Conv2D(CHANNELS, 3, padding="same")(inputs)
    y = keras.layers.ReLU()(keras.layers.BatchNormalization()(keras.layers.Conv2D(CHANNELS, 3, padding="same")(x)))
    x = keras.layers.Add()([x, y])
    outputs = keras.layers.Dense(CLASSES)(keras.layers.GlobalAveragePooling2D()(x))
    model = keras.Model(inputs, outputs)
    concrete, holder = training_step_function(model, "sparse_categorical_crossentropy", from_logits=True,
                                              batch_size=BATCH)
    return concrete, holder


@pytest.mark.parametrize("lowering", converters.LOWERINGS)
def test_keras3_batch_norm_and_residual_step_passes_per_node(lowering):
    concrete, holder = _keras3_bn_step()
    model = converters.from_concrete_function(concrete, lowering=lowering)
    batch = _batch(5)
    inputs = {model.graph.input[0].name: batch["images"], "labels": batch["labels"]}
    report = verify_nodes(model, concrete, inputs=inputs, print_table=False)
    assert report.ok, report.table()
    squared = [c for c in report.checks if c.tf_type == "SquaredDifference"]
    # The squared difference is judged at the Mul inserted after the Sub that kept its name.
    assert squared and all(c.onnx_nodes[-1].endswith("(Mul)") for c in squared), report.table()
    del holder


def test_judged_error_and_bound_are_of_one_element():
    """The table's error and bound explain the verdict: both of the element nearest (or furthest past) its bound,
    not the largest error next to another element's bound."""
    from converters.verification import judge_output

    expected = np.array([1.0, 1e-3], np.float32)
    wrong = np.array([1.0 + 4e-6, 1e-3 + 1e-6], np.float32)
    check = judge_output("x", expected, wrong)
    assert not check.ok
    assert check.error == pytest.approx(abs(float(wrong[1]) - float(expected[1])), rel=1e-6)
    assert check.bound == pytest.approx(1e-5 * float(expected[1]), rel=1e-3)
    assert check.max_abs_err > check.error  # the largest error sits at the other, well-inside element
    right = np.array([1.0 + 4e-6, 1e-3], np.float32)
    check = judge_output("x", expected, right)
    assert check.ok and check.error <= check.bound and check.error == pytest.approx(check.max_abs_err)


def test_cli_tfmot_training_step_from_a_keras_file(tmp_path):
    """A tfmot quantize_model .h5 (tf_keras) loads without the user's quantize_scope and its step passes per node."""
    import tf_keras
    import tensorflow_model_optimization as tfmot

    tf_keras.utils.set_random_seed(0)
    layers = tf_keras.layers
    inputs = tf_keras.Input((8, 8, 3))
    x = layers.ReLU()(layers.BatchNormalization()(layers.Conv2D(8, 3, padding="same", use_bias=False)(inputs)))
    y = layers.BatchNormalization()(layers.Conv2D(8, 3, padding="same", use_bias=False)(x))
    x = layers.ReLU()(layers.Add()([x, y]))
    x = layers.ReLU(6.0)(layers.DepthwiseConv2D(3, padding="same")(x))
    model = tfmot.quantization.keras.quantize_model(
        tf_keras.Model(inputs, layers.Dense(CLASSES)(layers.GlobalAveragePooling2D()(x))))
    path = tmp_path / "qat.h5"
    model.save(str(path))
    proc = _cli("--keras", path, "--train-step", "--loss", "sparse_categorical_crossentropy", "--from-logits",
                "--optimizer", "sgd", "--learning-rate", "0.01", "--output", tmp_path / "step.onnx", "--verify-nodes",
                "--no-tf-spread")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "per-node verification passed" in proc.stdout
    assert "FakeQuantWithMinMaxVarsGradient" in proc.stdout


def test_a_transpose_that_kept_another_tensors_name_is_re_anchored():
    """tf2onnx's layout optimizer moves a Transpose behind an op and the Transpose keeps its old output's name;
    its output holds its input's tensor (converters.node_verification.follow_layout_ops)."""
    from onnx import helper

    from converters.node_verification import Anchor, follow_layout_ops

    rng = np.random.default_rng(0)
    total = rng.standard_normal((2, 3, 3, 4)).astype(np.float32)  # TF's AddN:0, NHWC
    summand = rng.standard_normal((2, 3, 3, 4)).astype(np.float32)  # TF's Conv2DBackpropInput:0, NHWC
    graph = helper.make_graph([helper.make_node("Transpose", ["addn"], ["backprop"], perm=[0, 2, 3, 1])], "g",
                              [helper.make_tensor_value_info("addn", onnx.TensorProto.FLOAT, [2, 4, 3, 3])],
                              [helper.make_tensor_value_info("backprop", onnx.TensorProto.FLOAT, [2, 3, 3, 4])])
    model = helper.make_model(graph)
    anchors = {"addn": Anchor("addn", "AddN:0", (0, 3, 1, 2)), "backprop": Anchor("backprop", "Backprop:0")}
    tf_values = {"AddN:0": total, "Backprop:0": summand}
    onnx_values = {"addn": total.transpose(0, 3, 1, 2), "backprop": total}
    assert follow_layout_ops(model, anchors, tf_values, onnx_values) == 1
    assert anchors["backprop"].tf_name == "AddN:0" and anchors["backprop"].perm is None


def test_an_ambiguous_layout_is_decided_by_the_graph_not_by_ort_value():
    """H == W == C: both NCHW and NHWC give ONNX's shape. The anchored neighbour across a layout-keeping node
    decides, even where ORT's value (a training step's, after a mask flip) is closer to the wrong layout's."""
    from onnx import helper

    from converters.node_verification import find_anchors

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 8, 4)).astype(np.float32)  # TF's NHWC input of the Conv (unambiguous)
    y = rng.standard_normal((1, 4, 4, 4)).astype(np.float32)  # TF's NHWC Conv output (H == W == C)
    w = helper.make_tensor("w", onnx.TensorProto.FLOAT, [4, 4, 1, 1], np.ones(16, np.float32))
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2]), helper.make_node("Relu", ["y"], ["z"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [1, 4, 4, 4])], [w])
    model = helper.make_model(graph)
    tf_values = {"X:0": x, "Y:0": y, "Z:0": np.maximum(y, 0)}
    candidates = {"x": "X:0", "y": "Y:0", "z": "Z:0"}
    wrong = (0, 2, 3, 1)  # ORT's values are made closest to this layout's transpose of TF's
    onnx_values = {"x": x.transpose(0, 3, 1, 2), "y": y.transpose(wrong), "z": np.maximum(y, 0).transpose(wrong)}
    by_value, _ = find_anchors(candidates, tf_values, onnx_values)
    assert by_value["y"].perm == wrong  # ORT's value alone picks the wrong one: the case this guards
    anchors, left_out = find_anchors(candidates, tf_values, onnx_values, model)
    assert not left_out and anchors["x"].perm == (0, 3, 1, 2)
    assert anchors["y"].perm == (0, 3, 1, 2) and anchors["z"].perm == (0, 3, 1, 2)  # z through y, decided first


def test_sigmoid_is_judged_by_its_absolute_error():
    """ORT's Sigmoid errs by an absolute amount (converters.verification.ABSOLUTE_ERROR_ULPS): on outputs near 0
    its relative error is unbounded, and per-node verification must not call that a wrong node. A wrong Sigmoid
    (HardSigmoid in its place) still fails there."""
    from onnx import helper

    @tf.function(input_signature=[tf.TensorSpec([4096], tf.float32)])
    def gate(x):
        return tf.math.sigmoid(x * 1.5) * x

    x = np.linspace(-20.0, 20.0, 4096).astype(np.float32)
    onnx_model = converters.from_function(gate, gate.input_signature, lowering="standard")
    report = verify_nodes(onnx_model, gate, inputs=[x], print_table=False)
    assert report.ok and report.by_type()["Sigmoid"]["checked"] == 1, report.table()
    wrong = onnx.ModelProto()
    wrong.CopyFrom(onnx_model)
    node = next(n for n in wrong.graph.node if n.op_type == "Sigmoid")
    node.op_type = "HardSigmoid"
    node.attribute.extend([helper.make_attribute("alpha", 0.2), helper.make_attribute("beta", 0.5)])
    report = verify_nodes(wrong, gate, inputs=[x], print_table=False)
    assert not report.ok and report.first_failure.tf_type == "Sigmoid", report.table()


def test_shipped_float_mobilenet_step_passes_per_node():
    """The committed MobileNetV2 float training step, per node (where the layout optimizer's renamed Transposes
    and Keras' residual AddN gradients meet)."""
    from converters.frontends import load_signature

    loaded, fn = load_signature(str(ROOT / "models" / "mobilenet_v2_float" / "saved_model"), "train_step")
    model = onnx.load(str(ROOT / "models" / "mobilenet_v2_float_train_step" / "model.custom.onnx"))
    rng = np.random.default_rng(0)
    inputs = {"images": rng.standard_normal((8, 96, 96, 3)).astype(np.float32),
              "labels": rng.integers(0, 10, 8).astype(np.int32)}
    report = verify_nodes(model, fn, inputs=inputs, print_table=False)
    assert report.ok, report.table()
    assert len(report.checks) > 700 and report.by_type()["Relu6Grad"]["bit_exact"] > 0
    del loaded


def test_api_on_a_keras_model_in_inference():
    """converters.verify_nodes on a Keras model: its inference function as from_keras traced it."""
    import tf_keras

    tf_keras.utils.set_random_seed(1)
    layers = tf_keras.layers
    inputs = tf_keras.Input((SIZE, SIZE, 3))
    x = layers.BatchNormalization()(layers.Conv2D(CHANNELS, 3, padding="same")(inputs))
    x = layers.ReLU(6.0)(layers.DepthwiseConv2D(3, padding="same")(x))
    model = tf_keras.Model(inputs, layers.Dense(CLASSES)(layers.GlobalAveragePooling2D()(x)))
    for lowering in converters.LOWERINGS:
        onnx_model = converters.from_keras(model, lowering=lowering)
        report = converters.verify_nodes(onnx_model, model, inputs=[_batch()["images"]], print_table=False)
        assert report.ok and report.by_type()["DepthwiseConv2dNative"]["checked"] == 1, report.table()


def test_a_quantizer_after_a_fused_convolution_may_flip_only_at_a_tie():
    """A group that computes a quantizer's input (a convolution with a folded batch norm before it) may round a
    value at a tie of TF's grid the other way: one grid step there, and nowhere else."""
    from converters.node_verification import judge_quantizer

    step = np.float32(4.0 / 255)
    expected = (np.arange(8, dtype=np.float32) * step).astype(np.float32)
    ties = np.zeros(8, bool)
    ties[3] = True
    steps = np.full(8, step, np.float64)
    flipped = expected.copy()
    flipped[3] = np.float32(4 * step)
    assert judge_quantizer("q", expected, flipped, ties, steps).ok
    away = expected.copy()
    away[5] = np.float32(6 * step)  # one step, but TF's input was not at a tie
    check = judge_quantizer("q", expected, away, ties, steps)
    assert not check.ok and check.n_outside == 1
    two = expected.copy()
    two[3] = np.float32(5 * step)  # at the tie, but two steps
    assert not judge_quantizer("q", expected, two, ties, steps).ok
