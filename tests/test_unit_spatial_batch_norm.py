"""Issue 44, bug 2: a training-mode batch norm over a tensor whose H or W is 1, standard lowering.

The standard lowering computes the variance as ReduceSum((x - mean) * (x - mean)). tf2onnx's transpose
optimizer moved the NCHW->NHWC Transpose below that square Mul without permuting the Mul's recorded shape,
and its last step, which writes a Transpose that moves only size-1 dims as a Reshape, then built that Reshape
from the stale shape: with H or W of 1 the tensor was reshaped, not transposed, and the variance summed over
the wrong axes (a wrong loss), or the Reshape failed in ONNX Runtime. converters.layout's LayoutOptimizer
permutes the shape as tf2onnx does for every other node it moves a Transpose through.

Each training step (Conv2D with 1 and with 4 filters, each -> BatchNormalization -> ReLU, flattened into a
Dense) converts in both lowerings and is judged end to end and per node against TF, for 1xW, Hx1 and 1x1
spatial sizes, a static batch of 1 and a free batch run with 3, tf_keras and Keras 3 (whose batch norm is
plain arithmetic). The minimized graph, a square of a convolution summed over N, H and W, fails the same way
in both lowerings and is tested on its own; so is the CLI.
"""
from __future__ import annotations

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
SHAPES = ((1, 6, 3), (5, 1, 3), (1, 1, 3))
BATCHES = (1, None)  # a static batch of 1; a free batch, fed 3 rows
FLAVOURS = ("tf_keras", "keras3")


def _keras(flavour):
    if flavour == "tf_keras":
        import tf_keras

        return tf_keras
    import keras

    return keras


def _model(flavour, shape):
    lib = _keras(flavour)
    lib.utils.set_random_seed(4)
    inputs = lib.Input(shape)
    branches = []
    for filters in (1, 4):  # one channel: the Transpose to NHWC moves only size-1 dims for Hx1 too
        x = lib.layers.Conv2D(filters, 3, padding="same")(inputs)
        x = lib.layers.BatchNormalization()(x)
        branches.append(lib.layers.Flatten()(lib.layers.ReLU()(x)))
    return lib.Model(inputs, lib.layers.Dense(3)(lib.layers.Concatenate()(branches)))


def _inputs(shape, rows, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((rows,) + shape).astype(np.float32), rng.standard_normal((rows, 3)).astype(np.float32)]


def _assert_verified(onnx_model, fn, inputs):
    # Per node first: it freezes the function's variables as the converter did, and the end-to-end run of a
    # training step assigns them (a batch norm's moving statistics).
    per_node = converters.verify_nodes(onnx_model, fn, inputs=inputs, print_table=False)
    end_to_end = converters.verify(onnx_model, fn, inputs=inputs, print_table=False, spread=False)
    assert per_node.ok, per_node.table()
    assert end_to_end.ok, end_to_end.table()


@pytest.mark.parametrize("lowering", converters.LOWERINGS)
@pytest.mark.parametrize("batch", BATCHES, ids=("batch1", "free_batch"))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:2])))
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_batch_norm_training_step_over_unit_spatial_dims(flavour, shape, batch, lowering):
    model = _model(flavour, shape)
    onnx_model = converters.from_keras_train_step(model, "mse", lowering=lowering, batch_size=batch)
    step, holder = training_step_function(model, "mse", batch_size=batch)
    _assert_verified(onnx_model, step, _inputs(shape, batch or 3))
    del holder


def _square_of_convolution(shape):
    """The minimized graph: Conv2D -> Square -> sum over N, H, W (tf2onnx writes the Square as Mul(t, t))."""
    import tensorflow as tf

    kernel = np.random.default_rng(5).standard_normal((3, 3, shape[-1], 4)).astype(np.float32)

    @tf.function
    def fn(x):
        return tf.reduce_sum(tf.square(tf.nn.conv2d(x, kernel, 1, "SAME")), axis=[0, 1, 2])

    return fn, [tf.TensorSpec((None,) + shape, tf.float32)]


@pytest.mark.parametrize("lowering", converters.LOWERINGS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:2])))
def test_square_after_convolution_keeps_its_layout(shape, lowering):
    fn, signature = _square_of_convolution(shape)
    onnx_model = converters.from_function(fn, signature, lowering=lowering)
    _assert_verified(onnx_model, fn, _inputs(shape, 3)[:1])


def test_cli_verifies_the_standard_training_step(tmp_path):
    path = tmp_path / "unit_spatial.keras"
    _model("tf_keras", SHAPES[0]).save(str(path))
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-m", "converters", "--keras", str(path), "--train-step", "--loss", "mse",
                           "--lowering", "standard", "--output", str(tmp_path / "m.onnx"), "--verify",
                           "--verify-nodes", "--no-tf-spread"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verification passed" in proc.stdout and "per-node verification passed" in proc.stdout
