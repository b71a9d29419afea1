"""Standard-ONNX lowerings of the op family: models that run on any ONNX Runtime build and execution
provider without the custom-op library.

``STANDARD_LOWERINGS`` maps a TF op type to ``fn(ctx, node)`` with tf2onnx's handler contract: ``ctx``
is the tf2onnx Graph, ``node`` the TF node; the function replaces the node by standard-domain nodes
that produce the node's output names, or raises converters.errors.LoweringError when the op cannot
be written exactly (never a wrong model).
"""
from converters.standard import batch_norm, depthwise, fake_quant, quantize_dequantize

STANDARD_LOWERINGS = {
    **fake_quant.LOWERINGS,
    **quantize_dequantize.LOWERINGS,
    **batch_norm.LOWERINGS,
    **depthwise.LOWERINGS,
}

__all__ = ["STANDARD_LOWERINGS"]
