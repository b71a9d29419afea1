// A host stand-in for the CUDA subset that kernels/cuda/batch_norm.cu uses, so that its __global__
// kernels run unchanged on a machine without a GPU (tests/test_cuda_emulation_batch_norm.py).
//
// The test rewrites each `kernel<<<grid, block, 0, stream>>>(args);` of the .cu file into
// `::emu::Launch(grid, block, [&] { kernel(args); });` and includes this header instead of
// <cuda_runtime.h> / <cuda_fp16.h>. Launch runs the blocks one after another; the threads of a block
// are fibers (ucontext) on the calling thread, switched at every __syncthreads, so a block's
// barrier phases run as on the GPU: every thread finishes phase k before any starts phase k + 1.
// Blocks never overlap, so `static` stands in for __shared__. A barrier that not all of a block's
// threads reach (divergent __syncthreads) is reported as an error.
//
// float32 arithmetic runs with the CPU's FTZ/DAZ on (what -ftz=true gives the GPU's float32
// instructions); float16 conversions are kernels/half.h's, which round as the GPU's cvt.rn does.
// What this cannot check: anything only the hardware does (the .ftz and cvt instructions
// themselves, the memory model, launch limits, speed).
#pragma once

#include <ucontext.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/half.h"
#include "kernels/simd.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct EmuIndex {
  unsigned x, y, z;
};
inline EmuIndex threadIdx{0, 0, 0}, blockIdx{0, 0, 0};
inline dim3 blockDim, gridDim;

inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
struct __half {
  unsigned short bits;
};
inline __half __ushort_as_half(unsigned short b) { return {b}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline float __half2float(__half h) { return tfops::HalfToFloat(h.bits); }
inline __half __float2half_rn(float f) { return {tfops::FloatToHalf(f)}; }

typedef void* cudaStream_t;
typedef int cudaError_t;
constexpr cudaError_t cudaSuccess = 0;
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t) { return "emulated"; }
// common.cuh's ZeroFloats: host memory stands in for device memory, so a plain memset.
inline cudaError_t cudaMemsetAsync(void* p, int v, std::size_t n, cudaStream_t) {
  std::memset(p, v, n);
  return cudaSuccess;
}

namespace emu {

struct Fiber {
  ucontext_t context;
  std::vector<char> stack;
  bool done = false;
  long barriers = 0;
};

struct State {
  ucontext_t scheduler;
  std::vector<Fiber> fibers;
  unsigned current = 0;
  const std::function<void()>* body = nullptr;
  long launches = 0, blocks = 0;
};
inline State g_state;

inline void FiberMain() {
  (*g_state.body)();
  g_state.fibers[g_state.current].done = true;
}  // returns to the scheduler through uc_link

}  // namespace emu

inline void __syncthreads() {
  emu::Fiber& f = emu::g_state.fibers[emu::g_state.current];
  ++f.barriers;
  swapcontext(&f.context, &emu::g_state.scheduler);
}

namespace emu {

constexpr std::size_t kStackBytes = 256 * 1024;

inline void Launch(dim3 grid, dim3 block, const std::function<void()>& body) {
  if (block.y != 1 || block.z != 1 || grid.z != 1) throw std::logic_error("emu: only 1-D blocks and 2-D grids");
  tfops::ScopedFlushDenormals flush;  // captured by getcontext below, so every fiber runs with it
  State& s = g_state;
  ++s.launches;
  gridDim = grid;
  blockDim = block;
  s.body = &body;
  s.fibers.resize(block.x);
  for (Fiber& f : s.fibers) f.stack.resize(kStackBytes);
  for (unsigned by = 0; by < grid.y; ++by) {
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      ++s.blocks;
      blockIdx = {bx, by, 0};
      for (Fiber& f : s.fibers) {
        f.done = false;
        f.barriers = 0;
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = f.stack.data();
        f.context.uc_stack.ss_size = f.stack.size();
        f.context.uc_link = &s.scheduler;
        makecontext(&f.context, FiberMain, 0);
      }
      for (;;) {  // one barrier phase per round
        for (unsigned t = 0; t < block.x; ++t) {
          if (s.fibers[t].done) continue;
          s.current = t;
          threadIdx = {t, 0, 0};
          swapcontext(&s.scheduler, &s.fibers[t].context);
        }
        unsigned finished = 0;
        for (const Fiber& f : s.fibers) finished += f.done ? 1 : 0;
        if (finished == block.x) break;
        const long phase = s.fibers[0].barriers;
        for (const Fiber& f : s.fibers)
          if (f.done || f.barriers != phase)
            throw std::logic_error("emu: __syncthreads not reached by every thread of block (" + std::to_string(bx) +
                                   ", " + std::to_string(by) + ")");
      }
    }
  }
}

}  // namespace emu
