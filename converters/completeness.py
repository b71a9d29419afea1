"""After tf2onnx: prove that no TensorFlow op was left behind.

tf2onnx only logs ops it cannot convert and leaves them in the graph under the default domain,
so a model can look finished and fail only when loaded. Every node of the result must be an
operator onnx knows for its domain at the imported opset, or one of this project's ops.
"""
from __future__ import annotations

import onnx

from converters.errors import UnconvertedOpsError
from converters.family import FAMILY_OPS, unshielded_type
from ort_ops.schemas import DOMAIN


def _opset_versions(model: onnx.ModelProto) -> dict:
    return {imp.domain or "": imp.version for imp in model.opset_import}


def _is_converted(node: onnx.NodeProto, versions: dict, local_functions: set) -> bool:
    domain = node.domain or ""
    if (domain, node.op_type) in local_functions:
        return True
    if domain == DOMAIN:
        return node.op_type in FAMILY_OPS and domain in versions
    if domain not in versions:
        return False
    try:
        onnx.defs.get_schema(node.op_type, versions[domain], domain)
    except onnx.defs.SchemaError:
        return False
    return True


def _walk(nodes):
    """Every node, including those of subgraphs (If/Loop/Scan bodies)."""
    for node in nodes:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _walk(attr.g.node)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _walk(g.node)


def unconverted_ops(model: onnx.ModelProto) -> list:
    """(TF op type, node name) for every node that is not a valid ONNX or domain operator."""
    versions = _opset_versions(model)
    local_functions = {(f.domain or "", f.name) for f in model.functions}
    bad = []
    for node in _walk(model.graph.node):
        if not _is_converted(node, versions, local_functions):
            bad.append((unshielded_type(node.op_type), node.name))
    for function in model.functions:
        for node in _walk(function.node):
            if not _is_converted(node, versions, local_functions):
                bad.append((unshielded_type(node.op_type), node.name))
    return bad


def check_fully_converted(model: onnx.ModelProto) -> None:
    """Raise UnconvertedOpsError listing every op tf2onnx left unconverted."""
    bad = unconverted_ops(model)
    if bad:
        raise UnconvertedOpsError(bad)
