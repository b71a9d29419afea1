// The ONNX Runtime adapter framework: everything that touches ORT's C API lives here and in
// op_base.cc, so that each op's adapter (cpp_ops/src/ort/*_ops.cc) is a small class that reads its
// attributes, calls the ORT-free checks and kernels (cpp_ops/src/kernels/), and allocates outputs.
//
// Conventions every family follows:
//  * Attributes are read through the op table (op_table.h, GENERATED from ort_ops/specs/ by
//    `python -m ort_ops.codegen`): KernelAttributes::Float("epsilon") takes the default and the
//    required-ness from the spec; adapters hold no literal defaults. A new attribute is added to the
//    spec, the header regenerated, and the adapter reads it by name.
//  * Validation is ORT-free and lives with the kernels (kernels/<family>.h declares it; the .cc is
//    <family>.cc, <family>_checks.cc or depthwise_geometry.cc), so the CPU and the CUDA execution
//    paths run the same checks, and the CUDA host emulations in tests/ can call them too.
//  * Every problem is reported one way: by throwing tfops::OpError (kernels/op_error.h) with the
//    problem only, TF's wording where TF has one. Adapters throw the same type for their own few
//    checks (input counts, attribute types). No check returns a message string.
//
// How to write an op (see fake_quant_ops.cc for complete examples):
//
//   class MyOp {                                       // one instance per node (ORT "kernel")
//    public:
//     static constexpr const char* kName = "MyTfOp";   // the op type in the domain (and op table)
//     explicit MyOp(const KernelAttributes& attrs);    // read + check attributes; throw OpError
//     void Compute(KernelContext& ctx) const;          // check inputs, allocate outputs, run;
//                                                      // throw OpError. Must be thread-safe (const).
//     static void InferShapes(ShapeInference& ctx);    // output shapes at graph-build time; it may
//                                                      // leave outputs unset, and should only throw
//                                                      // OpError for input that is certainly bad.
//   };
//
//   // One statically stored CustomOp per type combination of the spec, then one registrar per file
//   // (the library refuses to load if these differ from the op table's combinations):
//   CustomOp<MyOp> my_op_float({kFloat, kFloat}, {kFloat});
//   const OpRegistrar kRegistered({&my_op_float});
//
// CUDA (a build with TFOPS_WITH_CUDA, see kernels/device.h and docs/cuda.md): an op class that declares
//     static constexpr bool kHasCudaKernel = true;
// gets a second OrtCustomOp for ORT's CUDAExecutionProvider (same name and types). The one Compute
// validates once and dispatches with `if constexpr (kWithCuda) { if (ctx.OnCuda()) ... }`. On the CUDA
// EP every input and output is device memory except the inputs named in
//     static constexpr unsigned kHostInputs = (1u << 1) | (1u << 2);   // bit i: input i
// which the host reads (scalars such as min/max, num_bits, input_sizes): ORT hands those over in CPU
// memory (OrtMemTypeCPUInput). On the CPU EP everything is host memory.
//
// The framework turns OpError into ORT_INVALID_ARGUMENT with "<op name>: " before the message (and
// the node name after it), and any other C++ exception into an ORT error as well, so that no
// exception ever crosses into ORT.
#pragma once

#include <onnxruntime_c_api.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/device.h"
#include "kernels/half.h"
#include "kernels/op_error.h"
#include "kernels/parallel.h"
#include "kernels/simd.h"
#include "ort/op_table.h"

namespace tfops {
namespace ort {

// ---------------------------------------------------------------- API table and errors

// The C API version the library asks the runtime for, and the version every OrtCustomOp declares: 17
// (ONNX Runtime 1.17). The entries that decide it are custom-op shape inference (OrtCustomOp's
// InferOutputShapeFn, and ShapeInferContext_*, SetSymbolicDimensions and ReadOpAttr, which it calls) and
// KernelContext_ParallelFor, all new in API 17; every other entry and OrtCustomOp field the library uses
// is older (KernelInfo_GetNodeName 15, CreateKernelV2/KernelComputeV2 16, the rest 14 or before). The
// OrtCustomOps fill the fields up to GetEndVersion (API 17) and nothing newer, so a runtime of any
// version from 1.17 on reads the same struct, and none refuses it (a runtime rejects ops that declare a
// version newer than its own).
constexpr uint32_t kRequiredApiVersion = 17;
// The CUDA kernels also call KernelInfoGetAllocator (API 18) for their device scratch: RegisterCustomOps
// adds them to the domain only where the runtime offers API 18 (on 1.17 the domain's nodes of a CUDA
// session run on the CPU).
constexpr uint32_t kCudaApiVersion = 18;
static_assert(ORT_API_VERSION >= kCudaApiVersion, "the ONNX Runtime headers are older than the API the library uses");

// The API table ORT handed to RegisterCustomOps (the runtime's table, asked for kRequiredApiVersion: call
// nothing newer than that without checking that the runtime has it).
const OrtApi& Api();
void SetApi(const OrtApi* api);

// Bad attributes or inputs of a node: tfops::OpError (kernels/op_error.h), thrown by the adapters
// and by the kernels' checks alike.

// A call into ORT's API failed (out of memory, internal error): carries ORT's message and code.
class OrtCallError : public std::runtime_error {
 public:
  OrtCallError(OrtErrorCode code, const std::string& message) : std::runtime_error(message), code(code) {}
  OrtErrorCode code;
};

// Throws OrtCallError if `status` is an error (and releases it).
void Check(OrtStatus* status);

using Shape = std::vector<int64_t>;
int64_t NumElements(const Shape& shape);  // throws OpError on negative dims or overflow

constexpr ONNXTensorElementDataType kFloat = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
constexpr ONNXTensorElementDataType kDouble = ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE;
constexpr ONNXTensorElementDataType kFloat16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
constexpr ONNXTensorElementDataType kBFloat16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
constexpr ONNXTensorElementDataType kInt32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;

// The element type of a C++ storage type (float, double, int32_t, and the 16-bit float types of
// kernels/half.h).
template <typename T>
constexpr ONNXTensorElementDataType ElementType();
template <>
constexpr ONNXTensorElementDataType ElementType<float>() { return kFloat; }
template <>
constexpr ONNXTensorElementDataType ElementType<double>() { return kDouble; }
template <>
constexpr ONNXTensorElementDataType ElementType<int32_t>() { return kInt32; }
template <>
constexpr ONNXTensorElementDataType ElementType<Half>() { return kFloat16; }
template <>
constexpr ONNXTensorElementDataType ElementType<BFloat16>() { return kBFloat16; }

const char* ElementTypeName(ONNXTensorElementDataType type);

// ---------------------------------------------------------------- attributes (kernel creation)

// Reads a node's attributes through the op table (op_table.h, generated from the specs): the default
// of an absent attribute and whether it is required come from there, never from the adapter. It
// validates their ONNX type, which ORT never checks for custom ops (e.g. a FLOAT where an INT is
// expected). Bools are INT attributes holding 0 or 1 (how tf2onnx writes them); strings are STRING.
// Asking for an attribute the op's spec does not declare, or with another kind, is a bug in the
// adapter (std::logic_error, reported as an internal error).
class KernelAttributes {
 public:
  KernelAttributes(const OrtKernelInfo* info, const op_table::OpEntry& op) : info_(info), op_(op) {}

  float Float(const char* name) const;
  int64_t Int(const char* name) const;
  bool Bool(const char* name) const;
  // Any string: for an adapter that checks the value itself, later or in its own words (batch norm's
  // data_format, which TF checks after the input ranks).
  std::string String(const char* name) const;
  // One of the spec's choices for `name`, or OpError in TF's attr-value wording.
  std::string Choice(const char* name) const;
  std::vector<int64_t> Ints(const char* name) const;

  const OrtKernelInfo* info() const { return info_; }

 private:
  enum class Kind { kMissing, kFloat, kInt, kString, kInts, kFloats };
  Kind Probe(const char* name) const;
  // The table's entry for `name` (logic_error unless it is declared with `kind`); throws OpError
  // when the attribute is required and absent (`present` false).
  const op_table::AttrSpec& Declared(const char* name, op_table::AttrKind kind, bool present) const;
  [[noreturn]] void WrongType(const char* name, const char* expected) const;
  std::string ReadString(const char* name) const;
  std::vector<int64_t> ReadInts(const char* name) const;

  const OrtKernelInfo* info_;
  const op_table::OpEntry& op_;
};

// ---------------------------------------------------------------- compute

// A read-only view of one input tensor.
struct Tensor {
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  Shape shape;
  int64_t size = 0;  // number of elements
  const void* data = nullptr;

  std::size_t rank() const { return shape.size(); }
  template <typename T>
  const T* Data() const { return static_cast<const T*>(data); }
  // The value of a one-element tensor (callers check the element count first).
  template <typename T>
  T Scalar() const { return *Data<T>(); }
};

// The execution provider an OrtCustomOp is registered for.
enum class Provider { kCpu, kCuda };

class KernelContext {
 public:
  // `device_allocator`: ORT's allocator for the CUDA EP's device memory (null on the CPU EP).
  KernelContext(OrtKernelContext* context, Provider provider = Provider::kCpu,
                OrtAllocator* device_allocator = nullptr)
      : context_(context), provider_(provider), scratch_(device_allocator) {}

  std::size_t InputCount() const;
  // Throws OpError for a missing input (ORT passes null for an omitted optional input).
  Tensor Input(std::size_t index) const;
  // Allocates output `index` with `shape` (validated: no negative dims) and returns its buffer
  // (device memory on the CUDA EP).
  template <typename T>
  T* Output(std::size_t index, const Shape& shape) {
    return static_cast<T*>(OutputRaw(index, shape));
  }
  void* OutputRaw(std::size_t index, const Shape& shape);

  // Runs tasks on the session's intra-op thread pool (serially when it has none).
  tfops::Parallel parallel() const;

  // True when this kernel runs for the CUDA execution provider.
  bool OnCuda() const { return provider_ == Provider::kCuda; }
  // ORT's compute stream and device scratch memory (freed when Compute returns). CUDA EP only.
  CudaLaunch Cuda();

 private:
  // Device memory from ORT's allocator, given back when the context goes (end of Compute).
  class Scratch : public DeviceScratch {
   public:
    explicit Scratch(OrtAllocator* allocator) : allocator_(allocator) {}
    ~Scratch() override;
    void* Allocate(std::size_t bytes) override;

   private:
    OrtAllocator* allocator_;
    std::vector<void*> blocks_;
  };

  OrtKernelContext* context_;
  Provider provider_;
  Scratch scratch_;
};

// ---------------------------------------------------------------- shape inference

// One input's type and shape at graph-build time; a dim is -1 when unknown (its symbolic name, if any,
// is kept so that an output copying it stays linked to it).
struct TypeShape {
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  Shape dims;
  std::vector<std::string> symbols;  // same length as dims; "" where none

  std::size_t rank() const { return dims.size(); }
  bool known(std::size_t i) const { return dims[i] >= 0; }
};

class ShapeInference {
 public:
  ShapeInference(OrtShapeInferContext* context, const op_table::OpEntry& op) : context_(context), op_(op) {}

  std::size_t InputCount() const;
  TypeShape Input(std::size_t index) const;
  void SetOutput(std::size_t index, const TypeShape& type_shape);
  void SetOutput(std::size_t index, ONNXTensorElementDataType type, const Shape& dims);
  // An output shaped like `input` (its type as given in `input.type`). ORT's C API reports an input of
  // unknown rank as rank 0, the same as a scalar, so a rank-0 input leaves the output's shape to ORT
  // (unknown rank in, unknown rank out) rather than claiming a scalar.
  void SetOutputLike(std::size_t index, const TypeShape& input);

  // Attributes with the op table's defaults, as KernelAttributes reads them. Absent, unreadable or
  // required-and-absent ones give the default (empty for a required one): the kernel reports those.
  int64_t Int(const char* name) const;
  std::vector<int64_t> Ints(const char* name) const;
  std::string String(const char* name) const;

 private:
  const op_table::AttrSpec& Declared(const char* name, op_table::AttrKind kind) const;

  OrtShapeInferContext* context_;
  const op_table::OpEntry& op_;
};

// ---------------------------------------------------------------- the OrtCustomOp adapter

// The C entry points shared by every op; implemented in op_base.cc.
namespace detail {
OrtStatus* ErrorStatus(const char* op, const OrtKernelInfo* info, const std::exception* error);
OrtStatus* ErrorStatusForNode(const char* op, const std::string& node_name, const std::exception* error);
std::string NodeName(const OrtKernelInfo* info);
// The op table's entry for an op class's kName (std::logic_error if the table has none; the library
// also refuses to load then, see CheckRegisteredOps).
const op_table::OpEntry& TableEntry(const char* op);

// The fields of OrtCustomOp that do not depend on the kernel class.
void FillCommon(OrtCustomOp* op);
}  // namespace detail

// Optional members of an op class: kHasCudaKernel (default false) and kHostInputs (default none).
template <class K, class = void>
struct HasCudaKernel { static constexpr bool value = false; };
template <class K>
struct HasCudaKernel<K, std::void_t<decltype(K::kHasCudaKernel)>> { static constexpr bool value = K::kHasCudaKernel; };
template <class K, class = void>
struct HostInputMask { static constexpr unsigned value = 0; };
template <class K>
struct HostInputMask<K, std::void_t<decltype(K::kHostInputs)>> { static constexpr unsigned value = K::kHostInputs; };

// One type combination of an op: the OrtCustomOps it adds to the domain (one per execution provider).
class OpDefinition {
 public:
  virtual ~OpDefinition() = default;
  virtual std::vector<const OrtCustomOp*> Kernels() const = 0;
};

// The static per-op data ORT sees: op name, one fixed type combination, and an OrtCustomOp for the CPU
// execution provider plus, in a CUDA build when K has a CUDA kernel, one for the CUDA EP.
// `K` is the op class described at the top of this file.
template <class K>
class CustomOp : public OpDefinition {
 public:
  static constexpr bool kRegistersCuda = kWithCuda && HasCudaKernel<K>::value;

  CustomOp(std::vector<ONNXTensorElementDataType> input_types,
           std::vector<ONNXTensorElementDataType> output_types)
      : input_types_(std::move(input_types)),
        output_types_(std::move(output_types)),
        cpu_(this, Provider::kCpu),
        cuda_(this, Provider::kCuda) {}

  CustomOp(const CustomOp&) = delete;
  CustomOp& operator=(const CustomOp&) = delete;

  std::vector<const OrtCustomOp*> Kernels() const override {
    if constexpr (kRegistersCuda) return {&cpu_, &cuda_};
    return {&cpu_};
  }

 private:
  struct Kernel {
    K op;
    std::string node_name;
    Provider provider;
    OrtAllocator* device_allocator;  // the CUDA EP's device allocator; null on the CPU EP
    ~Kernel() {
      if (device_allocator != nullptr) Api().ReleaseAllocator(device_allocator);
    }
  };

  // One OrtCustomOp: the C entry points ORT calls, for one provider.
  struct Entry : OrtCustomOp {
    const CustomOp* owner;
    Provider provider;

    Entry(const CustomOp* owner_op, Provider p) : owner(owner_op), provider(p) {
      detail::FillCommon(this);
      OrtCustomOp::GetName = [](const OrtCustomOp*) { return K::kName; };
      OrtCustomOp::GetExecutionProviderType = [](const OrtCustomOp* op) {
        return static_cast<const Entry*>(op)->provider == Provider::kCuda ? "CUDAExecutionProvider"
                                                                          : "CPUExecutionProvider";
      };
      OrtCustomOp::GetInputMemoryType = [](const OrtCustomOp* op, std::size_t i) {
        const bool host = i < 32 && ((HostInputMask<K>::value >> i) & 1u) != 0;
        return static_cast<const Entry*>(op)->provider == Provider::kCuda && host ? OrtMemTypeCPUInput
                                                                                  : OrtMemTypeDefault;
      };
      OrtCustomOp::GetInputType = [](const OrtCustomOp* op, std::size_t i) {
        const auto& types = static_cast<const Entry*>(op)->owner->input_types_;
        return i < types.size() ? types[i] : ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
      };
      OrtCustomOp::GetInputTypeCount = [](const OrtCustomOp* op) {
        return static_cast<const Entry*>(op)->owner->input_types_.size();
      };
      OrtCustomOp::GetOutputType = [](const OrtCustomOp* op, std::size_t i) {
        const auto& types = static_cast<const Entry*>(op)->owner->output_types_;
        return i < types.size() ? types[i] : ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
      };
      OrtCustomOp::GetOutputTypeCount = [](const OrtCustomOp* op) {
        return static_cast<const Entry*>(op)->owner->output_types_.size();
      };
      OrtCustomOp::CreateKernelV2 = [](const OrtCustomOp* op, const OrtApi*, const OrtKernelInfo* info,
                                       void** kernel) -> OrtStatusPtr {
        *kernel = nullptr;
        const Provider provider = static_cast<const Entry*>(op)->provider;
        OrtAllocator* allocator = nullptr;
        try {
          const op_table::OpEntry& entry = detail::TableEntry(K::kName);
          if (provider == Provider::kCuda) Check(Api().KernelInfoGetAllocator(info, OrtMemTypeDefault, &allocator));
          *kernel = new Kernel{K(KernelAttributes(info, entry)), detail::NodeName(info), provider, allocator};
          return nullptr;
        } catch (const std::exception& e) {
          if (allocator != nullptr) Api().ReleaseAllocator(allocator);
          return detail::ErrorStatus(K::kName, info, &e);
        } catch (...) {
          if (allocator != nullptr) Api().ReleaseAllocator(allocator);
          return detail::ErrorStatus(K::kName, info, nullptr);
        }
      };
      OrtCustomOp::KernelComputeV2 = [](void* kernel, OrtKernelContext* context) -> OrtStatusPtr {
        const Kernel* self = static_cast<const Kernel*>(kernel);
        try {
          // TF computes every CPU kernel with flush-to-zero and denormals-are-zero on (simd.h); the
          // caller's mode comes back when this returns or throws. On the CUDA EP this covers what the
          // host computes (a nudged range, say), so that it matches the CPU kernel's.
          tfops::ScopedFlushDenormals flush;
          KernelContext ctx(context, self->provider, self->device_allocator);
          self->op.Compute(ctx);
          return nullptr;
        } catch (const std::exception& e) {
          return detail::ErrorStatusForNode(K::kName, self->node_name, &e);
        } catch (...) {
          return detail::ErrorStatusForNode(K::kName, self->node_name, nullptr);
        }
      };
      OrtCustomOp::KernelDestroy = [](void* kernel) { delete static_cast<Kernel*>(kernel); };
      OrtCustomOp::InferOutputShapeFn = [](const OrtCustomOp*, OrtShapeInferContext* context) -> OrtStatusPtr {
        try {
          ShapeInference ctx(context, detail::TableEntry(K::kName));
          K::InferShapes(ctx);
          return nullptr;
        } catch (const std::exception& e) {
          return detail::ErrorStatus(K::kName, nullptr, &e);
        } catch (...) {
          return detail::ErrorStatus(K::kName, nullptr, nullptr);
        }
      };
    }
  };

  std::vector<ONNXTensorElementDataType> input_types_;
  std::vector<ONNXTensorElementDataType> output_types_;
  Entry cpu_;
  Entry cuda_;
};

// Adds statically stored ops to the library's op list at load time (one registrar per *_ops.cc file),
// so a new file joins the library without editing any other file.
class OpRegistrar {
 public:
  OpRegistrar(std::initializer_list<const OpDefinition*> ops);
};

// Every OrtCustomOp registered so far (CPU and CUDA ones), in registration order.
const std::vector<const OrtCustomOp*>& RegisteredOps();

}  // namespace ort
}  // namespace tfops
