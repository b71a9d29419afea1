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

import ort_ops

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
