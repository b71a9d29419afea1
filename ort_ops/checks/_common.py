"""Pieces of the rules both quantization families share: TF's number printing and the gradient's size rule."""
from __future__ import annotations

import numpy as np

from ort_ops.spec import OpError


def tf_float(value) -> str:
    """A float the way TensorFlow's StrCat prints it: the shortest of %.6g/%.9g (float32) or
    %.15g/%.17g (float64) that reads back exactly."""
    v = np.asarray(value)
    t = v.dtype.type
    if np.isnan(v):
        return "-nan" if np.signbit(v) else "nan"
    if np.isinf(v):
        return "-inf" if v < 0 else "inf"
    short, long_ = ("%.6g", "%.9g") if v.dtype == np.float32 else ("%.15g", "%.17g")
    text = short % float(v)
    return text if t(float(text)) == v else long_ % float(v)


def shapes_differ(a, b) -> bool:
    """Whether two partly known shapes (see ort_ops.spec.OpSpec) are known to differ."""
    if a is None or b is None:
        return False
    return len(a) != len(b) or any(x is not None and y is not None and x != y for x, y in zip(a, b))


def merged(a, b):
    """The shape two shapes that do not differ describe, unknown dims taken from the other."""
    if a is None or b is None:
        return b if a is None else a
    return tuple(x if x is not None else y for x, y in zip(a, b))


def gradient_same_size(op: str, gradients, inputs):
    """The gradient must have the input's shape (FakeQuant's Vars gradients, QDQ's V4Grad); returns the
    shape both describe."""
    if shapes_differ(gradients, inputs):
        raise OpError(op, "gradient and input must be the same size")
    return merged(gradients, inputs)
