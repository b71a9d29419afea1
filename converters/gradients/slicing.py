"""StridedSliceGrad in standard ONNX, both lowerings, bit-exact (it only moves values).

The gradient scatters dy into zeros of the sliced tensor's shape. The positions are found by slicing
an iota of that shape with ONNX Slice, whose clamping of begin/end matches TF's; begin, end and
strides must be constants, the shape may be dynamic (a None batch).
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from converters.gradients.registry import gradient_op
from converters.standard._builder import Lowering

_BIG = np.iinfo(np.int64).max
_SMALL = np.iinfo(np.int64).min


def _bits(mask: int, i: int) -> bool:
    return bool((mask >> i) & 1)


def dense_slice(b: Lowering, rank: int, begin, end, strides, masks: dict):
    """TF's sparse slice spec -> (starts, ends, steps) over all ``rank`` dims of the input."""
    n = len(begin)
    ellipsis = [i for i in range(n) if _bits(masks["ellipsis_mask"], i)]
    if len(ellipsis) > 1:
        b.fail("more than one ellipsis in ellipsis_mask")
    consuming = [i for i in range(n) if not _bits(masks["new_axis_mask"], i) and i not in ellipsis]
    if len(consuming) > rank:
        b.fail(f"the slice has {len(consuming)} indices for a tensor of rank {rank}")
    starts, ends, steps = [], [], []
    entries = list(range(n)) + ([] if ellipsis else ["..."])
    for i in entries:
        if i == "..." or i in ellipsis:
            for _ in range(rank - len(consuming)):
                starts.append(0), ends.append(_BIG), steps.append(1)
            continue
        if _bits(masks["new_axis_mask"], i):
            continue
        stride = int(strides[i])
        if stride == 0:
            b.fail(f"strides[{i}] is 0")
        if _bits(masks["shrink_axis_mask"], i):
            index = int(begin[i])
            starts.append(index), ends.append(_BIG if index == -1 else index + 1), steps.append(1)
            continue
        if _bits(masks["begin_mask"], i):
            start = 0 if stride > 0 else _BIG
        else:
            start = int(begin[i])
        if _bits(masks["end_mask"], i):
            stop = _BIG if stride > 0 else _SMALL
        else:
            stop = int(end[i])
        starts.append(start), ends.append(stop), steps.append(stride)
    return starts, ends, steps


@gradient_op("StridedSliceGrad")
def strided_slice_grad(ctx, node, lowering):
    b = Lowering(ctx, node)
    spec = []
    for i, what in ((1, "begin"), (2, "end"), (3, "strides")):
        value = b.constant_value(i)
        if value is None:
            b.fail(f"input {what} ({b.inputs[i]!r}) must be a constant")
        spec.append([int(v) for v in value.reshape(-1)])
    shape_of_shape = b.shape(0)
    if shape_of_shape is None or len(shape_of_shape) != 1 or shape_of_shape[0] < 0:
        b.fail(f"input shape ({b.inputs[0]!r}) must have a known length")
    rank = shape_of_shape[0]
    masks = {m: int(b.attr(m, 0)) for m in ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")}
    starts, ends, steps = dense_slice(b, rank, *spec, masks)
    b.take_over()
    shape, dy = b.inputs[0], b.inputs[4]
    shape = b.cast(shape, TensorProto.INT64)
    count = b.op("ReduceProd", shape, keepdims=1)
    iota = b.op("Range", b.const(0, np.int64), b.op("Squeeze", count, b.const([0], np.int64)), b.const(1, np.int64))
    iota = b.op("Reshape", iota, shape)
    if rank:
        axes = b.const(np.arange(rank, dtype=np.int64), np.int64)
        iota = b.op("Slice", iota, b.const(starts, np.int64), b.const(ends, np.int64), axes, b.const(steps, np.int64))
    flat = b.const([-1], np.int64)
    dtype = b.dtype(4)
    zero = b.op("ConstantOfShape", count, value=_zero_tensor(dtype))
    scattered = b.op("ScatterElements", zero, b.op("Reshape", iota, flat), b.op("Reshape", dy, flat), axis=0)
    b.emit(0, b.op("Reshape", scattered, shape))


def _zero_tensor(onnx_type: int):
    from onnx import helper

    return helper.make_tensor("value", onnx_type, [1], [0])
