"""The integer lowering: a ZeroPadding2D before a convolution with padding="same" (tools.graphgen found a tfmot
SeparableConv2D there refused: "a Pad before SAME padding").

A zero Pad and then SAME over the padded size is one explicit padding: SAME's own pads for the padded size plus the
Pad's (converters.integer.rewrite, conv_attrs). Each network here is a tfmot QAT model, trained a few steps, with a
ZeroPadding2D (asymmetric) before a DepthwiseConv2D, two Conv2D and a SeparableConv2D (tfmot writes its
depthwise and its pointwise Conv2D), all padding="same", at strides 1 and 2 on odd sizes (so SAME's own padding is uneven);
judged end to end and per quantized tensor as tests/test_integer_lowering.py judges.
"""
import numpy as np
import pytest
from integer_models import run_ort

pytestmark = pytest.mark.tensorflow

SHAPE = (11, 11, 2)


def _qat(strides, seed):
    import tensorflow as tf
    import tf_keras
    import tensorflow_model_optimization as tfmot

    tf.keras.utils.set_random_seed(seed)
    layers = tf_keras.layers
    x = inputs = tf_keras.Input(SHAPE, name="images")
    x = layers.ZeroPadding2D(((1, 2), (2, 1)))(x)
    x = layers.DepthwiseConv2D(3, strides=strides, padding="same")(x)
    x = layers.ZeroPadding2D(((2, 0), (1, 1)))(x)
    x = layers.Conv2D(4, 3, strides=strides, padding="same")(x)
    x = layers.ZeroPadding2D(((0, 1), (1, 0)))(x)
    x = layers.Conv2D(4, 3, strides=1, padding="same")(x)
    x = layers.ZeroPadding2D(((1, 1), (0, 2)))(x)
    x = layers.SeparableConv2D(3, 3, strides=1 if strides == 2 else 2, padding="same", activation="sigmoid")(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(4)(x)
    model = tfmot.quantization.keras.quantize_model(tf_keras.Model(inputs, x))
    model.compile(tf_keras.optimizers.SGD(0.05), tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(seed)
    model.fit(rng.uniform(-1, 1, (12,) + SHAPE).astype(np.float32), rng.integers(0, 4, 12), batch_size=4,
              epochs=1, verbose=0)
    return model


def _images(n, seed):
    return np.random.default_rng(seed).uniform(-1, 1, (n,) + SHAPE).astype(np.float32)


@pytest.mark.parametrize("strides", [1, 2])
def test_a_zero_pad_before_same_padding_is_explicit_and_exact(strides):
    import converters
    from converters.frontends import keras_concrete_function
    from converters.integer import read_summary
    from converters.integer.per_tensor import verify_quantized_tensors
    from converters.integer.steps import judge_steps

    qat = _qat(strides, seed=10 + strides)
    converted = converters.from_keras(qat, lowering="integer")  # refused before: "a Pad before SAME padding"
    lines, steps = read_summary(converted)
    assert "Conv in integer: 3/3" in lines and "DepthwiseConv2dNative in integer: 2/2" in lines, lines
    assert not any("float island" in line for line in lines), lines
    nodes = converted.graph.node
    convs = [n for n in nodes if n.op_type == "Conv"]
    assert len(convs) == 5
    # The Pads before the depthwise convolutions and before the second Conv2D are folded into explicit pads; the
    # one before the first Conv2D stays (a Transpose to NCHW between them) as an op on its input's grid.
    assert sum(n.op_type == "Pad" for n in nodes) <= 1
    for conv in convs:
        attrs = {a.name: a for a in conv.attribute}
        assert "auto_pad" not in attrs or attrs["auto_pad"].s in (b"NOTSET", b""), conv.name

    images = _images(16, seed=strides)
    step = next(iter(steps.values()))
    check = judge_steps("logits", qat(images, training=False).numpy(), run_ort(converted, {"images": images})[0],
                        step)
    assert check.ok and check.max_steps <= 2, check

    report = verify_quantized_tensors(converted, keras_concrete_function(qat), {"images": _images(8, seed=5)})
    assert report.ok and len(report.checks) >= 4, report.table()


def test_same_pads_match_tf_for_strides_dilations_and_sizes():
    """The explicit pads written for Pad -> SAME equal TF's Pad then SAME, on a depthwise convolution with TF's
    own dilations (tf.nn.depthwise_conv2d's native kernel), every size, stride and dilation here."""
    import onnx
    import tensorflow as tf
    from onnx import TensorProto, helper

    from converters.integer.rewrite import _Rewriter

    rng = np.random.default_rng(0)
    for n in (5, 6, 7, 8):
        for stride, dilation in ((1, 1), (2, 1), (3, 1), (1, 2), (1, 3)):
            for k in (2, 3):
                pad = ((1, 2), (0, 3))
                x = rng.normal(size=(1, n, n, 2)).astype(np.float32)
                w = rng.normal(size=(k, k, 2, 1)).astype(np.float32)
                padded = tf.pad(x, ((0, 0),) + pad + ((0, 0),))
                tf_y = tf.nn.depthwise_conv2d(padded, w, [1, stride, stride, 1], "SAME",
                                              dilations=[dilation, dilation]).numpy()
                node = helper.make_node("DepthwiseConv2dNative", ["p", "w"], ["y"], name="dw", padding=b"SAME",
                                        strides=[1, stride, stride, 1], dilations=[1, dilation, dilation, 1],
                                        data_format=b"NHWC", domain="ai.onnx.contrib")
                rewriter = _Rewriter.__new__(_Rewriter)
                rewriter.shapes = {"p": [1, n + 3, n + 3, 2]}
                rewriter.weights, rewriter.constants = {}, {"w": w}
                attrs = rewriter.conv_attrs(node, [pad[0][0], pad[1][0], pad[0][1], pad[1][1]])
                graph = helper.make_graph(
                    [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]),
                     helper.make_node("Conv", ["t", "wg"], ["c"], **attrs),
                     helper.make_node("Transpose", ["c"], ["y"], perm=[0, 2, 3, 1])], "g",
                    [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                    [onnx.numpy_helper.from_array(np.ascontiguousarray(np.transpose(w, (2, 3, 0, 1))), "wg")])
                model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
                ours = run_ort(model, {"x": x})[0]
                assert ours.shape == tf_y.shape, (n, stride, dilation, k)
                np.testing.assert_allclose(ours, tf_y, rtol=1e-5, atol=1e-5, err_msg=str((n, stride, dilation, k)))
