"""Example models made with tensorflow-model-optimization (tfmot), as a user would make them.

* MobileNetV2 (tf_keras.applications, alpha 0.35, 96x96, ``weights=None``, 10 classes, seeded) wrapped by
  tfmot's ``quantize_model`` (its default 8-bit scheme), then a few SGD steps on random data so that the
  batch-norm moving statistics and the quantization ranges are not their initial values. Three graphs:
  inference (``model(x, training=False)``), one training step (sparse softmax cross-entropy and the gradient
  of every trainable variable, ``training=True``, which also assigns the moving statistics and the ranges),
  and saliency (the gradient of each image's top class score with respect to the image, ``training=False``).
* A small CNN whose Conv2D and Dense layers carry a custom tfmot ``QuantizeConfig`` (tfmot's own API:
  ``quantize_annotate_layer`` + ``quantize_apply`` under ``quantize_scope``): 4-bit weights
  (LastValueQuantizer, per tensor, symmetric) and 8-bit activations (MovingAverageQuantizer). tf2onnx 1.17
  cannot convert it correctly (models/run_all.py runs tf2onnx alone on the same signatures):
  - its FakeQuantWithMinMax{Args,Vars} handler rewrites the op to QuantizeLinear/DequantizeLinear and refuses
    num_bits != 8 and narrow_range; it has no handler for any FakeQuant gradient;
  - the inference graph converts only because grappler folds the 4-bit weight quantizers (constant kernel)
    into constants first, and the result is wrong: QuantizeLinear rounds half to even where TF's FakeQuant
    rounds half up on its nudged grid, so 6 of the 40 logits move by a grid step (max |err| 0.047);
  - the training step fails ("Cannot find node with output ...SparseSoftmaxCrossEntropyWithLogits:1", and
    behind it the gradient ops, FakeQuantWithMinMaxVarsGradient among them).
  This project converts both bit-exactly or within the stated tolerances.
"""
from __future__ import annotations

import re

import numpy as np
import tensorflow as tf
import tf_keras
import tensorflow_model_optimization as tfmot

SEED = 1234
MOBILENET_SHAPE = (96, 96, 3)
CNN_SHAPE = (16, 16, 3)
NUM_CLASSES = 10
TRAIN_BATCH = 8
WARMUP_STEPS = 3

quant_keras = tfmot.quantization.keras


def random_batch(rng, shape, batch=TRAIN_BATCH):
    """Images in [0, 1] and labels that depend on them (so training has something to learn)."""
    images = rng.uniform(0.0, 1.0, (batch,) + shape).astype(np.float32)
    labels = (images.mean(axis=(1, 2)) @ np.arange(1, 4, dtype=np.float32) * 3).astype(np.int32) % NUM_CLASSES
    return images, labels


def loss_fn(labels, logits):
    return tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits)


def warm_up(model, shape, steps=WARMUP_STEPS, seed=SEED):
    """A few SGD steps in TF, so that moving statistics, ranges and weights are all non-trivial."""
    rng = np.random.default_rng(seed)
    optimizer = tf_keras.optimizers.SGD(learning_rate=0.05)

    @tf.function
    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for _ in range(steps):
        step(*random_batch(rng, shape))
    return model


def _mobilenet_v2():
    tf_keras.utils.set_random_seed(SEED)
    return tf_keras.applications.MobileNetV2(
        input_shape=MOBILENET_SHAPE, alpha=0.35, weights=None, classes=NUM_CLASSES, classifier_activation=None
    )


def quantized_mobilenet_v2():
    return warm_up(quant_keras.quantize_model(_mobilenet_v2()), MOBILENET_SHAPE)


def float_mobilenet_v2():
    """The same network without quantization: the control for the quantized training step, whose gradients
    no two implementations can agree on (see models/run_all.py, "quantization flips")."""
    return warm_up(_mobilenet_v2(), MOBILENET_SHAPE)


class FourBitWeightsConfig(quant_keras.QuantizeConfig):
    """4-bit per-tensor symmetric kernel, 8-bit activation (tfmot's QuantizeConfig interface)."""

    def get_weights_and_quantizers(self, layer):
        return [(layer.kernel, quant_keras.quantizers.LastValueQuantizer(
            num_bits=4, symmetric=True, narrow_range=False, per_axis=False))]

    def get_activations_and_quantizers(self, layer):
        return [(layer.activation, quant_keras.quantizers.MovingAverageQuantizer(
            num_bits=8, symmetric=False, narrow_range=False, per_axis=False))]

    def set_quantize_weights(self, layer, quantize_weights):
        layer.kernel = quantize_weights[0]

    def set_quantize_activations(self, layer, quantize_activations):
        layer.activation = quantize_activations[0]

    def get_output_quantizers(self, layer):
        return []

    def get_config(self):
        return {}


def fourbit_cnn():
    """Conv2D 3x3 (8, ReLU) -> Conv2D 3x3 stride 2 (16, ReLU) -> global average pool -> Dense (10), the
    Conv2D and Dense layers annotated with FourBitWeightsConfig."""
    tf_keras.utils.set_random_seed(SEED)
    annotate = quant_keras.quantize_annotate_layer
    config = FourBitWeightsConfig()
    layers = tf_keras.layers
    model = tf_keras.Sequential([
        layers.InputLayer(CNN_SHAPE),
        annotate(layers.Conv2D(8, 3, padding="same", activation="relu"), config),
        annotate(layers.Conv2D(16, 3, strides=2, padding="same", activation="relu"), config),
        layers.GlobalAveragePooling2D(),
        annotate(layers.Dense(NUM_CLASSES), config),
    ])
    with quant_keras.quantize_scope({"FourBitWeightsConfig": FourBitWeightsConfig}):
        quantized = quant_keras.quantize_apply(quant_keras.quantize_annotate_model(model))
    return warm_up(quantized, CNN_SHAPE)


def gradient_key(variable) -> str:
    """A signature output name for a variable's gradient, e.g. 'grad_Conv1_kernel'."""
    return "grad_" + re.sub(r"[^0-9A-Za-z]+", "_", variable.name.split(":")[0]).strip("_")


class _Untracked:
    """Holds the Keras model out of the SavedModel's object graph: tracking it would also serialize every
    layer's own traced call functions (9.5 MB for MobileNetV2) that nobody converts."""

    def __init__(self, model):
        self.model = model


class QuantizedModelGraphs(tf.Module):
    """The inference, training-step and saliency functions of one Keras model."""

    def __init__(self, model, image_shape, train_batch=TRAIN_BATCH):
        super().__init__()
        self._keras = _Untracked(model)
        # The signatures capture these; the SavedModel needs them reachable from its root.
        self.model_variables = list(model.variables)
        images = tf.TensorSpec((None,) + image_shape, tf.float32, name="images")
        train_images = tf.TensorSpec((train_batch,) + image_shape, tf.float32, name="images")
        labels = tf.TensorSpec((train_batch,), tf.int32, name="labels")
        self.serve = tf.function(self._serve, input_signature=[images])
        self.train_step = tf.function(self._train_step, input_signature=[train_images, labels])
        self.saliency = tf.function(self._saliency, input_signature=[images])

    @property
    def model(self):
        return self._keras.model

    def _serve(self, images):
        return {"logits": self.model(images, training=False)}

    def _train_step(self, images, labels):
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, self.model(images, training=True))
        grads = tape.gradient(loss, variables)
        out = {"loss": loss}
        out.update({gradient_key(v): g for v, g in zip(variables, grads)})
        return out

    def _saliency(self, images):
        with tf.GradientTape() as tape:
            tape.watch(images)
            logits = self.model(images, training=False)
            top_scores = tf.reduce_max(logits, axis=-1)
        return {"logits": logits, "saliency": tape.gradient(top_scores, images)}

    def signatures(self):
        return {"serving_default": self.serve, "train_step": self.train_step, "saliency": self.saliency}
