// What every CUDA kernel file shares: the stream, launch checking and grid sizes.
//
// Conventions (docs/cuda.md):
// - Every launch and copy goes on the stream of the CudaLaunch the adapter passes (ORT's compute
//   stream); nothing uses the default stream and nothing waits on the host, so ORT can capture the
//   kernels into a CUDA graph.
// - The arithmetic is the CPU kernels' (shared TFOPS_HD functions); the .cu files are built with
//   --fmad=false (no contraction, like -ffp-contract=off on the CPU side), -ftz=true (TF's CPU
//   kernels run with flush-to-zero and denormals-are-zero; for float32 the GPU's .ftz instructions
//   do the same; float64 has no .ftz and flushes explicitly where the CPU kernel's result depends on
//   it) and IEEE division and square root.
// - Reductions are deterministic: fixed block shapes and a fixed combination order, no atomics on
//   floats, so every run gives the same bits.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/device.h"

namespace tfops {
namespace cuda {

inline cudaStream_t StreamOf(const CudaLaunch& launch) { return static_cast<cudaStream_t>(launch.stream); }

// Throws DeviceError if the last launch (or an earlier asynchronous error) failed. Does not wait.
inline void CheckLaunch(const char* what) {
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) throw DeviceError(std::string(what) + ": " + cudaGetErrorString(error));
}

// Throws DeviceError if a CUDA runtime call failed.
inline void CheckCuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) throw DeviceError(std::string(what) + ": " + cudaGetErrorString(error));
}

// n floats of device memory set to +0.0f (all-zero bits) on the launch's stream; nothing for n <= 0.
inline void ZeroFloats(float* p, std::int64_t n, const CudaLaunch& launch, const char* what) {
  if (n <= 0) return;
  CheckCuda(cudaMemsetAsync(p, 0, static_cast<std::size_t>(n) * sizeof(float), StreamOf(launch)), what);
}

constexpr int kThreadsPerBlock = 256;

// Blocks for a grid-stride loop over n items: enough to fill any current GPU, never more than the
// items need. Bounded so that the launch is valid whatever n is (grid-stride loops cover the rest).
inline unsigned GridFor(std::int64_t n, int threads = kThreadsPerBlock) {
  const std::int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min<std::int64_t>(blocks, 65536)));
}

}  // namespace cuda
}  // namespace tfops
