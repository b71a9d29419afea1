// The library's exported symbols: RegisterCustomOps adds the domain ai.onnx.converters.tensorflow,
// holding every op registered by the *_ops.cc files, to a session; TfOpsCudaKernelCount says how many
// of those kernels are for the CUDA execution provider (0 in a CPU-only build); TfOpsCpuIsa names
// the vector ISA the CPU kernels run with (kernels/simd.h); TfOpsOpTable describes the registered
// type combinations and the attribute defaults the adapters read (op_table.h).
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/simd.h"
#include "ort/op_base.h"
#include "ort/op_table.h"

namespace {

constexpr const char* kDomain = "ai.onnx.converters.tensorflow";

// The domain object must outlive every session that uses it: it is built at the first registration after
// the library is loaded and shared by every session from then on. ONNX Runtime unloads the library
// (dlclose) once every session and session options that registered it are gone, and may load it again
// later: the domain goes with the library, released by this object's destructor, which runs at that
// dlclose (or at process exit, where ONNX Runtime's code is still mapped and releasing a domain only frees
// its memory). Before, a domain was built at each load and never released: about 1.2 KB per
// register/unload cycle (tests/test_ort_reload.py).
struct DomainHolder {
  std::mutex mutex;
  OrtCustomOpDomain* domain = nullptr;
  const OrtApi* api = nullptr;  // the table that created it

  ~DomainHolder() {
    std::lock_guard<std::mutex> lock(mutex);
    if (domain != nullptr && api != nullptr) api->ReleaseCustomOpDomain(domain);
    domain = nullptr;
  }
};
DomainHolder g_domain;

bool OnCuda(const OrtCustomOp* op) {
  return std::strcmp(op->GetExecutionProviderType(op), "CUDAExecutionProvider") == 0;
}

OrtStatus* BuildDomain(const OrtApiBase& api_base, const OrtApi& api) {
  // A library whose registrations drifted from the specs' op table refuses to load rather than
  // offer types or ops the converters and the Python side do not know.
  const std::vector<const OrtCustomOp*>& ops = tfops::ort::RegisteredOps();
  const std::string drift = tfops::ort::op_table::CheckRegisteredOps(ops);
  if (!drift.empty()) return api.CreateStatus(ORT_FAIL, ("libort_tf_ops: " + drift).c_str());
  // The CUDA kernels need API 18 (op_base.h): asked only by a build that has them (a runtime without it
  // prints a line on stderr when asked), and without it they stay out of the domain.
  bool cuda_api = false;
  for (const OrtCustomOp* op : ops) {
    if (OnCuda(op)) {
      cuda_api = api_base.GetApi(tfops::ort::kCudaApiVersion) != nullptr;
      break;
    }
  }
  OrtCustomOpDomain* domain = nullptr;
  if (OrtStatus* s = api.CreateCustomOpDomain(kDomain, &domain)) return s;
  for (const OrtCustomOp* op : ops) {
    if (OnCuda(op) && !cuda_api) continue;
    if (OrtStatus* s = api.CustomOpDomain_Add(domain, op)) {
      api.ReleaseCustomOpDomain(domain);
      return s;
    }
  }
  g_domain.domain = domain;
  g_domain.api = &api;
  return nullptr;
}

// A runtime without the API the library needs: say so with the oldest API table, which every runtime has.
OrtStatus* RuntimeTooOld(const OrtApiBase& api_base) {
  const OrtApi* oldest = api_base.GetApi(1);
  if (oldest == nullptr) return nullptr;  // not an ONNX Runtime we could report to
  const char* version = api_base.GetVersionString != nullptr ? api_base.GetVersionString() : nullptr;
  const std::string needed = std::to_string(tfops::ort::kRequiredApiVersion);
  const std::string message = std::string("libort_tf_ops: onnxruntime ") + (version != nullptr ? version : "(unknown version)") +
                              " is too old: the library needs ONNX Runtime's C API " + needed +
                              ", i.e. onnxruntime 1." + needed + " or newer";
  return oldest->CreateStatus(ORT_FAIL, message.c_str());
}

}  // namespace

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  if (api_base == nullptr) return nullptr;  // nothing to report an error with; ORT never does this
  // The API the library needs, not the headers' (ORT_API_VERSION): any newer runtime hands out the same
  // table, and the library calls nothing newer unchecked (op_base.h).
  const OrtApi* api = api_base->GetApi(tfops::ort::kRequiredApiVersion);
  if (api == nullptr) return RuntimeTooOld(*api_base);
  std::lock_guard<std::mutex> lock(g_domain.mutex);
  tfops::ort::SetApi(api);
  if (g_domain.domain == nullptr) {
    if (OrtStatus* s = BuildDomain(*api_base, *api)) return s;
  }
  return api->AddCustomOpDomain(options, g_domain.domain);
}

// Needs no ORT (and no GPU): ort_ops.cuda_kernels_built() calls it through ctypes.
extern "C" __attribute__((visibility("default"))) int TfOpsCudaKernelCount(void) {
  int count = 0;
  for (const OrtCustomOp* op : tfops::ort::RegisteredOps()) {
    if (OnCuda(op)) ++count;
  }
  return count;
}

// Needs no ORT: ort_ops.library.cpu_isa() calls it through ctypes. "avx512", "avx2" or "sse2"
// (TFOPS_ISA caps it), "baseline" in a build without ISA dispatch.
extern "C" __attribute__((visibility("default"))) const char* TfOpsCpuIsa(void) {
  return tfops::IsaName(tfops::ActiveIsa());
}

// Needs no ORT: tests/test_cpp_op_table.py compares it with the specs. JSON: "registered", one
// {"op", "provider", "inputs", "outputs"} per OrtCustomOp (types as ONNX element type numbers), and
// "attributes", per op the table's {"name", "kind", "required", "default", "choices"}.
extern "C" __attribute__((visibility("default"))) const char* TfOpsOpTable(void) {
  static const std::string json = tfops::ort::op_table::DescribeAsJson(tfops::ort::RegisteredOps());
  return json.c_str();
}
