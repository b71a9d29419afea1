"""The TF ops this package converts itself, and how they are hidden from tf2onnx's own rewriters.

tf2onnx runs graph rewriters before any op handler: one turns QuantizeAndDequantizeV2/3/4 into
QuantizeLinear/DequantizeLinear pairs (ignoring num_bits, rounding mode, narrow range), one folds
SpaceToBatchND -> DepthwiseConv2dNative -> BatchToSpaceND into one conv, one splits
_Fused* ops. Handlers alone therefore cannot claim these ops. Instead, right after tf2onnx has
parsed the TF graph, every family node gets a private op type that no tf2onnx rewriter or
built-in handler knows ("shielding"); our handlers are registered under those private types and
restore the TF type before building the replacement.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

import ort_ops
from ort_ops import spec as op_spec

FAMILY_OPS = tuple(ort_ops.OP_NAMES)
QUANTIZATION_OPS = tuple(
    spec.name for spec in ort_ops.OP_SPECS if spec.family in ("fake_quant", "quantize_dequantize")
)

_SHIELD_PREFIX = "OrtOpsShielded_"


def shielded_type(op_type: str) -> str:
    return _SHIELD_PREFIX + op_type


def unshielded_type(op_type: str) -> str:
    return op_type[len(_SHIELD_PREFIX):] if op_type.startswith(_SHIELD_PREFIX) else op_type


def shield_nodes(graph, op_types) -> int:
    """Give every node of a tf2onnx ``graph`` whose type is in ``op_types`` its private type; returns how many."""
    count = 0
    for node in graph.get_nodes():
        if node.type in op_types:
            node.type = shielded_type(node.type)
            count += 1
    return count


def shield_family_nodes(graph) -> int:
    """Give every family node of a tf2onnx ``graph`` its private type; returns how many there were."""
    return shield_nodes(graph, FAMILY_OPS)


# tf2onnx's element types (ONNX TensorProto codes) as the specs write them.
_SPEC_TYPES = {
    TensorProto.FLOAT: op_spec.FLOAT,
    TensorProto.DOUBLE: op_spec.DOUBLE,
    TensorProto.FLOAT16: op_spec.FLOAT16,
    TensorProto.BFLOAT16: op_spec.BFLOAT16,
    TensorProto.INT32: op_spec.INT32,
}


def tf_attributes(node, spec) -> dict:
    """The spec's attributes of a tf2onnx ``node`` in Python form, TF's defaults filled in.

    Attributes the spec does not name (the type attributes T, U) are ignored. Raises
    ort_ops.OpError for a value the op does not accept (e.g. an unknown round_mode).
    """
    given = {a.name: node.get_attr_value(a.name) for a in spec.attrs if node.get_attr(a.name) is not None}
    return spec.with_defaults(given)


def validate_node(ctx, node, spec, attrs: dict) -> list:
    """Run the spec's checks on what the graph tells about ``node`` at conversion time: static shapes
    (unknown dims as None), constant inputs and element types. Returns the output shapes the spec
    infers; raises ort_ops.OpError, in the same words the kernels use at run time."""
    shapes, values, dtypes = [], [], []
    for name in node.input:
        shape = ctx.get_shape(name)
        shapes.append(None if shape is None else tuple(None if d < 0 else d for d in shape))
        values.append(np.asarray(ctx.get_tensor_value(name, as_list=False)) if ctx.is_const(name) else None)
        dtype = ctx.get_dtype(name)
        dtypes.append(None if dtype is None else _SPEC_TYPES.get(dtype, f"tensor({TensorProto.DataType.Name(dtype).lower()})"))
    return spec.validate(shapes, values, dtypes, attrs)
