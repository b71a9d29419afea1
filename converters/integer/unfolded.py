"""Keep tf2onnx from folding the weight quantizers into float constants (integer lowering only).

tf2onnx evaluates every TF node whose inputs are all constants in a TF session before conversion
(``tf2onnx.tf_utils.compute_const_folding_using_tf``); a weight's ``FakeQuantWithMinMaxVarsPerChannel`` on its
frozen kernel and ranges is such a node, and would reach ONNX as float values on TF's grid without the grid.
The integer lowering needs the quantizer itself (its range gives the scale and zero point, its input the
integers), so while it converts, every folded value that depends on a quantizer's output is dropped from
tf2onnx's table: the quantizer stays a node, with its constant inputs (converters.variable_state.freeze's
``keep_quantized_constants`` keeps grappler from folding it first).
"""
from __future__ import annotations

import contextlib

from converters.family import QUANTIZATION_OPS


def _quantizer_dependent_outputs(tf_graph) -> set:
    """Names of the tensors of ``tf_graph`` computed from a quantizer's output (its own outputs included)."""
    tainted = set()
    for op in tf_graph.get_operations():  # TF lists operations in creation order: inputs first
        if op.type in QUANTIZATION_OPS or any(t.name in tainted for t in op.inputs):
            tainted.update(t.name for t in op.outputs)
    return tainted


@contextlib.contextmanager
def quantizers_unfolded():
    """While active, tf2onnx's TF-session folding leaves quantizers (and what reads them) as nodes."""
    import tf2onnx.tfonnx as tfonnx

    original = tfonnx.compute_const_folding_using_tf

    def folding(g, const_node_values, graph_outputs):
        values, shapes = original(g, const_node_values, graph_outputs)
        for name in _quantizer_dependent_outputs(g) & set(values):
            del values[name]
        return values, shapes

    tfonnx.compute_const_folding_using_tf = folding
    try:
        yield
    finally:
        tfonnx.compute_const_folding_using_tf = original
