"""Softmax cross-entropy (both outputs: loss and backprop) and L2Loss in standard ONNX, both lowerings.

TF's kernels (xent_op, l2loss_op) are followed step by step (max-shifted logits, exp, sum, log), but
the sums run in ONNX Runtime's order, so the results agree with TF within a float tolerance. tf2onnx's
own handlers for the cross-entropy ops produce only the loss; these produce the backprop as well.
A sparse label outside [0, classes) (e.g. ``classes``, -1 or 2**31-1) makes TF's CPU kernel fail at run
time (InvalidArgumentError); ONNX has no run-time error, so both lowerings do what TF's GPU kernel does:
that row's loss and every element of that row's backprop are NaN, and the other rows are untouched (so a
training step's weight gradients, which sum over the rows, become NaN too).
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from converters.gradients._common import float_type
from converters.gradients.registry import gradient_op
from converters.standard._builder import Lowering


def _softmax_parts(b: Lowering, logits: str):
    """(shifted logits, exp(shifted), sum over classes, keepdims) along the class axis, 1 (the logits are
    2-D). Not -1: onnxruntime(-gpu) 1.31's reductions skip a negative axis of an empty input (a None batch
    that is 0 at run time), returning it unreduced."""
    peak = b.reduce("ReduceMax", logits, [1], keepdims=True)
    shifted = b.op("Sub", logits, peak)
    exps = b.op("Exp", shifted)
    return shifted, exps, b.reduce("ReduceSum", exps, [1], keepdims=True)


def _check_rank2(b: Lowering, index: int, what: str, rank: int = 2):
    got = b.rank(index)
    if got is not None and got != rank:
        b.fail(f"input {what} ({b.inputs[index]!r}) must have rank {rank}, got {got}")


@gradient_op("SoftmaxCrossEntropyWithLogits")
def softmax_cross_entropy(ctx, node, lowering):
    b = Lowering(ctx, node)
    t = float_type(b, 0)
    if float_type(b, 1) != t:
        b.fail("inputs features and labels differ in element type")
    _check_rank2(b, 0, "features")
    b.take_over()
    logits, labels = b.inputs
    shifted, exps, total = _softmax_parts(b, logits)
    per_class = b.op("Mul", labels, b.op("Sub", b.op("Log", total), shifted))
    b.emit(0, b.reduce("ReduceSum", per_class, [1], keepdims=False))
    b.emit(1, b.op("Sub", b.op("Div", exps, total), labels))


@gradient_op("SparseSoftmaxCrossEntropyWithLogits")
def sparse_softmax_cross_entropy(ctx, node, lowering):
    b = Lowering(ctx, node)
    t = float_type(b, 0)
    if b.dtype(1) not in (TensorProto.INT32, TensorProto.INT64):
        b.fail(f"input labels ({b.inputs[1]!r}) must be int32 or int64")
    _check_rank2(b, 0, "features")
    _check_rank2(b, 1, "labels", rank=1)
    b.take_over()
    logits, labels = b.inputs
    classes = b.op("Gather", b.op("Shape", logits), b.const([1], np.int64), axis=0)
    class_ids = b.op("Range", b.const(0, np.int64), b.op("Squeeze", classes, b.const([0], np.int64)), b.const(1, np.int64))
    labels = b.op("Unsqueeze", b.cast(labels, TensorProto.INT64), b.const([1], np.int64))
    one_hot = b.cast(b.op("Equal", labels, class_ids), TensorProto.DOUBLE if t == np.float64 else TensorProto.FLOAT)
    shifted, exps, total = _softmax_parts(b, logits)
    picked = b.reduce("ReduceSum", b.op("Mul", one_hot, shifted), [1], keepdims=False)
    # Out-of-range labels: a factor of 1 (exact for every value, -0 and NaN included) or NaN per row,
    # as TF's GPU kernel gives (its CPU kernel raises). Where only selects between constants here.
    in_range = b.op("And", b.op("GreaterOrEqual", labels, b.const(0, np.int64)), b.op("Less", labels, classes))
    row_factor = b.op("Where", in_range, b.const(1.0, t), b.const(np.nan, t))  # [batch, 1]
    loss = b.op("Sub", b.op("Squeeze", b.op("Log", total), b.const([1], np.int64)), picked)
    b.emit(0, b.op("Mul", loss, b.op("Squeeze", row_factor, b.const([1], np.int64))))
    b.emit(1, b.op("Mul", b.op("Sub", b.op("Div", exps, total), one_hot), row_factor))


@gradient_op("L2Loss")
def l2_loss(ctx, node, lowering):
    # sum(t * t * 0.5)
    b = Lowering(ctx, node)
    t = float_type(b, 0)
    b.take_over()
    x = b.inputs[0]
    halves = b.op("Mul", b.op("Mul", x, x), b.const(0.5, t))
    b.emit(0, b.reduce("ReduceSum", halves, None, keepdims=False))
