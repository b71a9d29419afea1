"""The converter's batch norm -> clip -> fake-quant fusion (converters/fusions.py, BatchNormClipFakeQuant).

Every graph is converted twice in the custom lowering, with the fusion and without it, and run on inputs with
NaN of both signs, infinities, signed zeros, subnormals and a dense sweep: the two models must give the same
bits, and where TF's batch norm is the correctly rounded one (fewer than 8 channels, no convolution before
it) both must give TF's bits. Each case also says whether the chain is fused, so a fusion that never
happens fails the node count, and one that fuses what it must not (a batch norm in training mode, a
ReLU6 or batch-norm output read twice, a range computed in the graph) fails it too.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import converters
import converters.pipeline as pipeline
from converters import fusions
from converters.verification import run_onnx

pytestmark = pytest.mark.tensorflow

F32 = np.float32
FUSED = "FusedBatchNormClipFakeQuant"


def probe(shape) -> np.ndarray:
    tiny = np.finfo(F32).tiny
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, tiny / 3, -tiny / 3, tiny, 1e30, -1e30], F32)
    n = int(np.prod(shape))
    x = np.linspace(-9.0, 9.0, n).astype(F32)
    x[: special.size * 7: 7] = special
    return x.reshape(shape)


def stats(c, seed=3):
    rng = np.random.default_rng(seed)
    return dict(scale=tf.constant(rng.uniform(0.5, 2.0, c).astype(F32)), offset=tf.constant(rng.standard_normal(c).astype(F32)),
                mean=tf.constant(rng.standard_normal(c).astype(F32)), variance=tf.constant(rng.uniform(0.2, 2.0, c).astype(F32)))


def bn(x, c, training=False, fmt="NHWC", seed=3):
    return tf.raw_ops.FusedBatchNormV3(x=x, **stats(c, seed), epsilon=1e-3, exponential_avg_factor=1.0,
                                       data_format=fmt, is_training=training)[0]


def fq(y, lo=-0.5, hi=5.75, **kw):
    return tf.quantization.fake_quant_with_min_max_vars(y, lo, hi, **kw)


def conv(x, c_out, seed=5):
    w = np.random.default_rng(seed).standard_normal((3, 3, x.shape[-1], c_out)).astype(F32) * 0.3
    return tf.nn.conv2d(x, w, 1, "SAME")


def _no_fusion():
    class NoFusion(fusions._Fusion, fusions._optimizer_base()):
        def rewrite(self, g, node):
            return False

    return NoFusion


def convert(fn, x, monkeypatch, fuse: bool):
    with monkeypatch.context() as m:
        if not fuse:
            m.setattr(pipeline, "batch_norm_clip_fake_quant_class", _no_fusion)
        return converters.from_function(tf.function(fn), [tf.TensorSpec(x.shape, tf.float32)], lowering="custom")


def run(model, x):
    (out,) = run_onnx(model, {model.graph.input[0].name: x}).values()
    return out


def count(model, op):
    return sum(n.op_type == op for n in model.graph.node)


# name: (graph, input shape, fused nodes expected, whether TF's bits are expected)
CASES = {
    "bn -> relu6 -> vars": (lambda x: fq(tf.nn.relu6(bn(x, 5))), (2, 6, 7, 5), 1, True),
    "bn -> relu -> vars": (lambda x: fq(tf.nn.relu(bn(x, 5))), (2, 6, 7, 5), 1, True),
    "bn -> vars, 4 bits narrow": (lambda x: fq(bn(x, 5), -2.0, 3.0, num_bits=4, narrow_range=True), (2, 6, 7, 5), 1, True),
    "bn -> relu6 -> args": (
        lambda x: tf.quantization.fake_quant_with_min_max_args(tf.nn.relu6(bn(x, 3)), -1.0, 6.0), (2, 6, 7, 3), 1, True),
    "conv -> bn -> relu6 -> vars -> conv -> bn -> vars (NCHW after layout)": (
        lambda x: fq(bn(conv(fq(tf.nn.relu6(bn(conv(x, 24), 24))), 16, seed=6), 16, seed=4), -3.0, 3.0),
        (2, 9, 11, 4), 2, False),
    "bn in training mode: not fused": (lambda x: fq(tf.nn.relu6(bn(x, 5, training=True))), (2, 6, 7, 5), 0, False),
    "bn read twice: not fused": (lambda x: (lambda y: fq(tf.nn.relu6(y)) + y)(bn(x, 5)), (2, 6, 7, 5), 0, False),
    "relu6 read by two quantizers: not fused": (
        lambda x: (lambda r: fq(r) + fq(r, 0.0, 3.0))(tf.nn.relu6(bn(x, 5))), (2, 6, 7, 5), 0, True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fused_and_unfused_models_give_the_same_bits(name, monkeypatch):
    fn, shape, fused_nodes, tf_bits = CASES[name]
    x = probe(shape)
    fused, plain = convert(fn, x, monkeypatch, True), convert(fn, x, monkeypatch, False)
    assert count(fused, FUSED) == fused_nodes
    assert count(plain, FUSED) == 0
    if fused_nodes:  # each fused node took a batch norm and a quantizer (and a clip where there was one)
        assert count(plain, "FusedBatchNormV3") - count(fused, "FusedBatchNormV3") == fused_nodes
        assert count(fused, "Transpose") == count(plain, "Transpose")  # the layout pass still clears the pair
        if "conv" in name:  # after a convolution the fused node computes in its NCHW layout
            formats = {a.s for n in fused.graph.node if n.op_type == FUSED for a in n.attribute if a.name == "data_format"}
            assert formats == {b"NCHW"}
    got, want = run(fused, x), run(plain, x)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    if tf_bits:
        expected = fn(tf.constant(x)).numpy()
        np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


def test_a_range_computed_in_the_graph_is_not_fused(monkeypatch):
    def fn(x, hi):
        return tf.quantization.fake_quant_with_min_max_vars(tf.nn.relu6(bn(x, 5)), -0.5, hi[0])

    x = probe((2, 6, 7, 5))
    model = converters.from_function(tf.function(fn), [tf.TensorSpec(x.shape, tf.float32), tf.TensorSpec((1,), tf.float32)],
                                     lowering="custom")
    assert count(model, FUSED) == 0
    hi = np.array([5.75], F32)
    got = run_onnx(model, {model.graph.input[0].name: x, model.graph.input[1].name: hi})
    expected = fn(tf.constant(x), tf.constant(hi)).numpy()
    np.testing.assert_array_equal(next(iter(got.values())).view(np.uint32), expected.view(np.uint32))
