"""The registry of gradient-op handlers: ``@gradient_op("Relu6Grad")`` and what the pipeline needs.

A handler is ``fn(ctx, node, lowering)``: ``ctx`` the tf2onnx Graph, ``node`` the TF node (its
``type`` already the TF op type again), ``lowering`` "custom" or "standard". It follows tf2onnx's
handler contract: it removes the TF node and builds nodes whose outputs carry the TF node's output
names. With lowering "standard" it may build standard ONNX only; with "custom" it may also use ops
of the domain ``ai.onnx.converters.tensorflow``. A handler that cannot convert a node exactly raises
converters.errors.LoweringError / ConversionError naming op and node (never a wrong model).

Registered ops are shielded from tf2onnx's rewriters and built-in handlers the same way as the
family (converters.family): right after parsing they get a private op type that only our handler
knows, so a handler here always takes precedence over tf2onnx's own (e.g. Conv2DBackpropInput).
"""
from __future__ import annotations

from typing import Callable, Dict

from converters.errors import ConversionError
from converters.family import shield_nodes, shielded_type

GradientHandler = Callable[[object, object, str], None]

GRADIENT_HANDLERS: Dict[str, GradientHandler] = {}


def gradient_op(*op_types: str):
    """Register the decorated ``fn(ctx, node, lowering)`` as the handler of every TF op in ``op_types``.

    Registering an op twice is an error: two modules claiming one op is a bug, not an override.
    """
    if not op_types:
        raise ValueError("gradient_op needs at least one TF op type")

    def register(fn: GradientHandler) -> GradientHandler:
        for op_type in op_types:
            if op_type in GRADIENT_HANDLERS:
                owner = GRADIENT_HANDLERS[op_type]
                raise ValueError(f"{op_type} already has a gradient handler: {owner.__module__}.{owner.__name__}")
            GRADIENT_HANDLERS[op_type] = fn
        return fn

    return register


def gradient_op_types() -> tuple:
    return tuple(sorted(GRADIENT_HANDLERS))


def shield_gradient_nodes(graph) -> int:
    """Give every node of a registered gradient op its private type; returns how many there were."""
    return shield_nodes(graph, GRADIENT_HANDLERS)


def gradient_handlers(lowering: str, failures: list) -> dict:
    """tf2onnx custom_op_handlers for the shielded gradient types.

    tf2onnx (continue_on_error) only logs a handler's exception; it is also appended to
    ``failures`` so that the pipeline raises it.
    """

    def make_handler(op_type, fn):
        def handler(ctx, node, name, args):
            node.type = op_type
            try:
                fn(ctx, node, lowering)
            except ConversionError as e:
                failures.append(e)
                raise
            except Exception as e:
                failures.append(ConversionError(f"{op_type} (node {name!r}): {type(e).__name__}: {e}"))
                raise

        return handler

    return {shielded_type(op): (make_handler(op, fn), []) for op, fn in GRADIENT_HANDLERS.items()}
