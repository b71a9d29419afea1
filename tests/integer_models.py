"""Helpers the integer-lowering tests share: running a model in ONNX Runtime's CPU provider (optimized, so its QDQ
fusions run, or not) and cutting a model down to its graph input's integers."""
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper


def run_ort(model, feeds, outputs=None, optimize=True):
    """``model``'s outputs (a list, in order) on ``feeds``; ``optimize=False``: ONNX Runtime's graph optimizations
    off (no QDQ fusion: float operators on the dequantized values)."""
    options = ort.SessionOptions()
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(outputs, feeds)


def input_quantizer_integers(model):
    """The model truncated to its input quantizer's integers (the Cast that ends TF's exact rounding)."""
    cast = next(n for n in model.graph.node if n.op_type == "Cast")
    truncated = onnx.ModelProto()
    truncated.CopyFrom(model)
    del truncated.graph.output[:]
    truncated.graph.output.append(helper.make_tensor_value_info(cast.output[0], TensorProto.UINT8, None))
    return truncated
