// The GPU check program (scripts/gpu_check.sh): the library's ORT-free CUDA launchers against its CPU kernels on
// the same inputs, without ONNX Runtime. Shared declarations of its parts:
//   cases.cc   tensors, the case files tools/gpu_check/export_cases.py writes (the goldens), attribute access
//   random.cc  seeded random cases of every op, type and layout (large and empty ones included)
//   ops.cc     one Prepare per op: the adapter's checks and output shapes (cpp_ops/src/ort/*_ops.cc), then the
//              CPU kernel and the CUDA launcher to run
//   judge.cc   the suite's comparison rules (tests/comparison.py, tests/cuda_support.py, test_batch_norm.py,
//              test_depthwise.py) and the float64 math they need
//   main.cc    the runs, the JSON results
//   device.cu  the CUDA half (only in a build with CUDA): device runs on a non-default stream, a CUDA graph per
//              op, CUDA-event timings against a device-to-device copy
// Plain C++17; nothing here includes CUDA or ONNX Runtime headers.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "kernels/parallel.h"

namespace gpu_check {

// ------------------------------------------------------------------------------------------------ tensors

enum class DType { kF32, kF64, kF16, kBF16, kI32, kBool };

std::size_t SizeOf(DType t);
const char* Name(DType t);
DType ParseDType(const std::string& name);  // throws std::runtime_error
bool IsFloat(DType t);

struct Tensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint64_t> store;  // 8-byte aligned bytes

  static Tensor Make(DType dtype, std::vector<int64_t> shape);
  int64_t count() const;
  std::size_t nbytes() const { return static_cast<std::size_t>(count()) * SizeOf(dtype); }
  void* data() { return store.data(); }
  const void* data() const { return store.data(); }
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(store.data());
  }
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(store.data());
  }
  // Element i widened to double (NaN payloads are not kept; use the bits for those).
  double At(int64_t i) const;
  uint64_t BitsAt(int64_t i) const;
  void FillBytes(unsigned char byte);
};

std::string ShapeText(const std::vector<int64_t>& shape);

// --------------------------------------------------------------------------------------------------- cases

struct AttrValue {
  char kind = 'i';  // i: integer or bool, f: float, s: string, l: list of integers
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<int64_t> l;
};

struct Case {
  std::string op;
  std::string source;  // "golden", "random", "large", "timing"
  int index = 0;
  std::string note;
  std::map<std::string, AttrValue> attrs;
  std::vector<Tensor> inputs;
  std::vector<Tensor> expected;  // the golden outputs (TF's), empty for generated cases
  bool has_expected = false;
  std::string error;  // TF's message for a golden case TF rejects

  // Attribute access with the op table's defaults (cpp_ops/src/ort/op_table.generated.h); an unknown or
  // missing required attribute, or a string not among the allowed ones, throws tfops::OpError.
  int64_t Int(const char* name) const;
  bool Bool(const char* name) const { return Int(name) != 0; }
  float Float(const char* name) const;
  std::string String(const char* name) const;
  std::vector<int64_t> Ints(const char* name) const;
  // The layout for the table: data_format where the op has one, else "".
  std::string Layout() const;
  // The dtype the row of the table is keyed by: the op's T (first float input).
  DType KeyType() const;
};

// Reads DIR/<op>.cases for every op of the table that has one; throws std::runtime_error on a malformed file.
std::vector<Case> ReadGoldenCases(const std::string& dir, std::vector<std::string>* missing_ops);

// Every op of the domain, in the op table's order.
std::vector<std::string> AllOps();
// The op table's type combinations of `op`, each its input dtypes.
std::vector<std::vector<DType>> InputTypeCombinations(const std::string& op);
// The data_format choices of `op` (empty when it has none).
std::vector<std::string> LayoutChoices(const std::string& op);

// Seeded random cases of `op` (random.cc). `large` adds the large ones (grids past one launch, over 2^24
// elements); TimingCases gives one case per type combination of `op` (NHWC 16x56x56x128, benchmarks/
// bench_ops.py's shape; depthwise float32 also at stride 2 with multiplier 2, and NCHW).
std::vector<Case> RandomCases(const std::string& op, bool large);
std::vector<Case> TimingCases(const std::string& op);

// ------------------------------------------------------------------------------------------------ running

using Pointers = std::vector<const void*>;
using MutablePointers = std::vector<void*>;

struct Prepared {
  std::vector<Tensor> outputs;  // shapes and dtypes of the outputs (data: scratch for the caller)
  std::vector<bool> host_input;  // inputs the CUDA path reads on the host (the adapter's kHostInputs)
  std::function<void(const Pointers& in, const MutablePointers& out, const tfops::Parallel& par)> cpu;
  std::function<void(const Pointers& in, const MutablePointers& out, const tfops::CudaLaunch& launch)> gpu;
};

// The adapter's checks, then the kernels to run. Throws tfops::OpError when the op rejects the case. The
// returned functions read host-side values (ranges, sizes) from `c`, which must outlive them.
Prepared Prepare(const Case& c);

// Runs the CPU kernel of `p` on the case's inputs into fresh outputs, in TF's denormal mode.
std::vector<Tensor> RunCpu(const Case& c, const Prepared& p, const tfops::Parallel& par);

// ---------------------------------------------------------------------------------------- the CUDA half
// device.cc (a build with CUDA); a CPU-only build has stand-ins that say so. Every call uses one non-default
// stream; device memory comes from the stream-ordered allocator (cudaMallocAsync), as ORT's arena serves a
// kernel's scratch in stream order.

struct DeviceInfo {
  bool ok = false;
  std::string why;  // when not ok
  std::string name, driver, runtime;
  int major = 0, minor = 0, multiprocessors = 0;
  double memory_gib = 0;
};
DeviceInfo ProbeDevice();

struct DeviceRun {
  std::vector<Tensor> outputs;
  std::string error;    // "" when the launches and copies succeeded
  bool broken = false;  // the error left the CUDA context unusable (an illegal address, say)
};
// variant 0: outputs poisoned with 0xFF bytes; 1: with 0xA5 bytes (an element left unwritten differs between
// the two); 2: like 0, every buffer one element past an aligned address (the kernels' unvectorized paths).
DeviceRun RunOnDevice(const Case& c, const Prepared& p, int variant);

struct GraphRun {
  std::vector<std::vector<Tensor>> outputs;  // one per replay
  std::string error;
  bool broken = false;
  std::size_t nodes = 0;
};
// Captures p's launches (inputs of `a`) in a CUDA graph on a non-default stream in global capture mode (any
// use of the default stream, a synchronization or a cudaMalloc fails the capture), then replays it on the
// inputs of each case of `replays`, written in place into the captured buffers.
GraphRun GraphOnDevice(const Case& a, const Prepared& p, const std::vector<const Case*>& replays);

struct Timing {
  double kernel_us = -1;  // median over replays of the op's captured graph, L2 flushed before each
  double launch_us = -1;  // median of events around a direct call of the launcher (host work included)
  double copy_us = -1;    // median of a device-to-device copy of half the bytes (read + write = bytes)
  int64_t bytes = 0;      // every float input read once + every output written once
  std::string error;
  bool broken = false;
};
Timing TimeOnDevice(const Case& c, const Prepared& p, int repeat);

// ------------------------------------------------------------------------------------------------- judging

enum class Against { kCpu, kGolden };

// Every problem of `got` against `want` under the suite's rule for `c.op` (empty: they agree). kCpu: the
// CUDA-against-CPU rules of tests/cuda_support.py (outputs_mismatch), `want` being the CPU kernels' result;
// kGolden: the suite's golden rules (quantization bit for bit with summed outputs to 1e-6 * sum|g|, batch norm
// and depthwise to their tolerances), `want` being TF's. `cpu`: the CPU kernels' outputs where neither side
// is (the depthwise bound of 16-bit types holds their rounding error). For batch norm against the CPU kernels,
// an output outside the suite's tolerance still passes when it is no further from the float64 math than twice
// the CPU kernel's own error, or than the tolerance (docs/cuda.md: on large batches the GPU's tree sums are
// the closer ones); `float64_passes` counts those.
std::vector<std::string> Judge(const Case& c, const std::vector<Tensor>& want, const std::vector<Tensor>& got,
                               Against against, const std::vector<Tensor>* cpu = nullptr,
                               int* float64_passes = nullptr);

// Bit-for-bit equality (NaN payloads included): "" or the first difference.
std::string BitsMismatch(const Tensor& want, const Tensor& got, bool nan_payloads = true);

// The key phrase of a TF message: the part before its first number (tests/comparison.py key_phrase).
std::string KeyPhrase(const std::string& message);
// Whether the op's golden error cases are matched by key phrase (quantization and fused ops) or whole.
bool BitExactFamily(const std::string& op);

}  // namespace gpu_check
