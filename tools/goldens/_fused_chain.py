"""TensorFlow's side of the fused ops (ort_ops/specs/fused.py), which TF has no op for: the chain of TF ops
each one fuses. ``tf_op`` is TF's computation of any op of the domain (its raw op, or for a fused op its
chain), which the golden generators (_common.run_tf), the fuzzer's oracle and reproducers (tools/fuzz/) and
the CPU benchmark (benchmarks/bench_ops.py) all call. TF's kernel set is the caller's to pin
(TF_ENABLE_ONEDNN_OPTS).
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


def tf_op(op: str, values, attrs: dict) -> list:
    """TF's outputs of domain op ``op`` (a list of tensors) on ``values`` in the spec's input order: tf.raw_ops.<op>
    called with the spec's input names, or a fused op's chain. ``values`` are passed as they are (tensors, or
    NumPy arrays that a raw op converts to the types it expects); a fused op's chain gets tensors."""
    import tensorflow as tf

    import ort_ops

    spec = ort_ops.get_spec(op)
    if spec.family == "fused":
        return [chain(op, [v if tf.is_tensor(v) else tf.constant(np.asarray(v)) for v in values], attrs)]
    out = getattr(tf.raw_ops, op)(**{p.name: v for p, v in zip(spec.inputs, values)}, **attrs)
    return list(out) if isinstance(out, (list, tuple)) else [out]
