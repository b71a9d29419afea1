"""The ops the layer catalogue emits beyond issue 9's list, against live TensorFlow, both lowerings.

* DynamicStitch / ParallelDynamicStitch (the gradient of a mean or sum over a None batch rebuilds the
  reduced shape with it): a selection, so bit-exact, repeated indices included (the last one wins).
* Erfc (Keras's exact gelu): TF's float32 erfc is Eigen's approximation, up to 65 ulp (relative
  4e-6) from the true erfc; ours is within 2 ulp of it (checked here against Python's double erfc).
  So the comparison with TF uses rtol 5e-6, and atol 1e-36 because TF's erfc reaches 0 a little
  before erfc(x) leaves the normal range (x ~ 9.2, erfc ~ 1.3e-38); the naive ``1 - erf(x)`` fails it.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

import converters
from converters.verification import compare_output, run_onnx

pytestmark = pytest.mark.tensorflow

LOWERINGS = ("custom", "standard")
ERFC_RTOL = 5e-6
ERFC_ATOL = 1e-36
rng = np.random.default_rng(91)


def _convert(fn, signature, lowering):
    return converters.from_function(fn, signature, lowering=lowering)


def _check(model, fn, inputs, exact, rtol=None, atol=None):
    """Every output of ``model`` against ``fn`` on ``inputs``; returns the report."""
    names = [o.name for o in model.graph.output]
    report = converters.verify(
        model, fn, inputs=inputs, exact_outputs=names if exact else None, rtol=rtol, atol=atol, print_table=False
    )
    assert report.ok, report.table()
    assert all(c.exact == exact for c in report.outputs)
    return report


def _op_types(model):
    return {n.op_type for n in model.graph.node}


# ---------------------------------------------------------------- DynamicStitch


def _stitch_fn(parallel=False):
    """Three partitions: 2-D constant indices, a scalar index, and run-time indices (may repeat)."""
    signature = [tf.TensorSpec([2, 2, 3], tf.float32), tf.TensorSpec([3], tf.float32),
                 tf.TensorSpec([None], tf.int32), tf.TensorSpec([None, 3], tf.float32)]
    op = tf.raw_ops.ParallelDynamicStitch if parallel else tf.raw_ops.DynamicStitch

    @tf.function(input_signature=signature)
    def fn(a, b, i, c):
        return op(indices=[tf.constant([[0, 4], [2, 1]]), tf.constant(3), i], data=[a, b, c])

    return fn, signature


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_dynamic_stitch_is_exact_and_the_last_repeated_index_wins(lowering):
    fn, signature = _stitch_fn()
    model = _convert(fn, signature, lowering)
    assert "ScatterND" in _op_types(model)
    a = rng.standard_normal((2, 2, 3)).astype(np.float32)
    b = np.float32([np.nan, -0.0, np.inf])
    # Index 3 and 1 repeat across partitions and within the run-time one; 6 extends the output.
    i = np.int32([3, 6, 1, 3])
    c = rng.standard_normal((4, 3)).astype(np.float32)
    c[2] = [-0.0, np.nan, -np.inf]
    report = _check(model, fn, [a, b, i, c], exact=True)
    assert report.outputs[0].shape == (7, 3)


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_dynamic_stitch_with_empty_run_time_indices(lowering):
    fn, signature = _stitch_fn()
    model = _convert(fn, signature, lowering)
    a = rng.standard_normal((2, 2, 3)).astype(np.float32)
    _check(model, fn, [a, np.float32([1, 2, 3]), np.zeros([0], np.int32), np.zeros([0, 3], np.float32)], exact=True)


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_parallel_dynamic_stitch(lowering):
    fn, signature = _stitch_fn(parallel=True)
    model = _convert(fn, signature, lowering)
    a = rng.standard_normal((2, 2, 3)).astype(np.float32)
    # ParallelDynamicStitch leaves the winner of a repeated index open: no repeats here.
    _check(model, fn, [a, np.float32([1, 2, 3]), np.int32([6, 5]), rng.standard_normal((2, 3)).astype(np.float32)],
           exact=True)


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_mean_gradient_over_a_none_batch(lowering):
    """The pattern that brings DynamicStitch in: reduce_mean over the last axis with unknown batch."""
    signature = [tf.TensorSpec([None, 4], tf.float32)]

    @tf.function(input_signature=signature)
    def fn(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.reduce_mean(tf.square(x), axis=-1))
        return tape.gradient(loss, x)

    concrete = fn.get_concrete_function(*signature)
    assert "DynamicStitch" in {op.type for op in concrete.graph.get_operations()}
    model = _convert(fn, signature, lowering)
    # dx = (1 / 4) * 2 x: the same roundings in both, so exact.
    _check(model, fn, [rng.standard_normal((5, 4)).astype(np.float32)], exact=True)


def test_dynamic_stitch_rejects_indices_of_unknown_rank():
    # Reshaped to a run-time shape of run-time length, the indices have no static rank.
    signature = [tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.float32)]

    @tf.function(input_signature=signature)
    def fn(i, shape, d):
        return tf.raw_ops.DynamicStitch(indices=[tf.reshape(i, shape)], data=[tf.reshape(d, shape)])

    with pytest.raises(converters.ConversionError, match=r"DynamicStitch.*input 0.*unknown rank"):
        converters.from_function(fn, signature, lowering="standard")


# ---------------------------------------------------------------- Erfc


def _erfc_inputs():
    """A dense sweep over the whole range plus the edges: +-0, subnormals, +-inf, NaN, the underflow."""
    sweep = np.linspace(-10.0, 10.0, 4001)
    tails = np.concatenate([np.logspace(-38, 1.02, 600), -np.logspace(-38, 1.02, 200)])
    edges = [0.0, -0.0, 1e-40, -1e-40, np.inf, -np.inf, np.nan, 9.1, 9.2, 9.3, 10.5, 0.5, -0.5, 1e-3]
    return np.concatenate([sweep, tails, edges]).astype(np.float32)


def _erfc_fn(shape):
    signature = [tf.TensorSpec(shape, tf.float32)]

    @tf.function(input_signature=signature)
    def fn(x):
        return tf.math.erfc(x)

    return fn, signature


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_erfc_matches_tf_and_the_true_erfc(lowering):
    fn, signature = _erfc_fn([None])
    model = _convert(fn, signature, lowering)
    x = _erfc_inputs()
    report = _check(model, fn, [x], exact=False, rtol=ERFC_RTOL, atol=ERFC_ATOL)
    ours = run_onnx(model, {model.graph.input[0].name: x})[model.graph.output[0].name]
    # Against the correctly rounded erfc (flushed to zero below the normal range, as TF's kernels
    # flush): within 2 ulp wherever it is normal, exactly 0 where it is not, NaN for NaN.
    true = np.array([math.erfc(float(v)) if not np.isnan(v) else np.nan for v in x])
    true32 = true.astype(np.float32)
    normal = np.abs(true32) >= np.finfo(np.float32).tiny
    ulps = np.abs(ours[normal].astype(np.float64) - true32[normal]) / np.spacing(true32[normal])
    assert ulps.max() <= 2, f"max {ulps.max()} ulp from the correctly rounded erfc"
    assert np.all(ours[~normal & ~np.isnan(x)] == 0) and np.all(np.isnan(ours[np.isnan(x)]))
    assert report.outputs[0].max_rel_err < ERFC_RTOL


def test_erfc_tolerance_rejects_one_minus_erf():
    """The tolerance is tight enough to catch the naive form, which loses the tail (erfc(4) = 1.5e-8)."""
    fn, _ = _erfc_fn([None])
    x = _erfc_inputs()
    expected = fn(x).numpy()
    naive = (1.0 - tf.math.erf(x)).numpy()
    assert not compare_output("erfc", expected, naive, rtol=ERFC_RTOL, atol=ERFC_ATOL).ok


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_erfc_of_an_empty_tensor(lowering):
    fn, signature = _erfc_fn([None, 3])
    model = _convert(fn, signature, lowering)
    _check(model, fn, [np.zeros([0, 3], np.float32)], exact=False, rtol=ERFC_RTOL, atol=ERFC_ATOL)


def test_erfc_rejects_float64():
    signature = [tf.TensorSpec([3], tf.float64)]

    @tf.function(input_signature=signature)
    def fn(x):
        return tf.math.erfc(x)

    with pytest.raises(converters.ConversionError, match=r"Erfc.*input 0.*DOUBLE.*only float32"):
        converters.from_function(fn, signature)


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_exact_gelu_and_its_gradient(lowering):
    """gelu(x) = x/2 erfc(-x/sqrt 2) and its gradient (erfc's derivative is standard ops): the erfc
    tolerance carries through one product, and the gradient's erfc term is the same value."""
    signature = [tf.TensorSpec([6, 7], tf.float32)]

    @tf.function(input_signature=signature)
    def fn(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.nn.gelu(x, approximate=False)
        return y, tape.gradient(y, x)

    model = _convert(fn, signature, lowering)
    x = (rng.standard_normal((6, 7)) * 4).astype(np.float32)
    x[0, :4] = [0.0, -0.0, -9.5, 9.5]
    # gelu(x) = x * erfc(.) / 2 and dgelu = erfc(.) / 2 + x * pdf: erfc's relative error plus a few ulp
    # of the product and the sum.
    _check(model, fn, [x], exact=False, rtol=ERFC_RTOL + 1e-6, atol=ERFC_ATOL)


# ---------------------------------------------------------------- Conv2D backprops after a padded gradient


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_conv_backprops_whose_out_backprop_shape_tf2onnx_lost(lowering):
    """With a None batch, Pad's gradient is a Slice of run-time size, and tf2onnx knows nothing of its
    shape; the conv backprops behind it compute out_backprop's spatial size from the forward geometry
    (converters.gradients._conv.forward_geometry); without that they cannot convert.
    Both are sums (ORT's Conv adds in another order than TF), so verify's float32 tolerance applies."""
    signature = [tf.TensorSpec([None, 5, 6, 2], tf.float32)]
    w1 = tf.constant(rng.standard_normal((3, 3, 2, 3)).astype(np.float32))
    w2 = tf.constant(rng.standard_normal((2, 2, 3, 2)).astype(np.float32))

    @tf.function(input_signature=signature)
    def fn(x):
        with tf.GradientTape() as tape:
            tape.watch([x, w1, w2])
            h = tf.nn.conv2d(x, w1, strides=2, padding="SAME")
            h = tf.pad(h, [[0, 0], [1, 0], [0, 2], [0, 0]])
            y = tf.nn.conv2d(h, w2, strides=1, padding="VALID")
            loss = tf.reduce_sum(y * y)
        return tape.gradient(loss, [x, w1, w2])

    ops = {op.type for op in fn.get_concrete_function(*signature).graph.get_operations()}
    assert {"Conv2DBackpropInput", "Conv2DBackpropFilter"} <= ops
    model = _convert(fn, signature, lowering)
    _check(model, fn, [rng.standard_normal((3, 5, 6, 2)).astype(np.float32)], exact=False)
