"""Shape arithmetic of gradient graphs with a dynamic (None) batch: BroadcastGradientArgs,
ConcatOffset, ShapeN. With static shapes TF folds these to constants before conversion; with a None
batch they stay and are computed at run time here, exactly (integer arithmetic), in standard ONNX.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from converters.gradients.registry import gradient_op
from converters.standard._builder import Lowering

_INT_TYPES = {TensorProto.INT32: np.int32, TensorProto.INT64: np.int64}


def _int_type(b: Lowering, index: int):
    onnx_type = b.dtype(index)
    if onnx_type not in _INT_TYPES:
        b.fail(f"input {index} ({b.inputs[index]!r}) must be int32 or int64")
    return onnx_type


def _vector_length(b: Lowering, index: int, what: str) -> int:
    shape = b.shape(index)
    if shape is None or len(shape) != 1 or shape[0] < 0:
        b.fail(f"input {what} ({b.inputs[index]!r}) must be a vector of known length (a shape of known rank)")
    return shape[0]


@gradient_op("BroadcastGradientArgs")
def broadcast_gradient_args(ctx, node, lowering):
    # TF: the axes (of the broadcast shape) over which each operand's gradient is summed: where the
    # operand, padded on the left with 1s, has a 1; nothing at all when the two shapes are equal.
    b = Lowering(ctx, node)
    onnx_type = _int_type(b, 0)
    lengths = [_vector_length(b, i, w) for i, w in ((0, "s0"), (1, "s1"))]
    rank = max(lengths)
    b.take_over()
    shapes = []
    for shape, length in zip(b.inputs, lengths):
        shape = b.cast(shape, TensorProto.INT64)
        if length < rank:
            shape = b.op("Concat", b.const(np.ones(rank - length, np.int64), np.int64), shape, axis=0)
        shapes.append(shape)
    if lengths[0] == lengths[1]:
        same = b.op("ReduceMin", b.cast(b.op("Equal", shapes[0], shapes[1]), TensorProto.INT32), keepdims=1)
        differ = b.op("Not", b.cast(same, TensorProto.BOOL))
    else:
        differ = b.const([True], np.bool_)
    axes = b.const(np.arange(rank, dtype=np.int64), np.int64)
    for i, shape in enumerate(shapes):
        reduce_here = b.op("And", b.op("Equal", shape, b.const(1, np.int64)), differ)
        b.emit(i, b.cast(b.op("Compress", axes, reduce_here, axis=0), onnx_type))


@gradient_op("ConcatOffset")
def concat_offset(ctx, node, lowering):
    # offset i: zeros, except the concat axis, which holds the sum of the earlier shapes' sizes there.
    b = Lowering(ctx, node)
    axis = b.constant_value(0)
    if axis is None or axis.size != 1:
        b.fail(f"input concat_dim ({b.inputs[0]!r}) must be a constant scalar")
    onnx_type = _int_type(b, 1)
    rank = _vector_length(b, 1, "shape")
    axis = int(axis.reshape(-1)[0])
    if not -rank <= axis < rank:
        b.fail(f"concat_dim {axis} is out of range for rank {rank}")
    axis %= rank
    b.take_over()
    np_type = _INT_TYPES[onnx_type]
    one_hot = b.const(np.eye(rank, dtype=np_type)[axis], np_type)
    offsets = [b.const(np.zeros(rank, np_type), np_type)]
    for shape in b.inputs[1:-1]:
        offsets.append(b.op("Add", offsets[-1], b.op("Mul", shape, one_hot)))
    # Emitted only once all are built: emit renames a built value in place.
    for i, offset in enumerate(offsets):
        b.emit(i, offset)


@gradient_op("ShapeN")
def shape_n(ctx, node, lowering):
    b = Lowering(ctx, node)
    out_type = b.attr("out_type", TensorProto.INT32)
    b.take_over()
    for i, x in enumerate(b.inputs):
        shape = b.op("Shape", x)
        b.emit(i, b.cast(shape, out_type) if out_type != TensorProto.INT64 else shape)
