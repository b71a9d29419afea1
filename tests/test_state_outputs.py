"""Variable state in converted training steps (converters.variable_state).

* Default: the model has exactly the function's outputs, and a warning names every variable update left out.
* ``variable_updates="outputs"``: one extra output per updated variable, named after it, equal to the
  variable's value in TF after running the step once.
* Reads that TF orders after an assignment (tfmot's quantizers read their range after the moving-average
  update) see the new value, as in TF; tf2onnx's own freezing gives them the old one.
* ``trainable_inputs=True``: the trainable variables are inputs with same-name initializers, and three SGD
  steps run in ONNX Runtime (feeding the updated weights) follow the same three steps in TF.
"""
from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
import tensorflow as tf
import tf_keras

import converters
import ort_ops
from converters.variable_state import TRAINABLE_INPUTS_KEY, VARIABLE_UPDATES_KEY
from comparison import assert_bits_equal
from converters.verification import run_onnx, session

pytestmark = pytest.mark.tensorflow

BATCH, SHAPE, CLASSES = 4, (8, 8, 3), 5


def _keras_net(seed):
    # Layer names (and so variable names, which the tests expect) come from a process-wide counter that
    # every Keras model built earlier in the run advances.
    tf_keras.backend.clear_session()
    tf_keras.utils.set_random_seed(seed)
    layers = tf_keras.layers
    inputs = tf_keras.Input(SHAPE)
    x = layers.Conv2D(6, 3, padding="same", use_bias=False)(inputs)  # a bias before batch norm gets no gradient
    x = layers.BatchNormalization(momentum=0.9)(x)
    x = layers.ReLU(6.0)(x)
    x = layers.DepthwiseConv2D(3, strides=2, padding="same", use_bias=False)(x)
    x = layers.BatchNormalization(momentum=0.9)(x)
    x = layers.ReLU()(x)
    x = layers.GlobalAveragePooling2D()(x)
    return tf_keras.Model(inputs, layers.Dense(CLASSES)(x))


def _quantized_net():
    import tensorflow_model_optimization as tfmot

    return tfmot.quantization.keras.quantize_model(_keras_net(3))


class Step(tf.Module):
    """loss, logits and the gradient of every trainable variable (keyed by the variable's name), training=True."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    @tf.function(input_signature=[tf.TensorSpec((BATCH,) + SHAPE, tf.float32, name="images"),
                                  tf.TensorSpec((BATCH,), tf.int32, name="labels")])
    def __call__(self, images, labels):
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            logits = self.model(images, training=True)
            loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits)
        grads = tape.gradient(loss, variables)
        out = {"loss": loss, "logits": logits}
        out.update({"grad:" + v.name.split(":")[0]: g for v, g in zip(variables, grads)})
        return out


def _batch(seed):
    rng = np.random.default_rng(seed)
    # Spread beyond tfmot's initial activation range, so that the range updates are large.
    images = rng.uniform(-3.0, 9.0, (BATCH,) + SHAPE).astype(np.float32)
    labels = rng.integers(0, CLASSES, (BATCH,)).astype(np.int32)
    return {"images": images, "labels": labels}




def _tf_step(step, batch):
    """Run the step once in TF: (outputs, variable values before, after)."""
    variables = {v.name.split(":")[0]: v for v in step.model.variables}
    before = {k: v.numpy() for k, v in variables.items()}
    out = {k: v.numpy() for k, v in step(**{k: tf.constant(v) for k, v in batch.items()}).items()}
    after = {k: v.numpy() for k, v in variables.items()}
    return out, before, after


def _changed(before, after):
    return {k for k in before if not np.array_equal(before[k], after[k])}


@pytest.fixture(scope="module")
def qat_step():
    return Step(_quantized_net())


def test_default_keeps_outputs_and_warns_every_update(qat_step, caplog):
    with caplog.at_level(logging.DEBUG, logger="converters.variable_state"):
        model = converters.from_concrete_function(qat_step.__call__.get_concrete_function())
    out, before, after = _tf_step(qat_step, _batch(0))
    changed = _changed(before, after)
    # tfmot's input/activation/weight ranges and both batch norms' moving statistics.
    assert len(changed) >= 10 and {"batch_normalization/moving_mean", "batch_normalization_1/moving_variance"} <= changed
    assert sorted(o.name for o in model.graph.output) == sorted(out)
    # The warning is one sentence (the count and a few names); the whole list, with each assignment, at debug level.
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "left out" in r.getMessage()]
    assert len(warnings) == 1 and len(warnings[0]) < 400, warnings
    assert warnings[0].startswith(f"{len(changed)} variable update(s) left out")
    full = [r.getMessage() for r in caplog.records
            if r.levelno == logging.DEBUG and r.getMessage().startswith("variable updates left out")]
    assert len(full) == 1
    named = {part.split(" (")[0] for part in full[0].split(": ", 1)[1].split("; ")}
    assert named == changed
    for op in ("AssignVariableOp", "AssignSubVariableOp"):
        assert op in full[0]


@pytest.mark.parametrize("lowering", converters.LOWERINGS)
def test_update_outputs_equal_tf_after_one_step(lowering):
    step = Step(_quantized_net())
    model = converters.from_concrete_function(step.__call__.get_concrete_function(), lowering=lowering,
                                              variable_updates="outputs")
    batch = _batch(1)
    onnx_out = run_onnx(model, batch)
    tf_out, before, after = _tf_step(step, batch)
    props = {p.key: p.value for p in model.metadata_props}
    updates = props[VARIABLE_UPDATES_KEY].split(",")
    assert set(updates) == _changed(before, after)
    assert [o.name for o in model.graph.output] == sorted(tf_out) + updates
    for name in updates:
        new, old = after[name], before[name]
        got = onnx_out[name]
        assert got.dtype == new.dtype and got.shape == new.shape, name
        if "moving_" in name:
            # FusedBatchNormV3's batch mean and variance are sums over the batch, summed in a different order
            # than TF's kernel: a few ulps of the statistic (rtol 1e-5 of |new| + 1e-6 of max |new|).
            tol = 1e-5 * np.abs(new) + 1e-6 * np.abs(new).max()
            assert np.all(np.abs(got - new) <= tol), name
        else:
            # Ranges: min/max reductions, the moving average's v - (v - x) * decay, all exact float ops on
            # inputs that are themselves exact here (the step's activations match TF bit for bit below).
            assert_bits_equal(new, got, name)
        # The stale value must not pass: the step moved every one of them.
        assert not np.array_equal(old, new), name
    # The function's own outputs, computed after tfmot's range updates, match TF exactly here.
    np.testing.assert_array_equal(onnx_out["logits"], tf_out["logits"])


def test_reads_after_assignment_see_the_new_value():
    """The quantized logits use the ranges the step has just updated; tf2onnx's freezing (which drops the
    reads' control edges) computes them with the old ranges and gets different logits."""
    from tf2onnx import tf_loader

    step = Step(_quantized_net())
    concrete = step.__call__.get_concrete_function()
    batch = _batch(2)
    ours = run_onnx(converters.from_concrete_function(concrete, lowering="custom"), batch)
    names = [t.name for t in concrete.inputs if t.dtype != tf.resource][:2]
    outputs = [t.name for t in concrete.outputs]
    frozen_by_tf2onnx = tf_loader.from_function(concrete, names, outputs)
    stale_model = converters.convert_frozen_graph(frozen_by_tf2onnx, names, outputs, lowering="custom")
    logits_index = sorted(concrete.structured_outputs).index("logits")
    stale = run_onnx(stale_model, dict(zip([i.name for i in stale_model.graph.input], batch.values())))
    stale_logits = stale[stale_model.graph.output[logits_index].name]
    tf_out, _, _ = _tf_step(step, batch)
    np.testing.assert_array_equal(ours["logits"], tf_out["logits"])
    assert not np.array_equal(stale_logits, tf_out["logits"])


@pytest.mark.parametrize("lowering", converters.LOWERINGS)
def test_three_sgd_steps_in_ort_follow_tf(lowering):
    step = Step(_keras_net(5))
    model = converters.from_concrete_function(step.__call__.get_concrete_function(), lowering=lowering,
                                              trainable_inputs=True)
    trainable = [v.name.split(":")[0] for v in step.model.trainable_variables]
    props = {p.key: p.value for p in model.metadata_props}
    assert sorted(props[TRAINABLE_INPUTS_KEY].split(",")) == sorted(trainable)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    inputs = [i.name for i in model.graph.input]
    assert set(trainable) <= set(inputs) and set(trainable) <= set(inits)
    for v in step.model.trainable_variables:
        np.testing.assert_array_equal(inits[v.name.split(":")[0]], v.numpy())
    assert model.ir_version == ort_ops.lowest_ir_version(model) == 8
    onnx.checker.check_model(model)

    lr = np.float32(0.1)
    weights = {}  # the first step uses the initializers: nothing fed
    losses_ort, losses_tf = [], []
    sess = session(model, log_severity_level=3)  # the library exactly where the model uses the domain
    names = [o.name for o in sess.get_outputs()]
    for k in range(3):
        batch = _batch(10 + k)
        out = dict(zip(names, sess.run(names, {**batch, **weights})))
        current = weights or {n: inits[n] for n in trainable}
        weights = {n: current[n] - lr * out["grad:" + n] for n in trainable}
        losses_ort.append(out["loss"])
        tf_out, _, _ = _tf_step(step, batch)
        for v in step.model.trainable_variables:
            v.assign_sub(lr * tf_out["grad:" + v.name.split(":")[0]])
        losses_tf.append(tf_out["loss"])
    # Three steps of float32 sums in different orders (convolutions, batch norm): the weights drift apart
    # by rounding only, far below the change the steps make.
    for v in step.model.trainable_variables:
        name = v.name.split(":")[0]
        moved = np.abs(v.numpy() - inits[name]).max()
        assert moved > 1e-5, name  # every weight took part in training
        np.testing.assert_allclose(weights[name], v.numpy(), rtol=1e-4, atol=1e-4 * moved, err_msg=name)
    np.testing.assert_allclose(losses_ort, losses_tf, rtol=1e-5)
    assert len(set(np.round(losses_tf, 6))) == 3


def _start_value(start):
    return np.broadcast_to(np.asarray(start, np.float32), (4,)).copy()


class _SignedZeroUpdates(tf.Module):
    """AssignSub and AssignAdd of variables that start at +0.0, at -0.0 or mixed, by five kinds of delta: a
    constant (grappler folds the whole update), constants of +0 and of -0 (TF's own grappler drops them when the
    function runs, so the variable keeps its bits), one computed from the input (the update stays a node), and
    one that is zero by construction but not a constant (a sum of the input times 0, times a learning rate: a
    bias gradient behind a loss that ignores it), which grappler's folding of the frozen graph turned into
    ``Neg(delta)``; and an optimizer's momentum update of a slot, ``m * 0.9 - delta``, folded the same way."""

    KINDS = ("const", "zero_const", "minus_zero_const", "fed", "zero_sum")

    def __init__(self, start):
        super().__init__()
        self.lr = tf.Variable(0.1, name="lr")
        self.targets = {
            f"{op}_{kind}": tf.Variable(_start_value(start), name=f"{op}_{kind}")
            for op in ("sub", "add") for kind in self.KINDS
        }
        # SGD's momentum slot: m <- m * momentum - g * lr, an AssignVariableOp of a value computed from m.
        self.targets["momentum"] = tf.Variable(_start_value(start), name="momentum")

    @tf.function(input_signature=[tf.TensorSpec([4], tf.float32, name="delta")])
    def __call__(self, delta):
        deltas = {
            "const": tf.constant([0.0, -0.0, 1.5, -1.5], tf.float32),
            # Constant zeros: TF's own grappler drops them when the function runs (v + 0 -> v keeps a -0 of v).
            "zero_const": tf.zeros([4], tf.float32),
            "minus_zero_const": tf.constant([-0.0] * 4, tf.float32),
            "fed": delta * 1.0,
            "zero_sum": tf.reduce_sum(tf.reshape(tf.abs(delta), [1, 4]) * 0.0, axis=0) * self.lr,
        }
        for kind, value in deltas.items():
            self.targets[f"sub_{kind}"].assign_sub(value)
            self.targets[f"add_{kind}"].assign_add(value)
        momentum = self.targets["momentum"]
        momentum.assign(momentum * 0.9 - deltas["zero_sum"])
        return {"out": delta + 1.0}


@pytest.mark.parametrize("lowering", converters.LOWERINGS)
@pytest.mark.parametrize("start", [0.0, -0.0, (-0.0, 0.0, 1.5, -2.0)], ids=["plus_zero", "minus_zero", "mixed"])
def test_assign_sub_and_add_keep_tf_signed_zeros(lowering, start):
    """TF computes v - d and v + d on the variable's value; 0 - (+0) is +0, not Neg(+0) = -0 (grappler's
    rewrite of an update on a frozen zero variable, which the converter must not inherit)."""
    module = _SignedZeroUpdates(start)
    model = converters.from_concrete_function(module.__call__.get_concrete_function(), lowering=lowering,
                                              variable_updates="outputs")
    for delta in ([0.0, -0.0, 1.5, -1.5], [-0.0, 0.0, -0.0, 0.0]):
        for v in module.targets.values():
            v.assign(_start_value(start))
        delta = np.array(delta, np.float32)
        out = run_onnx(model, {"delta": delta})
        module(tf.constant(delta))
        for name, v in module.targets.items():
            assert_bits_equal(v.numpy(), out[name], f"{name} start={start} delta={delta.tolist()}")
    # The expected signs are not all the same, so a converter that got every sign wrong cannot pass.
    target = module.targets["sub_const"]
    target.assign(_start_value(start))
    target.assign_sub([0.0, -0.0, 1.5, -1.5])
    assert len(set(np.signbit(target.numpy()).tolist())) == 2
