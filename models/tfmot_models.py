"""Example models made with tensorflow-model-optimization (tfmot), as a user would make them.

* MobileNetV2 (tf_keras.applications, alpha 0.35, 96x96, ``weights=None``, 10 classes, seeded), trained in float
  on scikit-learn's digits (models/data.py), then wrapped by tfmot's ``quantize_model`` (its default 8-bit
  scheme) and fine-tuned quantization-aware: the usual QAT recipe, so that the weights, the batch-norm moving
  statistics and the quantization ranges are trained values. Three graphs (models/graphs.py): inference
  (``model(x, training=False)``), one training step (sparse softmax cross-entropy and the gradient of every
  trainable variable, ``training=True``, which also assigns the moving statistics and the ranges), and saliency
  (the gradient of each image's top class score with respect to the image, ``training=False``). The float
  network is the float control of the quantized training step.
* A small CNN whose Conv2D and Dense layers carry a custom tfmot ``QuantizeConfig`` (tfmot's own API:
  ``quantize_annotate_layer`` + ``quantize_apply`` under ``quantize_scope``): 4-bit weights
  (LastValueQuantizer, per tensor, symmetric) and 8-bit activations (MovingAverageQuantizer), trained
  quantization-aware on the digits at 16x16. tf2onnx 1.17
  cannot convert it correctly (models/run_all.py runs tf2onnx alone on the same signatures):
  - its FakeQuantWithMinMax{Args,Vars} handler rewrites the op to QuantizeLinear/DequantizeLinear and refuses
    num_bits != 8 and narrow_range; it has no handler for any FakeQuant gradient;
  - the inference graph converts only because grappler folds the 4-bit weight quantizers (constant kernel)
    into constants first, and the result is wrong: QuantizeLinear rounds half to even where TF's FakeQuant
    rounds half up on its nudged grid, so logits move by grid steps (trained network, 360 held-out digits: 44%
    of its logits bit-identical to TF's, max |err| 2.5, 359 of 360 predictions; docs/examples.md);
  - the training step fails ("Cannot find node with output ...SparseSoftmaxCrossEntropyWithLogits:1", and
    behind it the gradient ops, FakeQuantWithMinMaxVarsGradient among them).
  This project converts both bit-exactly or within the stated tolerances.
"""
from __future__ import annotations

import functools

import tensorflow as tf
import tf_keras
import tensorflow_model_optimization as tfmot

from models import data, graphs

SEED = 1234
MOBILENET_SHAPE = (96, 96, 3)
CNN_SHAPE = (16, 16, 3)
NUM_CLASSES = data.NUM_CLASSES
FIT_BATCH = 32
# Training on the digits (models/data.py): the float MobileNetV2 from its random initialization, then
# quantization-aware fine-tuning of quantize_model's copy; the 4-bit CNN quantization-aware from the start.
FLOAT_EPOCHS, FLOAT_LEARNING_RATE = 8, 2e-3
QAT_EPOCHS, QAT_LEARNING_RATE = 4, 5e-4
BATCH_NORM_MOMENTUM = 0.9
CNN_EPOCHS, CNN_LEARNING_RATE = 30, 5e-3

quant_keras = tfmot.quantization.keras


def loss_fn(labels, logits):
    return tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits)


def train(model, shape, epochs, learning_rate, seed=SEED):
    """``epochs`` epochs of Adam on scikit-learn's digits at ``shape`` (models/data.py), batches of
    ``FIT_BATCH``; the moving statistics and tfmot's ranges move with them."""
    optimizer = tf_keras.optimizers.Adam(learning_rate)

    @tf.function
    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    graphs.fit(step, data.digits(shape[0]), epochs, FIT_BATCH, seed)
    return model


def _mobilenet_v2():
    tf_keras.utils.set_random_seed(SEED)
    model = tf_keras.applications.MobileNetV2(
        input_shape=MOBILENET_SHAPE, alpha=0.35, weights=None, classes=NUM_CLASSES, classifier_activation=None
    )
    # tf_keras' MobileNetV2 builds its batch norms with momentum 0.999, made for ImageNet's long schedules: in
    # the few hundred steps here their moving statistics stay near (0, 1) and inference is at chance (11% held
    # out, measured). quantize_model copies the layers' configurations, so the QAT network inherits 0.9.
    for layer in model.layers:
        if isinstance(layer, tf_keras.layers.BatchNormalization):
            layer.momentum = BATCH_NORM_MOMENTUM
    return model


@functools.lru_cache(maxsize=None)
def float_mobilenet_v2():
    """The network trained in float (``FLOAT_EPOCHS``): the control for the quantized training step, and what
    ``quantized_mobilenet_v2`` starts from."""
    return train(_mobilenet_v2(), MOBILENET_SHAPE, FLOAT_EPOCHS, FLOAT_LEARNING_RATE)


def quantized_mobilenet_v2():
    """tfmot's ``quantize_model`` of the trained float network (it copies the weights), fine-tuned
    (``QAT_EPOCHS``): the usual quantization-aware training recipe."""
    return train(quant_keras.quantize_model(float_mobilenet_v2()), MOBILENET_SHAPE, QAT_EPOCHS, QAT_LEARNING_RATE)


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
    """Conv2D 3x3 (8, ReLU) -> Conv2D 3x3 stride 2 (16, ReLU) -> Conv2D 3x3 stride 2 (32, ReLU) -> global average
    pool -> Dense (10), the Conv2D and Dense layers annotated with FourBitWeightsConfig (the third convolution
    gives the pool features that see a whole stroke: 85% held out without it, 95% with it)."""
    tf_keras.utils.set_random_seed(SEED)
    annotate = quant_keras.quantize_annotate_layer
    config = FourBitWeightsConfig()
    layers = tf_keras.layers
    model = tf_keras.Sequential([
        layers.InputLayer(CNN_SHAPE),
        annotate(layers.Conv2D(8, 3, padding="same", activation="relu"), config),
        annotate(layers.Conv2D(16, 3, strides=2, padding="same", activation="relu"), config),
        annotate(layers.Conv2D(32, 3, strides=2, padding="same", activation="relu"), config),
        layers.GlobalAveragePooling2D(),
        annotate(layers.Dense(NUM_CLASSES), config),
    ])
    with quant_keras.quantize_scope({"FourBitWeightsConfig": FourBitWeightsConfig}):
        quantized = quant_keras.quantize_apply(quant_keras.quantize_annotate_model(model))
    return train(quantized, CNN_SHAPE, CNN_EPOCHS, CNN_LEARNING_RATE)
