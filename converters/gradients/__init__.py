"""Handlers for the gradient ops TF's autodiff emits (ReluGrad, Conv2DBackpropFilter, MaxPoolGrad, ...).

One small handler per TF op, registered with ``@gradient_op("OpType")`` from
converters.gradients.registry; see there for the handler contract (``fn(ctx, node, lowering)``,
both lowerings). The pipeline shields every registered op from tf2onnx's rewriters and built-in
handlers, so a handler here replaces tf2onnx's own.

Adding handlers: put them in a module of this package. Importing the package imports every module
named in ``HANDLER_MODULES`` below, then every module whose name starts with ``extra_`` (found with
pkgutil), so a new ``extra_<group>.py`` file registers itself without editing this file.
"""
from __future__ import annotations

import importlib
import pkgutil

from converters.gradients.registry import (
    GRADIENT_HANDLERS,
    gradient_handlers,
    gradient_op,
    gradient_op_types,
    shield_gradient_nodes,
)

HANDLER_MODULES = (
    "activations",
    "bias_conv",
    "pooling",
    "losses",
    "slicing",
    "resizing",
    "shapes",
)


def _import_handler_modules() -> None:
    for module in HANDLER_MODULES:
        importlib.import_module(f"{__name__}.{module}")
    extras = sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name.startswith("extra_"))
    for module in extras:
        importlib.import_module(f"{__name__}.{module}")


_import_handler_modules()

__all__ = ["GRADIENT_HANDLERS", "gradient_handlers", "gradient_op", "gradient_op_types", "shield_gradient_nodes"]
