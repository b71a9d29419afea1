"""The ONNX custom domain ``ai.onnx.converters.tensorflow``: TensorFlow's quantization, batch-norm and
depthwise op family with TensorFlow's exact semantics.

- ``OP_SPECS``: one declarative spec per op (``ort_ops.spec.OpSpec``), the single source of truth.
- ``register_schemas()``: onnx schemas with type and shape inference.
- ``reference_evaluator(model)``: an onnx ReferenceEvaluator running the NumPy kernels.
- ``library_path()``: the compiled ORT custom-op library (``cpp_ops``); ``cuda_kernels_built()``: whether
  it has CUDA kernels (built where a CUDA compiler was found; ``cuda_build_info()`` says why).
- ``lowest_ir_version(model)``: the IR version every model the project writes carries, the lowest its opsets
  and types need (opset 17: IR 8, which every onnxruntime from 1.17 reads).
"""
from ort_ops.evaluator import reference_evaluator
from ort_ops.library import cuda_build_info, cuda_kernel_count, cuda_kernels_built, library_path, session_options
from ort_ops.model import lowest_ir_version, make_node, make_single_op_model
from ort_ops.schemas import DOMAIN, OPSET_VERSION, register_schemas
from ort_ops.spec import OpError, OpSpec
from ort_ops.specs import OP_SPECS, get_spec

OP_NAMES = tuple(spec.name for spec in OP_SPECS)

__all__ = [
    "DOMAIN",
    "OPSET_VERSION",
    "OP_SPECS",
    "OP_NAMES",
    "lowest_ir_version",
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
