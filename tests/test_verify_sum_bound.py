"""A sum's bound grows with the number of terms it adds (issue 44, bug 6b).

A sum is judged within ``rtol*|tf| + max(sum_rtol, 2(n+1)u) * Σ|terms|`` (converters.verification.
summation_coefficient), n the terms one element adds (converters.verify_magnitude counts them per summing
node, and an output takes the largest count on its path back): a recursive float32 sum of n terms in any order
is within (n-1)·u·Σ|terms| of the exact sum, so TF's order and ONNX Runtime's are within twice that. Below
n = 83 that is under sum_rtol (1e-5) and nothing changes.

* A reduction over 2,048 terms that TF sums in NHWC and ONNX Runtime in NCHW (the layout of a convolution's
  output in the converted graph), with values whose rounding depends on the order, differs by 9e-5 of Σ|terms|: it
  passes end to end and per node, and failed before at 9x the old bound.
* The bound still fails a wrong gradient on a batch-norm training step of realistic shape (its bias gradient a
  sum over N*H*W = 2,048 terms): zeros, a flipped sign, a dropped epsilon, a term dropped from the sum.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import tensorflow as tf
from onnx import helper, numpy_helper

import converters
from converters.node_verification import freeze_like_converter, verify_nodes
from converters.verification import judge_output, run_onnx, summation_coefficient
from converters.verify_magnitude import companion
from ort_ops.schemas import DOMAIN

pytestmark = pytest.mark.tensorflow

U = 2.0 ** -24
N, H, W, C = 8, 16, 16, 4  # the reduction adds N*H*W = 2048 terms per channel
TERMS = N * H * W


# ---------------------------------------------------------------- a long reduction whose orders differ


@tf.function(input_signature=[tf.TensorSpec((N, H, W, C), tf.float32, name="x")])
def channel_sums(x):
    # A 1x1 convolution with the identity filter (exact: one nonzero product per element): its converted
    # output is NCHW.
    y = tf.nn.conv2d(x, tf.eye(C, batch_shape=[1, 1]), 1, "VALID")
    return {"sums": tf.reduce_sum(y, axis=[0, 1, 2])}


def _order_sensitive_input():
    """1.0 at the first element of each channel, then terms of 0.75 ulp of 1: summed after the 1.0 each rounds
    away, summed among themselves first they count; the two layouts meet them in different orders."""
    x = np.full((N, H, W, C), 0.75 * U, np.float32)
    x[0, 0, 0, :] = 1.0
    return x


@pytest.fixture(scope="module")
def reduction_model():
    """The converted function, its reduction moved in front of the Transpose back to NHWC (as tf2onnx's layout
    optimizer does where it can): ONNX Runtime sums the NCHW tensor over (N, H, W), TF the NHWC one."""
    model = converters.from_concrete_function(channel_sums.get_concrete_function())
    (reduce,) = [n for n in model.graph.node if n.op_type == "ReduceSum"]
    (back,) = [n for n in model.graph.node if n.output[0] == reduce.input[0] and n.op_type == "Transpose"]
    assert list(back.attribute[0].ints) == [0, 2, 3, 1]
    axes = "reduce_over_nhw_of_nchw"
    model.graph.initializer.append(numpy_helper.from_array(np.array([0, 2, 3], np.int64), axes))
    reduce.input[:] = [back.input[0], axes]
    model.graph.node.remove(back)
    onnx.checker.check_model(model)
    return model


def test_the_orders_differ_by_more_than_the_old_bound(reduction_model):
    """The premise: TF's and ONNX Runtime's sums differ beyond sum_rtol * Σ|terms|, within 2(n+1)u."""
    x = _order_sensitive_input()
    tf_sums = channel_sums(tf.constant(x))["sums"].numpy()
    comp = companion(reduction_model, ["sums"])
    values = run_onnx(comp.model, {"x": x})
    magnitude, terms = values[comp.outputs["sums"]], values[comp.terms["sums"]]
    assert float(terms) == TERMS
    ratio = np.abs(tf_sums.astype(np.float64) - values["sums"]) / magnitude
    assert ratio.max() > 2e-5 and ratio.max() <= 2 * (TERMS + 1) * U, ratio
    assert not judge_output("sums", tf_sums, values["sums"], magnitude=magnitude).ok  # the old bound
    assert judge_output("sums", tf_sums, values["sums"], magnitude=magnitude, terms=terms).ok


def test_a_long_reduction_in_another_order_passes_end_to_end_and_per_node(reduction_model):
    x = _order_sensitive_input()
    report = converters.verify(reduction_model, channel_sums, inputs={"x": x}, spread=False, print_table=False)
    (check,) = report.outputs
    assert check.ok and check.kind == "sum" and check.terms == TERMS and check.n_differing > 0, report.table()
    nodes = verify_nodes(reduction_model, channel_sums, inputs={"x": x}, print_table=False)
    sums = [c for c in nodes.checks if c.tf_type == "Sum"]
    assert nodes.ok and sums and sums[0].check.terms == TERMS, nodes.table()


def test_the_coefficient_is_the_larger_of_the_two():
    assert summation_coefficient("float32", 1e-5, None) == 1e-5
    assert summation_coefficient("float32", 1e-5, 9.0) == 1e-5  # 2 * 10 * u = 1.2e-6
    assert summation_coefficient("float32", 1e-5, 2048.0) == pytest.approx(2 * 2049 * U)
    assert summation_coefficient("float64", 1e-12, 2048.0) == pytest.approx(2 * 2049 * 2.0 ** -53)


# ---------------------------------------------------------------- a wrong gradient still fails

EPSILON = 0.01
SHAPE, CLASSES = (H, W, 3), 4
BETA, GAMMA, KERNEL = "grad:bn/beta", "grad:bn/gamma", "grad:conv/kernel"


def _net():
    import tf_keras

    tf_keras.backend.clear_session()
    tf_keras.utils.set_random_seed(1)
    layers = tf_keras.layers
    inputs = tf_keras.Input(SHAPE)
    x = layers.Conv2D(8, 3, padding="same", name="conv")(inputs)
    x = layers.BatchNormalization(epsilon=EPSILON, name="bn")(x)
    x = layers.GlobalAveragePooling2D()(layers.ReLU()(x))
    return tf_keras.Model(inputs, layers.Dense(CLASSES, name="dense")(x))


class Step(tf.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    @tf.function(input_signature=[tf.TensorSpec((N,) + SHAPE, tf.float32, name="images"),
                                  tf.TensorSpec((N,), tf.int32, name="labels")])
    def __call__(self, images, labels):
        import tf_keras

        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            logits = self.model(images, training=True)
            loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits)
        out = {"loss": loss}
        out.update({"grad:" + v.name.split(":")[0]: g for v, g in zip(variables, tape.gradient(loss, variables))})
        return out


def _batch():
    rng = np.random.default_rng(0)
    return {"images": rng.standard_normal((N,) + SHAPE).astype(np.float32),
            "labels": rng.integers(0, CLASSES, N).astype(np.int32)}


@pytest.fixture(scope="module")
def step():
    """The step, its conversion, and the step frozen before anything runs it (a run assigns the batch norm's
    moving statistics, which per-node verification compares)."""
    step = Step(_net())
    concrete = step.__call__.get_concrete_function()
    model = converters.from_concrete_function(concrete)
    return step, model, freeze_like_converter(concrete, model)


def _verify(model, step):
    return converters.verify(model, step.__call__.get_concrete_function(), inputs=_batch(), spread=False,
                             print_table=False)


def _copy(model):
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _scale_output(model, name, factor):
    wrong = _copy(model)
    pre = name + "/unscaled"
    for node in wrong.graph.node:
        node.output[:] = [pre if o == name else o for o in node.output]
    wrong.graph.initializer.append(numpy_helper.from_array(np.float32(factor), name + "/factor"))
    wrong.graph.node.append(helper.make_node("Mul", [pre, name + "/factor"], [name]))
    return wrong


def _drop_epsilon(model):
    wrong = _copy(model)
    nodes = [n for n in wrong.graph.node if n.domain == DOMAIN and n.op_type.startswith("FusedBatchNorm")]
    for node in nodes:
        for attr in node.attribute:
            if attr.name == "epsilon":
                attr.f = 0.0
    assert nodes
    return wrong


def _drop_a_term(model):
    """One element of the incoming gradient (per channel the one of largest size) left out of the batch-norm
    gradient's sums: a mask with one zero per channel on its ``dy``."""
    (grad,) = [n for n in model.graph.node if n.domain == DOMAIN and n.op_type.startswith("FusedBatchNormGrad")]
    probe = _copy(model)
    probe.graph.output.append(onnx.ValueInfoProto(name=grad.input[0]))
    dy = run_onnx(probe, _batch())[grad.input[0]]
    fmt = next((a.s.decode() for a in grad.attribute if a.name == "data_format"), "NHWC")
    rows = np.moveaxis(np.abs(dy), 1 if fmt == "NCHW" else -1, -1).reshape(-1, dy.shape[1 if fmt == "NCHW" else -1])
    mask = np.ones(rows.shape, np.float32)
    mask[np.argmax(rows, axis=0), np.arange(rows.shape[1])] = 0.0
    moved = (dy.shape[0],) + tuple(d for i, d in enumerate(dy.shape[1:], 1) if i != (1 if fmt == "NCHW" else 3))
    mask = np.moveaxis(mask.reshape(moved + (rows.shape[1],)), -1, 1 if fmt == "NCHW" else -1)
    wrong = _copy(model)
    (node,) = [n for n in wrong.graph.node if n.name == grad.name]
    wrong.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(mask), "dropped_term/mask"))
    position = list(wrong.graph.node).index(node)
    masked = helper.make_node("Mul", [node.input[0], "dropped_term/mask"], ["dropped_term/dy"])
    wrong.graph.node.insert(position, masked)
    node.input[0] = "dropped_term/dy"
    onnx.checker.check_model(wrong)
    return wrong


def test_the_bias_gradient_of_a_realistic_step_passes_with_its_terms_counted(step):
    fn, model, frozen = step
    report = _verify(model, fn)
    checks = {c.name: c for c in report.outputs}
    assert report.ok, report.table()
    assert checks[BETA].kind == "sum" and checks[BETA].terms >= TERMS, checks[BETA].to_dict()
    nodes = verify_nodes(model, fn, inputs=_batch(), print_table=False, frozen=frozen)
    assert nodes.ok, nodes.table()


@pytest.mark.parametrize("mutation", ["zeros", "sign", "term"])
def test_a_wrong_bias_gradient_fails(step, mutation):
    fn, model, frozen = step
    wrong = {"zeros": lambda m: _scale_output(m, BETA, 0.0), "sign": lambda m: _scale_output(m, BETA, -1.0),
             "term": _drop_a_term}[mutation](model)
    failed = {c.name for c in _verify(wrong, fn).outputs if not c.ok}
    assert BETA in failed, failed
    if mutation == "term":
        nodes = verify_nodes(wrong, fn, inputs=_batch(), print_table=False, frozen=frozen)
        assert not nodes.ok and nodes.first_failure.tf_type.startswith("FusedBatchNormGrad"), nodes.table()


def test_a_dropped_epsilon_fails(step):
    fn, model, frozen = step
    failed = {c.name for c in _verify(_drop_epsilon(model), fn).outputs if not c.ok}
    assert {GAMMA, KERNEL} <= failed, failed
