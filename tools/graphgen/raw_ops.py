"""The raw family: a chain of the family's TF ops called directly (``tf.raw_ops``), with every attribute TF accepts.

Each op is a dict: ``{"op": "fq_args" | "fq_vars" | "fq_vars_pc" | "qdq" | "bn" | "dw" | "relu", ...attributes}``.
This module holds the attribute spaces (drawn by ``draw``, counted by ``report``'s coverage) and the shape rule;
``build`` writes the ops in TF. No TensorFlow here.
"""
from __future__ import annotations

import math

from tools.graphgen.spec import InvalidGraph

FAKE_QUANT_BITS = tuple(range(2, 17))  # TF accepts num_bits 2..16
QDQ_BITS = tuple(range(2, 17))
QDQ_VERSIONS = (2, 3, 4)
ROUND_MODES = ("HALF_TO_EVEN", "HALF_UP")
BN_VERSIONS = (1, 2, 3)
DATA_FORMATS = ("NHWC", "NCHW")
PADDINGS = ("SAME", "VALID", "EXPLICIT")


def _dw_size(n: int, op: dict, axis: int) -> int:
    k, s, d = op["kernel"], op["strides"], op["dilations"]
    effective = (k - 1) * d + 1
    if op["padding"] == "SAME":
        return math.ceil(n / s)
    before, after = op["explicit"][axis] if op["padding"] == "EXPLICIT" else (0, 0)
    padded = n + before + after
    if padded < effective:
        raise InvalidGraph(f"depthwise kernel {k} dilation {d} over {padded} pixels")
    return (padded - effective) // s + 1


def raw_shape(op: dict, shape):
    h, w, c = shape
    kind = op["op"]
    if kind in ("fq_args", "fq_vars", "qdq", "bn", "relu"):
        if kind == "qdq" and op.get("axis", -1) not in (-1,) and op["axis"] > 3:
            raise InvalidGraph(f"QuantizeAndDequantize axis {op['axis']} of a 4-D tensor")
        return shape
    if kind == "fq_vars_pc":
        if len(op["min"]) != c:
            raise InvalidGraph(f"{len(op['min'])} per-channel ranges for {c} channels")
        return shape
    if kind == "dw":
        return _dw_size(h, op, 0), _dw_size(w, op, 1), c * op["multiplier"]
    raise InvalidGraph(f"unknown raw op {kind!r}")


def raw_chain_check(spec) -> None:
    shape = tuple(spec.input)
    for op in spec.raw:
        shape = raw_shape(op, shape)
