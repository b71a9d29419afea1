"""What ONNX Runtime makes of an integer model: its optimized graph, counted.

The QDQ groups the integer lowering writes are fused by ONNX Runtime's QDQ transformers when a session is
created (onnxruntime/core/optimizer/qdq_transformer): DQ -> Conv -> Q becomes QLinearConv, DQ -> Gemm -> Q
QGemm, DQ -> Add -> Q QLinearAdd, and so on. Whether they were is read here from the graph ONNX Runtime itself
optimized (``SessionOptions.optimized_model_filepath``), not assumed.
"""
from __future__ import annotations

import collections
import os
import tempfile

import onnx

# The integer kernels, by the op of the written model they stand for.
FUSED = {"Conv": ("QLinearConv",), "Gemm": ("QGemm",), "MatMul": ("QLinearMatMul", "MatMulIntegerToFloat"),
         "Add": ("QLinearAdd",), "GlobalAveragePool": ("QLinearGlobalAveragePool",)}


LEVELS = ("basic", "extended", "all")


def optimized_graph(model: onnx.ModelProto, level: str = "extended") -> onnx.ModelProto:
    """``model`` as ONNX Runtime's CPU provider optimizes it at ``level`` ("basic", "extended" or "all")."""
    import onnxruntime as ort

    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    options = ort.SessionOptions()
    options.graph_optimization_level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                                        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[level]
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory() as tmp:
        options.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return onnx.load(options.optimized_model_filepath)


def optimized_op_counts(model: onnx.ModelProto, level: str = "extended") -> collections.Counter:
    """Op types of ``model`` as ONNX Runtime's CPU provider optimizes it (``level``: see optimized_graph)."""
    return collections.Counter(n.op_type for n in optimized_graph(model, level).graph.node)


def fusion_lines(model: onnx.ModelProto) -> list:
    """One line per fusable op type of the written model: how many ONNX Runtime runs as integer kernels,
    e.g. ``QLinearConv 52/52``; and the float convolutions and matmuls left, if any."""
    dequantized = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    # A depthwise convolution left in NHWC reads its DQ through a Transpose to NCHW (converters.integer.rewrite).
    dequantized |= {n.output[0] for n in model.graph.node if n.op_type == "Transpose" and n.input[0] in dequantized}
    # The written ops in a QDQ group: their data inputs dequantized (the exact input quantization's Add is not).
    written = collections.Counter(n.op_type for n in model.graph.node
                                  if n.op_type in FUSED and all(i in dequantized for i in n.input[:2] if i))
    optimized = optimized_op_counts(model)
    lines = []
    for op, kernels in FUSED.items():
        if written.get(op):
            fused = sum(optimized.get(k, 0) for k in kernels)
            lines.append(f"{'/'.join(kernels)} {fused}/{written[op]} (ONNX Runtime's optimized graph: {op} "
                         "run in integer)")
    left = {op: optimized[op] for op in ("Conv", "Gemm", "MatMul", "FusedConv", "FusedGemm", "FusedMatMul")
            if optimized.get(op)}
    if left:
        lines.append("left in float by ONNX Runtime: " + ", ".join(f"{op} {n}" for op, n in sorted(left.items())))
    return lines
