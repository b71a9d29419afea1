"""Keras 3 (TF's default ``import keras``) and tf_keras as conversion sources (converters.keras_models).

* from_keras takes either Keras's models, their ``.keras`` / ``.h5`` files (loaded by the Keras that wrote
  them) and Keras 3's ``model.export`` directories; the batch dimension stays free, unnamed inputs get a
  name, outputs are named after the model's.
* A model whose inputs are unknown gets a ConversionError that says to pass ``input_signature``.
* The CLI names the Keras it loaded a file with, converts a training step (``--train-step``), and reports
  every failure as one ``error:`` line (the traceback only with ``--debug``).
"""
from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import onnx
import pytest
import tensorflow as tf
import tf_keras

import converters
from converters.__main__ import EXIT_CONVERSION_FAILED, main
from converters.keras_models import KERAS_3, TF_KERAS, file_keras, gradient_output_name, keras_of_model
from converters.verification import run_onnx
from ort_ops.conformance import rules

pytestmark = pytest.mark.tensorflow

ROOT = Path(__file__).resolve().parent.parent
SHAPE = (10, 10, 3)


def _cli(*args, path=()):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *map(str, path)]), TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-m", "converters", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def _keras3_net(name="k3net"):
    """Each float layer of the issue: Conv2D with a bias before BatchNormalization, ReLU(max_value=6),
    DepthwiseConv2D, SeparableConv2D, Dense."""
    keras.utils.set_random_seed(4)
    layers = keras.layers
    inputs = keras.Input(SHAPE, name="images")
    x = layers.Conv2D(6, 3, padding="same", use_bias=True)(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU(max_value=6.0)(x)
    x = layers.DepthwiseConv2D(3, padding="same")(x)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU(max_value=6.0)(x)
    x = layers.SeparableConv2D(6, 3, strides=2, padding="same")(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(4, name="logits")(x), name=name)


def _tf_keras_net():
    tf_keras.utils.set_random_seed(4)
    inputs = tf_keras.Input(SHAPE, name="images")
    x = tf_keras.layers.Conv2D(4, 3)(inputs)
    x = tf_keras.layers.BatchNormalization()(x)
    x = tf_keras.layers.GlobalAveragePooling2D()(x)
    return tf_keras.Model(inputs, tf_keras.layers.Dense(3, name="logits")(x))


def _images(batch, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (batch,) + SHAPE).astype(np.float32)


def _batch_dim(value_info):
    dim = value_info.type.tensor_type.shape.dim[0]
    return dim.dim_value if dim.HasField("dim_value") else None


def test_which_keras():
    assert keras_of_model(_keras3_net()) == KERAS_3
    assert keras_of_model(_tf_keras_net()) == TF_KERAS
    assert keras_of_model(tf.Module()) is None


@pytest.mark.parametrize("lowering", converters.LOWERINGS)
def test_keras3_model_converts_with_a_free_batch(lowering):
    model = _keras3_net()
    onnx_model = converters.from_keras(model, lowering=lowering)
    assert [i.name for i in onnx_model.graph.input] == ["images"]
    assert [o.name for o in onnx_model.graph.output] == ["logits"]
    assert _batch_dim(onnx_model.graph.input[0]) is None
    for batch in (1, 3):
        images = _images(batch)
        got = run_onnx(onnx_model, {"images": images})["logits"]
        want = model(images, training=False).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_sequential_built_on_a_batch_keeps_the_batch_free():
    """A Sequential built by calling it on a batch of 4 records that batch; the model is not about it."""
    model = keras.Sequential([keras.layers.Dense(3)])
    model(np.zeros((4, 5), np.float32))
    onnx_model = converters.from_keras(model)
    assert [i.name for i in onnx_model.graph.input] == ["input"]  # not Keras 3's keras_tensor_N
    assert _batch_dim(onnx_model.graph.input[0]) is None
    fixed = converters.from_keras(model, batch_size=4)
    assert _batch_dim(fixed.graph.input[0]) == 4
    x = np.random.default_rng(1).standard_normal((7, 5)).astype(np.float32)
    np.testing.assert_allclose(run_onnx(onnx_model, {"input": x})["output"], model(x).numpy(), rtol=1e-6, atol=1e-6)


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(2)

    def call(self, x):
        return self.dense(x)


@pytest.mark.parametrize("make", [lambda: keras.Sequential([keras.layers.Dense(3)]), Subclassed],
                         ids=["uncalled_sequential", "subclassed"])
def test_unknown_inputs_ask_for_an_input_signature(make):
    model = make()
    with pytest.raises(converters.ConversionError, match=r"input_signature=\[tf.TensorSpec"):
        converters.from_keras(model)
    signature = [tf.TensorSpec([None, 5], tf.float32, name="features")]
    onnx_model = converters.from_keras(model, input_signature=signature)
    assert [i.name for i in onnx_model.graph.input] == ["features"]
    x = np.ones((2, 5), np.float32)
    np.testing.assert_allclose(run_onnx(onnx_model, {"features": x})["output"], model(x).numpy(), rtol=1e-6)


@pytest.mark.parametrize("suffix", [".keras", ".h5"])
@pytest.mark.parametrize("which", ["keras3", "tf_keras"])
def test_files_load_with_the_keras_that_wrote_them(tmp_path, suffix, which):
    model = _keras3_net() if which == "keras3" else _tf_keras_net()
    path = tmp_path / f"model{suffix}"
    model.save(str(path))
    assert file_keras(path) == (KERAS_3 if which == "keras3" else TF_KERAS)
    onnx_model = converters.from_keras(str(path))
    images = _images(2)
    want = model(images, training=False).numpy()
    got = run_onnx(onnx_model, {onnx_model.graph.input[0].name: images})
    np.testing.assert_allclose(got[onnx_model.graph.output[0].name], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_export_directory(tmp_path):
    model = _keras3_net()
    model.export(str(tmp_path / "exported"), verbose=False)
    onnx_model = converters.from_keras(str(tmp_path / "exported"))
    images = _images(2)
    got = run_onnx(onnx_model, {onnx_model.graph.input[0].name: images})
    want = model(images, training=False).numpy()
    np.testing.assert_allclose(got[onnx_model.graph.output[0].name], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("lowering", converters.LOWERINGS)
def test_keras3_training_step_applies_the_optimizer(lowering):
    """loss and gradients as TF computes them, and every variable the step assigns (weights, SGD's momentum
    slots and iteration count, the moving statistics) as an output equal to TF's value after the step."""
    model = _keras3_net()
    onnx_model = converters.from_keras_train_step(
        model, "sparse_categorical_crossentropy", from_logits=True,
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9), lowering=lowering, variable_updates="outputs",
    )
    names = [o.name for o in onnx_model.graph.output]
    taken = {"loss"}
    grad_names = [gradient_output_name(v, taken) for v in model.trainable_variables]
    assert "loss" in names and set(grad_names) <= set(names)
    images, labels = _images(4, seed=3), np.array([0, 3, 1, 2], np.int32)
    got = run_onnx(onnx_model, {"images": images, "labels": labels})
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(images, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    np.testing.assert_allclose(got["loss"], loss.numpy(), rtol=1e-5)
    summed = _bias_sum_bounds(model, loss_fn, images, labels)
    for name, v, g in zip(grad_names, model.trainable_variables, grads):
        want = g.numpy()
        # A bias gradient is a sum over batch and space of the layer's incoming gradient, and before a training
        # batch norm it is zero in exact arithmetic: rounding noise on both sides, judged against the size of
        # what was summed (the kit's sum rule), not its own value.
        atol = np.maximum(1e-4 * np.abs(want).max(), summed.get(v.path, 0.0))
        err = np.abs(got[name] - want)
        assert (err <= 1e-4 * np.abs(want) + atol).all(), (name, float(err.max()), got[name], want, atol)
    assert any(n.endswith("moving_mean") for n in names) and any("momentum" in n for n in names)


def _bias_sum_bounds(model, loss_fn, images, labels) -> dict:
    """{bias variable path: the kit's sum bound per channel, 1e-6 * sum |dL/dz|} for every layer with a bias,
    z being the layer's output, from TF (a second pass; only its gradients are read)."""
    biased = [layer for layer in model.layers if getattr(layer, "bias", None) is not None]
    probe = keras.Model(model.inputs, [layer.output for layer in biased] + [model.output])
    with tf.GradientTape() as tape:
        *outputs, logits = probe(images, training=True)
        loss = loss_fn(labels, logits)
    incoming = tape.gradient(loss, outputs)
    return {layer.bias.path: rules.SUM_RELATIVE * np.abs(dz.numpy()).reshape(-1, dz.shape[-1]).sum(axis=0)
            for layer, dz in zip(biased, incoming)}


def test_cli_keras3_file_names_its_keras(tmp_path):
    path = tmp_path / "net.keras"
    _keras3_net().save(str(path))
    out = tmp_path / "net.onnx"
    proc = _cli("--keras", path, "--output", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"with Keras {keras.__version__} (keras)" in proc.stdout
    # Quiet: TF's start-up lines (absl, oneDNN, CUDA notes) do not reach the user.
    assert "absl" not in proc.stderr and "cuda" not in proc.stderr.lower(), proc.stderr
    assert [i.name for i in onnx.load(str(out)).graph.input] == ["images"]


@pytest.mark.parametrize("lowering", converters.LOWERINGS)
def test_cli_keras3_training_step_verifies(tmp_path, lowering):
    """The issue's failing case: Conv2D(use_bias=True) -> BatchNormalization's bias gradient is rounding
    noise on both sides, and --verify must pass it."""
    path = tmp_path / "net.keras"
    _keras3_net().save(str(path))
    proc = _cli("--keras", path, "--train-step", "--loss", "sparse_categorical_crossentropy", "--from-logits",
                "--optimizer", "sgd", "--learning-rate", "0.1", "--variable-update-outputs", "--lowering", lowering,
                "--output", tmp_path / "step.onnx", "--verify", "--no-tf-spread")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verification passed" in proc.stdout
    assert re.search(r"^grad_conv2d(_\d+)?_bias ", proc.stdout, re.M), proc.stdout
    assert "Initializer" not in proc.stderr


def _run_main(argv, capsys):
    rc = main([str(a) for a in argv])
    return rc, capsys.readouterr()


def test_cli_errors_are_one_line(tmp_path, capsys):
    rc, out = _run_main(["--keras", tmp_path / "missing.keras", "--output", tmp_path / "o.onnx"], capsys)
    assert rc == EXIT_CONVERSION_FAILED
    assert out.err.strip().count("\n") == 0 and out.err.startswith("error: Keras file") and "Traceback" not in out.err

    not_keras = tmp_path / "weights.h5"
    import h5py

    with h5py.File(not_keras, "w") as f:
        f["w"] = np.zeros(3)
    rc, out = _run_main(["--keras", not_keras, "--output", tmp_path / "o.onnx"], capsys)
    assert rc == EXIT_CONVERSION_FAILED and "records no keras_version" in out.err and "Traceback" not in out.err


_CUSTOM_LAYER_MODULE = """
import keras


@keras.saving.register_keras_serializable(package="{package}")
class Scale(keras.layers.Layer):
    def call(self, x):
        return x * 2.0
"""


def test_cli_custom_layer_needs_its_module(tmp_path, monkeypatch):
    module_name = f"custom_layers_{os.getpid()}"
    (tmp_path / f"{module_name}.py").write_text(_CUSTOM_LAYER_MODULE.format(package=module_name))
    monkeypatch.syspath_prepend(str(tmp_path))
    custom = importlib.import_module(module_name)
    inputs = keras.Input((3,), name="x")
    path = tmp_path / "custom.keras"
    keras.Model(inputs, custom.Scale()(inputs)).save(str(path))
    proc = _cli("--keras", path, "--output", tmp_path / "o.onnx")
    assert proc.returncode == EXIT_CONVERSION_FAILED
    assert "--import MODULE" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    proc = _cli("--keras", path, "--import", module_name, "--output", tmp_path / "o.onnx", path=[tmp_path])
    assert proc.returncode == 0, proc.stderr


def test_cli_unexpected_errors_are_one_line_and_debug_shows_the_traceback(tmp_path, capsys, monkeypatch):
    path = tmp_path / "net.keras"
    _keras3_net().save(str(path))

    def broken(*args, **kwargs):
        raise RuntimeError("simulated failure\nsecond line")

    monkeypatch.setattr(converters, "from_keras", broken)
    rc, out = _run_main(["--keras", path, "--output", tmp_path / "o.onnx"], capsys)
    assert rc == EXIT_CONVERSION_FAILED
    assert "error: unexpected RuntimeError while converting: simulated failure" in out.err
    assert "Traceback" not in out.err and "second line" not in out.err
    rc, out = _run_main(["--keras", path, "--output", tmp_path / "o.onnx", "--debug"], capsys)
    assert rc == EXIT_CONVERSION_FAILED and "Traceback" in out.err


def test_cli_train_step_needs_a_loss(tmp_path):
    proc = _cli("--keras", tmp_path / "x.keras", "--train-step", "--output", tmp_path / "o.onnx")
    assert proc.returncode == 2 and "--train-step needs --loss" in proc.stderr


def test_dtype_without_onnx_type_is_a_conversion_error():
    """tf2onnx raises a bare KeyError for a TF dtype it cannot map (here qint8); the converter names the nodes."""

    @tf.function(input_signature=[tf.TensorSpec([4], tf.float32, name="x")])
    def quantize(x):
        q = tf.quantization.quantize(x, -1.0, 1.0, tf.qint8, name="to_qint8")
        return tf.quantization.dequantize(q.output, q.output_min, q.output_max, name="back")

    with pytest.raises(converters.ConversionError, match=r"QuantizeV2 \(node 'to_qint8'\): qint8"):
        converters.from_function(quantize, quantize.input_signature)


def _keras3_quantized_net():
    """The issue's layers with Keras 3's own fake quantizers between them: per tensor 8-bit, 4-bit narrow,
    per channel on the last axis and on axis 1 (wrapped by Keras in a Transpose pair)."""
    from keras3_layers import FakeQuant

    keras.utils.set_random_seed(4)
    layers = keras.layers
    inputs = keras.Input(SHAPE, name="images")
    x = FakeQuant(-3, 3, name="fq_input")(inputs)
    x = layers.Conv2D(6, 3, padding="same", use_bias=True)(x)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU(max_value=6.0)(x)
    x = FakeQuant(0, 6, num_bits=4, narrow_range=True, name="fq_4bit_narrow")(x)
    x = layers.DepthwiseConv2D(3, padding="same")(x)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU(max_value=6.0)(x)
    x = FakeQuant(0, 6, axis=-1, name="fq_channels_last")(x)
    x = layers.SeparableConv2D(6, 3, strides=2, padding="same")(x)
    x = FakeQuant(-4, 4, axis=1, name="fq_axis1")(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(4, name="logits")(x), name="k3qnet")


@pytest.mark.parametrize("lowering", converters.LOWERINGS)
def test_cli_keras3_quantized_file_and_its_step_verify(tmp_path, lowering, capsys):
    """The issue's "done when": a Keras 3 model with each layer and quantizer, from a .keras file through the
    CLI with --verify, inference and a training step that applies an optimizer, in both lowerings."""
    path = tmp_path / "quantized.keras"
    _keras3_quantized_net().save(str(path))
    out = tmp_path / "q.onnx"
    rc, printed = _run_main(["--keras", path, "--import", "keras3_layers", "--lowering", lowering, "--output", out,
                             "--verify", "--no-tf-spread"], capsys)
    assert rc == 0, printed.out + printed.err
    if lowering == "custom":  # Keras's Transpose pair around the axis-1 quantizer is gone
        graph = onnx.load(str(out)).graph
        transposed = {o for n in graph.node if n.op_type == "Transpose" for o in n.output}
        per_channel = [n for n in graph.node if n.op_type == "FakeQuantWithMinMaxVarsPerChannel"]
        assert len(per_channel) == 2 and not any(i in transposed for n in per_channel for i in n.input)
        assert {a.i for n in per_channel for a in n.attribute if a.name == "axis"} >= {1}
    rc, printed = _run_main(["--keras", path, "--import", "keras3_layers", "--lowering", lowering, "--train-step",
                             "--loss", "sparse_categorical_crossentropy", "--from-logits", "--optimizer", "adam",
                             "--learning-rate", "0.01", "--variable-update-outputs", "--output", tmp_path / "s.onnx",
                             "--verify", "--no-tf-spread"], capsys)
    assert rc == 0, printed.out + printed.err
    assert "grad_fq_axis1_range_min" in printed.out and "verification passed" in printed.out


@pytest.mark.parametrize("mode", ["int8", "int4", "float8"])
def test_cli_model_quantize(tmp_path, mode, capsys):
    """model.quantize(mode) of a Dense network, saved as .keras, converted and verified through the CLI (float8
    needs opset 19, and says so at 17)."""
    keras.utils.set_random_seed(5)
    layers = keras.layers
    model = keras.Sequential([keras.Input((8,), name="features"), layers.Dense(6, name="hidden"), layers.ReLU(),
                              layers.Dense(3, name="logits")], name="dense_net")
    model.quantize(mode)
    path = tmp_path / f"dense_{mode}.keras"
    model.save(str(path))
    opset = ["--opset", "19"] if mode == "float8" else []
    for lowering in converters.LOWERINGS:
        rc, printed = _run_main(["--keras", path, "--lowering", lowering, *opset, "--output", tmp_path / "d.onnx",
                                 "--verify", "--no-tf-spread"], capsys)
        assert rc == 0 and "verification passed" in printed.out, printed.out + printed.err
    if mode == "float8":
        rc, printed = _run_main(["--keras", path, "--output", tmp_path / "d.onnx"], capsys)
        assert rc == EXIT_CONVERSION_FAILED and "opset 19" in printed.err and "Traceback" not in printed.err


def test_cli_train_step_verify_draws_labels_from_the_classes(tmp_path, capsys):
    """Two classes: the verifier's generic integer inputs (0-3) would be labels TF rejects."""
    path = tmp_path / "two.keras"
    keras.Sequential([keras.Input((5,), name="x"), keras.layers.Dense(2, name="logits")]).save(str(path))
    rc, printed = _run_main(["--keras", path, "--train-step", "--loss", "sparse_categorical_crossentropy",
                             "--from-logits", "--output", tmp_path / "t.onnx", "--verify", "--no-tf-spread"], capsys)
    assert rc == 0 and "verification passed" in printed.out, printed.out + printed.err
