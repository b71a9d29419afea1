"""The integer lowering on a depthwise convolution the layout optimizer leaves in NHWC.

A depthwise convolution takes NCHW from the NCHW->NHWC Transpose of a convolution before it, pushed down to it
(converters/layout.py). With nothing before it (a network's first layer, here of a single-channel image, where the
layout Transposes tf2onnx writes for one channel are Reshapes) it stays NHWC, and the integer lowering refused it
("not in NCHW after layout optimization"). It now writes it between Transposes to NCHW and back, its bias, batch
norm and a ZeroPadding2D before it read in NHWC, and ONNX Runtime still fuses it into QLinearConv.
"""
import numpy as np
import pytest
from integer_models import run_ort

pytestmark = pytest.mark.tensorflow

SIZE = 8
CASES = {  # (depth multiplier, batch norm, zero padding before it)
    "x1": (1, False, False),
    "x2": (2, False, False),
    "x1_batch_norm": (1, True, False),
    "x2_batch_norm": (2, True, False),
    "x2_zero_padding": (2, False, True),
}


def _build(case):
    """tfmot's quantize_model of Input(HxWx1) -> DepthwiseConv2D [-> BatchNormalization -> ReLU] -> Conv2D 1x1,
    trained a few steps on random data so its ranges and statistics move."""
    import tensorflow as tf
    import tensorflow_model_optimization as tfmot
    import tf_keras

    multiplier, batch_norm, padding = CASES[case]
    tf.keras.utils.set_random_seed(9)
    layers = tf_keras.layers
    x = inputs = tf_keras.Input((SIZE, SIZE, 1), name="images")
    if padding:
        x = layers.ZeroPadding2D(1)(x)
    x = layers.DepthwiseConv2D(3, padding="valid" if padding else "same", depth_multiplier=multiplier,
                               use_bias=not batch_norm)(x)
    if batch_norm:  # (a ReLU layer straight after the depthwise layer would cost it its weight quantizer in tfmot)
        x = layers.ReLU()(layers.BatchNormalization()(x))
    x = layers.Conv2D(3, 1)(x)
    model = tfmot.quantization.keras.quantize_model(tf_keras.Model(inputs, x))
    rng = np.random.default_rng(10)
    model.compile(tf_keras.optimizers.Adam(0.01), "mse")
    model.fit(rng.uniform(0, 1, (64, SIZE, SIZE, 1)).astype(np.float32),
              rng.normal(size=(64, SIZE, SIZE, 3)).astype(np.float32), batch_size=16, epochs=2, verbose=0)
    return model


@pytest.mark.parametrize("case", list(CASES))
def test_a_single_channel_depthwise_runs_in_integer(case):
    import tensorflow as tf

    import converters
    from converters.integer import read_summary
    from converters.integer.fusion import optimized_op_counts
    from converters.integer.per_tensor import verify_quantized_tensors
    from converters.integer.steps import judge_steps

    model = _build(case)
    onnx_model = converters.from_keras(model, lowering="integer")
    lines, steps = read_summary(onnx_model)
    assert "DepthwiseConv2dNative in integer: 1/1" in lines and "Conv in integer: 1/1" in lines, lines
    assert not any("float island" in line for line in lines), lines
    for level in ("extended", "all"):
        counts = optimized_op_counts(onnx_model, level)
        assert counts["QLinearConv"] == 2 and not counts["Conv"] and not counts["FusedConv"], (level, counts)

    images = np.random.default_rng(11).uniform(0, 1, (16, SIZE, SIZE, 1)).astype(np.float32)
    fn = tf.function(lambda images: model(images, training=False))
    per_tensor = verify_quantized_tensors(onnx_model, fn, {"images": images})
    assert per_tensor.ok and any("depthwise" in c.name or "re_lu" in c.name for c in per_tensor.checks), \
        per_tensor.table()
    end_to_end = judge_steps("output", fn(images).numpy(), run_ort(onnx_model, {"images": images})[0],
                             next(iter(steps.values())))
    assert end_to_end.max_steps <= 1, end_to_end
