"""Verifier verdicts the random-graph generator (tools.graphgen) found wrong, minimized; each with a wrong model that
must still fail.

1. A Transpose that tf2onnx's layout optimizer moved in front of an elementwise op (x -> FakeQuantWithMinMaxVars ->
   Transpose(NHWC -> NCHW) -> FusedBatchNormV3 NCHW became Transpose -> FakeQuant) keeps its output's name, so the
   value named after TF's transpose holds the graph input transposed, not the quantized tensor transposed: per
   node it was compared with the wrong TF tensor (448 of 448 differ in bits). follow_layout_ops now follows a
   layout op whose input is a graph input too (the input's own TF tensor, as fed).
2. A Keras 3 training step at batch 1 with a 1x4 spatial size whose batch norm feeds a global average pool: the
   gradient into the batch norm is uniform per channel, so its input gradient, and every gradient upstream, is
   exactly zero in exact arithmetic (rounding noise on both sides). End to end, the magnitude (verify_magnitude)
   counted TF's AddN (ONNX Sum: a gradient's paths added elementwise) as a level of sums, as it counts a reduction,
   where Add, which does the same for two paths, is a chain: the walk stopped two levels back, short of the AddN
   where the noise arises, and judged the noise against a few ulps of its own size (error 1e-8, bound 1e-13). Per
   node, a 3x3x3x3 kernel gradient (a graph output, whose shape allows three layouts) took the layout nearest
   ORT's value, which is noise there: it was compared with its own transpose. A graph output now keeps TF's
   layout (end-to-end verification compares it as it is).
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import converters

pytestmark = pytest.mark.tensorflow


def _copy(model):
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


# ---------------------------------------------------------------- 1. a Transpose moved in front of a quantizer


def _quantized_batch_norm():
    import tensorflow as tf

    lo, hi = tf.Variable(-1.0), tf.Variable(2.5)
    gamma, beta = tf.Variable(np.linspace(0.5, 1.5, 4, dtype=np.float32)), tf.Variable(np.zeros(4, np.float32))

    @tf.function(input_signature=[tf.TensorSpec((None, 8, 7, 4), tf.float32)])
    def fn(x):
        q = tf.quantization.fake_quant_with_min_max_vars(x, lo, hi, num_bits=15, narrow_range=True)
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(tf.transpose(q, [0, 3, 1, 2]), gamma, beta, epsilon=0.01,
                                                   data_format="NCHW", is_training=True)
        return tf.transpose(y, [0, 2, 3, 1])

    fn.keep = (lo, hi, gamma, beta)
    return fn


@pytest.fixture(scope="module")
def quantized_batch_norm():
    fn = _quantized_batch_norm()
    model = converters.from_function(fn, fn.input_signature, lowering="custom")
    inputs = [np.random.default_rng(0).standard_normal((2, 8, 7, 4)).astype(np.float32)]
    return fn, model, inputs


def _moved_transpose(model):
    inputs = {i.name for i in model.graph.input}
    (node,) = [n for n in model.graph.node if n.op_type == "Transpose" and n.input[0] in inputs]
    return node


def test_a_transpose_moved_in_front_of_a_quantizer_is_judged_against_the_graph_input(quantized_batch_norm):
    fn, model, inputs = quantized_batch_norm
    moved = _moved_transpose(model)  # the layout optimizer's move this finding is about
    report = converters.verify_nodes(model, fn, inputs=inputs, print_table=False)
    assert report.ok, report.table()
    check = report.check_of(moved.output[0])
    assert check is not None and check.check.exact and check.check.n_differing == 0, check  # judged, bit for bit
    assert {c.tf_type for c in report.checks} >= {"FakeQuantWithMinMaxVars", "FusedBatchNormV3"}
    assert converters.verify(model, fn, inputs=inputs, spread=False, print_table=False).ok


def test_a_wrong_input_to_the_moved_transpose_still_fails(quantized_batch_norm):
    fn, model, inputs = quantized_batch_norm
    wrong = _copy(model)
    node = [n for n in wrong.graph.node if n.name == _moved_transpose(model).name][0]
    wrong.graph.initializer.append(numpy_helper.from_array(np.float32(1.001), "wrong/factor"))
    wrong.graph.node.insert(0, helper.make_node("Mul", [node.input[0], "wrong/factor"], ["wrong/x"]))
    node.input[0] = "wrong/x"
    report = converters.verify_nodes(wrong, fn, inputs=inputs, print_table=False)
    assert not report.ok and report.first_failure.value == node.output[0], report.table()


# ---------------------------------------------------------------- 2. an exactly-zero gradient behind an AddN

SHAPE = (2, 8, 3)  # 1x4 after the strided convolution; 3 channels in and out: a 3x3x3x3 kernel


def _keras3_step():
    import keras

    keras.utils.set_random_seed(2)
    inputs = keras.Input(SHAPE)
    x = keras.layers.Conv2D(3, 3, strides=2, padding="same", use_bias=False)(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Conv2D(3, 1, padding="same")(x)
    x = keras.layers.BatchNormalization()(x)  # its gradient (from the average pool) is uniform: dx == 0 exactly
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(4)(x))


@pytest.fixture(scope="module", params=converters.LOWERINGS)
def keras3_step(request):
    from converters.keras_models import training_step_function

    model = _keras3_step()
    onnx_model = converters.from_keras_train_step(model, "mse", lowering=request.param, batch_size=1)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((1,) + SHAPE).astype(np.float32), rng.standard_normal((1, 4)).astype(np.float32)]
    step, holder = training_step_function(model, "mse", batch_size=1)
    # per node first: it freezes the variables as the converter did (the step assigns the moving statistics)
    per_node = converters.verify_nodes(onnx_model, step, inputs=inputs, print_table=False)
    yield onnx_model, step, inputs, per_node, holder


def _output(model, part, shape=None, kind="kernel"):
    """The gradient output whose name holds ``part`` (and of that shape)."""
    def dims(o):
        return tuple(d.dim_value for d in o.type.tensor_type.shape.dim)

    (name,) = [o.name for o in model.graph.output if o.name.startswith("grad_") and part in o.name and
               o.name.endswith(kind) and (shape is None or dims(o) == shape)]
    return name


def _verify(model, step, inputs):
    return converters.verify(model, step, inputs=inputs, spread=False, print_table=False)


def test_an_exactly_zero_gradient_behind_an_addn_is_judged_against_what_was_summed(keras3_step):
    model, step, inputs, per_node, _ = keras3_step
    assert per_node.ok, per_node.table()
    report = _verify(model, step, inputs)
    assert report.ok, report.table()
    checks = {c.name: c for c in report.outputs}
    kernel = checks[_output(model, "conv2d", (3, 3, 3, 3))]  # the first convolution's
    assert kernel.kind == "sum" and tuple(kernel.shape) == (3, 3, 3, 3), kernel.to_dict()


def _drop_a_path(model):
    """Each Sum (TF's AddN) of three or more gradients with its first input left out (the batch norm's dy * scale,
    which the other paths cancel)."""
    wrong = _copy(model)
    sums = [n for n in wrong.graph.node if n.op_type == "Sum" and len(n.input) >= 3]
    assert sums
    for node in sums:
        del node.input[0]
    return wrong


def _scale_output(model, name, factor):
    wrong = _copy(model)
    pre = name + "/unscaled"
    for node in wrong.graph.node:
        node.output[:] = [pre if o == name else o for o in node.output]
    wrong.graph.initializer.append(numpy_helper.from_array(np.float32(factor), name + "/factor"))
    wrong.graph.node.append(helper.make_node("Mul", [pre, name + "/factor"], [name]))
    return wrong


@pytest.mark.parametrize("mutation", ["dropped path", "zeros", "sign"])
def test_a_wrong_gradient_still_fails(keras3_step, mutation):
    model, step, inputs, _, _ = keras3_step
    dense = _output(model, "dense", kind="bias")  # (its kernel's gradient is 0: GAP(BN(x)) == beta == 0)
    wrong = {"dropped path": _drop_a_path, "zeros": lambda m: _scale_output(m, dense, 0.0),
             "sign": lambda m: _scale_output(m, dense, -1.0)}[mutation](model)
    failed = {c.name for c in _verify(wrong, step, inputs).outputs if not c.ok}
    if mutation == "dropped path":  # the batch norms' input gradients: every gradient upstream is wrong
        assert {_output(model, "conv2d", (3, 3, 3, 3)), _output(model, "conv2d", (1, 1, 3, 3))} & failed, failed
    else:
        assert dense in failed, failed


def test_a_graph_output_keeps_tfs_layout_per_node():
    """find_anchors: a graph output, named after the function's output, takes TF's layout among the three its
    3x3x3x3 shape allows, wherever ORT's value lies."""
    from converters.node_verification import find_anchors

    tf_value = np.arange(81, dtype=np.float32).reshape(3, 3, 3, 3)
    onnx_value = np.ascontiguousarray(tf_value.transpose(0, 3, 1, 2))  # ORT's value nearest another layout
    anchors, _ = find_anchors({"out": "t:0"}, {"t:0": tf_value}, {"out": onnx_value})
    assert anchors["out"].perm == (0, 3, 1, 2)
    anchors, _ = find_anchors({"out": "t:0"}, {"t:0": tf_value}, {"out": onnx_value}, as_tf={"out": "t:0"})
    assert anchors["out"].perm is None and anchors["out"].shape is None
