// The ONNX Runtime adapter framework: everything that touches ORT's C API lives here and in
// op_base.cc, so that each op's adapter (cpp_ops/src/ort/*_ops.cc) is a small class that reads and
// validates attributes, validates inputs, and calls an ORT-free kernel (cpp_ops/src/kernels/).
//
// How to write an op (see fake_quant_ops.cc for complete examples):
//
//   class MyOp {                                       // one instance per node (ORT "kernel")
//    public:
//     static constexpr const char* kName = "MyTfOp";   // the op type in the domain
//     explicit MyOp(const KernelAttributes& attrs);    // read + validate attributes; throw OpError
//     void Compute(KernelContext& ctx) const;          // validate inputs, allocate outputs, run;
//                                                      // throw OpError. Must be thread-safe (const).
//     static void InferShapes(ShapeInference& ctx);    // output shapes at graph-build time; it may
//                                                      // leave outputs unset, and should only throw
//                                                      // OpError for input that is certainly bad.
//   };
//
//   // One statically stored CustomOp per type combination, then one registrar per file:
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
// OpError messages are the problem only: the framework prefixes "<op name>: " (and the node name),
// returns ORT_INVALID_ARGUMENT, and turns any other C++ exception into an ORT error as well, so that
// no exception ever crosses into ORT.
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

namespace tfops {
namespace ort {

// ---------------------------------------------------------------- API table and errors

// The API table ORT handed to RegisterCustomOps (the version of the headers we were built with).
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

// Reads a node's attributes with TF's defaults and validates their ONNX type. ORT never checks
// custom-op attributes, so a wrong type (e.g. a FLOAT where an INT is expected) is reported here.
// Bools are INT attributes holding 0 or 1 (how tf2onnx writes them); strings are STRING.
class KernelAttributes {
 public:
  explicit KernelAttributes(const OrtKernelInfo* info) : info_(info) {}

  float Float(const char* name, float default_value) const;
  int64_t Int(const char* name, int64_t default_value) const;
  bool Bool(const char* name, bool default_value) const;
  // `choices` empty: any string. Otherwise the value must be one of them.
  std::string String(const char* name, const std::string& default_value,
                     std::initializer_list<const char*> choices = {}) const;
  std::string RequiredString(const char* name, std::initializer_list<const char*> choices = {}) const;
  std::vector<int64_t> Ints(const char* name, const std::vector<int64_t>& default_value) const;
  std::vector<int64_t> RequiredInts(const char* name) const;

  bool Has(const char* name) const;
  const OrtKernelInfo* info() const { return info_; }

 private:
  enum class Kind { kMissing, kFloat, kInt, kString, kInts, kFloats };
  Kind Probe(const char* name) const;
  [[noreturn]] void WrongType(const char* name, const char* expected) const;
  std::string ReadString(const char* name) const;
  std::vector<int64_t> ReadInts(const char* name) const;

  const OrtKernelInfo* info_;
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
  explicit ShapeInference(OrtShapeInferContext* context) : context_(context) {}

  std::size_t InputCount() const;
  TypeShape Input(std::size_t index) const;
  void SetOutput(std::size_t index, const TypeShape& type_shape);
  void SetOutput(std::size_t index, ONNXTensorElementDataType type, const Shape& dims);
  // An output shaped like `input` (its type as given in `input.type`). ORT's C API reports an input of
  // unknown rank as rank 0, the same as a scalar, so a rank-0 input leaves the output's shape to ORT
  // (unknown rank in, unknown rank out) rather than claiming a scalar.
  void SetOutputLike(std::size_t index, const TypeShape& input);

  // Attributes as in KernelAttributes (defaults when absent or unreadable: the kernel reports those).
  int64_t Int(const char* name, int64_t default_value) const;
  std::vector<int64_t> Ints(const char* name, const std::vector<int64_t>& default_value) const;
  std::string String(const char* name, const std::string& default_value) const;

 private:
  OrtShapeInferContext* context_;
};

// ---------------------------------------------------------------- the OrtCustomOp adapter

// The C entry points shared by every op; implemented in op_base.cc.
namespace detail {
OrtStatus* ErrorStatus(const char* op, const OrtKernelInfo* info, const std::exception* error);
OrtStatus* ErrorStatusForNode(const char* op, const std::string& node_name, const std::exception* error);
std::string NodeName(const OrtKernelInfo* info);

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
          if (provider == Provider::kCuda) Check(Api().KernelInfoGetAllocator(info, OrtMemTypeDefault, &allocator));
          *kernel = new Kernel{K(KernelAttributes(info)), detail::NodeName(info), provider, allocator};
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
          ShapeInference ctx(context);
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
