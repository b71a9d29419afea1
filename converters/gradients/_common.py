"""Helpers the gradient handlers share: input checks and TF's flush-to-zero arithmetic in ONNX.

TF runs its CPU kernels with denormals-are-zero and flush-to-zero on: a subnormal operand acts as a
zero of its sign and a subnormal result becomes one. ONNX Runtime computes with subnormals, so an
exact handler flushes the float inputs that enter arithmetic, and every product that can land in the
subnormal range. A comparison with 0 under DAZ is a comparison with the smallest normal instead.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from converters.standard._builder import NP_TYPES, Lowering

FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.DOUBLE)


def float_type(b: Lowering, index: int):
    """The NumPy float type of input ``index``; fails for anything but float32/float64."""
    onnx_type = b.dtype(index)
    if onnx_type not in FLOAT_TYPES:
        b.fail(f"input {index} ({b.inputs[index]!r}) has element type {TensorProto.DataType.Name(onnx_type)}; "
               "only float32 and float64 are converted")
    return NP_TYPES[onnx_type]


def smallest_normal(b: Lowering, np_type, negative: bool = False) -> str:
    tiny = np.finfo(np_type).tiny
    return b.const(-tiny if negative else tiny, np_type)


def daz(b: Lowering, v: str, np_type) -> str:
    """``v`` with subnormals replaced by zeros of their sign, NaN kept (v times a 0/1 mask, which
    keeps the sign of a flushed zero without ONNX Runtime's signed-zero loss in Where)."""
    keep = b.op("GreaterOrEqual", b.op("Abs", v), smallest_normal(b, np_type))
    # NaN compares false: NaN * 0 is NaN again.
    return b.op("Mul", v, b.op("Cast", keep, to=_onnx_type(np_type)))


def _onnx_type(np_type) -> int:
    return TensorProto.DOUBLE if np.dtype(np_type) == np.float64 else TensorProto.FLOAT


onnx_type = _onnx_type


def positive(b: Lowering, x: str, np_type) -> str:
    """x > 0 as TF evaluates it under DAZ (a positive subnormal is zero)."""
    return b.op("GreaterOrEqual", x, smallest_normal(b, np_type))


def negative(b: Lowering, x: str, np_type) -> str:
    """x < 0 as TF evaluates it under DAZ."""
    return b.op("LessOrEqual", x, smallest_normal(b, np_type, negative=True))


def mask(b: Lowering, cond: str, np_type) -> str:
    return b.op("Cast", cond, to=_onnx_type(np_type))


def is_zero(b: Lowering, v: str, np_type) -> str:
    """v == 0 as TF evaluates it under DAZ (subnormals are zero)."""
    return b.op("Less", b.op("Abs", v), smallest_normal(b, np_type))


def flushed_product(b: Lowering, x: str, factor: str, np_type, pass_through: str = None) -> str:
    """TF's ``x * factor`` under DAZ/FTZ: a subnormal ``x`` or product gives a zero of the product's
    sign (a subnormal x times inf gives NaN, as 0 * inf). With ``pass_through`` (a boolean), those elements are ``x`` itself,
    untouched (``factor`` must be 1 there): TF's ``cond ? x : x * factor`` selects x unflushed."""
    tiny = smallest_normal(b, np_type)
    product = b.op("Mul", x, factor)
    keep = b.op("And", b.op("GreaterOrEqual", b.op("Abs", x), tiny), b.op("GreaterOrEqual", b.op("Abs", product), tiny))
    if pass_through is not None:
        keep = b.op("Or", keep, pass_through)
    # NaN products: keep is false and NaN * 0 stays NaN.
    return b.op("Mul", product, mask(b, keep, np_type))


def mul_no_nan(b: Lowering, a: str, x: str, np_type) -> str:
    """TF's mul_no_nan(a, x) under DAZ/FTZ: +0 where x is zero (even if a is inf or NaN), else a * x."""
    product = daz(b, b.op("Mul", a, x), np_type)
    return b.where(is_zero(b, x, np_type), b.const(0.0, np_type), product, np_type)
