"""StridedSliceGrad in standard ONNX, both lowerings, bit-exact (it only moves values).

The gradient scatters dy into zeros of the sliced tensor's shape. The positions are found by taking,
axis by axis, the indices TF's slice selects from an iota of that shape (Gather). begin, end and
strides must be constants, the shape may be dynamic (a None batch).

The indices follow TF's canonical bounds: a negative index counts from the end, then begin and end are
clamped to [0, dim] for a positive stride and to [-1, dim - 1] for a negative one (Python's slice rule).
ONNX Slice is not used: it clamps a negative-stride start to [0, dim - 1] (so begin < -dim selects
element 0 where TF selects nothing), and on an empty dim with a negative step that range is inverted,
which aborts assertion-enabled ONNX Runtime builds. With a constant shape the indices are constants
(an empty selection gives zeros at once); otherwise each bound is clamped in the graph and Range
enumerates the indices, which is valid for every size, 0 included (a negative stride's Range is
offset, so that ONNX Runtime does not fuse it with the Gather into a Slice). Axes the slice keeps whole
are not touched.
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
    """TF's sparse slice spec -> (starts, ends, steps, shrinks) over all ``rank`` dims of the input;
    shrinks holds the index of a shrink_axis entry, else None."""
    n = len(begin)
    ellipsis = [i for i in range(n) if _bits(masks["ellipsis_mask"], i)]
    if len(ellipsis) > 1:
        b.fail("more than one ellipsis in ellipsis_mask")
    consuming = [i for i in range(n) if not _bits(masks["new_axis_mask"], i) and i not in ellipsis]
    if len(consuming) > rank:
        b.fail(f"the slice has {len(consuming)} indices for a tensor of rank {rank}")
    starts, ends, steps, shrinks = [], [], [], []
    entries = list(range(n)) + ([] if ellipsis else ["..."])
    for i in entries:
        if i == "..." or i in ellipsis:
            for _ in range(rank - len(consuming)):
                starts.append(0), ends.append(_BIG), steps.append(1), shrinks.append(None)
            continue
        if _bits(masks["new_axis_mask"], i):
            continue
        stride = int(strides[i])
        if stride == 0:
            b.fail(f"strides[{i}] is 0")
        if _bits(masks["shrink_axis_mask"], i):
            index = int(begin[i])
            starts.append(index), ends.append(_BIG if index == -1 else index + 1), steps.append(1)
            shrinks.append(index)
            continue
        if _bits(masks["begin_mask"], i):
            start = 0 if stride > 0 else _BIG
        else:
            start = int(begin[i])
        if _bits(masks["end_mask"], i):
            stop = _BIG if stride > 0 else _SMALL
        else:
            stop = int(end[i])
        starts.append(start), ends.append(stop), steps.append(stride), shrinks.append(None)
    return starts, ends, steps, shrinks


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
    starts, ends, steps, shrinks = dense_slice(b, rank, *spec, masks)
    axes = [(axis, start, stop, step) for axis, (start, stop, step) in enumerate(zip(starts, ends, steps))
            if (start, stop, step) != (0, _BIG, 1)]
    dims = b.constant_value(0)
    if dims is not None:
        dims = [int(d) for d in dims.reshape(-1)]
        selections = {}
        for axis, start, stop, step in axes:
            shrink = shrinks[axis]
            if shrink is not None and not -dims[axis] <= shrink < dims[axis]:
                b.fail(f"slice index {shrink} of dimension {axis} out of bounds (size {dims[axis]})")
            selections[axis] = np.arange(dims[axis], dtype=np.int64)[slice(start, stop, step)]
    b.take_over()
    shape, dy = b.inputs[0], b.inputs[4]
    dtype = b.dtype(4)
    shape = b.cast(shape, TensorProto.INT64)
    count = b.op("ReduceProd", shape, keepdims=1)
    if dims is not None and (0 in dims or any(len(sel) == 0 for sel in selections.values())):
        # Nothing selected (or nothing to select from): dy is empty and the gradient all zeros.
        b.emit(0, b.op("ConstantOfShape", shape, value=_zero_tensor(dtype)))
        return
    iota = b.op("Range", b.const(0, np.int64), b.op("Squeeze", count, b.const([0], np.int64)), b.const(1, np.int64))
    iota = b.reshape_to(iota, shape)
    for axis, start, stop, step in axes:
        if dims is not None:
            indices = b.const(selections[axis], np.int64)
        else:
            dim = b.op("Gather", shape, b.const(axis, np.int64), axis=0)
            lo, hi = (0, dim) if step > 0 else (-1, b.op("Sub", dim, b.const(1, np.int64)))
            first, last = (_canonical(b, v, dim, lo, hi) for v in (start, stop))
            if step > 0:
                indices = b.op("Range", first, last, b.const(step, np.int64))
            else:
                # first, first - |step|, ... while > last. Not Range(first, last, step) straight into the
                # Gather: ONNX Runtime's optimizer fuses that pair into a Slice, which reads last = -1 (TF's
                # "before element 0") as the last element and selects nothing.
                taken = b.op("Div", b.op("Add", b.op("Sub", first, last), b.const(-step - 1, np.int64)),
                             b.const(-step, np.int64))
                taken = b.op("Max", taken, b.const(0, np.int64))
                steps = b.op("Range", b.const(0, np.int64), taken, b.const(1, np.int64))
                indices = b.op("Add", first, b.op("Mul", steps, b.const(step, np.int64)))
        iota = b.op("Gather", iota, indices, axis=axis)
    flat = b.const([-1], np.int64)
    zero = b.op("ConstantOfShape", count, value=_zero_tensor(dtype))
    scattered = b.op("ScatterElements", zero, b.op("Reshape", iota, flat), b.op("Reshape", dy, flat), axis=0)
    b.emit(0, b.reshape_to(scattered, shape))


def _canonical(b: Lowering, value: int, dim: str, lo, hi) -> str:
    """TF's canonical slice bound in the graph: value + dim when negative, clamped to [lo, hi]
    (``lo`` an int, ``hi`` a scalar name). A non-negative constant can only exceed ``hi``; a negative
    one, moved by dim, can only fall below ``lo``."""
    if value >= 0:
        return b.op("Min", b.const(value, np.int64), hi)
    return b.op("Max", b.op("Add", dim, b.const(value, np.int64)), b.const(lo, np.int64))


def _zero_tensor(onnx_type: int):
    from onnx import helper

    return helper.make_tensor("value", onnx_type, [1], [0])
