"""Writes the example SavedModels into models/<name>/saved_model (re-runnable, deterministic).

    PYTHONPATH=. python -m models.make_models [--only NAME ...]

Every network is trained on scikit-learn's digits (models/data.py: 1,437 training images, 360 held out,
upsampled to the network's input size) and gets its signatures from models/graphs.py; each classifier's
held-out accuracy in TF is printed.

- mobilenet_v2_qat: tfmot's quantize_model on tf_keras' MobileNetV2 (alpha 0.35, 96x96, 10 classes, seeded,
  trained in float, then fine-tuned quantization-aware), models/tfmot_models.py. Signatures: serving_default
  (images [batch, 96, 96, 3] -> logits), train_step (images [8, 96, 96, 3], labels [8] -> loss and the
  gradient of every trainable variable; assigns the batch-norm moving statistics and tfmot's ranges), saliency
  (images [batch, ...] -> logits and d(top class score)/d(images)).
- mobilenet_v2_float: the float MobileNetV2 that mobilenet_v2_qat started from, train_step only: the float
  control for the quantized training step.
- fourbit_cnn: a small CNN with a custom tfmot QuantizeConfig (4-bit weights, 8-bit activations):
  serving_default and train_step (images [8, 16, 16, 3], labels [8]).
- cnn_train_step_float: the hand-made CNN of models/qat_network.py without activation quantizers,
  training step (see that module for what it covers beyond the tfmot models).
- qdq: quantize_and_dequantize (V2/V3/V4 ops) in several configurations and the V4 gradient (tfmot
  does not use these ops).
- keras3_qat: a small Keras 3 (``import keras``) CNN quantized with Keras 3's own keras.quantizers
  (8-bit activations, 4-bit narrow-range per-channel weights, all ranges trainable), models/keras3_qat.py,
  trained by its own train_step signature (Keras 3 SGD with momentum 0.9). Signatures: serving_default (images
  [batch, 32, 32, 3] -> logits), train_step (images [8, 32, 32, 3], labels [8] -> loss and every gradient;
  the optimizer then assigns the weights, ranges, momentum slots and its iteration count, and batch norm
  the moving statistics), saliency (images -> logits and d(top class score)/d(images)).

The ONNX files next to them are written by ``python -m models.run_all``.
"""
from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from models import data, graphs, keras3_qat, qat_network, tfmot_models  # noqa: E402

MODELS_DIR = Path(__file__).resolve().parent
SEED = 1234
CNN_EPOCHS = 10


def saved_model_dir(name: str) -> Path:
    return MODELS_DIR / name / "saved_model"


def build_trained_qat_cnn(quantize_activations=True) -> qat_network.QatCnn:
    """The network after ``CNN_EPOCHS`` of Adam on scikit-learn's digits (models/data.py), its weight ranges
    following its kernels, so that the batch-norm moving statistics, the learned activation ranges and the
    weights are all trained."""
    tf_keras.utils.set_random_seed(SEED)
    model = qat_network.QatCnn(quantize_activations=quantize_activations, name="qat_cnn")
    model(tf.zeros((1,) + qat_network.IMAGE_SHAPE), training=False)
    optimizer = tf_keras.optimizers.Adam(learning_rate=5e-3)

    @tf.function
    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = qat_network.cross_entropy(model(images, training=True), labels)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    def set_ranges():  # eagerly, from the kernels' values, as tfmot's LastValueQuantizer would
        for layer in model.weight_quantized():
            layer.set_range_from_kernel()

    set_ranges()
    graphs.fit(step, data.digits(qat_network.IMAGE_SHAPE[0]), CNN_EPOCHS, 32, SEED, after_step=set_ranges)
    return model


def _cross_entropy(labels, logits):
    return qat_network.cross_entropy(logits, labels)


QDQ_SHAPE = (2, 6, 6, 4)
# Ranges whose quantization step is a power of two (8 bits signed: scale 64 on both sides), so that
# inputs on a 1/128 grid land exactly on rounding ties and the two rounding modes differ.
TIE_MIN, TIE_MAX = -2.0, 127.0 / 64.0


class QuantizeDequantizeModel(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec(QDQ_SHAPE, tf.float32, name="x")])
    def serve(self, x):
        qdq2 = tf.quantization.quantize_and_dequantize_v2  # emits QuantizeAndDequantizeV4
        out = {}
        out["tensor_given_half_even"] = qdq2(x, TIE_MIN, TIE_MAX, range_given=True, round_mode="HALF_TO_EVEN")
        out["tensor_given_half_up"] = qdq2(x, TIE_MIN, TIE_MAX, range_given=True, round_mode="HALF_UP")
        out["tensor_data_half_even"] = qdq2(x, 0.0, 0.0, range_given=False, round_mode="HALF_TO_EVEN")
        out["tensor_data_half_up_4bit_narrow"] = qdq2(
            x, 0.0, 0.0, range_given=False, round_mode="HALF_UP", num_bits=4, narrow_range=True
        )
        out["tensor_given_unsigned_6bit"] = qdq2(
            x, 0.0, 1.5, signed_input=False, num_bits=6, range_given=True, round_mode="HALF_UP"
        )
        # Per axis (TF 2.21 rejects per-axis with range_given=True, so the range comes from the data).
        # (min/max must still be vectors of dims[axis]; their values are ignored.)
        zeros4, zeros6 = tf.zeros([QDQ_SHAPE[3]]), tf.zeros([QDQ_SHAPE[1]])
        out["axis3_data_half_even"] = qdq2(x, zeros4, zeros4, range_given=False, axis=3, round_mode="HALF_TO_EVEN")
        out["axis1_data_half_up"] = qdq2(x, zeros6, zeros6, range_given=False, axis=1, round_mode="HALF_UP")
        # The deprecated wrapper emits QuantizeAndDequantizeV2; V3 exists only as a raw op.
        out["v2_op_given"] = tf.quantization.quantize_and_dequantize(x, -1.0, 1.0, range_given=True)
        out["v3_op_5bit"] = tf.raw_ops.QuantizeAndDequantizeV3(
            input=x, input_min=-1.5, input_max=1.5, num_bits=tf.constant(5), range_given=True
        )
        # Gradients: QuantizeAndDequantizeV4Grad passes the gradient where input_min <= x <= input_max.
        weights = tf.reshape(tf.range(1.0, 1.0 + np.prod(QDQ_SHAPE), dtype=tf.float32), QDQ_SHAPE) / 64.0
        axis_min = tf.constant([-1.0, -0.5, -2.0, -0.25])
        axis_max = tf.constant([1.0, 0.5, 2.0, 0.75])
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y_tensor = qdq2(x, -1.0, 1.0, range_given=True, round_mode="HALF_UP")
            y_axis = qdq2(x, axis_min, axis_max, range_given=False, axis=3)
            objective_tensor = tf.reduce_sum(weights * y_tensor)
            objective_axis = tf.reduce_sum(weights * y_axis)
        out["grad_tensor_given"] = tape.gradient(objective_tensor, x)
        out["grad_axis3"] = tape.gradient(objective_axis, x)
        return out


def save(module, name, signatures):
    path = saved_model_dir(name)
    if path.exists():
        shutil.rmtree(path)
    tf.saved_model.save(module, str(path), signatures=signatures)
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    held_out = ""
    if "serving_default" in signatures and isinstance(module, graphs.ClassifierGraphs):
        split = data.digits(int(module.serve.input_signature[0].shape[1]))
        held_out = f", held-out accuracy {graphs.accuracy(module.serve, split.test_images, split.test_labels):.1%}"
    print(f"wrote {path.relative_to(MODELS_DIR.parent)} ({size / 1024:.0f} KiB{held_out})", flush=True)
    return path


def _tfmot_graphs(model, shape):
    return graphs.ClassifierGraphs(model, shape, tfmot_models.loss_fn)


def make_mobilenet_v2_qat():
    module = _tfmot_graphs(tfmot_models.quantized_mobilenet_v2(), tfmot_models.MOBILENET_SHAPE)
    save(module, "mobilenet_v2_qat", module.signatures())


def make_mobilenet_v2_float():
    module = _tfmot_graphs(tfmot_models.float_mobilenet_v2(), tfmot_models.MOBILENET_SHAPE)
    save(module, "mobilenet_v2_float", {"train_step": module.train_step})


def make_fourbit_cnn():
    module = _tfmot_graphs(tfmot_models.fourbit_cnn(), tfmot_models.CNN_SHAPE)
    signatures = module.signatures()
    del signatures["saliency"]
    save(module, "fourbit_cnn", signatures)


def make_cnn_train_step_float():
    module = graphs.ClassifierGraphs(build_trained_qat_cnn(quantize_activations=False), qat_network.IMAGE_SHAPE,
                                     _cross_entropy)
    save(module, "cnn_train_step_float", {"serving_default": module.train_step})


def make_qdq():
    module = QuantizeDequantizeModel()
    save(module, "qdq", {"serving_default": module.serve})


def make_keras3_qat():
    module = keras3_qat.trained_graphs()
    save(module, "keras3_qat", module.signatures())


MAKERS = {
    "mobilenet_v2_qat": make_mobilenet_v2_qat,
    "mobilenet_v2_float": make_mobilenet_v2_float,
    "fourbit_cnn": make_fourbit_cnn,
    "cnn_train_step_float": make_cnn_train_step_float,
    "qdq": make_qdq,
    "keras3_qat": make_keras3_qat,
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=sorted(MAKERS), help="make only these models")
    args = parser.parse_args(argv)
    for name in args.only or MAKERS:
        MAKERS[name]()


if __name__ == "__main__":
    main()
