"""The rules of FakeQuantWithMinMax{Args,Vars,VarsPerChannel} and their gradients, each written once.

TF's order: the constructor reads the attributes (Args: min < max, then num_bits; the others only
num_bits), then Compute looks at the inputs. Shapes may be partly known (None: unknown dim or rank);
a check those facts cannot decide is skipped. The element types (float32 only) are the spec's.
"""
from __future__ import annotations

import numpy as np

from ort_ops.checks._common import gradient_same_size, merged, shapes_differ, tf_float
from ort_ops.reference._fake_quant import flush
from ort_ops.spec import OpError, tf_shape

__all__ = ["args_range", "num_bits", "same_shape_binary", "gradient_same_size", "scalar_range", "channel_count"]


def args_range(op: str, attrs: dict) -> None:
    """Args ops: the attribute range must satisfy min < max."""
    # TF compares (and prints) the float32 attributes with denormals-are-zero on: subnormal bounds are
    # signed zeros, so min=-1e-38, max=1e-38 is rejected as "-0 >= 0".
    mn, mx = flush(np.float32(attrs["min"])), flush(np.float32(attrs["max"]))
    if not mn < mx:
        raise OpError(op, f"min has to be smaller than max, was: {tf_float(mn)} >= {tf_float(mx)}")


def num_bits(op: str, attrs: dict) -> None:
    if not 2 <= attrs["num_bits"] <= 16:
        raise OpError(op, "num_bits must be between 2 and 16, inclusive")


def same_shape_binary(op: str, a, b):
    """FakeQuantWithMinMaxArgsGradient is a binary element-wise kernel to TF: its inputs must have the
    same shape, in that base class's words. Returns the shape both describe."""
    if shapes_differ(a, b):
        raise OpError(
            op, f"Inputs to operation {op} of type {op} must have the same size and shape.  "
                f"Input 0: {tf_shape(a)} != input 1: {tf_shape(b)}"
        )
    return merged(a, b)


def scalar_range(op: str, mn, mx) -> None:
    """Vars ops: min and max are scalars."""
    for name, shape in (("min", mn), ("max", mx)):
        if shape is not None and len(shape) != 0:
            raise OpError(op, f"`{name}` must be rank 0 but is rank {len(shape)}")


def channel_count(op: str, x, mn, mx, axis: int = -1):
    """PerChannel ops: inputs of rank >= 1, a channel `axis` of -1 (the last dim, TF's only choice) or
    in [0, rank), and min and max vectors of that dim's size; returns that size (None when unknown)."""
    if x is not None and len(x) < 1:
        # TF 2.21 aborts the process here (CHECK failure); newer TF sources reject it with this message.
        raise OpError(op, "input must be at least rank 1")
    # `axis` is not TF's (spec deviation); checked after TF's own rank rule, before the sizes it selects.
    if axis != -1 and (axis < 0 or (x is not None and axis >= len(x))):
        rank = "?" if x is None else len(x)
        raise OpError(op, f"attribute axis must be -1 or in [0, rank) = [0, {rank}), was {axis}")
    depth = None if x is None else x[axis]
    for name, shape in (("min", mn), ("max", mx)):
        if shape is None:
            continue
        if len(shape) != 1:
            raise OpError(op, f"`{name}` must be rank 1 but is rank {len(shape)}")
        if depth is not None and shape[0] is not None and shape[0] != depth:
            raise OpError(op, f"{name} has incorrect size, expected {depth} was {shape[0]}")
        depth = depth if depth is not None else shape[0]
    return depth
