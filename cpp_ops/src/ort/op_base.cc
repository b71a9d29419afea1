// The ORT-facing half of the adapter framework (see op_base.h).
#include "ort/op_base.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>

namespace tfops {
namespace ort {

namespace {
const OrtApi* g_api = nullptr;

// Releases an OrtTensorTypeAndShapeInfo when leaving scope.
struct TypeShapeInfoHolder {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  ~TypeShapeInfoHolder() {
    if (info != nullptr) Api().ReleaseTensorTypeAndShapeInfo(info);
  }
};

// "\"A\", \"B\"": the list TF prints after "is not in the list of allowed values: ".
std::string JoinChoices(op_table::Span<const char*> choices) {
  std::string out;
  for (const char* c : choices) {
    if (!out.empty()) out += ", ";
    out += "\"";
    out += c;
    out += "\"";
  }
  return out;
}
}  // namespace

const OrtApi& Api() { return *g_api; }
void SetApi(const OrtApi* api) { g_api = api; }

void Check(OrtStatus* status) {
  if (status == nullptr) return;
  const OrtErrorCode code = Api().GetErrorCode(status);
  std::string message = Api().GetErrorMessage(status);
  Api().ReleaseStatus(status);
  throw OrtCallError(code, message);
}

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw OpError("negative dimension in shape " + ShapeString(shape));
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) {
      throw OpError("shape " + ShapeString(shape) + " has too many elements");
    }
    n *= d;
  }
  return n;
}

const char* ElementTypeName(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return "double";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "int32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "int64";
    default: return "unsupported type";
  }
}

// ---------------------------------------------------------------- KernelAttributes

// ORT reports a missing attribute and a type mismatch with the same error code, so to tell them
// apart we try each attribute kind in turn.
KernelAttributes::Kind KernelAttributes::Probe(const char* name) const {
  const OrtApi& api = Api();
  auto ok = [&](OrtStatus* s) {
    if (s == nullptr) return true;
    api.ReleaseStatus(s);
    return false;
  };
  float f;
  int64_t i;
  std::size_t size = 0;
  if (ok(api.KernelInfoGetAttribute_float(info_, name, &f))) return Kind::kFloat;
  if (ok(api.KernelInfoGetAttribute_int64(info_, name, &i))) return Kind::kInt;
  if (ok(api.KernelInfoGetAttribute_string(info_, name, nullptr, &size))) return Kind::kString;
  size = 0;
  if (ok(api.KernelInfoGetAttributeArray_int64(info_, name, nullptr, &size))) return Kind::kInts;
  size = 0;
  if (ok(api.KernelInfoGetAttributeArray_float(info_, name, nullptr, &size))) return Kind::kFloats;
  return Kind::kMissing;
}

const op_table::AttrSpec& KernelAttributes::Declared(const char* name, op_table::AttrKind kind, bool present) const {
  const op_table::AttrSpec* attr = op_table::FindAttr(op_, name);
  if (attr == nullptr || attr->kind != kind) {
    throw std::logic_error(std::string("the adapter reads attribute ") + name +
                           " in a way its spec does not declare (ort_ops/specs, op_table.generated.h)");
  }
  if (!present && attr->required) throw OpError(std::string("missing required attribute ") + name);
  return *attr;
}

void KernelAttributes::WrongType(const char* name, const char* expected) const {
  static const char* const kKindNames[] = {"missing", "FLOAT", "INT", "STRING", "INTS", "FLOATS"};
  const Kind kind = Probe(name);
  throw OpError(std::string("attribute ") + name + " must be " + expected + ", got " +
                kKindNames[static_cast<int>(kind)]);
}

float KernelAttributes::Float(const char* name) const {
  const Kind kind = Probe(name);
  const op_table::AttrSpec& spec = Declared(name, op_table::AttrKind::kFloat, kind != Kind::kMissing);
  if (kind == Kind::kMissing) return spec.float_default;
  if (kind == Kind::kFloat) {
    float value;
    Check(Api().KernelInfoGetAttribute_float(info_, name, &value));
    return value;
  }
  WrongType(name, "a FLOAT");
}

int64_t KernelAttributes::Int(const char* name) const {
  const Kind kind = Probe(name);
  const op_table::AttrSpec& spec = Declared(name, op_table::AttrKind::kInt, kind != Kind::kMissing);
  if (kind == Kind::kMissing) return spec.int_default;
  if (kind == Kind::kInt) {
    int64_t value;
    Check(Api().KernelInfoGetAttribute_int64(info_, name, &value));
    return value;
  }
  WrongType(name, "an INT");
}

bool KernelAttributes::Bool(const char* name) const {
  const Kind kind = Probe(name);
  const op_table::AttrSpec& spec = Declared(name, op_table::AttrKind::kBool, kind != Kind::kMissing);
  if (kind == Kind::kMissing) return spec.int_default != 0;
  if (kind != Kind::kInt) WrongType(name, "an INT holding 0 or 1");
  int64_t value;
  Check(Api().KernelInfoGetAttribute_int64(info_, name, &value));
  if (value != 0 && value != 1) {
    throw OpError(std::string("attribute ") + name + " must be 0 or 1, got " + std::to_string(value));
  }
  return value == 1;
}

std::string KernelAttributes::ReadString(const char* name) const {
  std::size_t size = 0;
  Check(Api().KernelInfoGetAttribute_string(info_, name, nullptr, &size));
  std::string value(size, '\0');
  Check(Api().KernelInfoGetAttribute_string(info_, name, value.data(), &size));
  value.resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
  return value;
}

std::string KernelAttributes::String(const char* name) const {
  const Kind kind = Probe(name);
  const op_table::AttrSpec& spec = Declared(name, op_table::AttrKind::kString, kind != Kind::kMissing);
  if (kind == Kind::kMissing) return spec.string_default;
  if (kind != Kind::kString) WrongType(name, "a STRING");
  return ReadString(name);
}

std::string KernelAttributes::Choice(const char* name) const {
  const std::string value = String(name);
  const op_table::AttrSpec& spec = *op_table::FindAttr(op_, name);  // String checked it is declared
  if (spec.choices.size == 0) return value;
  for (const char* c : spec.choices) {
    if (value == c) return value;
  }
  throw OpError(std::string("Value for attr '") + name + "' of \"" + value + "\" is not in the list of allowed values: " +
                JoinChoices(spec.choices));
}

std::vector<int64_t> KernelAttributes::ReadInts(const char* name) const {
  std::size_t size = 0;
  Check(Api().KernelInfoGetAttributeArray_int64(info_, name, nullptr, &size));
  std::vector<int64_t> value(size);
  if (size > 0) Check(Api().KernelInfoGetAttributeArray_int64(info_, name, value.data(), &size));
  value.resize(size);
  return value;
}

std::vector<int64_t> KernelAttributes::Ints(const char* name) const {
  const Kind kind = Probe(name);
  const op_table::AttrSpec& spec = Declared(name, op_table::AttrKind::kInts, kind != Kind::kMissing);
  if (kind == Kind::kMissing) return std::vector<int64_t>(spec.ints_default.begin(), spec.ints_default.end());
  if (kind != Kind::kInts) WrongType(name, "INTS");
  return ReadInts(name);
}

// ---------------------------------------------------------------- KernelContext

std::size_t KernelContext::InputCount() const {
  std::size_t n = 0;
  Check(Api().KernelContext_GetInputCount(context_, &n));
  return n;
}

Tensor KernelContext::Input(std::size_t index) const {
  const OrtApi& api = Api();
  const OrtValue* value = nullptr;
  Check(api.KernelContext_GetInput(context_, index, &value));
  if (value == nullptr) throw OpError("input " + std::to_string(index) + " is missing");
  Tensor t;
  TypeShapeInfoHolder info;
  Check(api.GetTensorTypeAndShape(value, &info.info));
  Check(api.GetTensorElementType(info.info, &t.type));
  std::size_t rank = 0;
  Check(api.GetDimensionsCount(info.info, &rank));
  t.shape.resize(rank);
  if (rank > 0) Check(api.GetDimensions(info.info, t.shape.data(), rank));
  t.size = NumElements(t.shape);
  void* data = nullptr;
  Check(api.GetTensorMutableData(const_cast<OrtValue*>(value), &data));
  t.data = data;
  return t;
}

void* KernelContext::OutputRaw(std::size_t index, const Shape& shape) {
  NumElements(shape);  // rejects negative dims before ORT sees them
  OrtValue* value = nullptr;
  Check(Api().KernelContext_GetOutput(context_, index, shape.data(), shape.size(), &value));
  void* data = nullptr;
  Check(Api().GetTensorMutableData(value, &data));
  return data;
}

namespace {
// Parallel's runner: one ORT ParallelFor call; if ORT refuses (it should not), run serially.
void RunOnOrtPool(void* pool, Parallel::TaskFn fn, void* arg, std::size_t num_tasks) {
  OrtStatus* status = Api().KernelContext_ParallelFor(static_cast<const OrtKernelContext*>(pool), fn, num_tasks,
                                                      /*num_batch=*/0, arg);
  if (status == nullptr) return;
  Api().ReleaseStatus(status);
  for (std::size_t i = 0; i < num_tasks; ++i) fn(arg, i);
}
}  // namespace

tfops::Parallel KernelContext::parallel() const { return tfops::Parallel(&RunOnOrtPool, context_); }

CudaLaunch KernelContext::Cuda() {
  if (provider_ != Provider::kCuda) throw std::logic_error("KernelContext::Cuda() called on the CPU execution provider");
  CudaLaunch launch;
  Check(Api().KernelContext_GetGPUComputeStream(context_, &launch.stream));
  launch.scratch = &scratch_;
  return launch;
}

KernelContext::Scratch::~Scratch() {
  for (void* block : blocks_) allocator_->Free(allocator_, block);
}

void* KernelContext::Scratch::Allocate(std::size_t bytes) {
  if (bytes == 0) bytes = 1;  // a valid, unique pointer even for an empty temporary
  if (allocator_ == nullptr) throw std::logic_error("device scratch requested without a device allocator");
  blocks_.reserve(blocks_.size() + 1);  // so that push_back below cannot throw and leak the block
  void* block = nullptr;
  Check(Api().AllocatorAlloc(allocator_, bytes, &block));
  if (block == nullptr) throw std::bad_alloc();
  blocks_.push_back(block);
  return block;
}

// ---------------------------------------------------------------- ShapeInference

std::size_t ShapeInference::InputCount() const {
  std::size_t n = 0;
  Check(Api().ShapeInferContext_GetInputCount(context_, &n));
  return n;
}

TypeShape ShapeInference::Input(std::size_t index) const {
  const OrtApi& api = Api();
  TypeShape out;
  // The context owns this info (releasing it here makes ORT free it twice).
  struct {
    OrtTensorTypeAndShapeInfo* info = nullptr;
  } info;
  Check(api.ShapeInferContext_GetInputTypeShape(context_, index, &info.info));
  Check(api.GetTensorElementType(info.info, &out.type));
  std::size_t rank = 0;
  Check(api.GetDimensionsCount(info.info, &rank));
  out.dims.resize(rank);
  out.symbols.assign(rank, "");
  if (rank > 0) {
    Check(api.GetDimensions(info.info, out.dims.data(), rank));
    std::vector<const char*> symbols(rank, nullptr);
    Check(api.GetSymbolicDimensions(info.info, symbols.data(), rank));
    for (std::size_t i = 0; i < rank; ++i) {
      if (symbols[i] != nullptr) out.symbols[i] = symbols[i];
    }
  }
  return out;
}

void ShapeInference::SetOutput(std::size_t index, const TypeShape& ts) {
  const OrtApi& api = Api();
  TypeShapeInfoHolder info;
  Check(api.CreateTensorTypeAndShapeInfo(&info.info));
  Check(api.SetTensorElementType(info.info, ts.type));
  Check(api.SetDimensions(info.info, ts.dims.data(), ts.dims.size()));
  if (!ts.dims.empty()) {
    // ORT reads a dim of -1 with an empty symbol as the value -1, which then clashes with the real
    // size at run time. Every unknown dim without a symbol of its own gets a fresh, unique one.
    static std::atomic<std::uint64_t> next_symbol{0};
    std::vector<std::string> names(ts.dims.size());
    std::vector<const char*> symbols(ts.dims.size(), "");
    for (std::size_t i = 0; i < ts.dims.size(); ++i) {
      if (i < ts.symbols.size() && !ts.symbols[i].empty()) {
        names[i] = ts.symbols[i];
      } else if (ts.dims[i] < 0) {
        names[i] = "tfops_unk_" + std::to_string(next_symbol.fetch_add(1));
      }
      symbols[i] = names[i].c_str();
    }
    Check(api.SetSymbolicDimensions(info.info, symbols.data(), symbols.size()));
  }
  Check(api.ShapeInferContext_SetOutputTypeShape(context_, index, info.info));
}

void ShapeInference::SetOutputLike(std::size_t index, const TypeShape& input) {
  if (input.rank() == 0) return;
  SetOutput(index, input);
}

void ShapeInference::SetOutput(std::size_t index, ONNXTensorElementDataType type, const Shape& dims) {
  TypeShape ts;
  ts.type = type;
  ts.dims = dims;
  ts.symbols.assign(dims.size(), "");
  SetOutput(index, ts);
}

namespace {
const OrtOpAttr* FindAttr(OrtShapeInferContext* context, const char* name) {
  const OrtOpAttr* attr = nullptr;
  OrtStatus* status = Api().ShapeInferContext_GetAttribute(context, name, &attr);
  if (status != nullptr) {
    Api().ReleaseStatus(status);
    return nullptr;
  }
  return attr;
}
}  // namespace

const op_table::AttrSpec& ShapeInference::Declared(const char* name, op_table::AttrKind kind) const {
  const op_table::AttrSpec* attr = op_table::FindAttr(op_, name);
  if (attr == nullptr || attr->kind != kind) {
    throw std::logic_error(std::string("shape inference reads attribute ") + name +
                           " in a way its spec does not declare (ort_ops/specs, op_table.generated.h)");
  }
  return *attr;
}

int64_t ShapeInference::Int(const char* name) const {
  const int64_t default_value = Declared(name, op_table::AttrKind::kInt).int_default;
  const OrtOpAttr* attr = FindAttr(context_, name);
  if (attr == nullptr) return default_value;
  int64_t value = default_value;
  std::size_t out = 0;
  OrtStatus* status = Api().ReadOpAttr(attr, ORT_OP_ATTR_INT, &value, sizeof(value), &out);
  if (status != nullptr) {
    Api().ReleaseStatus(status);
    return default_value;
  }
  return value;
}

std::vector<int64_t> ShapeInference::Ints(const char* name) const {
  const op_table::AttrSpec& spec = Declared(name, op_table::AttrKind::kInts);
  const std::vector<int64_t> default_value(spec.ints_default.begin(), spec.ints_default.end());
  const OrtOpAttr* attr = FindAttr(context_, name);
  if (attr == nullptr) return default_value;
  std::size_t bytes = 0;
  OrtStatus* status = Api().ReadOpAttr(attr, ORT_OP_ATTR_INTS, nullptr, 0, &bytes);
  if (status != nullptr) Api().ReleaseStatus(status);  // the size query reports "buffer too small"
  std::vector<int64_t> value(bytes / sizeof(int64_t));
  status = Api().ReadOpAttr(attr, ORT_OP_ATTR_INTS, value.data(), value.size() * sizeof(int64_t), &bytes);
  if (status != nullptr) {
    Api().ReleaseStatus(status);
    return default_value;
  }
  return value;
}

std::string ShapeInference::String(const char* name) const {
  const std::string default_value = Declared(name, op_table::AttrKind::kString).string_default;
  const OrtOpAttr* attr = FindAttr(context_, name);
  if (attr == nullptr) return default_value;
  std::size_t bytes = 0;
  OrtStatus* status = Api().ReadOpAttr(attr, ORT_OP_ATTR_STRING, nullptr, 0, &bytes);
  if (status != nullptr) Api().ReleaseStatus(status);
  std::string value(bytes, '\0');
  status = Api().ReadOpAttr(attr, ORT_OP_ATTR_STRING, value.data(), value.size(), &bytes);
  if (status != nullptr) {
    Api().ReleaseStatus(status);
    return default_value;
  }
  value.resize(std::min(bytes, value.size()));
  // Up to ONNX Runtime 1.22, ReadOpAttr writes a terminating NUL and counts it ("NCHW" is 5 bytes); from
  // 1.23 on it counts the characters only. Kept, the NUL made every string compare unequal there (batch
  // norm's "NCHW\0" read as NHWC: statistics declared with the last axis's size; depthwise's padding
  // unknown: no output shape). Attribute strings hold no NUL of their own, so the first one ends the value.
  const std::size_t end = value.find('\0');
  if (end != std::string::npos) value.resize(end);
  return value;
}

// ---------------------------------------------------------------- the C entry points

namespace detail {

std::string NodeName(const OrtKernelInfo* info) {
  if (info == nullptr) return "";
  std::size_t size = 0;
  OrtStatus* status = Api().KernelInfo_GetNodeName(info, nullptr, &size);
  if (status != nullptr) {
    Api().ReleaseStatus(status);
    return "";
  }
  std::string name(size, '\0');
  status = Api().KernelInfo_GetNodeName(info, name.data(), &size);
  if (status != nullptr) {
    Api().ReleaseStatus(status);
    return "";
  }
  name.resize(size > 0 ? size - 1 : 0);
  return name;
}

OrtStatus* ErrorStatusForNode(const char* op, const std::string& node_name, const std::exception* error) {
  OrtErrorCode code = ORT_FAIL;
  std::string message;
  if (error == nullptr) {
    message = "unknown internal error";
  } else if (dynamic_cast<const OpError*>(error) != nullptr) {
    code = ORT_INVALID_ARGUMENT;
    message = error->what();
  } else if (const auto* call = dynamic_cast<const OrtCallError*>(error)) {
    code = call->code;
    message = error->what();
  } else if (dynamic_cast<const DeviceError*>(error) != nullptr) {
    message = std::string("CUDA error: ") + error->what();
  } else if (dynamic_cast<const std::bad_alloc*>(error) != nullptr) {
    message = "out of memory";
  } else {
    message = std::string("internal error: ") + error->what();
  }
  std::string text = std::string(op) + ": " + message;
  if (!node_name.empty()) text += " (node " + node_name + ")";
  return Api().CreateStatus(code, text.c_str());
}

const op_table::OpEntry& TableEntry(const char* op) {
  const op_table::OpEntry* entry = op_table::FindOp(op);
  if (entry == nullptr) throw std::logic_error(std::string(op) + " is not in the op table (op_table.generated.h)");
  return *entry;
}

OrtStatus* ErrorStatus(const char* op, const OrtKernelInfo* info, const std::exception* error) {
  return ErrorStatusForNode(op, NodeName(info), error);
}

void FillCommon(OrtCustomOp* op) {
  std::memset(static_cast<void*>(op), 0, sizeof(OrtCustomOp));
  op->version = kRequiredApiVersion;  // the fields filled here are those of API 17 (op_base.h)
  op->GetExecutionProviderType = [](const OrtCustomOp*) { return "CPUExecutionProvider"; };
  op->GetInputCharacteristic = [](const OrtCustomOp*, std::size_t) {
    return INPUT_OUTPUT_REQUIRED;
  };
  op->GetOutputCharacteristic = [](const OrtCustomOp*, std::size_t) {
    return INPUT_OUTPUT_REQUIRED;
  };
  op->GetInputMemoryType = [](const OrtCustomOp*, std::size_t) { return OrtMemTypeDefault; };
  op->GetVariadicInputMinArity = [](const OrtCustomOp*) { return 1; };
  op->GetVariadicInputHomogeneity = [](const OrtCustomOp*) { return 1; };
  op->GetVariadicOutputMinArity = [](const OrtCustomOp*) { return 1; };
  op->GetVariadicOutputHomogeneity = [](const OrtCustomOp*) { return 1; };
  op->GetStartVersion = [](const OrtCustomOp*) { return 1; };
  op->GetEndVersion = [](const OrtCustomOp*) { return INT_MAX; };
  // CreateKernel/KernelCompute (the V1 entry points) stay null: ORT uses the V2 ones, which can
  // return an error status instead of having to throw.
}

}  // namespace detail

// ---------------------------------------------------------------- registry

namespace {
std::vector<const OrtCustomOp*>& MutableOps() {
  static std::vector<const OrtCustomOp*> ops;
  return ops;
}
}  // namespace

OpRegistrar::OpRegistrar(std::initializer_list<const OpDefinition*> ops) {
  for (const OpDefinition* op : ops) {
    for (const OrtCustomOp* kernel : op->Kernels()) MutableOps().push_back(kernel);
  }
}

const std::vector<const OrtCustomOp*>& RegisteredOps() { return MutableOps(); }

}  // namespace ort
}  // namespace tfops
