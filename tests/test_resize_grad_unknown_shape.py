"""Graphgen finding: UpSampling2D -> ZeroPadding2D, converted as a saliency map with a None batch.

The Pad's gradient is a Slice whose size is computed, so tf2onnx does not know the H and W of the grads that
reach ResizeBilinearGrad / ResizeNearestNeighborGrad, and both lowerings refused the node. The handlers
(converters/gradients/resizing.py) now read H and W off the forward resize of the same graph (bilinear: the one
whose input is the gradient's original_image; nearest: every one from the gradient's size, all agreeing).
Judged end to end and per node against TF, with the verifiers' default tolerances.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import converters

pytestmark = pytest.mark.tensorflow

SHAPE = (3, 3, 2)


def _saliency(interpolation):
    import tf_keras

    tf_keras.utils.set_random_seed(0)
    inputs = tf_keras.Input(SHAPE)
    x = tf_keras.layers.UpSampling2D(2, interpolation=interpolation)(inputs)
    x = tf_keras.layers.ZeroPadding2D(((1, 0), (2, 1)))(x)
    model = tf_keras.Model(inputs, tf_keras.layers.Dense(4)(tf_keras.layers.Flatten()(x)))

    @tf.function
    def saliency(images):
        with tf.GradientTape() as tape:
            tape.watch(images)
            logits = model(images, training=False)
            top = tf.reduce_max(logits, axis=-1)
        return {"logits": logits, "saliency": tape.gradient(top, images)}

    return saliency


@pytest.mark.parametrize("lowering", ("custom", "standard"))
@pytest.mark.parametrize("interpolation", ("bilinear", "nearest"))
def test_resize_grad_after_zero_padding_saliency(interpolation, lowering):
    fn = _saliency(interpolation)
    spec = [tf.TensorSpec((None,) + SHAPE, tf.float32, name="images")]
    onnx_model = converters.from_function(fn, spec, lowering=lowering)
    grads = {"bilinear": "ResizeBilinearGrad", "nearest": "ResizeNearestNeighborGrad"}[interpolation]
    assert grads in str(fn.get_concrete_function(*spec).graph.as_graph_def())
    inputs = [np.random.default_rng(0).standard_normal((2,) + SHAPE).astype(np.float32)]
    end_to_end = converters.verify(onnx_model, fn, inputs=inputs, print_table=False, spread=False)
    assert end_to_end.ok, end_to_end.table()
    per_node = converters.verify_nodes(onnx_model, fn, inputs=inputs, print_table=False)
    assert per_node.ok, per_node.table()
