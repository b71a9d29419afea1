"""A small quantization-aware depthwise-separable CNN, built from raw TF ops inside tf_keras layers.

The layers imitate what tfmot's ``quantize_model`` puts in a graph: activations go through
FakeQuantWithMinMaxVars (8 bits, narrow_range False, learned min/max), conv kernels through
FakeQuantWithMinMaxVarsPerChannel (narrow_range True, min/max set from the kernel's range and not
trained), the depthwise kernel through a per-tensor narrow-range FakeQuantWithMinMaxVars, and batch
norm is tf_keras' fused BatchNormalization. Its gradients are TF's own (ReluGrad, Conv2DBackpropFilter,
BiasAddGrad, SparseSoftmaxCrossEntropyWithLogits' backprop ...).

What it covers that the tfmot MobileNetV2 examples (models/tfmot_models.py) do not: a depthwise
convolution with channel multiplier 2 and stride 2 (DepthwiseConv2dNative and both backprops with M=2),
a per-tensor FakeQuantWithMinMaxVars on a depthwise kernel, and, in its float-activation variant
(cnn_train_step_float), a training step with no activation quantizer, whose float ops can be held to a
tight elementwise tolerance (quantized activations make that impossible, see models/run_all.py).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf
import tf_keras

IMAGE_SHAPE = (16, 16, 3)
NUM_CLASSES = 10


class ActivationQuant(tf_keras.layers.Layer):
    """FakeQuantWithMinMaxVars on activations with trainable min/max (8 bits, full range)."""

    def __init__(self, init_min=-6.0, init_max=6.0, learn_range=True, **kw):
        super().__init__(**kw)
        self.init_min, self.init_max, self.learn_range = init_min, init_max, learn_range

    def build(self, input_shape):
        def bound(name, value):
            init = tf_keras.initializers.Constant(value)
            return self.add_weight(name, shape=(), initializer=init, trainable=self.learn_range)

        self.min_var = bound("min", self.init_min)
        self.max_var = bound("max", self.init_max)

    def call(self, x):
        return tf.quantization.fake_quant_with_min_max_vars(x, self.min_var, self.max_var, num_bits=8, narrow_range=False)


class WeightQuantMixin:
    """Per-channel (last axis) weight fake quantization with min/max taken from the kernel, as tfmot's
    LastValueQuantizer does; the range variables are not trained."""

    def add_range(self, channels):
        self.w_min = self.add_weight("w_min", shape=(channels,), initializer="zeros", trainable=False)
        self.w_max = self.add_weight("w_max", shape=(channels,), initializer="zeros", trainable=False)

    def set_range_from_kernel(self):
        k = self.kernel.numpy().reshape(-1, self.kernel.shape[-1])
        self.w_min.assign(np.minimum(k.min(axis=0), 0.0))
        self.w_max.assign(np.maximum(k.max(axis=0), 0.0))

    def quantized_kernel(self):
        return tf.quantization.fake_quant_with_min_max_vars_per_channel(
            self.kernel, self.w_min, self.w_max, num_bits=8, narrow_range=True
        )


class QuantConv2D(WeightQuantMixin, tf_keras.layers.Layer):
    def __init__(self, filters, kernel_size, strides=1, **kw):
        super().__init__(**kw)
        self.filters, self.kernel_size, self.strides = filters, kernel_size, strides

    def build(self, input_shape):
        shape = (self.kernel_size, self.kernel_size, int(input_shape[-1]), self.filters)
        self.kernel = self.add_weight("kernel", shape=shape, initializer="glorot_uniform")
        self.add_range(self.filters)

    def call(self, x):
        return tf.nn.conv2d(x, self.quantized_kernel(), strides=self.strides, padding="SAME")


class QuantDepthwiseConv2D(tf_keras.layers.Layer):
    """DepthwiseConv2dNative with a per-tensor narrow-range fake-quantized kernel [3, 3, C, M]."""

    def __init__(self, strides=1, multiplier=1, **kw):
        super().__init__(**kw)
        self.strides, self.multiplier = strides, multiplier

    def build(self, input_shape):
        shape = (3, 3, int(input_shape[-1]), self.multiplier)
        self.kernel = self.add_weight("kernel", shape=shape, initializer="glorot_uniform")
        self.w_min = self.add_weight("w_min", shape=(), initializer="zeros", trainable=False)
        self.w_max = self.add_weight("w_max", shape=(), initializer="zeros", trainable=False)

    def set_range_from_kernel(self):
        k = self.kernel.numpy()
        self.w_min.assign(min(float(k.min()), 0.0))
        self.w_max.assign(max(float(k.max()), 0.0))

    def call(self, x):
        w = tf.quantization.fake_quant_with_min_max_vars(self.kernel, self.w_min, self.w_max, num_bits=8, narrow_range=True)
        s = self.strides
        return tf.nn.depthwise_conv2d(x, w, strides=[1, s, s, 1], padding="SAME")


class FusedBatchNorm(tf_keras.layers.BatchNormalization):
    """tf_keras' fused BatchNormalization (FusedBatchNormV3); in training it assigns the moving statistics."""

    def __init__(self, **kw):
        super().__init__(fused=True, **kw)


class ReLU(tf_keras.layers.Layer):
    def call(self, x):
        return tf.nn.relu(x)


class QuantDense(WeightQuantMixin, tf_keras.layers.Layer):
    def __init__(self, units, **kw):
        super().__init__(**kw)
        self.units = units

    def build(self, input_shape):
        self.kernel = self.add_weight("kernel", shape=(int(input_shape[-1]), self.units), initializer="glorot_uniform")
        self.bias = self.add_weight("bias", shape=(self.units,), initializer="zeros")
        self.add_range(self.units)

    def call(self, x):
        return tf.nn.bias_add(tf.matmul(x, self.quantized_kernel()), self.bias)


class QatCnn(tf_keras.Model):
    """input FQ -> Conv2D 3x3 (8) -> BN -> ReLU -> FQ -> depthwise 3x3 -> BN -> ReLU -> FQ
    -> Conv2D 1x1 (16) -> BN -> ReLU -> FQ -> depthwise 3x3 stride 2, multiplier 2 -> BN -> ReLU -> FQ
    -> global average pool -> Dense (10) -> FQ."""

    def __init__(self, quantize_activations=True, **kw):
        super().__init__(**kw)
        self.quantize_activations = quantize_activations
        self.blocks = [
            # The images' range is known, and nothing upstream could carry a gradient to it.
            ActivationQuant(0.0, 1.0, learn_range=False, name="input_quant"),
            QuantConv2D(8, 3, name="conv1"),
            FusedBatchNorm(name="bn1"),
            ReLU(name="relu1"),
            ActivationQuant(0.0, 6.0, name="act1"),
            QuantDepthwiseConv2D(1, 1, name="dw1"),
            FusedBatchNorm(name="bn2"),
            ReLU(name="relu2"),
            ActivationQuant(0.0, 6.0, name="act2"),
            QuantConv2D(16, 1, name="pw1"),
            FusedBatchNorm(name="bn3"),
            ReLU(name="relu3"),
            ActivationQuant(0.0, 6.0, name="act3"),
            QuantDepthwiseConv2D(2, 2, name="dw2"),
            FusedBatchNorm(name="bn4"),
            ReLU(name="relu4"),
            ActivationQuant(0.0, 6.0, name="act4"),
        ]
        self.head = QuantDense(NUM_CLASSES, name="dense")
        self.logits_quant = ActivationQuant(-8.0, 8.0, name="logits_quant")

    def call(self, x, training=False):
        for layer in self.blocks:
            if isinstance(layer, ActivationQuant) and layer.learn_range and not self.quantize_activations:
                continue  # the float-activation variant skips every activation quantizer but the input's
            x = layer(x, training=training) if isinstance(layer, FusedBatchNorm) else layer(x)
        x = tf.reduce_mean(x, axis=[1, 2])
        logits = self.head(x)
        return self.logits_quant(logits) if self.quantize_activations else logits

    def batch_norms(self):
        return [layer for layer in self.blocks if isinstance(layer, FusedBatchNorm)]

    def weight_quantized(self):
        return [layer for layer in self.blocks + [self.head] if hasattr(layer, "set_range_from_kernel")]


def cross_entropy(logits, labels):
    """Mean sparse softmax cross-entropy (SparseSoftmaxCrossEntropyWithLogits, both outputs in the step)."""
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
