"""Issue 11's quantization edges through the standard lowering, against live TensorFlow, bit for bit:
subnormal gradients (flushed inside the range, copied unflushed for a min == max == 0 range) and
subnormal Args bounds (rejected at conversion as TF rejects them at run time)."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from converters.errors import LoweringError
from test_standard_lowering import Runner, assert_bits_equal, convert

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
        assert_bits_equal(a, b, f"output {i}")
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
