"""Keras 3's grouped convolutions, its XLA-compiled calls and MobileNetV3's hard-swish (issue 33, items 1 and 2).

* ``Conv2D(groups=...)`` runs inside ``tf.function(jit_compile=True)`` in Keras 3; the freezing inlines those
  calls (converters.inlining), so the model converts in both lowerings, inference and training step.
* One group per input channel is a depthwise convolution (converters.grouped_conv): the domain's
  DepthwiseConv2dNative in the custom lowering, with its filter reshaped value for value; another group
  count is an ONNX Conv with ``group``, and its two gradients are grouped (converters.gradients.bias_conv).
* Verification, end to end and per node, passes them; a filter whose channels are mixed up fails it, at
  that node.
* A convolution followed by the addition of a 0-d constant (hard-swish's ``x + 3``) converts without an
  optimizer traceback and leaves no Transpose but the input image's.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import onnx
import pytest
import tensorflow as tf

import converters
from converters.errors import ConversionError
from converters.inlining import inline_calls
from converters.verification import compare_output
from ort_ops.schemas import DOMAIN

pytestmark = pytest.mark.tensorflow

ROOT = Path(__file__).resolve().parent.parent
SHAPE = (12, 12, 4)


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-m", "converters", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


def _grouped_net():
    """A depthwise convolution written as Conv2D(groups=C) with a channel multiplier of 2 (so that the
    filter's reshape has an order to get wrong), strided and valid; a Conv2D with 2 groups; batch norms."""
    keras.utils.set_random_seed(7)
    layers = keras.layers
    inputs = keras.Input(SHAPE, name="images")
    x = layers.Conv2D(8, 3, strides=2, padding="valid", groups=4, name="depthwise_as_groups")(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU()(x)
    x = layers.Conv2D(6, 3, padding="same", groups=2, name="two_groups")(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(3, name="logits")(x), name="grouped")


@pytest.fixture(scope="module")
def grouped_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("grouped") / "grouped.keras"
    _grouped_net().save(str(path))
    return path


@pytest.mark.parametrize("lowering", converters.LOWERINGS)
def test_grouped_convolutions_convert(grouped_file, lowering):
    model = converters.from_keras(keras.models.load_model(str(grouped_file)), lowering=lowering)
    nodes = list(model.graph.node)
    assert not [n for n in nodes if "Call" in n.op_type]
    # A float inference graph: both lowerings write the depthwise op as ONNX Runtime's grouped Conv with one
    # group per channel (converters.pipeline.standard_conv_for_depthwise); a training step keeps the domain's.
    assert sorted(_group(n) for n in nodes if n.op_type == "Conv") == [2, 4]
    assert not [n for n in nodes if n.op_type == "DepthwiseConv2dNative"]
    step = converters.from_keras_train_step(keras.models.load_model(str(grouped_file)),
                                            "sparse_categorical_crossentropy", from_logits=True, lowering=lowering)
    domain = {n.op_type for n in step.graph.node if n.domain == DOMAIN}
    if lowering == "custom":
        assert {"DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropFilter"} <= domain
    else:
        assert not domain


def _group(node) -> int:
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == "group"), 1)


@pytest.mark.parametrize("lowering", converters.LOWERINGS)
@pytest.mark.parametrize("graph", ["inference", "train"])
def test_grouped_convolutions_verify_end_to_end_and_per_node(tmp_path, grouped_file, lowering, graph):
    """TF's CPU kernels lack the grouped Conv2DBackpropInput/Filter; the verifier runs them with XLA, as
    the Keras model does (converters.inlining marks them)."""
    step = ["--train-step", "--loss", "sparse_categorical_crossentropy", "--from-logits"] if graph == "train" else []
    proc = _cli("--keras", grouped_file, *step, "--lowering", lowering, "--output", tmp_path / "m.onnx",
                "--verify", "--verify-nodes", "--no-tf-spread")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verification passed" in proc.stdout and "per-node verification passed" in proc.stdout
    assert "Traceback" not in proc.stderr
    if graph == "train":
        assert "Conv2DBackpropFilter" in proc.stdout and "Conv2DBackpropInput" in proc.stdout


def test_mixed_up_depthwise_filter_fails_at_that_node(tmp_path, grouped_file):
    """The filter of Conv2D(groups=C) is [kh, kw, 1, C*M] with output channel c*M + m; the depthwise filter
    [kh, kw, C, M] is its reshape. Reading it as [kh, kw, M, C] (transposed) is the same shape and wrong:
    per-node verification names that convolution, the one value that fails."""
    model_path = tmp_path / "m.onnx"
    step = ["--train-step", "--loss", "sparse_categorical_crossentropy", "--from-logits"]  # keeps the domain node
    proc = _cli("--keras", grouped_file, *step, "--output", model_path)
    assert proc.returncode == 0, proc.stderr
    model = onnx.load(str(model_path))
    node = next(n for n in model.graph.node if n.op_type == "DepthwiseConv2dNative")
    init = next(i for i in model.graph.initializer if i.name == node.input[1])
    w = onnx.numpy_helper.to_array(init)
    kh, kw, c, m = w.shape
    wrong = w.reshape(kh, kw, c * m).reshape(kh, kw, m, c).transpose(0, 1, 3, 2)
    assert not np.array_equal(wrong, w)
    init.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(wrong), init.name))
    onnx.save(model, str(model_path))
    proc = _cli("--keras", grouped_file, *step, "--verify-model", model_path, "--verify-nodes", "--no-tf-spread")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    # The convolution carries the name of the batch norm's multiplication that grappler folded into its filter.
    first = proc.stdout[proc.stdout.index("first failing"):].splitlines()
    assert "(Conv2D)" in first[1] and "ONNX nodes:" in first[3] and "(DepthwiseConv2dNative)" in first[3], first


def test_jit_compiled_call_is_inlined():
    """Any tf.function(jit_compile=True) inside the converted function is inlined, not left as a call."""
    kernel = tf.constant(np.random.default_rng(0).standard_normal((3, 3, 4, 4)), tf.float32)

    @tf.function(jit_compile=True)
    def compiled(x):
        return tf.nn.relu(tf.nn.conv2d(x, kernel, 1, "SAME"))

    @tf.function
    def outer(x):
        return compiled(x) * 2.0

    x = np.random.default_rng(1).standard_normal((2, 6, 6, 4)).astype(np.float32)
    model = converters.from_function(outer, [tf.TensorSpec([None, 6, 6, 4], tf.float32, name="x")])
    got = converters.verification.run_onnx(model, {"x": x})
    want = outer(x).numpy()
    np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_uninlinable_call_is_a_conversion_error_naming_it():
    """A call grappler cannot inline (its function is missing from the library) is an error naming the call."""
    graph_def = tf.compat.v1.GraphDef()
    x = graph_def.node.add(name="x", op="Placeholder")
    x.attr["dtype"].type = tf.float32.as_datatype_enum
    call = graph_def.node.add(name="call", op="PartitionedCall", input=["x"])
    call.attr["f"].func.name = "not_in_the_library"
    call.attr["Tin"].list.type.append(tf.float32.as_datatype_enum)
    call.attr["Tout"].list.type.append(tf.float32.as_datatype_enum)
    with pytest.raises(ConversionError, match="call"):
        inline_calls(graph_def, ["x:0", "call:0"])


@pytest.mark.parametrize("lowering", converters.LOWERINGS)
def test_hard_swish_after_a_convolution_keeps_one_transpose(lowering, caplog):
    """MobileNetV3's blocks: Conv -> x + 3 (a 0-d constant) -> ReLU6 -> * x / 6, with squeeze-excite."""
    keras.utils.set_random_seed(3)
    layers = keras.layers
    inputs = keras.Input((16, 16, 3), name="images")
    x = layers.Conv2D(8, 3, padding="same")(inputs)
    x = layers.Activation("hard_swish")(x)
    x = layers.DepthwiseConv2D(3, padding="same")(x)
    x = layers.Activation("hard_swish")(x)
    se = layers.GlobalAveragePooling2D(keepdims=True)(x)
    se = layers.Conv2D(8, 1, activation="hard_sigmoid")(se)
    x = layers.Multiply()([x, se])
    x = layers.Conv2D(4, 1)(x)
    x = layers.Activation("hard_swish")(x)
    model = keras.Model(inputs, layers.GlobalAveragePooling2D()(x))
    with caplog.at_level(logging.WARNING):
        onnx_model = converters.from_keras(model, lowering=lowering)
    assert not [r for r in caplog.records if "optimizer failed" in r.getMessage()], caplog.text
    assert [n.op_type for n in onnx_model.graph.node].count("Transpose") <= 1
    images = np.random.default_rng(0).uniform(-2, 2, (2, 16, 16, 3)).astype(np.float32)
    got = next(iter(converters.verification.run_onnx(onnx_model, {"images": images}).values()))
    want = model(images).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


# ------------------------------------------------------------------ the grouped gradients, op by op

# (data_format, padding, strides, dilations, explicit NHWC-ordered pairs, groups); x is (2, 9, 8, 6), the filter
# (3, 2, 6 / groups, 12), so groups=6 is the depthwise case with a channel multiplier of 2.
GROUPED_CASES = [
    ("NHWC", "SAME", (1, 1), (1, 1), (), 2),
    ("NHWC", "VALID", (2, 2), (1, 1), (), 3),
    ("NHWC", "SAME", (2, 1), (2, 2), (), 2),
    ("NHWC", "EXPLICIT", (1, 2), (1, 1), (0, 0, 1, 2, 0, 1, 0, 0), 2),
    ("NCHW", "SAME", (2, 2), (1, 1), (), 3),
    ("NHWC", "SAME", (1, 1), (1, 1), (), 6),
    ("NHWC", "VALID", (2, 2), (1, 2), (), 6),
    ("NCHW", "SAME", (1, 1), (1, 1), (), 6),
]


def _grouped_attrs(fmt, padding, strides, dilations, explicit):
    four = (lambda v: [1, v[0], v[1], 1]) if fmt == "NHWC" else (lambda v: [1, 1, v[0], v[1]])
    explicit = list(explicit)
    if fmt == "NCHW" and explicit:
        explicit = explicit[0:2] + explicit[6:8] + explicit[2:6]
    return dict(strides=four(strides), padding=padding, explicit_paddings=explicit, data_format=fmt,
                dilations=four(dilations))


@pytest.mark.parametrize("lowering", converters.LOWERINGS)
@pytest.mark.parametrize("case", GROUPED_CASES, ids=lambda c: "-".join(map(str, c)).replace(" ", ""))
def test_grouped_backprops_match_tf(case, lowering):
    """Conv2DBackpropFilter and Conv2DBackpropInput of a grouped convolution against TF's XLA kernels (TF's
    CPU kernels reject grouped backprops; XLA is what runs them in a Keras 3 model), judged as sums."""
    fmt, padding, strides, dilations, explicit, groups = case
    attrs = _grouped_attrs(fmt, padding, strides, dilations, explicit)
    rng = np.random.default_rng(len(str(case)))
    x = rng.standard_normal((2, 9, 8, 6)).astype(np.float32)
    w = rng.standard_normal((3, 2, 6 // groups, 12)).astype(np.float32)
    if fmt == "NCHW":
        x = x.transpose(0, 3, 1, 2)
    y = tf.function(lambda a, k: tf.raw_ops.Conv2D(input=a, filter=k, **attrs), jit_compile=True)(x, w).numpy()
    dy = rng.standard_normal(y.shape).astype(np.float32)

    def by_filter(a, g):
        return tf.raw_ops.Conv2DBackpropFilter(input=a, filter_sizes=list(w.shape), out_backprop=g, **attrs)

    def by_input(k, g):
        return tf.raw_ops.Conv2DBackpropInput(input_sizes=list(x.shape), filter=k, out_backprop=g, **attrs)

    for fn, inputs, free_batch in ((by_filter, [x, dy], True), (by_input, [w, dy], False)):
        want = tf.function(fn, jit_compile=True)(*inputs).numpy()
        specs = [tf.TensorSpec([None, *a.shape[1:]] if free_batch else a.shape, tf.float32) for a in inputs]
        model = converters.from_function(tf.function(fn), specs, lowering=lowering)
        got = next(iter(converters.verification.run_onnx(
            model, dict(zip([i.name for i in model.graph.input], inputs))).values()))
        check = compare_output(f"{fn.__name__} {case}", want, got, rtol=1e-5)
        assert check.ok, f"{check}"
        if groups == 6 and lowering == "custom":  # one group per channel: the domain's depthwise gradient
            assert any(n.domain == DOMAIN and n.op_type.startswith("DepthwiseConv2dNativeBackprop")
                       for n in model.graph.node)
