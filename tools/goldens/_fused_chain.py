"""TensorFlow's side of the fused ops (ort_ops/specs/fused.py), which TF has no op for: the chain of TF ops
each one fuses, on NumPy inputs. The golden generator (gen_fused.py) and the fuzzer's oracle
(tools/fuzz/child.py) both run it. TF's kernel set is the caller's to pin (TF_ENABLE_ONEDNN_OPTS).
"""
from __future__ import annotations

import math

import numpy as np


def chain(op: str, tensors, attrs: dict):
    """``op``'s chain of TF ops on TF tensors (usable inside a tf.function); returns its output tensor."""
    import tensorflow as tf

    if op != "FusedBatchNormClipFakeQuant":
        raise KeyError(f"{op} is not a fused op")
    x, scale, offset, mean, variance, mn, mx = tensors
    lo, hi = attrs.get("clip_min", -math.inf), attrs.get("clip_max", math.inf)
    y = tf.raw_ops.FusedBatchNormV3(x=x, scale=scale, offset=offset, mean=mean, variance=variance,
                                    epsilon=attrs.get("epsilon", 1e-4), exponential_avg_factor=1.0,
                                    data_format=attrs.get("data_format", "NHWC"), is_training=False)[0]
    if (lo, hi) == (0.0, 6.0):
        y = tf.raw_ops.Relu6(features=y)  # what TF's graphs have; the converter makes a Clip of it
    else:
        if lo != -math.inf:
            y = tf.raw_ops.Maximum(x=y, y=tf.constant(np.float32(lo)))
        if hi != math.inf:
            y = tf.raw_ops.Minimum(x=y, y=tf.constant(np.float32(hi)))
    bits = {"num_bits": attrs.get("num_bits", 8), "narrow_range": bool(attrs.get("narrow_range", False))}
    if attrs.get("fake_quant", "FakeQuantWithMinMaxVars") == "FakeQuantWithMinMaxArgs":
        # Args takes its range as attributes: Python floats, known when the graph is built.
        return tf.raw_ops.FakeQuantWithMinMaxArgs(inputs=y, min=float(tf.get_static_value(mn)),
                                                  max=float(tf.get_static_value(mx)), **bits)
    return tf.raw_ops.FakeQuantWithMinMaxVars(inputs=y, min=mn, max=mx, **bits)


def run_chain(op: str, inputs, attrs: dict) -> list:
    """The outputs of ``op``'s chain as NumPy arrays; raises whatever TF raises for inputs it rejects."""
    import tensorflow as tf

    return [chain(op, [tf.constant(np.asarray(v)) for v in inputs], attrs).numpy()]
