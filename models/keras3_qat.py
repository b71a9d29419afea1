"""A small quantization-aware CNN written for Keras 3 (``import keras``, the TensorFlow backend).

TF 2.21's default ``keras`` is Keras 3; the other examples use tf_keras and tfmot, which Keras 3 models cannot
use. This network quantizes with Keras 3's own API, ``keras.quantizers.fake_quant_with_min_max_vars``, which
on the TensorFlow backend emits TF's FakeQuantWithMinMaxVars (per tensor) or FakeQuantWithMinMaxVarsPerChannel
(per channel) and whose gradients are TF's FakeQuant*Gradient ops. The layers below are small Keras 3 layers:

* ``FakeQuantActivation``: 8-bit, full range (narrow_range False), per tensor; its ``range_min`` and
  ``range_max`` are trainable scalar variables (initial range given per layer).
* ``QuantConv2D``, ``QuantDepthwiseConv2D``, ``QuantDense``: the layer's float kernel is fake-quantized to
  4 bits, narrow range (levels 1..15), per output channel, before it is used; the per-channel
  ``kernel_min`` and ``kernel_max`` are trainable variables that start at -max|kernel| and +max|kernel| of
  their channel. The channel axis is the kernel's last for Conv2D ([kh, kw, in, out]) and Dense ([in, out]),
  and axis 2 (the input channel) for the depthwise kernel [kh, kw, channels, 1]; Keras 3 quantizes an axis
  other than the last by swapping it to the end and back (two Transposes around the op).
* Keras 3's own BatchNormalization (not fused on this backend: moments, then scale and shift), ReLU with
  max_value 6 (TF's Relu6), MaxPooling2D and GlobalAveragePooling2D.

Network (images 32x32x3 in [0, 1], 10 classes):
    input quant [0, 1] -> Conv2D 3x3 (16) -> BN -> ReLU6 -> quant [0, 2] -> MaxPool 4x4
    -> DepthwiseConv2D 3x3 -> BN -> ReLU6 -> quant -> Conv2D 1x1 (32) -> BN -> ReLU6 -> quant
    -> global average pool -> Dense (10, bias) -> quant [-2, 2] = logits
(the quantizers' initial ranges; ACTIVATION_INIT_MAX says why they are narrower than ReLU6's).

``trained_graphs`` trains it on scikit-learn's digits (models/data.py) and gives ``models.graphs.ClassifierGraphs``
with a Keras 3 optimizer (SGD with momentum): the three signatures of models/keras3_qat/saved_model,
``serving_default`` (logits, training=False), ``train_step`` (loss and the gradient of every trainable variable,
then the optimizer applies them: it assigns the weights, the quantizer ranges, the momentum slots and its
iteration count, and training-mode batch norm assigns the moving statistics) and ``saliency`` (logits and
d(top class score)/d(images), training=False).
"""
from __future__ import annotations

import keras
from keras import ops

from models import data, graphs

SEED = 1234
IMAGE_SHAPE = (32, 32, 3)
NUM_CLASSES = data.NUM_CLASSES
TRAIN_BATCH = 8
EPOCHS = 20
# A 4x4 max pool before the depthwise convolution: a digit's strokes span the global average pool's
# features only with that reach (2x2: 62% held out, 4x4: 82% after 10 epochs).
POOL = 4
ACTIVATION_BITS = 8
WEIGHT_BITS = 4
# A range's gradient is the sum of the upstream gradient over the elements beyond it (TF's
# FakeQuantWithMinMaxVarsGradient), so a range that holds every value never learns. The untrained network's
# ReLU6 outputs reach 4-5 but only ~3% pass 2, and its training logits span about [-1.5, 4]: the activation
# ranges start at [0, 2] and the logits' at [-2, 2], so that their upper ends learn (the lower end of a range
# after a ReLU, and the images' [0, 1], never have an element beyond them: their gradients are 0).
ACTIVATION_INIT_MAX = 2.0
LOGITS_INIT_RANGE = 2.0


@keras.saving.register_keras_serializable(package="models.keras3_qat")
class FakeQuantActivation(keras.layers.Layer):
    """y = fake_quant_with_min_max_vars(x, range_min, range_max): 8 bits, per tensor, trainable range."""

    def __init__(self, init_min=0.0, init_max=6.0, **kwargs):
        super().__init__(**kwargs)
        self.init_min, self.init_max = float(init_min), float(init_max)

    def build(self, input_shape):
        self.range_min = self.add_weight(
            name="range_min", shape=(), initializer=keras.initializers.Constant(self.init_min), trainable=True
        )
        self.range_max = self.add_weight(
            name="range_max", shape=(), initializer=keras.initializers.Constant(self.init_max), trainable=True
        )

    def call(self, x):
        return keras.quantizers.fake_quant_with_min_max_vars(
            x, self.range_min, self.range_max, num_bits=ACTIVATION_BITS, narrow_range=False
        )

    def get_config(self):
        return {**super().get_config(), "init_min": self.init_min, "init_max": self.init_max}


class _PerChannelKernelQuant:
    """Adds trainable per-channel [kernel_min, kernel_max] (initially -/+ max|kernel| of each channel along
    ``channel_axis``) and fake-quantizes the kernel with them: 4 bits, narrow range."""

    channel_axis = -1

    def add_kernel_range(self):
        axis = self.channel_axis % len(self.kernel.shape)
        others = tuple(i for i in range(len(self.kernel.shape)) if i != axis)
        kernel = self.kernel

        def bound(sign):
            return lambda shape, dtype=None: sign * ops.max(ops.abs(ops.convert_to_tensor(kernel)), axis=others)

        channels = (self.kernel.shape[axis],)
        self.kernel_min = self.add_weight(name="kernel_min", shape=channels, initializer=bound(-1.0), trainable=True)
        self.kernel_max = self.add_weight(name="kernel_max", shape=channels, initializer=bound(1.0), trainable=True)

    def quantized_kernel(self):
        return keras.quantizers.fake_quant_with_min_max_vars(
            self.kernel, self.kernel_min, self.kernel_max, num_bits=WEIGHT_BITS, narrow_range=True,
            axis=self.channel_axis,
        )


@keras.saving.register_keras_serializable(package="models.keras3_qat")
class QuantConv2D(_PerChannelKernelQuant, keras.layers.Layer):
    """Conv2D, 'same' padding, no bias (a batch norm follows), 4-bit per-output-channel kernel."""

    def __init__(self, filters, kernel_size, strides=1, **kwargs):
        super().__init__(**kwargs)
        self.filters, self.kernel_size, self.strides = filters, kernel_size, strides

    def build(self, input_shape):
        shape = (self.kernel_size, self.kernel_size, int(input_shape[-1]), self.filters)
        self.kernel = self.add_weight(name="kernel", shape=shape, initializer="glorot_uniform")
        self.add_kernel_range()

    def call(self, x):
        return ops.conv(x, self.quantized_kernel(), strides=self.strides, padding="same")

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "kernel_size": self.kernel_size,
                "strides": self.strides}


@keras.saving.register_keras_serializable(package="models.keras3_qat")
class QuantDepthwiseConv2D(_PerChannelKernelQuant, keras.layers.Layer):
    """DepthwiseConv2D (multiplier 1), 'same' padding, no bias, 4-bit kernel quantized per input channel."""

    channel_axis = 2

    def __init__(self, kernel_size=3, strides=1, **kwargs):
        super().__init__(**kwargs)
        self.kernel_size, self.strides = kernel_size, strides

    def build(self, input_shape):
        shape = (self.kernel_size, self.kernel_size, int(input_shape[-1]), 1)
        self.kernel = self.add_weight(name="kernel", shape=shape, initializer="glorot_uniform")
        self.add_kernel_range()

    def call(self, x):
        return ops.depthwise_conv(x, self.quantized_kernel(), strides=self.strides, padding="same")

    def get_config(self):
        return {**super().get_config(), "kernel_size": self.kernel_size, "strides": self.strides}


@keras.saving.register_keras_serializable(package="models.keras3_qat")
class QuantDense(_PerChannelKernelQuant, keras.layers.Layer):
    """Dense with bias, 4-bit per-output-unit kernel."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        self.kernel = self.add_weight(name="kernel", shape=(int(input_shape[-1]), self.units),
                                      initializer="glorot_uniform")
        self.bias = self.add_weight(name="bias", shape=(self.units,), initializer="zeros")
        self.add_kernel_range()

    def call(self, x):
        return ops.add(ops.matmul(x, self.quantized_kernel()), self.bias)

    def get_config(self):
        return {**super().get_config(), "units": self.units}


def build_model() -> keras.Model:
    """The network of the module docstring, seeded (keras.utils.set_random_seed), not trained."""
    keras.utils.set_random_seed(SEED)
    layers = keras.layers

    def conv_block(x, conv, name):
        x = conv(x)
        # momentum 0.9: a few hundred training steps move the moving statistics to the data's.
        x = layers.BatchNormalization(momentum=0.9, name=f"{name}_bn")(x)
        x = layers.ReLU(max_value=6.0, name=f"{name}_relu6")(x)
        return FakeQuantActivation(0.0, ACTIVATION_INIT_MAX, name=f"{name}_quant")(x)

    images = keras.Input(IMAGE_SHAPE, name="images")
    x = FakeQuantActivation(0.0, 1.0, name="input_quant")(images)
    x = conv_block(x, QuantConv2D(16, 3, name="conv1"), "conv1")
    x = layers.MaxPooling2D(POOL, name="pool")(x)
    x = conv_block(x, QuantDepthwiseConv2D(3, name="dw"), "dw")
    x = conv_block(x, QuantConv2D(32, 1, name="pw"), "pw")
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    x = QuantDense(NUM_CLASSES, name="head")(x)
    logits = FakeQuantActivation(-LOGITS_INIT_RANGE, LOGITS_INIT_RANGE, name="logits_quant")(x)
    return keras.Model(images, logits, name="keras3_qat")


def loss_fn(labels, logits):
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits)


def trained_graphs(epochs=EPOCHS) -> graphs.ClassifierGraphs:
    """The seeded model after ``epochs`` epochs on scikit-learn's digits (models/data.py) by the train_step
    signature itself (its optimizer: Keras 3 SGD with momentum), so that moving statistics, ranges, weights and
    the optimizer's momentum slots have all moved from their initial values."""
    model = build_model()
    optimizer = keras.optimizers.SGD(learning_rate=0.02, momentum=0.9)
    trained = graphs.ClassifierGraphs(model, IMAGE_SHAPE, loss_fn, optimizer=optimizer, train_batch=TRAIN_BATCH)
    graphs.fit(trained.train_step, data.digits(IMAGE_SHAPE[0]), epochs, TRAIN_BATCH, SEED)
    return trained
