"""The layer catalogue: one small seeded tf_keras model per layer of issue 9, and its training step.

Each entry is a model ``trainable stem -> layer under test -> head`` and a loss. The stem (a Dense or
Conv2D) puts a trainable variable in front of the layer, so the gradient wrt all trainable variables
runs through the layer's own gradient. The head turns the features into what the loss wants: logits
(SparseCategoricalCrossentropy from logits), softmax probabilities (SparseCategoricalCrossentropy from
probabilities, CategoricalCrossentropy) or a regression vector (MSE). On a softmax output Keras computes
CategoricalCrossentropy from the softmax's logits (its shortcut, kept: that is what users get), while the
sparse loss from probabilities sees the probabilities behind an Identity, so the clip/log path is covered.

The training step is ``loss, *tape.gradient(loss, model.trainable_variables)`` as a tf.function of
``(x, y)``, traced with a static batch or with a ``None`` batch (``training_step``). Shapes are small
so that the whole catalogue converts and runs in little time.

This module imports TensorFlow; only TF-marked test modules and tools import it.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Tuple

import numpy as np
import tensorflow as tf
import tf_keras

layers = tf_keras.layers

CLASSES = 4
STATIC_BATCH = 3
# The None-batch graphs run with another batch than the static ones, so a size baked in by mistake shows.
DYNAMIC_BATCH = 5

LOSSES = ("sparse_logits", "sparse_probs", "categorical", "mse")


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    input_shape: Tuple[int, ...]  # without the batch dim
    body: Callable  # features tensor -> features tensor (functional API), builds the layer(s) under test
    loss: str  # one of LOSSES
    stem: str = "auto"  # "dense", "conv" or "auto" (conv for images, dense for vectors)
    training: bool = True  # the value of ``training`` the model is called with
    # A bias right before a training-mode BatchNormalization has a gradient that is exactly zero in
    # exact arithmetic (the batch mean removes it), i.e. pure rounding noise in both TF and ONNX; Keras
    # models leave that bias out, and so does the catalogue.
    stem_bias: bool = True

    def build_model(self, seed: int = 0):
        tf_keras.utils.set_random_seed(seed)
        inputs = layers.Input(self.input_shape)
        stem = self.stem if self.stem != "auto" else ("conv" if len(self.input_shape) == 3 else "dense")
        if stem == "conv":
            features = layers.Conv2D(3, 3, padding="same", use_bias=self.stem_bias, name="stem")(inputs)
        else:
            features = layers.Dense(8, use_bias=self.stem_bias, name="stem")(inputs)
        features = self.body(features)
        if len(features.shape) > 2:
            features = layers.Flatten(name="head_flatten")(features)
        if self.loss in ("sparse_probs", "categorical"):
            outputs = layers.Dense(CLASSES, activation="softmax", name="head")(features)
        else:
            outputs = layers.Dense(CLASSES, name="head")(features)
        return tf_keras.Model(inputs, outputs, name=self.name)


def loss_object(loss: str):
    if loss == "sparse_logits":
        return tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if loss == "sparse_probs":
        return tf_keras.losses.SparseCategoricalCrossentropy(from_logits=False)
    if loss == "categorical":
        return tf_keras.losses.CategoricalCrossentropy()
    if loss == "mse":
        return tf_keras.losses.MeanSquaredError()
    raise ValueError(f"unknown loss {loss!r}; one of {LOSSES}")


def label_spec(loss: str, batch: Optional[int]) -> tf.TensorSpec:
    if loss.startswith("sparse"):
        return tf.TensorSpec([batch], tf.int32, name="y")
    return tf.TensorSpec([batch, CLASSES], tf.float32, name="y")


def training_step(entry: Entry, static_batch: bool, seed: int = 0):
    """(tf.function, input_signature, model): ``step(x, y) -> [loss, *gradients]``."""
    model = entry.build_model(seed)
    loss_fn = loss_object(entry.loss)
    batch = STATIC_BATCH if static_batch else None
    signature = [tf.TensorSpec((batch,) + tuple(entry.input_shape), tf.float32, name="x"), label_spec(entry.loss, batch)]

    @tf.function(input_signature=signature)
    def step(x, y):
        with tf.GradientTape() as tape:
            prediction = model(x, training=entry.training)
            if entry.loss == "sparse_probs":
                # Keras computes a loss "from probabilities" on a softmax output from the softmax's
                # logits; behind an Identity it takes the probabilities path (clip, log) for real.
                prediction = tf.identity(prediction)
            loss = loss_fn(y, prediction)
        return [loss] + tape.gradient(loss, model.trainable_variables)

    return step, signature, model


def step_inputs(entry: Entry, batch: int, seed: int = 0):
    """Seeded inputs ``[x, y]`` for a batch of ``batch``."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch,) + tuple(entry.input_shape)).astype(np.float32)
    labels = rng.integers(0, CLASSES, batch)
    if entry.loss.startswith("sparse"):
        y = labels.astype(np.int32)
    elif entry.loss == "categorical":
        y = np.eye(CLASSES, dtype=np.float32)[labels]
    else:
        y = rng.standard_normal((batch, CLASSES)).astype(np.float32)
    return [x, y]


def _activation(name):
    return lambda f: layers.Activation(name)(f)


IMAGE = (6, 6, 2)
VECTOR = (5,)

# The losses rotate down the list: each is used by about a quarter of the entries.
_ENTRIES = [
    ("dense", VECTOR, lambda f: layers.Dense(6)(f), {}),
    ("conv2d_same_bias", IMAGE, lambda f: layers.Conv2D(4, 3, padding="same")(f), {}),
    ("conv2d_valid_strides", IMAGE, lambda f: layers.Conv2D(4, 3, strides=2, padding="valid")(f), {}),
    ("conv2d_same_strides", IMAGE, lambda f: layers.Conv2D(4, 3, strides=2, padding="same", use_bias=False)(f), {}),
    ("conv2d_dilation", IMAGE, lambda f: layers.Conv2D(4, 2, dilation_rate=2, padding="same")(f), {}),
    ("depthwise_conv2d", IMAGE, lambda f: layers.DepthwiseConv2D(3, depth_multiplier=2, padding="same")(f), {}),
    ("separable_conv2d", IMAGE, lambda f: layers.SeparableConv2D(4, 3, padding="valid")(f), {}),
    ("conv2d_transpose", IMAGE, lambda f: layers.Conv2DTranspose(3, 3, strides=2, padding="same")(f), {}),
    ("batch_norm_training", IMAGE, lambda f: layers.BatchNormalization()(f), {"stem_bias": False}),
    ("batch_norm_inference", IMAGE, lambda f: layers.BatchNormalization()(f), {"training": False}),
    ("relu", VECTOR, lambda f: layers.ReLU()(f), {}),
    ("relu6", VECTOR, lambda f: layers.ReLU(max_value=6.0)(f), {}),
    ("leaky_relu", VECTOR, lambda f: layers.LeakyReLU(alpha=0.3)(f), {}),
    ("elu", VECTOR, lambda f: layers.ELU()(f), {}),
    ("sigmoid", VECTOR, _activation("sigmoid"), {}),
    ("tanh", VECTOR, _activation("tanh"), {}),
    ("softmax", VECTOR, _activation("softmax"), {}),
    ("softsign", VECTOR, _activation("softsign"), {}),
    ("selu", VECTOR, _activation("selu"), {}),
    ("gelu", VECTOR, _activation("gelu"), {}),
    ("swish", VECTOR, _activation("swish"), {}),
    ("max_pooling2d", IMAGE, lambda f: layers.MaxPooling2D(2)(f), {}),
    ("average_pooling2d", IMAGE, lambda f: layers.AveragePooling2D(3, strides=2, padding="same")(f), {}),
    ("global_average_pooling2d", IMAGE, lambda f: layers.GlobalAveragePooling2D()(f), {}),
    ("global_max_pooling2d", IMAGE, lambda f: layers.GlobalMaxPooling2D()(f), {}),
    ("upsampling2d_nearest", IMAGE, lambda f: layers.UpSampling2D(2, interpolation="nearest")(f), {}),
    ("upsampling2d_bilinear", IMAGE, lambda f: layers.UpSampling2D(2, interpolation="bilinear")(f), {}),
    ("zero_padding2d", IMAGE, lambda f: layers.ZeroPadding2D(((1, 0), (2, 1)))(f), {}),
    ("cropping2d", IMAGE, lambda f: layers.Cropping2D(((1, 0), (0, 2)))(f), {}),
    ("add", IMAGE, lambda f: layers.Add()([layers.Conv2D(3, 1)(f), f]), {}),
    ("concatenate", IMAGE, lambda f: layers.Concatenate()([layers.Conv2D(2, 1)(f), f]), {}),
    ("flatten", IMAGE, lambda f: layers.Flatten()(f), {}),
    ("reshape", VECTOR, lambda f: layers.Dense(4)(layers.Reshape((2, 4))(f)), {}),
]

ENTRIES = {
    name: Entry(name, shape, body, LOSSES[i % len(LOSSES)], **extra)
    for i, (name, shape, body, extra) in enumerate(_ENTRIES)
}
