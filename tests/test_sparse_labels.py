"""Out-of-range labels of SparseSoftmaxCrossEntropyWithLogits (converters/gradients/losses.py), both lowerings.

TF's CPU kernel rejects a label outside [0, classes) with InvalidArgumentError; its GPU kernel gives NaN for
that row's loss and for every element of that row's backprop. ONNX has no run-time error, so the converted
op does what the GPU kernel does. Checked here, on the op alone and on a small training step (a dense layer,
the mean sparse cross-entropy and its gradients), for the labels ``classes`` (10), -1 and 2**31-1, as int32
and int64 labels (float32 and float64 logits on the op alone):
* valid labels agree with TF as before (the sums within SUM_RTOL, as in tests/test_gradient_ops.py);
* a bad label's row is NaN in the loss and in the whole backprop row (and in the step's gradient with respect
  to the logits); a weight gradient, which sums over the rows, is NaN wherever a bad row enters it, as on a
  GPU;
* every other row has the bits the same model gives with that label replaced by a valid one, and so still
  agrees with TF.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import converters
from converters.verification import compare_output, run_onnx, same_bits

pytestmark = pytest.mark.tensorflow

LOWERINGS = ("custom", "standard")
CLASSES = 10
BATCH = 6
FEATURES = 5
SUM_RTOL = 1e-5
BAD_ROWS = {1: CLASSES, 3: -1, 4: 2**31 - 1}  # row -> label
raw = tf.raw_ops


def _logits(dtype=np.float32):
    rng = np.random.default_rng(27)
    logits = (rng.standard_normal((BATCH, CLASSES)) * 4).astype(dtype)
    logits[0] = 0.0  # a row of equal logits
    return logits


def _labels(dtype, bad: bool):
    labels = np.array([0, 9, 3, 2, 7, 5], dtype)
    if bad:
        for row, label in BAD_ROWS.items():
            labels[row] = label
    return labels


def _convert(fn, specs, lowering):
    return converters.from_function(tf.function(fn), specs, lowering=lowering)


def _run(model, inputs):
    feed = dict(zip([i.name for i in model.graph.input], inputs))
    got = run_onnx(model, feed)
    return [got[o.name] for o in model.graph.output]


def _assert_close(expected, actual, what):
    for i, (e, a) in enumerate(zip(expected, actual)):
        check = compare_output(f"{what} output {i}", np.asarray(e), a, rtol=SUM_RTOL)
        assert check.ok, str(check)


def _op(features, labels):
    return raw.SparseSoftmaxCrossEntropyWithLogits(features=features, labels=labels)


@pytest.mark.parametrize("dtype, label_dtype", [(np.float32, np.int32), (np.float32, np.int64), (np.float64, np.int32)])
@pytest.mark.parametrize("none_batch", [False, True])
@pytest.mark.parametrize("lowering", LOWERINGS)
def test_out_of_range_labels_give_nan_rows(lowering, none_batch, dtype, label_dtype):
    logits, good, bad = _logits(dtype), _labels(label_dtype, False), _labels(label_dtype, True)
    batch = None if none_batch else BATCH
    specs = [tf.TensorSpec((batch, CLASSES), tf.as_dtype(dtype)), tf.TensorSpec((batch,), tf.as_dtype(label_dtype))]
    model = _convert(_op, specs, lowering)

    # Valid labels: as TF, within the sums' tolerance.
    tf_good = [np.asarray(o) for o in _op(logits, good)]
    ort_good = _run(model, [logits, good])
    _assert_close(tf_good, ort_good, "valid labels:")

    # TF's CPU kernel refuses the bad labels (its GPU kernel gives the NaN rows checked below).
    with pytest.raises(tf.errors.InvalidArgumentError):
        _op(logits, bad)

    loss, backprop = _run(model, [logits, bad])
    rows = np.array(sorted(BAD_ROWS))
    others = np.setdiff1d(np.arange(BATCH), rows)
    assert np.isnan(loss[rows]).all(), f"loss rows {rows}: {loss[rows]}"
    assert np.isnan(backprop[rows]).all(), f"backprop rows {rows}: {backprop[rows]}"
    # The other rows: untouched (the bits of the valid-label run), so still TF's results.
    assert same_bits(loss[others], ort_good[0][others]).all()
    assert same_bits(backprop[others], ort_good[1][others]).all()
    assert not np.isnan(loss[others]).any() and not np.isnan(backprop[others]).any()


class _Step(tf.Module):
    """A dense layer's training step: per-row loss, mean loss and the gradients w.r.t. logits, kernel, bias."""

    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(3)
        self.kernel = tf.Variable(rng.standard_normal((FEATURES, CLASSES)).astype(np.float32), name="kernel")
        self.bias = tf.Variable(rng.standard_normal((CLASSES,)).astype(np.float32) * 0.1, name="bias")

    def __call__(self, x, labels):
        with tf.GradientTape() as tape:
            tape.watch([self.kernel, self.bias])
            logits = tf.matmul(x, self.kernel) + self.bias
            tape.watch(logits)
            per_row = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
            loss = tf.reduce_mean(per_row)
        d_logits, d_kernel, d_bias = tape.gradient(loss, [logits, self.kernel, self.bias])
        return per_row, loss, d_logits, d_kernel, d_bias


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_training_step_with_out_of_range_labels(lowering):
    step = _Step()
    x = np.random.default_rng(5).standard_normal((BATCH, FEATURES)).astype(np.float32)
    good, bad = _labels(np.int32, False), _labels(np.int32, True)
    specs = [tf.TensorSpec((None, FEATURES), tf.float32), tf.TensorSpec((None,), tf.int32)]
    model = _convert(step.__call__, specs, lowering)

    tf_good = [np.asarray(o) for o in tf.function(step.__call__)(x, good)]
    ort_good = _run(model, [x, good])
    _assert_close(tf_good, ort_good, "valid labels:")

    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.function(step.__call__)(x, bad)

    per_row, loss, d_logits, d_kernel, d_bias = _run(model, [x, bad])
    rows = np.array(sorted(BAD_ROWS))
    others = np.setdiff1d(np.arange(BATCH), rows)
    assert np.isnan(per_row[rows]).all() and np.isnan(d_logits[rows]).all()
    assert same_bits(per_row[others], ort_good[0][others]).all()
    assert same_bits(d_logits[others], ort_good[2][others]).all()
    # The mean and the weight gradients sum over the rows: NaN, as TF gives on a GPU.
    assert np.isnan(loss) and np.isnan(d_bias).all()
    # Every kernel element sums x[r, i] * d_logits[r, j] over the rows, a NaN row included.
    assert np.isnan(d_kernel).all()
