"""The rules of QuantizeAndDequantize{V2,V3,V4} and QuantizeAndDequantizeV4Grad, each written once.

TF's order: the constructor's attribute checks, then Compute's checks of the inputs. Shapes may be
partly known (None: unknown dim or rank), values may be unknown (None); a check those facts cannot
decide is skipped. The element types (T float32 or float64, V3's num_bits int32) are the spec's.
"""
from __future__ import annotations

from ort_ops.checks._common import gradient_same_size, tf_float
from ort_ops.spec import OpError

__all__ = [
    "num_bits", "axis_at_least_minus_one", "axis_within_rank", "v3_axis", "v3_num_bits", "given_range",
    "grad_axis_within_rank", "gradient_same_size", "grad_range_shapes",
]


def num_bits(op: str, bits: int, signed_input: bool, signed_label: str) -> None:
    """The grid must fit int64: 1..61 bits signed, 1..62 unsigned. ``signed_label`` is how TF's message
    names signed_input (V2/V4 ``signed_input_``, V3 ``\\`signed_input_\\```)."""
    if not 0 < bits < (62 if signed_input else 63):
        raise OpError(op, f"num_bits is out of range: {bits} with {signed_label} {int(signed_input)}")


def axis_at_least_minus_one(op: str, axis: int) -> None:
    """V2/V4 and V4Grad: the constructor's check of the axis attribute."""
    if axis < -1:
        raise OpError(op, f"Axis must be at least -1. Found {axis}")


def axis_within_rank(op: str, x, axis: int) -> None:
    """V2/V4: a per-axis axis must be a dim of the input."""
    if axis != -1 and x is not None and axis >= len(x):
        # TF's message names neither the attribute nor the input; ours leads with both.
        raise OpError(
            op, f"axis {axis} is out of range for input of rank {len(x)}: "
                f"Shape must be at least rank {axis + 1} but is rank {len(x)}"
        )


def v3_axis(op: str, x, axis: int) -> None:
    """V3 checks the axis only in Compute: first against the rank, then against -1."""
    if x is not None and not -len(x) <= axis < len(x):
        raise OpError(op, f"Axis requested is larger than input dimensions. Axis: {axis} Input Dimensions: {len(x)}")
    if axis < -1:
        # TF 2.21 aborts the process here (CHECK failure, TF issue #94116); its shape function says this.
        raise OpError(op, f"axis should be at least -1, got {axis}")


def v3_num_bits(op: str, shape, value, signed_input: bool) -> None:
    """V3's num_bits tensor: a scalar whose value is a valid bit width."""
    if shape is not None and len(shape) != 0:
        raise OpError(op, f"Invalid shape. The `num_bits` tensor should be a scalar. Got dimensions: {len(shape)}")
    if value is not None:
        num_bits(op, int(value), signed_input, "`signed_input_`")


def _rank_one_per_axis(op: str, name: str, shape) -> None:
    if shape is not None and len(shape) != 1:
        raise OpError(op, f"Shape must be rank 1 for {name}_tensor when the axis is specified")


def given_range(op: str, x, shapes, values, axis: int) -> None:
    """range_given: the (input_min, input_max) ``shapes`` and ``values``.

    Per tensor: scalars with min <= max (not: a NaN end is an invalid range too). Per axis: vectors of
    dims[axis] values. TF 2.21 V2/V4 also apply the scalar check per axis (so that mode can never work
    there); here it applies only per tensor, as the op's docs intend.
    """
    names = ("input_min", "input_max")
    if axis == -1:
        for name, shape in zip(names, shapes):
            if shape is not None and len(shape) != 0:
                raise OpError(op, f"{name} must be a scalar.")
        mn, mx = values
        if mn is not None and mx is not None and not mn <= mx:
            raise OpError(op, f"Invalid range: input_min {tf_float(mn)} > input_max {tf_float(mx)}")
        return
    for name, shape in zip(names, shapes):
        _rank_one_per_axis(op, name, shape)
    depth = None if x is None else x[axis]
    for name, shape in zip(names, shapes):
        if depth is not None and shape is not None and shape[0] is not None and shape[0] != depth:
            raise OpError(
                op, f"{name}_tensor has incorrect size, was {shape[0]} expected {depth} to match dim {axis} of the input [{shape[0]}]"
            )


def grad_axis_within_rank(op: str, x, axis: int) -> None:
    """V4Grad: a per-axis axis must be a dim of the input."""
    if axis != -1 and x is not None and axis >= len(x):
        # TF's message, missing space included.
        raise OpError(op, f"Axis should be -1 or 0 or a positive value less than {len(x)}but given axis value was {axis}")


def grad_range_shapes(op: str, x, mn, mx, axis: int) -> None:
    """V4Grad: input_min/input_max of rank 0 or 1; vectors of dims[axis] values per axis, else scalars."""
    ranges = (("min", mn), ("max", mx))
    for label, shape in ranges:
        if shape is not None and len(shape) > 1:
            raise OpError(op, f"Input {label} tensor must have dimension 0 or 1. Received {len(shape)}.")
    if axis == -1:
        for label, shape in ranges:
            if shape is not None and len(shape) != 0:
                raise OpError(op, f"input_{label} must be a scalar if axis is unspecified")
        return
    for label, shape in ranges:
        _rank_one_per_axis(op, f"input_{label}", shape)
    depth = None if x is None else x[axis]
    for label, shape in ranges:
        if depth is not None and shape is not None and shape[0] is not None and shape[0] != depth:
            raise OpError(op, f"{label} has incorrect size, expected {depth} was {shape[0]}")
