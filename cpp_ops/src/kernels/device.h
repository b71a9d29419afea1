// What the CPU and the CUDA kernels share, with no ONNX Runtime and no CUDA types in it, so that
// g++ (the adapters, the CPU kernels) and nvcc (kernels/cuda/*.cu) read the same header.
//
// - TFOPS_HD marks a function that both sides call: the per-element arithmetic of an op lives in
//   one such function, so the CUDA kernel computes exactly what the CPU kernel computes.
// - kWithCuda says whether this build has the CUDA kernels (CMake defines TFOPS_WITH_CUDA=1).
//   Adapters dispatch with `if constexpr (kWithCuda)`, so a CPU-only build never references the
//   launchers declared in kernels/cuda/*.h.
// - CudaLaunch is everything a launcher needs from the adapter: ORT's compute stream (a
//   cudaStream_t, carried as void* here) and device scratch memory from ORT's allocator.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

#if defined(__CUDACC__)
#define TFOPS_HD __host__ __device__
#else
#define TFOPS_HD
#endif

namespace tfops {

#if defined(TFOPS_WITH_CUDA) && TFOPS_WITH_CUDA
constexpr bool kWithCuda = true;
#else
constexpr bool kWithCuda = false;
#endif

// Device memory for a kernel's temporaries. The adapter frees it when its Compute returns, while
// the kernels that use it may still be queued: ORT's device allocator hands memory out in the order
// of the compute stream, which is how ORT's own CUDA kernels use their scratch buffers too.
class DeviceScratch {
 public:
  virtual ~DeviceScratch() = default;
  // Never null for bytes > 0; throws (OrtCallError from the adapter) when ORT cannot allocate.
  virtual void* Allocate(std::size_t bytes) = 0;
  template <typename T>
  T* Array(std::size_t count) {
    return static_cast<T*>(Allocate(count * sizeof(T)));
  }
};

struct CudaLaunch {
  void* stream = nullptr;  // cudaStream_t: ORT's compute stream; every launch and copy goes on it
  DeviceScratch* scratch = nullptr;
};

// A CUDA call failed (a launch error, an illegal address found by an earlier kernel). The adapter
// framework reports it as an ORT_FAIL status that names the op and the node.
class DeviceError : public std::runtime_error {
 public:
  explicit DeviceError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace tfops
