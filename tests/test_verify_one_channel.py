"""Per-node verification of a convolution whose input has one channel (issue 44, bug 6a).

With one channel the layout Transpose tf2onnx writes before a convolution is a Reshape (NHWC -> NCHW moves only a
unit dimension), named after the convolution's TF op. Where tf2onnx's layout optimizer fused the Conv with the
bias Add after it, the fused Conv gets a new name, so neither the convolution's output nor the Add's has an ONNX
value; the verifier used to take that Reshape (the one value leaving the nodes named after the convolution) as
the convolution's output and fail it against TF's. The anchor must go to the fused Conv's output (the bias Add's
TF tensor), so that the convolution is still judged on its own, and still fails when it is wrong.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import converters
from converters.node_verification import verify_nodes

pytestmark = pytest.mark.tensorflow

LAYOUT_OPS = ("Reshape", "Transpose", "Identity", "Squeeze", "Unsqueeze", "Flatten")


def _model(kind):
    import tf_keras

    tf_keras.utils.set_random_seed(1)
    layers = tf_keras.layers
    inputs = tf_keras.Input((8, 8, 1))
    # A trained layer's bias is not zero (a zero bias is dropped before the fusion happens).
    conv = layers.Conv2D(4, 3, bias_initializer="random_normal") if kind == "conv" else \
        layers.DepthwiseConv2D(3, padding="same", bias_initializer="random_normal")
    x = layers.ReLU()(conv(inputs))
    return tf_keras.Model(inputs, layers.Dense(3)(layers.Flatten()(x)))


def _images():
    return np.random.default_rng(0).standard_normal((2, 8, 8, 1)).astype(np.float32)


def _conv_check(report, onnx_model):
    """The check of the value the Conv node computes (None: the Conv is judged only through another value)."""
    (conv,) = [n for n in onnx_model.graph.node if n.op_type == "Conv"]
    return report.check_of(conv.output[0]), conv


@pytest.fixture(scope="module", params=["depthwise", "conv"])
def keras_model(request):
    return _model(request.param)


@pytest.mark.parametrize("lowering", converters.LOWERINGS)
def test_one_channel_convolution_is_judged_on_its_own_output(keras_model, lowering):
    onnx_model = converters.from_keras(keras_model, lowering=lowering)
    report = verify_nodes(onnx_model, keras_model, inputs=[_images()], print_table=False)
    assert report.ok, report.table()
    check, conv = _conv_check(report, onnx_model)
    assert check is not None, report.table()
    assert f"{conv.name} (Conv)" in check.onnx_nodes and check.tf_type in ("BiasAdd", "AddV2"), check.to_dict()
    # No value that only rearranges the graph's input is judged as an op that computes.
    producer = {out: n for n in onnx_model.graph.node for out in n.output}
    for c in report.checks:
        node = producer[c.value]
        if node.op_type in LAYOUT_OPS and c.tf_type not in ("Reshape", "Transpose", "Identity"):
            assert node.input[0] not in {i.name for i in onnx_model.graph.input}, c.to_dict()


@pytest.mark.parametrize("lowering", converters.LOWERINGS)
def test_a_wrong_one_channel_convolution_fails_at_the_convolution(keras_model, lowering):
    onnx_model = converters.from_keras(keras_model, lowering=lowering)
    conv = next(n for n in onnx_model.graph.node if n.op_type == "Conv")
    weights = next(t for t in onnx_model.graph.initializer if t.name == conv.input[1])
    wrong = numpy_helper.to_array(weights) * np.float32(1.01)
    weights.CopyFrom(numpy_helper.from_array(wrong, weights.name))
    onnx.checker.check_model(onnx_model)
    report = verify_nodes(onnx_model, keras_model, inputs=[_images()], print_table=False)
    assert not report.ok
    assert report.first_failure.value == conv.output[0], report.table()
