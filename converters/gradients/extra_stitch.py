"""DynamicStitch and ParallelDynamicStitch, which TF's gradients emit for reductions over a None batch.

The gradient of a mean or sum whose input shape is only known at run time rebuilds the reduced shape
with ``DynamicStitch([range(rank), axes], [shape, ones])``, whose ``axes`` index is often a scalar;
tf2onnx's handler takes rank-1 indices only and writes a ScatterElements whose result is undefined
for repeated indices. This one is a pure selection, so it is exact in both lowerings (standard ONNX):

    merged[indices[m][i], ...] = data[m][i, ...], the last (m, i) in order winning a repeated index,

with merged of shape ``[max(indices) + 1] + data[0].shape[indices[0].rank:]``. Rows that no index
names are zero (TF leaves them unspecified). Repeated indices are resolved before the scatter (only
each index's last occurrence is kept), so the ScatterND below never sees a repeated index.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from converters.gradients.registry import gradient_op
from converters.standard._builder import Lowering


@gradient_op("DynamicStitch", "ParallelDynamicStitch")
def dynamic_stitch(ctx, node, lowering):
    b = Lowering(ctx, node)
    n = len(b.inputs) // 2
    if n == 0 or len(b.inputs) != 2 * n:
        b.fail(f"expects N indices and N data inputs, got {len(b.inputs)} inputs")
    index_ranks = [b.rank(i) for i in range(n)]
    for i, rank in enumerate(index_ranks):
        if rank is None:
            b.fail(f"input {i} (indices {b.inputs[i]!r}) has an unknown rank; it decides which data dims are rows")
        if b.dtype(i) not in (TensorProto.INT32, TensorProto.INT64):
            b.fail(f"input {i} (indices {b.inputs[i]!r}) must be int32 or int64")
    data_type = b.dtype(n)
    for i in range(n, 2 * n):
        if b.dtype(i) != data_type:
            b.fail(f"data inputs differ in element type (input {i}, {b.inputs[i]!r})")
    b.take_over()

    minus_one = b.const([-1], np.int64)
    flat_indices, rows = [], []
    for i in range(n):
        indices, data, rank = b.inputs[i], b.inputs[n + i], index_ranks[i]
        flat_indices.append(b.op("Cast", b.op("Reshape", indices, minus_one), to=TensorProto.INT64))
        # data[i] is indices[i].shape + row shape: fold the index dims into one.
        row_shape = b.op("Slice", b.op("Shape", data), b.const([rank], np.int64), b.const([np.iinfo(np.int64).max], np.int64))
        rows.append(b.op("Reshape", data, b.op("Concat", minus_one, row_shape, axis=0)))
    all_indices = b.op("Concat", *flat_indices, axis=0) if n > 1 else flat_indices[0]
    all_rows = b.op("Concat", *rows, axis=0) if n > 1 else rows[0]

    # Position p loses when a later position q > p carries the same index.
    count = b.op("Shape", all_indices)
    positions = b.op("Range", b.const(0, np.int64), b.op("Squeeze", count, b.const([0], np.int64)), b.const(1, np.int64))
    later = b.op("Less", b.op("Unsqueeze", positions, b.const([1], np.int64)), b.op("Unsqueeze", positions, b.const([0], np.int64)))
    same = b.op("Equal", b.op("Unsqueeze", all_indices, b.const([1], np.int64)), b.op("Unsqueeze", all_indices, b.const([0], np.int64)))
    overwritten = b.op("Cast", b.op("And", same, later), to=TensorProto.INT32)
    # Padding with a zero column keeps ReduceMax well defined when there are no positions at all.
    padded = b.op("Concat", overwritten, b.op("ConstantOfShape", b.op("Concat", count, b.const([1], np.int64), axis=0),
                                              value=helper.make_tensor("value", TensorProto.INT32, [1], [0])), axis=1)
    keep = b.op("Equal", b.reduce("ReduceMax", padded, [1], keepdims=False), b.const(0, np.int32))
    kept_indices = b.op("Compress", all_indices, keep, axis=0)
    kept_rows = b.op("Compress", all_rows, keep, axis=0)

    # Output rows: max index + 1 (0 when every index input is empty).
    size = b.op("Add", b.reduce("ReduceMax", b.op("Concat", minus_one, all_indices, axis=0), [0], keepdims=True),
                b.const([1], np.int64))
    row_shape = b.op("Slice", b.op("Shape", all_rows), b.const([1], np.int64), b.const([np.iinfo(np.int64).max], np.int64))
    zero = helper.make_tensor("value", data_type, [1], [0])
    merged = b.op("ConstantOfShape", b.op("Concat", size, row_shape, axis=0), value=zero)
    b.emit(0, b.op("ScatterND", merged, b.op("Unsqueeze", kept_indices, b.const([1], np.int64)), kept_rows))
