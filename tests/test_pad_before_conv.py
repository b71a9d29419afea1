"""Issue 44, bug 1: a zero Pad (Keras' ZeroPadding2D) before a convolution that pads by itself.

TF runs a dilated Conv2D as SpaceToBatchND -> Conv2D(VALID) -> BatchToSpaceND, which tf2onnx rewrites into one
dilated Conv with explicit pads; its Pad-into-Conv rewrite then gave that Conv the ZeroPadding's pads in place
of the sum of both (wrong values, a shape error in ONNX Runtime, or ONNX Runtime aborting). The same happened to
a Conv2D with EXPLICIT padding after a Pad. converters.pad_before_conv folds the Pad into the SpaceToBatchND's
(or the Conv2D's) padding before tf2onnx's rewriters run.

Every combination below converts in both lowerings and is judged end to end and per node against TF
(converters.verify / verify_nodes, their default float tolerances: a convolution is a sum, judged against the
magnitude of its terms). Each model has one branch per combination (ZeroPadding2D -> convolution), so one
conversion covers a grid: symmetric and asymmetric zero paddings, SAME and VALID, dilation 1, 2 and (3, 2),
stride 2; Conv2D, Conv2D with 2 groups, DepthwiseConv2D with a multiplier of 2; tf_keras and Keras 3.
"""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import converters
from converters.keras_models import training_step_function

pytestmark = pytest.mark.tensorflow

ROOT = Path(__file__).resolve().parent.parent
SHAPE = (8, 8, 2)
ZERO_PADDINGS = (1, ((0, 2), (1, 0)), ((3, 1), (0, 2)))
PADDINGS = ("same", "valid")
DILATIONS_STRIDES = ((1, 1), (2, 1), ((3, 2), 1), (1, 2))
KINDS = ("conv", "grouped", "depthwise")
FLAVOURS = ("tf_keras", "keras3")


def _keras(flavour):
    if flavour == "tf_keras":
        import tf_keras

        return tf_keras
    import keras

    return keras


def _layer(lib, kind, padding, dilation, strides):
    common = dict(padding=padding, dilation_rate=dilation, strides=strides)
    if kind == "depthwise":
        return lib.layers.DepthwiseConv2D(3, depth_multiplier=2, **common)
    return lib.layers.Conv2D(4, 3, groups=2 if kind == "grouped" else 1, **common)


def _branches(lib, x, kinds, combinations):
    return [_layer(lib, kind, padding, dilation, strides)(lib.layers.ZeroPadding2D(zero)(x))
            for kind in kinds for zero, padding, (dilation, strides) in combinations]


def _inference_model(flavour, kind):
    lib = _keras(flavour)
    lib.utils.set_random_seed(1)
    inputs = lib.Input(SHAPE)
    grid = itertools.product(ZERO_PADDINGS, PADDINGS, DILATIONS_STRIDES)
    return lib.Model(inputs, _branches(lib, inputs, [kind], grid))


def _training_model(flavour):
    """Every kind in a few combinations, flattened into one Dense: the step's gradients reach each branch."""
    lib = _keras(flavour)
    lib.utils.set_random_seed(2)
    inputs = lib.Input(SHAPE)
    grid = [(ZERO_PADDINGS[1], "same", (2, 1)), (ZERO_PADDINGS[0], "valid", ((3, 2), 1)),
            (ZERO_PADDINGS[2], "same", (1, 2))]
    flat = [lib.layers.Flatten()(b) for b in _branches(lib, inputs, KINDS, grid)]
    return lib.Model(inputs, lib.layers.Dense(3)(lib.layers.Concatenate()(flat)))


def _images(batch=2, seed=0):
    return np.random.default_rng(seed).standard_normal((batch,) + SHAPE).astype(np.float32)


def _assert_verified(onnx_model, fn, inputs):
    # Per node first: it freezes the function's variables as the converter did, and the end-to-end run of a
    # training step assigns them (a batch norm's moving statistics).
    per_node = converters.verify_nodes(onnx_model, fn, inputs=inputs, print_table=False)
    end_to_end = converters.verify(onnx_model, fn, inputs=inputs, print_table=False, spread=False)
    assert per_node.ok, per_node.table()
    assert end_to_end.ok, end_to_end.table()


@pytest.mark.parametrize("lowering", converters.LOWERINGS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_zero_padding_before_convolution_inference(flavour, kind, lowering):
    model = _inference_model(flavour, kind)
    onnx_model = converters.from_keras(model, lowering=lowering)
    _assert_verified(onnx_model, model, [_images()])


@pytest.mark.parametrize("lowering", converters.LOWERINGS)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_zero_padding_before_convolution_training_step(flavour, lowering):
    model = _training_model(flavour)
    onnx_model = converters.from_keras_train_step(model, "mse", lowering=lowering)
    step, holder = training_step_function(model, "mse")
    labels = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    _assert_verified(onnx_model, step, [_images(), labels])
    del holder


def test_dilated_convolution_keeps_its_own_pads():
    """The minimized graph: ZeroPadding2D(1) -> Conv2D(3, 3, dilation_rate=2, padding="same") is one ONNX Conv
    padded by 1 + 2 on every side (tf2onnx alone writes 1)."""
    import onnx

    model = _keras("tf_keras")
    inputs = model.Input(SHAPE)
    net = model.Model(inputs, model.layers.Conv2D(3, 3, dilation_rate=2, padding="same")(
        model.layers.ZeroPadding2D(1)(inputs)))
    onnx_model = converters.from_keras(net)
    convs = [n for n in onnx_model.graph.node if n.op_type == "Conv"]
    assert len(convs) == 1 and not [n for n in onnx_model.graph.node if n.op_type == "Pad"]
    pads = next(onnx.helper.get_attribute_value(a) for a in convs[0].attribute if a.name == "pads")
    assert list(pads) == [3, 3, 3, 3]


def _explicit_function():
    """Pad -> Conv2D and Pad -> DepthwiseConv2dNative, both with EXPLICIT padding (asymmetric; dilated or strided)."""
    import tensorflow as tf

    rng = np.random.default_rng(3)
    conv_filter = tf.constant(rng.standard_normal((3, 3, 2, 4)).astype(np.float32))
    depthwise_filter = tf.constant(rng.standard_normal((3, 3, 2, 2)).astype(np.float32))
    explicit = [0, 0, 1, 2, 2, 0, 0, 0]

    @tf.function
    def fn(x):
        padded = tf.pad(x, [[0, 0], [2, 0], [1, 3], [0, 0]])
        return (
            tf.raw_ops.Conv2D(input=padded, filter=conv_filter, strides=[1, 1, 1, 1], padding="EXPLICIT",
                              explicit_paddings=explicit, dilations=[1, 2, 3, 1]),
            tf.raw_ops.Conv2D(input=padded, filter=conv_filter, strides=[1, 2, 1, 1], padding="EXPLICIT",
                              explicit_paddings=explicit),
            # TF's CPU depthwise kernel has no dilations.
            tf.raw_ops.DepthwiseConv2dNative(input=padded, filter=depthwise_filter, strides=[1, 2, 2, 1],
                                             padding="EXPLICIT", explicit_paddings=explicit),
            # A quantizer makes this no float inference graph, so the custom lowering keeps the domain's
            # depthwise node, whose own fusion (converters.fusions.PadIntoDepthwise) takes the Pad.
            tf.quantization.fake_quant_with_min_max_args(x, -2.0, 2.0),
        )

    return fn, [tf.TensorSpec((2,) + SHAPE, tf.float32)]


@pytest.mark.parametrize("lowering", converters.LOWERINGS)
def test_zero_pad_before_explicit_padding(lowering):
    fn, signature = _explicit_function()
    onnx_model = converters.from_function(fn, signature, lowering=lowering)
    _assert_verified(onnx_model, fn, [_images()])
    if lowering == "custom":
        assert not [n for n in onnx_model.graph.node if n.op_type == "Pad"]
        assert [n for n in onnx_model.graph.node if n.op_type == "DepthwiseConv2dNative"]


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-m", "converters", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


def test_cli_verifies_the_training_step(tmp_path):
    path = tmp_path / "padded.keras"
    _training_model("keras3").save(str(path))
    proc = _cli("--keras", path, "--train-step", "--loss", "mse", "--lowering", "standard",
                "--output", tmp_path / "m.onnx", "--verify", "--verify-nodes", "--no-tf-spread")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verification passed" in proc.stdout and "per-node verification passed" in proc.stdout
