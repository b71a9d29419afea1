"""Shape-function building blocks shared by the families.

A shape is a tuple of dims (int, or None when unknown) or None when even the rank is unknown.
"""
from __future__ import annotations

from ort_ops.spec import OpError


def rank(shape):
    return None if shape is None else len(shape)


def same_as(index):
    """Output shape equal to input ``index``'s shape."""

    def fn(shapes, values, attrs):
        return [shapes[index]]

    return fn


def merge_dims(op, what, a, b):
    """The dim both a and b describe; an error when both are known and differ."""
    if a is None:
        return b
    if b is not None and a != b:
        raise OpError(op, f"{what}: {a} vs {b}")
    return a


def merge_shapes(op, message, a, b):
    if a is None:
        return b
    if b is None:
        return a
    if len(a) != len(b):
        raise OpError(op, message)
    out = []
    for x, y in zip(a, b):
        if x is not None and y is not None and x != y:
            raise OpError(op, message)
        out.append(x if x is not None else y)
    return tuple(out)


def require_rank(op, name, shape, expected):
    if shape is not None and len(shape) != expected:
        raise OpError(op, f"`{name}` must be rank {expected} but is rank {len(shape)}")
