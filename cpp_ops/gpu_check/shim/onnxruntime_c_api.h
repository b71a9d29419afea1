// Stand-in for ONNX Runtime's C API header, for the GPU check program only: it reads the op table
// (cpp_ops/src/ort/op_table.generated.h: attribute defaults, allowed strings, type combinations) without ONNX
// Runtime's headers, which the lent GPU machine does not have. Only what ort/op_table.h names is declared:
// the element types, with the numbers of ONNX's TensorProto.DataType, and an opaque OrtCustomOp.
#pragma once

typedef enum ONNXTensorElementDataType {
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED = 0,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT = 1,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 = 6,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL = 9,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 = 10,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE = 11,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16 = 16,
} ONNXTensorElementDataType;

typedef struct OrtCustomOp OrtCustomOp;
