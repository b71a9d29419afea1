"""What every example classifier is converted as, written once: its signatures and its training loop.

``ClassifierGraphs`` gives a Keras model's (tf_keras or Keras 3) three graphs as tf.functions for one SavedModel:

* ``serve``: images -> ``logits``, ``training=False``;
* ``train_step``: images, labels -> ``loss`` and the gradient of every trainable variable, named as the converter
  names them (``converters.keras_models.gradient_output_name``), with ``training=True`` (which assigns batch
  norms' moving statistics and tfmot's ranges); with an optimizer, it then applies the gradients too;
* ``saliency``: images -> ``logits`` and ``saliency``, d(top class score)/d(images), ``training=False``.

``fit`` trains a model on a ``models.data.Split`` (seeded shuffles, mini-batches) with any step function and
``accuracy`` measures held-out accuracy, so that every example is trained the same way on real data.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from converters.keras_models import gradient_output_name
from models import data

TRAIN_BATCH = 8


class _Untracked:
    """Holds the Keras model out of the SavedModel's object graph: tracking it would also serialize every
    layer's own traced call functions (9.5 MB for MobileNetV2) that nobody converts."""

    def __init__(self, model):
        self.model = model


class ClassifierGraphs(tf.Module):
    """The inference, training-step and saliency functions of one Keras classifier (see the module docstring).

    ``loss(labels, logits)`` is the training loss; ``optimizer``, when given, is applied by ``train_step`` and
    saved with it (its slots and iteration count are variables the step assigns)."""

    def __init__(self, model, image_shape, loss, optimizer=None, train_batch=TRAIN_BATCH):
        super().__init__()
        self._keras = _Untracked(model)
        # The signatures capture these; the SavedModel needs them reachable from its root.
        self.model_variables = list(model.variables)
        self.optimizer = optimizer
        self._loss = loss
        images = tf.TensorSpec((None,) + tuple(image_shape), tf.float32, name="images")
        train_images = tf.TensorSpec((train_batch,) + tuple(image_shape), tf.float32, name="images")
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
            loss = self._loss(labels, self.model(images, training=True))
        grads = tape.gradient(loss, variables)
        if self.optimizer is not None:
            self.optimizer.apply_gradients(zip(grads, variables))
        out, taken = {"loss": loss}, set()
        out.update({gradient_output_name(v, taken): g for v, g in zip(variables, grads)})
        return out

    def _saliency(self, images):
        with tf.GradientTape() as tape:
            tape.watch(images)
            logits = self.model(images, training=False)
            top_scores = tf.reduce_max(logits, axis=-1)
        return {"logits": logits, "saliency": tape.gradient(top_scores, images)}

    def signatures(self):
        return {"serving_default": self.serve, "train_step": self.train_step, "saliency": self.saliency}


def fit(step, split, epochs: int, batch: int, seed: int, after_step=None) -> None:
    """``epochs`` passes over ``split``'s training images in seeded shuffles, ``step(images, labels)`` on each
    full mini-batch of ``batch`` (the rest of a shuffle is left for the next epoch's); ``after_step()`` after each."""
    rng = np.random.default_rng(seed)
    n = len(split.train_labels)
    for _ in range(epochs):
        order = rng.permutation(n)
        for start in range(0, n - batch + 1, batch):
            index = order[start:start + batch]
            step(tf.constant(split.train_images[index]), tf.constant(split.train_labels[index]))
            if after_step is not None:
                after_step()


def predict(serve, images: np.ndarray) -> np.ndarray:
    """Logits of ``serve`` (images -> {"logits"} or a tensor) over ``images`` in batches."""

    def logits(batch):
        result = serve(tf.constant(batch))
        return result["logits"] if isinstance(result, dict) else result

    return data.in_batches(logits, images)


def accuracy(serve, images: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(predict(serve, images).argmax(axis=-1) == labels))
