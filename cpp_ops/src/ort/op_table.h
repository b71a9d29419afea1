// The op table: every op of the domain with its attributes (kind, TF's default or required, allowed
// strings) and the type combinations it is registered for. The data is GENERATED from the specs
// (ort_ops/specs/) by `python -m ort_ops.codegen` into op_table.generated.h; this header holds its
// types and the queries on it. Why generated: the specs are the single source of truth, so the
// attribute defaults the adapters use (KernelAttributes reads through this table, op_base.h) and
// the registered types (checked by CheckRegisteredOps when the library is loaded) cannot drift from
// the Python side; tests/test_cpp_op_table.py fails when the committed header is stale.
#pragma once

#include <onnxruntime_c_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tfops {
namespace ort {
namespace op_table {

template <typename T>
struct Span {
  const T* data = nullptr;
  std::size_t size = 0;
  constexpr const T* begin() const { return data; }
  constexpr const T* end() const { return data + size; }
};

enum class AttrKind { kFloat, kInt, kBool, kString, kInts };

struct AttrSpec {
  const char* name;
  AttrKind kind;
  bool required;
  float float_default;  // kFloat
  std::int64_t int_default;  // kInt; kBool as 0 or 1
  const char* string_default;  // kString
  Span<std::int64_t> ints_default;  // kInts
  Span<const char*> choices;  // kString: the allowed values (empty: any)
};

constexpr AttrSpec FloatAttr(const char* name, float value) {
  return {name, AttrKind::kFloat, false, value, 0, "", {}, {}};
}
constexpr AttrSpec IntAttr(const char* name, std::int64_t value) {
  return {name, AttrKind::kInt, false, 0.0f, value, "", {}, {}};
}
constexpr AttrSpec BoolAttr(const char* name, bool value) {
  return {name, AttrKind::kBool, false, 0.0f, value ? 1 : 0, "", {}, {}};
}
constexpr AttrSpec StringAttr(const char* name, const char* value, Span<const char*> choices) {
  return {name, AttrKind::kString, false, 0.0f, 0, value, {}, choices};
}
constexpr AttrSpec IntsAttr(const char* name, Span<std::int64_t> value) {
  return {name, AttrKind::kInts, false, 0.0f, 0, "", value, {}};
}
constexpr AttrSpec RequiredAttr(const char* name, AttrKind kind, Span<const char*> choices) {
  return {name, kind, true, 0.0f, 0, "", {}, choices};
}

constexpr ONNXTensorElementDataType kF32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
constexpr ONNXTensorElementDataType kF64 = ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE;
constexpr ONNXTensorElementDataType kF16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
constexpr ONNXTensorElementDataType kBF16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
constexpr ONNXTensorElementDataType kI32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;

struct OpEntry {
  const char* name;
  Span<AttrSpec> attrs;
  std::size_t input_count, output_count;
  // `combinations` blocks of input_count + output_count types: the inputs, then the outputs.
  Span<ONNXTensorElementDataType> types;
  std::size_t combinations() const { return types.size / (input_count + output_count); }
};

// The op named `name`, or null when the table has none.
const OpEntry* FindOp(const char* name);
// Its attribute named `name`, or null when the op declares none.
const AttrSpec* FindAttr(const OpEntry& op, const char* name);

// "" when `registered` (every OrtCustomOp of the library) registers exactly the table's ops and type
// combinations for the CPU execution provider (and, for the CUDA one, only table combinations);
// otherwise what differs.
std::string CheckRegisteredOps(const std::vector<const OrtCustomOp*>& registered);

// The registered ops and the table's attributes as JSON, for tests/test_cpp_op_table.py.
std::string DescribeAsJson(const std::vector<const OrtCustomOp*>& registered);

}  // namespace op_table
}  // namespace ort
}  // namespace tfops
