"""The integer lowering (``lowering="integer"``): a quantization-aware inference graph as the integer model it
was trained to become, in standard QDQ that ONNX Runtime fuses into its int8 kernels.

converters.pipeline converts the graph with every family node as the domain's, the weight quantizers kept as
nodes (converters.integer.unfolded), and hands the model to :func:`lower_to_integer`, which rewrites it
(converters.integer.rewrite) on TF's grids (converters.integer.grid). The model records, in its metadata, the
summary of what runs in integer and what stays float (``SUMMARY_KEY``) and each quantized output's step
(``OUTPUT_STEPS_KEY``), by which converters.integer.steps judges it against TF. docs/integer.md.
"""
from __future__ import annotations

import json
from typing import Iterable

import onnx

from converters.errors import ConversionError
from converters.integer.rewrite import IntegerSummary, rewrite

SUMMARY_KEY = "converters.integer.summary"
OUTPUT_STEPS_KEY = "converters.integer.output_steps"
MIN_OPSET = 13  # DequantizeLinear's per-axis scales


def check_integer_opset(opset: int) -> int:
    if opset < MIN_OPSET:
        raise ConversionError(f"the integer lowering needs opset {MIN_OPSET} or later (per-channel "
                              f"DequantizeLinear), got {opset}")
    return opset


def refuse_training_graph(nodes: Iterable) -> None:
    """A training step (a gradient of the family, or of anything: TF's gradient ops) has no integer model."""
    gradients = sorted({n.type for n in nodes if "Grad" in n.type or "Backprop" in n.type})
    if gradients:
        raise ConversionError(
            "the integer lowering converts inference graphs; this graph computes gradients (" + ", ".join(gradients[:6])
            + "): a training step or saliency map runs in float. Convert it with lowering='custom' or 'standard'")


def lower_to_integer(model: onnx.ModelProto, weights: str = "uint8"):
    """(the model as QDQ, its IntegerSummary, {quantized output: step}); the model's domain nodes are rewritten
    or the conversion fails naming the node. ``weights``: converters.integer.rewrite.rewrite's."""
    model, summary, steps = rewrite(model, weights)
    if not summary.weight_quantizers and not summary.activation_quantizers:
        raise ConversionError("the integer lowering found no quantizer in this graph: it is a float model, with "
                              "nothing to run in integer. Convert it with lowering='custom' or 'standard', or "
                              "quantize it first (tfmot's quantize_model, keras.quantizers)")
    return model, summary, steps


def record(model: onnx.ModelProto, summary: IntegerSummary, steps: dict) -> None:
    """Add the summary and the output steps to the model's metadata."""
    entry = model.metadata_props.add()
    entry.key, entry.value = SUMMARY_KEY, json.dumps(summary.lines())
    entry = model.metadata_props.add()
    entry.key, entry.value = OUTPUT_STEPS_KEY, json.dumps(steps)


def read_summary(model: onnx.ModelProto):
    """(summary lines, {output: step}) recorded in an integer model, or None for another model."""
    props = {p.key: p.value for p in model.metadata_props}
    if SUMMARY_KEY not in props:
        return None
    return json.loads(props[SUMMARY_KEY]), json.loads(props.get(OUTPUT_STEPS_KEY, "{}"))


__all__ = ["IntegerSummary", "lower_to_integer", "record", "read_summary", "check_integer_opset",
           "refuse_training_graph", "SUMMARY_KEY", "OUTPUT_STEPS_KEY"]
