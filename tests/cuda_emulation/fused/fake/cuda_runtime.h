// A host stand-in for the part of the CUDA runtime that kernels/cuda/fused.cu uses (test harness only,
// tests/test_cuda_emulation_fused.py). The test rewrites each `kernel<<<grid, block, 0, stream>>>(args);`
// into `::emu::Launch(dim3(grid), dim3(block), [&] { kernel(args); });`, which runs every thread of
// every block, one after another, with the CPU's flush-to-zero and denormals-are-zero modes on (what
// -ftz=true gives the GPU's float32 instructions). The fused kernels have no barriers and no shared
// memory, so neither is defined here: a kernel that used them would not compile.
#pragma once

#include <xmmintrin.h>

// Every standard header the kernels' headers use, before the keyword macros below.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <math.h>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct EmuIndex {
  unsigned x, y, z;
};
inline EmuIndex threadIdx{0, 0, 0}, blockIdx{0, 0, 0};
inline dim3 blockDim, gridDim;

namespace emu {
struct Counters {
  long launches = 0, memsets = 0, threads = 0, vector_loads = 0, vector_stores = 0;
};
inline Counters g_counters;
}  // namespace emu

// Counts its copies (a 16-byte load) and assignments (a 16-byte store), so that the check can tell
// that the aligned path really used vectors.
struct float4 {
  float x, y, z, w;
  float4(float a = 0, float b = 0, float c = 0, float d = 0) : x(a), y(b), z(c), w(d) {}
  float4(const float4& o) : x(o.x), y(o.y), z(o.z), w(o.w) { ++emu::g_counters.vector_loads; }
  float4& operator=(const float4& o) {
    x = o.x, y = o.y, z = o.z, w = o.w;
    ++emu::g_counters.vector_stores;
    return *this;
  }
};
inline float4 make_float4(float a, float b, float c, float d) { return float4(a, b, c, d); }

typedef int cudaError_t;
typedef void* cudaStream_t;
constexpr cudaError_t cudaSuccess = 0;
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t) { return "emulated"; }

namespace emu {

// CUDA's launch limits, so that a launcher asking for an impossible grid fails here too.
inline void Launch(dim3 grid, dim3 block, const std::function<void()>& body) {
  if (block.x == 0 || block.x > 1024 || block.y != 1 || block.z != 1)
    throw std::logic_error("emu: bad block " + std::to_string(block.x));
  if (grid.x == 0 || grid.x > 0x7fffffffu || grid.y == 0 || grid.y > 65535 || grid.z != 1)
    throw std::logic_error("emu: bad grid " + std::to_string(grid.x) + " x " + std::to_string(grid.y));
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040);  // FTZ | DAZ
  ++g_counters.launches;
  gridDim = grid;
  blockDim = block;
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx)
      for (unsigned t = 0; t < block.x; ++t) {
        blockIdx = {bx, by, 0};
        threadIdx = {t, 0, 0};
        ++g_counters.threads;
        body();
      }
  _mm_setcsr(saved);
}

}  // namespace emu

inline cudaError_t cudaMemsetAsync(void* p, int v, std::size_t n, cudaStream_t) {
  ++emu::g_counters.memsets;
  std::memset(p, v, n);
  return cudaSuccess;
}
