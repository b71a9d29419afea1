"""Models written by plain tf2onnx with custom_ops (its --custom-ops option) run with our library unchanged.

tf2onnx passes a TF op listed in custom_ops through as a node of the given domain with the TF op name,
the TF inputs and the TF attributes (type attributes dropped, strings as bytes, lists as INTS, an
empty list such as explicit_paddings as an empty INTS). The library must accept exactly that. Outputs
are compared to TF: quantization ops bit-exact, the others within converters.verify's float32
tolerance (rtol 1e-5 + 1e-5 * max|TF|; oneDNN sums in another order).

tf2onnx's QuantizeAndDequantizeV2/3/4 rewriter runs before custom_ops are consulted, so those three
never reach the custom domain through plain tf2onnx (the last test pins that fact: it is why the
`converters` package exists); their gradient QuantizeAndDequantizeV4Grad does pass through.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tf2onnx
from onnx import helper

from backends import library_session
from converters.verification import compare_output
from ort_ops.schemas import DOMAIN

pytestmark = pytest.mark.tensorflow

rng = np.random.default_rng(99)


def _n(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def _quant_x(shape):
    x = np.linspace(-2.5, 2.5, int(np.prod(shape))).astype(np.float32)
    x[:5] = [np.nan, np.inf, -np.inf, -0.0, 1e-40]
    return x.reshape(shape)


raw = tf.raw_ops
CASES = {
    "FakeQuantWithMinMaxVars": (
        lambda x, lo, hi: raw.FakeQuantWithMinMaxVars(inputs=x, min=lo, max=hi, num_bits=7, narrow_range=True),
        [_quant_x((4, 6)), np.float32(-1.25), np.float32(1.5)],
        True,
    ),
    "FakeQuantWithMinMaxArgsGradient": (
        lambda g, x: raw.FakeQuantWithMinMaxArgsGradient(gradients=g, inputs=x, min=-1.0, max=1.0),
        [_n(4, 6), _quant_x((4, 6))],
        True,
    ),
    "QuantizeAndDequantizeV4Grad": (
        lambda g, x, lo, hi: raw.QuantizeAndDequantizeV4Grad(gradients=g, input=x, input_min=lo, input_max=hi, axis=-1),
        [_n(4, 6), _quant_x((4, 6)), np.float32(-1.0), np.float32(0.5)],
        True,
    ),
    "FusedBatchNormV3": (
        lambda x, s, o: raw.FusedBatchNormV3(
            x=x, scale=s, offset=o, mean=tf.zeros([0]), variance=tf.zeros([0]), epsilon=1e-3, is_training=True
        )[:3],
        [_n(2, 3, 3, 4), _n(4) + 1.0, _n(4)],
        False,
    ),
    "DepthwiseConv2dNative": (
        lambda x, w: raw.DepthwiseConv2dNative(input=x, filter=w, strides=[1, 1, 1, 1], padding="SAME"),
        [_n(1, 5, 5, 3), _n(3, 3, 3, 2)],
        False,
    ),
    "DepthwiseConv2dNativeBackpropFilter": (
        lambda x, d: raw.DepthwiseConv2dNativeBackpropFilter(
            input=x, filter_sizes=tf.constant([3, 3, 3, 2]), out_backprop=d, strides=[1, 2, 2, 1], padding="VALID"
        ),
        [_n(1, 5, 5, 3), _n(1, 2, 2, 6)],
        False,
    ),
    "DepthwiseConv2dNativeBackpropInput": (
        lambda w, d: raw.DepthwiseConv2dNativeBackpropInput(
            input_sizes=tf.constant([1, 5, 5, 3]), filter=w, out_backprop=d, strides=[1, 1, 1, 1], padding="SAME"
        ),
        [_n(3, 3, 3, 2), _n(1, 5, 5, 6)],
        False,
    ),
}


def _plain_tf2onnx(op, body, inputs):
    signature = [tf.TensorSpec(np.shape(v), tf.as_dtype(np.asarray(v).dtype)) for v in inputs]
    fn = tf.function(body, input_signature=signature)
    model, _ = tf2onnx.convert.from_function(
        fn, signature, opset=17, custom_ops={op: DOMAIN}, extra_opset=[helper.make_opsetid(DOMAIN, 1)]
    )
    return fn, model


@pytest.mark.parametrize("op", sorted(CASES))
def test_plain_tf2onnx_custom_op_runs_with_library(op):
    body, inputs, exact = CASES[op]
    fn, model = _plain_tf2onnx(op, body, inputs)
    nodes = [n for n in model.graph.node if n.domain == DOMAIN]
    assert [n.op_type for n in nodes] == [op]
    assert not {a.name for a in nodes[0].attribute} & {"T", "U"}
    # The model exactly as tf2onnx wrote it (its own ir_version for opset 17), only the library added.
    sess = library_session(model)
    feed = {i.name: np.asarray(v) for i, v in zip(sess.get_inputs(), inputs)}
    got = sess.run(None, feed)
    want = [np.asarray(t) for t in tf.nest.flatten(fn(*inputs))]
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        check = compare_output(f"{op}:{i}", w, g, exact=exact)
        assert check.ok, (check.n_outside, check.max_abs_err, check.tolerance)


def test_plain_tf2onnx_rewrites_quantize_and_dequantize_despite_custom_ops():
    def body(x):
        return tf.quantization.quantize_and_dequantize_v2(x, -1.0, 1.0, num_bits=4, range_given=True)

    _, model = _plain_tf2onnx("QuantizeAndDequantizeV4", body, [_n(3, 4)])
    types = [n.op_type for n in model.graph.node]
    assert "QuantizeLinear" in types and "QuantizeAndDequantizeV4" not in types
