"""The integer lowering on what lies between its patterns: a Pad that keeps a grid (ResNet's stem), and the float
islands (a convolution whose input no quantizer ends, the batch norm after it, a depthwise one), judged against TF.
"""
import numpy as np
import pytest
from integer_models import run_ort

pytestmark = pytest.mark.tensorflow


@pytest.fixture(scope="module")
def resnet_stem():
    """tfmot's quantize_model of ResNet50's stem and first block: Conv + BN + ReLU, ZeroPadding2D, MaxPool (both
    on the ReLU's grid), two convolutions reading the pool, a residual Add + ReLU, the head."""
    import tensorflow as tf
    import tensorflow_model_optimization as tfmot
    import tf_keras

    tf.keras.utils.set_random_seed(11)
    layers = tf_keras.layers
    x = inputs = tf_keras.Input((20, 20, 3), name="images")
    x = layers.ZeroPadding2D(3)(x)
    x = layers.Conv2D(8, 7, strides=2)(x)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)
    x = layers.ZeroPadding2D(1)(x)
    x = pooled = layers.MaxPooling2D(3, strides=2)(x)
    shortcut = layers.BatchNormalization()(layers.Conv2D(16, 1)(pooled))
    x = layers.Activation("relu")(layers.BatchNormalization()(layers.Conv2D(16, 3, padding="same")(x)))
    x = layers.BatchNormalization()(layers.Conv2D(16, 1)(x))
    x = layers.Activation("relu")(layers.Add()([shortcut, x]))
    x = layers.Dense(4)(layers.GlobalAveragePooling2D()(x))
    model = tfmot.quantization.keras.quantize_model(tf_keras.Model(inputs, x))
    rng = np.random.default_rng(0)
    model.compile(tf_keras.optimizers.SGD(0.01), tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(rng.uniform(-1, 1, (64, 20, 20, 3)).astype(np.float32), rng.integers(0, 4, 64), batch_size=16,
              verbose=0)
    return model


def test_a_pad_and_maxpool_on_a_grid_keep_resnets_stem_in_integer(resnet_stem):
    import tensorflow as tf

    import converters
    from converters.integer import read_summary
    from converters.integer.fusion import optimized_op_counts
    from converters.integer.per_tensor import verify_quantized_tensors
    from converters.integer.steps import judge_steps

    model = converters.from_keras(resnet_stem, lowering="integer")
    lines, steps = read_summary(model)
    assert "Conv in integer: 4/4" in lines and "MatMul in integer: 1/1" in lines, lines
    assert not any("float island" in line for line in lines), lines
    counts = optimized_op_counts(model)
    assert counts["QLinearConv"] == 4 and counts["QLinearAdd"] == 1 and counts["QGemm"] == 1, counts
    assert not any(counts.get(op) for op in ("Conv", "FusedConv", "Gemm", "MatMul")), counts
    images = np.random.default_rng(1).uniform(-1, 1, (16, 20, 20, 3)).astype(np.float32)
    check = judge_steps("logits", resnet_stem(images, training=False).numpy(), run_ort(model, {"images": images})[0],
                        next(iter(steps.values())))
    assert check.ok and check.max_steps <= 2, check
    fn = tf.function(lambda images: resnet_stem(images, training=False))
    report = verify_quantized_tensors(model, fn, {"images": images})
    assert report.ok and len(report.checks) >= 7, report.table()


def test_a_pad_off_the_grid_is_not_given_the_grid():
    """A constant pad whose value is no grid point would change TF's values if quantized on the grid: the Pad stays
    float, the convolution after it a named float island, and the result is TF's."""
    import tensorflow as tf

    import converters
    from converters.integer import read_summary

    w = tf.constant(np.random.default_rng(2).normal(0, 0.3, (3, 3, 2, 3)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([1, 6, 6, 2], tf.float32, name="x")])
    def f(x):
        xq = tf.quantization.fake_quant_with_min_max_args(x, -1.0, 1.0)
        padded = tf.pad(xq, [[0, 0], [1, 1], [1, 1], [0, 0]], constant_values=0.3)  # between grid points
        wq = tf.quantization.fake_quant_with_min_max_vars_per_channel(w, -tf.ones(3), tf.ones(3))
        y = tf.nn.conv2d(padded, wq, 1, "VALID")
        return tf.quantization.fake_quant_with_min_max_args(y, -4.0, 4.0)

    model = converters.from_function(f, f.input_signature, lowering="integer")
    lines = read_summary(model)[0]
    assert any("float island" in line and "not quantized" in line for line in lines), lines
    x = np.random.default_rng(3).uniform(-1, 1, (1, 6, 6, 2)).astype(np.float32)
    step = 8.0 / 255
    ours, tf_out = run_ort(model, {"x": x})[0], f(tf.constant(x)).numpy()
    assert np.abs(ours - tf_out).max() <= step * 1.0001, np.abs(ours - tf_out).max() / step


def test_float_islands_keep_their_batch_norm_and_depthwise_in_float():
    """A convolution and a depthwise convolution on an unquantized input stay float with TF's fake-quantized
    weights, the batch norm after the first in float (x - mean) * k + offset; the summary names all three."""
    import tensorflow as tf

    import converters
    from converters.integer import read_summary

    rng = np.random.default_rng(4)
    w = tf.constant(rng.normal(0, 0.3, (3, 3, 3, 4)).astype(np.float32))
    dw = tf.constant(rng.normal(0, 0.3, (3, 3, 4, 1)).astype(np.float32))
    gamma, beta = tf.constant([1.5, -0.7, 0.3, 1.0]), tf.constant([0.1, 0.2, -0.3, 0.0])
    mean, var = tf.constant([0.2, -0.1, 0.0, 0.5]), tf.constant([0.5, 2.0, 1.0, 0.1])

    @tf.function(input_signature=[tf.TensorSpec([2, 8, 8, 3], tf.float32, name="x")])
    def f(x):
        wq = tf.quantization.fake_quant_with_min_max_vars_per_channel(w, -tf.ones(4), tf.ones(4))
        y = tf.nn.conv2d(x, wq, 1, "SAME")
        y = tf.compat.v1.nn.fused_batch_norm(y, gamma, beta, mean=mean, variance=var, is_training=False)[0]
        dwq = tf.quantization.fake_quant_with_min_max_vars_per_channel(dw, -tf.ones(1), tf.ones(1))
        y = tf.nn.depthwise_conv2d(tf.nn.relu(y), dwq, [1, 1, 1, 1], "SAME")
        return tf.quantization.fake_quant_with_min_max_args(y, -6.0, 6.0)

    model = converters.from_function(f, f.input_signature, lowering="integer")
    islands = next(line for line in read_summary(model)[0] if "float island" in line)
    assert "3 float island(s)" in islands and "FusedBatchNorm" in islands and "DepthwiseConv2dNative" in islands
    x = rng.uniform(-1, 1, (2, 8, 8, 3)).astype(np.float32)
    ours, tf_out = run_ort(model, {"x": x})[0], f(tf.constant(x)).numpy()
    step = 12.0 / 255
    # Float convolutions and batch norm in other summation orders than TF's: at most a flip at a near-tie.
    assert np.abs(ours - tf_out).max() <= step * 1.0001 and np.mean(ours == tf_out) > 0.99
