"""TensorFlow graphs -> ONNX models that ONNX Runtime runs exactly like TensorFlow.

Built on tf2onnx for every op outside the family. The family (FakeQuant*, QuantizeAndDequantize*,
FusedBatchNorm*, DepthwiseConv2dNative*, 19 ops) is converted here, in one of two lowerings:

- ``lowering="custom"`` (default): one node of the domain ``ai.onnx.converters.tensorflow`` per op,
  run by the custom-op library (``ort_ops.library_path()``);
- ``lowering="standard"``: standard ONNX operators only (converters.standard), where exact;
- ``lowering="integer"``: a quantization-aware inference graph as the integer (QDQ) model ONNX Runtime runs with its
  int8 kernels, judged in quantization steps (converters.integer, docs/integer.md).

Verification: ``verify`` (end to end, every output) and ``verify_nodes`` (every converted op on TF's own input
values), docs/verification.md. Every model carries the lowest IR version its opsets need (``ort_ops.lowest_ir_version``); conversion fails with
``UnconvertedOpsError`` rather than leaving a TF op behind.
"""
from converters.errors import ConversionError, LoweringError, UnconvertedOpsError
from converters.frontends import (
    from_concrete_function,
    from_function,
    from_graph_def,
    from_keras,
    from_keras_train_step,
    from_saved_model,
)
from converters.pipeline import ALL_LOWERINGS, DEFAULT_OPSET, LOWERINGS, convert_frozen_graph
from converters.node_verification import NodeReport, verify_nodes
from converters.verification import (
    OutputCheck,
    VerifyReport,
    verify,
    verify_graph_def,
    verify_keras,
    verify_saved_model,
)

__all__ = [
    "ConversionError",
    "LoweringError",
    "UnconvertedOpsError",
    "DEFAULT_OPSET",
    "LOWERINGS",
    "ALL_LOWERINGS",
    "convert_frozen_graph",
    "from_concrete_function",
    "from_function",
    "from_graph_def",
    "from_keras",
    "from_keras_train_step",
    "from_saved_model",
    "NodeReport",
    "OutputCheck",
    "VerifyReport",
    "verify",
    "verify_graph_def",
    "verify_keras",
    "verify_nodes",
    "verify_saved_model",
]
