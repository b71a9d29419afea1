// CPU emulation of the bits of the CUDA runtime the kernels use (test harness only).
#pragma once
#include <barrier>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>
#include <xmmintrin.h>
#define __global__
#define __device__
#define __host__
#define __launch_bounds__(x)
#define __restrict__ __restrict
#define __shared__ static
struct EmuDim { unsigned x = 0, y = 1, z = 1; };
inline thread_local EmuDim threadIdx, blockIdx;
inline EmuDim blockDim, gridDim;
struct float4 { float x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
typedef int cudaError_t;
typedef void* cudaStream_t;
constexpr int cudaSuccess = 0;
enum cudaMemcpyKind { cudaMemcpyDeviceToDevice = 3 };
inline cudaError_t cudaGetLastError() { return 0; }
inline const char* cudaGetErrorString(cudaError_t) { return "emu"; }
inline cudaError_t cudaMemsetAsync(void* p, int v, std::size_t n, cudaStream_t) { std::memset(p, v, n); return 0; }
inline cudaError_t cudaMemcpyAsync(void* d, const void* s, std::size_t n, cudaMemcpyKind, cudaStream_t) { std::memcpy(d, s, n); return 0; }
inline thread_local std::barrier<>* emu_barrier = nullptr;
inline void __syncthreads() { emu_barrier->arrive_and_wait(); }
struct EmuFtz { unsigned saved; EmuFtz() : saved(_mm_getcsr()) { _mm_setcsr(saved | 0x8040); } ~EmuFtz() { _mm_setcsr(saved); } };
inline void EmuLaunch(unsigned grid, unsigned block, bool threaded, const std::function<void()>& body) {
  gridDim.x = grid; blockDim.x = block;
  for (unsigned b = 0; b < grid; ++b) {
    if (!threaded) {
      EmuFtz f;
      blockIdx.x = b;
      for (unsigned t = 0; t < block; ++t) { threadIdx.x = t; body(); }
    } else {
      std::barrier<> bar(block);
      std::vector<std::thread> ts;
      for (unsigned t = 0; t < block; ++t) ts.emplace_back([&, t] { EmuFtz f; emu_barrier = &bar; blockIdx.x = b; threadIdx.x = t; body(); });
      for (auto& th : ts) th.join();
    }
  }
}
