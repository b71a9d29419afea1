"""Which outputs of a converted model are held bit-exact: those a quantization op produces.

The converter (converters.pipeline) traces them in the frozen TF graph and records them in the model's
metadata; the checks (converters.verification) read the record. A module of its own so that the
conversion core does not depend on the QA module.
"""
from __future__ import annotations

import ort_ops
from converters.family import QUANTIZATION_OPS

_PASS_THROUGH = {"Identity", "IdentityN", "StopGradient", "Snapshot", "PreventGradient"}

EXACT_OUTPUTS_KEY = "converters.bit_exact_outputs"


def recorded_exact_outputs(onnx_model) -> set:
    """Output names the converter recorded as produced by a quantization op."""
    for prop in onnx_model.metadata_props:
        if prop.key == EXACT_OUTPUTS_KEY:
            return {n for n in prop.value.split(",") if n}
    return set()


def quantization_outputs(tf_graph, output_names, renames=None) -> list:
    """Those of ``output_names`` (tensor names in ``tf_graph``) produced by a quantization op."""
    renames = renames or {}
    return [
        renames.get(n, n) for n in output_names if producer_type(tf_graph.get_tensor_by_name(n)) in QUANTIZATION_OPS
    ]


def producer_type(tensor) -> str:
    """The op type behind a TF graph tensor, looking through identity-like ops."""
    op = tensor.op
    seen = 0
    while op.type in _PASS_THROUGH and op.inputs and seen < 64:
        index = tensor.value_index if op.type == "IdentityN" else 0
        tensor = op.inputs[index]
        op = tensor.op
        seen += 1
    if op.type in QUANTIZATION_OPS and tensor.value_index in ort_ops.get_spec(op.type).summed_outputs():
        # A summed output (FakeQuant's backprop_wrt_min/max) is a sum whose order TF does not fix (it
        # splits it by thread count), so it is held to the float tolerance rather than bit-exactness.
        return f"{op.type}:{tensor.value_index}"
    return op.type
