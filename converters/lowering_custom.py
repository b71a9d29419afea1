"""lowering="custom": each family op becomes one node of the domain ``ai.onnx.converters.tensorflow``.

The new node has the TF op name as op_type, the TF inputs in TF order, the same output names, and
the TF attributes under their TF names (bools as INT 0/1, strings as STRING, int lists as INTS,
every attribute written out with TF's default filled in). Type attributes (T, U) are dropped:
ONNX carries element types on the tensors.
"""
from __future__ import annotations

import ort_ops
from converters.family import tf_attributes, validate_node
from ort_ops.model import node_attributes
from ort_ops.schemas import DOMAIN


def onnx_attributes(op_type: str, attrs: dict) -> dict:
    """Attributes as they go on the ONNX node. An empty int list (explicit_paddings' default) is left
    out: ONNX cannot type an empty list, and the op reads a missing attribute as TF's default."""
    out = node_attributes(op_type, attrs)
    return {k: v for k, v in out.items() if not (isinstance(v, list) and not v)}


def lower_to_custom_node(ctx, node, op_type: str) -> None:
    """Replace TF ``node`` of ``op_type`` in tf2onnx graph ``ctx`` with its node of the domain.

    The spec's checks run first on what is known at conversion time, so a node TF would reject fails
    the conversion (ort_ops.OpError) instead of every run of the model."""
    spec = ort_ops.get_spec(op_type)
    attrs = tf_attributes(node, spec)
    validate_node(ctx, node, spec, attrs)
    attrs = onnx_attributes(op_type, attrs)
    name = node.name
    inputs = list(node.input)
    outputs = list(node.output)
    shapes = [ctx.get_shape(o) for o in outputs]
    dtypes = [ctx.get_dtype(o) for o in outputs]
    ctx.remove_node(name)
    ctx.make_node(
        op_type,
        inputs,
        attr=attrs,
        outputs=outputs,
        name=name,
        shapes=shapes,
        dtypes=dtypes,
        domain=DOMAIN,
    )
