"""The ONNX custom domain ``ai.onnx.converters.tensorflow``: TensorFlow's quantization, batch-norm and
depthwise op family with TensorFlow's exact semantics.

- ``OP_SPECS``: one declarative spec per op (``ort_ops.spec.OpSpec``), the single source of truth.
- ``register_schemas()``: onnx schemas with type and shape inference.
- ``reference_evaluator(model)``: an onnx ReferenceEvaluator running the NumPy kernels.
- ``library_path()``: the compiled ORT custom-op library (``cpp_ops``); ``cuda_kernels_built()``: whether
  it has CUDA kernels (the default build has none until they pass a GPU run; ``cuda_build_info()`` says why).
"""
from ort_ops.evaluator import reference_evaluator
from ort_ops.library import cuda_build_info, cuda_kernel_count, cuda_kernels_built, library_path, session_options
from ort_ops.model import IR_VERSION, make_node, make_single_op_model
from ort_ops.schemas import DOMAIN, OPSET_VERSION, register_schemas
from ort_ops.spec import OpError, OpSpec
from ort_ops.specs import OP_SPECS, get_spec

OP_NAMES = tuple(spec.name for spec in OP_SPECS)

__all__ = [
    "DOMAIN",
    "OPSET_VERSION",
    "OP_SPECS",
    "OP_NAMES",
    "IR_VERSION",
    "OpError",
    "OpSpec",
    "get_spec",
    "register_schemas",
    "reference_evaluator",
    "cuda_build_info",
    "cuda_kernel_count",
    "cuda_kernels_built",
    "library_path",
    "session_options",
    "make_node",
    "make_single_op_model",
]
