"""Issue 11's quantization edges through the standard lowering, against live TensorFlow, bit for bit:
subnormal gradients (flushed inside the range, copied unflushed for a min == max == 0 range) and
subnormal Args bounds (rejected at conversion as TF rejects them at run time)."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from comparison import assert_bits_equal
from converters.errors import LoweringError
from test_standard_lowering import Runner, convert

pytestmark = pytest.mark.tensorflow

F32 = np.float32
SUBNORMAL_G = F32([1e-45, -1e-40, 1.0, -1e-45, 1e-39])
X = F32([0.5, 0.5, 5.0, -5.0, 0.5])


def test_fake_quant_gradients_flush_subnormal_gradients_like_tf():
    ranges = [(-1.0, 1.0), (0.0, 0.0), (-1e-40, 1e-40)]

    def fn(g, x):
        outs = [tf.raw_ops.FakeQuantWithMinMaxArgsGradient(gradients=g, inputs=x, min=-1.0, max=1.0)]
        for mn, mx in ranges:
            outs += list(tf.raw_ops.FakeQuantWithMinMaxVarsGradient(gradients=g, inputs=x, min=F32(mn), max=F32(mx)))
        g2, x2 = tf.stack([g] * 3, axis=-1), tf.stack([x] * 3, axis=-1)
        mins, maxs = F32([r[0] for r in ranges]), F32([r[1] for r in ranges])
        outs += list(tf.raw_ops.FakeQuantWithMinMaxVarsPerChannelGradient(gradients=g2, inputs=x2, min=mins, max=maxs))
        return outs

    run = Runner(fn, [tf.TensorSpec([5], tf.float32)] * 2)
    got, expected = run.both(SUBNORMAL_G, X)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert_bits_equal(b, a, f"output {i}")
    # the case discriminates: TF's first output flushes the subnormal gradients to signed zeros
    assert expected[0][0] == 0 and np.signbit(expected[0][1]) and expected[0][1] == 0


@pytest.mark.parametrize("op", ["FakeQuantWithMinMaxArgs", "FakeQuantWithMinMaxArgsGradient"])
def test_subnormal_args_bounds_are_a_conversion_error(op):
    def fn(x):
        if op.endswith("Gradient"):
            return tf.raw_ops.FakeQuantWithMinMaxArgsGradient(gradients=x, inputs=x, min=-1e-38, max=1e-38)
        return tf.raw_ops.FakeQuantWithMinMaxArgs(inputs=x, min=-1e-38, max=1e-38)

    with pytest.raises(tf.errors.InvalidArgumentError, match="-0 >= 0"):
        fn(tf.constant(X))
    with pytest.raises(LoweringError, match="min has to be smaller than max, was: -0 >= 0"):
        convert(fn, [tf.TensorSpec([5], tf.float32)])


def _zero_heavy(rng, dtype, n):
    """+0, -0, negatives and subnormals: data ranges whose max (or min) is a zero of either sign."""
    tiny = np.finfo(dtype).smallest_subnormal
    return rng.choice(np.array([0.0, -0.0, -20.0, -3.0, tiny, -tiny, 7.0], dtype), size=n, p=[.3, .3, .14, .1, .06, .06, .04])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_quantize_and_dequantize_zero_extremes_keep_tf_signs(dtype):
    """Per tensor (Eigen's packet order) and per axis (its scan order), on an unsigned grid, where the sign of
    a zero extreme becomes every output zero's sign. Many lengths, so every part of the packet order shows."""
    lengths = [1, 3, 4, 8, 9, 31, 32, 33, 40, 67, 130]
    configs = [dict(signed_input=False, num_bits=8), dict(signed_input=True, num_bits=8)]

    def fn(*xs):
        outs = []
        for x in xs[:-1]:
            for c in configs:
                outs.append(tf.raw_ops.QuantizeAndDequantizeV2(input=x, input_min=dtype(0), input_max=dtype(0), **c))
        x3 = xs[-1]
        for axis in (0, 1, 2):
            depth = (3, 4, 5)[axis]
            zeros = tf.zeros([depth], x3.dtype)
            outs.append(tf.raw_ops.QuantizeAndDequantizeV4(input=x3, input_min=zeros, input_max=zeros, axis=axis,
                                                           signed_input=False, num_bits=8))
        return outs

    tf_dtype = tf.as_dtype(dtype)
    run = Runner(fn, [tf.TensorSpec([n], tf_dtype) for n in lengths] + [tf.TensorSpec([3, 4, 5], tf_dtype)])
    rng = np.random.default_rng(11)
    mismatched_signs = 0
    for trial in range(6):
        args = [_zero_heavy(rng, dtype, n) for n in lengths] + [_zero_heavy(rng, dtype, 60).reshape(3, 4, 5)]
        got, expected = run.both(*args)
        for i, (a, b) in enumerate(zip(got, expected)):
            assert_bits_equal(b, a, f"trial {trial} output {i}")
        # the check discriminates: plain ReduceMax picks differ from TF's sign somewhere
        for x in args[:-1]:
            flushed = np.where(np.abs(x) < np.finfo(dtype).tiny, x * 0, x)
            if flushed.max() == 0 and np.signbit(np.max(flushed)) != np.signbit(flushed[flushed == 0][0]):
                mismatched_signs += 1
    assert mismatched_signs > 0
