// CUDA kernel of FusedBatchNormClipFakeQuant (cuda/fused.h; the CPU kernel is kernels/fused.cc). One
// launch, one read of x and one write of y: each element is fused.h's BatchNormClipFakeQuantElement,
// compiled here with -ftz=true --fmad=false and IEEE division and square root (common.cuh), so every
// number is the CPU kernel's bits.
//
// NaN bits. The GPU returns its one canonical NaN from any arithmetic on a NaN, x86 the quieted NaN
// operand (the first one when both are NaN) or its default NaN 0xffc00000 for an invalid operation.
// An element whose result is NaN is therefore computed again with float_ops::X86, as fake_quant.cu
// does for the plain FakeQuant ops, but here every operation of the chain has to be spelled out, not
// only the quantizer's: a NaN x, mean, k or offset already makes batch_norm::Normalize's result NaN,
// and fused.h's BatchNormClipFakeQuantElement<kDivide, FakeQuantX86Ops> computes Normalize with the
// plain operators, which on the GPU would hand the canonical NaN to the quantizer. The per-channel
// factor k follows the same rule (a negative or NaN variance, a NaN scale). ExactElement below is
// the chain once more in its written operand order (x - mean, then * k, then + offset, then ClipValue
// and the quantizer), which is the order of the CPU kernel's AVX2 and AVX-512 copies (its SSE2 copy
// may commute the product and the sum where two NaNs meet there; docs/cuda.md). Only its NaN results
// are ever used, and they depend on the operands' bits alone, never on which NaN the GPU's own
// instructions return.
//
// Layout (batch_norm::Layout, [outer, channels, inner]):
//  - Channels last (inner == 1, also a channels-first x with spatial size 1): x is rows x C. A
//    thread owns V adjacent channels (V = 4 when C is a multiple of 4, so that a vector never
//    crosses a row) and walks rows; its channels' mean, k and offset stay in registers.
//  - Channels first (inner = P > 1): a block row of threads owns one channel (grid y) and walks
//    that channel's planes, each plane cut into chunks of at most 8 vectors a thread; V = 4 when P
//    is a multiple of 4. The channel's factor is computed once per thread.
//  Vectors are 16-byte loads and stores when x and y are 16-byte aligned, four scalar accesses
//  otherwise: the element arithmetic does not depend on either choice. A thread loads kBatch<V>
//  vectors before it computes any of them, to keep several loads in flight.
// k is computed per thread from variance, epsilon and scale (batch_norm::ScaleFactor, as
// batch_norm.cu's inference forward does) rather than by a separate kernel: a thread covers many
// elements of its channels, so the square root and division cost little, and there is no second
// launch and no scratch memory.
#include "kernels/cuda/fused.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/batch_norm.h"
#include "kernels/cuda/common.cuh"
#include "kernels/eigen_sum.h"
#include "kernels/fake_quant.h"
#include "kernels/fused.h"

namespace tfops {
namespace cuda {
namespace {

using i64 = std::int64_t;
using X86 = float_ops::X86;  // x86's NaN results (kernels/eigen_sum.h)

constexpr int kThreads = kThreadsPerBlock;
// Vectors a thread loads before it computes them (two float4 or four floats in flight a thread, which
// at full occupancy covers the memory latency); four float4 made ptxas spill registers on sm_90.
template <int V>
constexpr int kBatch = V == 4 ? 2 : 4;
constexpr i64 kVectorsPerThread = 8;            // a thread's share, about (grid-stride past the caps)
constexpr i64 kMaxBlocksX = i64(1) << 20;       // grid-stride loops cover the rest
constexpr i64 kMaxGridY = 65535;                // CUDA's limit on gridDim.y

bool Aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

int Log2(int v) {
  int l = 0;
  while ((1 << l) < v) ++l;
  return l;
}

i64 CeilDiv(i64 a, i64 b) { return (a + b - 1) / b; }

// The smallest power of two >= count, within [1, max_lanes].
int LanesFor(i64 count, int max_lanes) {
  int lanes = 1;
  while (lanes < max_lanes && lanes < count) lanes *= 2;
  return lanes;
}

unsigned Clamped(i64 blocks, i64 cap) { return static_cast<unsigned>(blocks < 1 ? 1 : blocks < cap ? blocks : cap); }
unsigned BlocksX(i64 blocks) { return Clamped(blocks, kMaxBlocksX); }
unsigned BlocksY(i64 blocks) { return Clamped(blocks, kMaxGridY); }

// ---------------------------------------------------------------- element arithmetic

// sqrtf with x86's NaN results: sqrtss returns the quieted operand for a NaN and the default NaN
// for a negative number (float_ops::X86 has no square root). Numbers are the hardware's.
__device__ __forceinline__ float X86Sqrt(float a) {
  const float r = sqrtf(a);
  if (!float_ops::IsNan(r)) return r;
  return float_ops::IsNan(a) ? X86::Quiet(a) : float_ops::FromBits(0xffc00000u);
}

// batch_norm::ScaleFactor (rsqrt(variance + epsilon) * scale, the CPU's k), and when it is NaN the
// same operations with x86's NaN rules, so that a NaN k carries the CPU's bits into ExactElement.
__device__ __forceinline__ float ChannelFactor(float variance, float epsilon, float scale) {
  const float k = batch_norm::ScaleFactor(variance, epsilon, scale);
  if (!FakeQuantIsNan(k)) return k;
  return X86::Mul(X86::Div(1.0f, X86Sqrt(X86::Add(variance, epsilon))), scale);
}

struct Channel {
  float mean, k, offset;
};

// The inputs a channel's elements need, read once per thread and channel.
struct Statistics {
  const float* mean;
  const float* variance;
  const float* scale;
  const float* offset;
  float epsilon;
  __device__ __forceinline__ Channel Load(i64 c) const {
    return {mean[c], ChannelFactor(variance[c], epsilon, scale[c]), offset[c]};
  }
};

// What every element needs besides its channel: the clip bounds and the quantizer's grid.
struct Chain {
  float clip_lo, clip_hi;
  FakeQuantGrid grid;
};

// fused::BatchNormClipFakeQuantElement with every operation x86's (see the file comment): the CPU
// kernel's NaN bits for an element whose result is NaN.
// Out of line and with its operands by value, so that the rare call costs the hot loop neither
// registers nor a stack frame.
template <bool kDivide>
__device__ __noinline__ float ExactElement(float x, float mean, float k, float offset, float clip_lo, float clip_hi,
                                           FakeQuantGrid g) {
  const float normalized = X86::Add(X86::Mul(X86::Sub(x, mean), k), offset);
  const float v = fused::ClipValue(normalized, clip_lo, clip_hi);
  return kDivide ? FakeQuantDivide<X86>(v, g.nudged_min, g.nudged_max, g.scale, g.quant_zero)
                 : FakeQuantMultiply<X86>(v, g.nudged_min, g.nudged_max, g.inv_scale, g.quant_zero, g.scale);
}

// One element: the hardware's operations, and the rare NaN result again with x86's (numbers are the
// same either way, so only the NaN bits change).
template <bool kDivide>
__device__ __forceinline__ float Element(float x, const Channel& ch, const Chain& chain) {
  const float y = fused::BatchNormClipFakeQuantElement<kDivide>(x, ch.mean, ch.k, ch.offset, chain.clip_lo,
                                                                chain.clip_hi, chain.grid);
  if (!FakeQuantIsNan(y)) return y;
  return ExactElement<kDivide>(x, ch.mean, ch.k, ch.offset, chain.clip_lo, chain.clip_hi, chain.grid);
}

// ---------------------------------------------------------------- vectors

template <int V>
struct Vec {
  float v[V];
};

template <int V>
__device__ __forceinline__ Vec<V> LoadVec(const float* p, bool aligned) {
  Vec<V> r;
  if constexpr (V == 4) {
    if (aligned) {
      const float4 q = *reinterpret_cast<const float4*>(p);
      r.v[0] = q.x;
      r.v[1] = q.y;
      r.v[2] = q.z;
      r.v[3] = q.w;
      return r;
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) r.v[j] = p[j];
  return r;
}

template <int V>
__device__ __forceinline__ void StoreVec(float* p, bool aligned, const Vec<V>& r) {
  if constexpr (V == 4) {
    if (aligned) {
      *reinterpret_cast<float4*>(p) = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) p[j] = r.v[j];
}

// ---------------------------------------------------------------- kernels

// Channels last: rows x channels. Thread tx of a block row owns channel vector group * lanes_c + tx
// (channels c0 .. c0 + V - 1); the block's lanes_r rows of threads take rows blockIdx.x * lanes_r + ty,
// then every gridDim.x * lanes_r-th row.
struct RowsGeometry {
  i64 rows, channels, vectors, groups;  // vectors = channels / V; groups = vectors / lanes_c, rounded up
  int lanes_c, log_lanes_c, lanes_r;
};

template <int V, bool kDivide>
__global__ void __launch_bounds__(kThreads)
    RowsKernel(RowsGeometry g, const float* __restrict__ x, float* __restrict__ y, bool aligned, Statistics s,
               Chain chain) {
  const int tx = threadIdx.x & (g.lanes_c - 1), ty = threadIdx.x >> g.log_lanes_c;
  const i64 C = g.channels;
  const i64 step = static_cast<i64>(gridDim.x) * g.lanes_r;
  for (i64 group = blockIdx.y; group < g.groups; group += gridDim.y) {
    const i64 cv = group * g.lanes_c + tx;
    if (cv >= g.vectors) continue;  // no barrier in this kernel: idle lanes may leave
    const i64 c0 = cv * V;
    Channel ch[V];
#pragma unroll
    for (int j = 0; j < V; ++j) ch[j] = s.Load(c0 + j);
    for (i64 r = static_cast<i64>(blockIdx.x) * g.lanes_r + ty; r < g.rows; r += kBatch<V> * step) {
      Vec<V> in[kBatch<V>];
#pragma unroll
      for (int u = 0; u < kBatch<V>; ++u) {
        const i64 row = r + u * step;
        if (row < g.rows) in[u] = LoadVec<V>(x + row * C + c0, aligned);
      }
#pragma unroll
      for (int u = 0; u < kBatch<V>; ++u) {
        const i64 row = r + u * step;
        if (row < g.rows) {
          Vec<V> out;
#pragma unroll
          for (int j = 0; j < V; ++j) out.v[j] = Element<kDivide>(in[u].v[j], ch[j], chain);
          StoreVec<V>(y + row * C + c0, aligned, out);
        }
      }
    }
  }
}

// Channels first: [outer, channels, inner]. Block row y owns channel blockIdx.y (then every
// gridDim.y-th); an "item" is one chunk of one of its planes: item = o * chunks + chunk covers the
// vectors [chunk * width, min((chunk + 1) * width, vectors)) of plane (o, c). Thread tx of a block
// takes vectors tx, tx + lanes_p, ... of its item; the lanes_o rows of threads take items
// blockIdx.x * lanes_o + ty, then every gridDim.x * lanes_o-th.
struct PlanesGeometry {
  i64 outer, channels, inner, vectors;  // vectors = inner / V
  i64 width, chunks, items;             // width = lanes_p * kVectorsPerThread; items = outer * chunks
  int lanes_p, log_lanes_p, lanes_o;
};

template <int V, bool kDivide>
__global__ void __launch_bounds__(kThreads)
    PlanesKernel(PlanesGeometry g, const float* __restrict__ x, float* __restrict__ y, bool aligned, Statistics s,
                 Chain chain) {
  const int tx = threadIdx.x & (g.lanes_p - 1), ty = threadIdx.x >> g.log_lanes_p;
  const i64 step = static_cast<i64>(gridDim.x) * g.lanes_o;
  for (i64 c = blockIdx.y; c < g.channels; c += gridDim.y) {
    const Channel ch = s.Load(c);
    for (i64 item = static_cast<i64>(blockIdx.x) * g.lanes_o + ty; item < g.items; item += step) {
      const i64 o = g.chunks == 1 ? item : item / g.chunks;  // one division per item, none per element
      const i64 first = (item - o * g.chunks) * g.width;
      const i64 end = first + g.width < g.vectors ? first + g.width : g.vectors;
      const i64 base = (o * g.channels + c) * g.inner;
      for (i64 v = first + tx; v < end; v += kBatch<V> * g.lanes_p) {
        Vec<V> in[kBatch<V>];
#pragma unroll
        for (int u = 0; u < kBatch<V>; ++u) {
          const i64 vu = v + u * g.lanes_p;
          if (vu < end) in[u] = LoadVec<V>(x + base + vu * V, aligned);
        }
#pragma unroll
        for (int u = 0; u < kBatch<V>; ++u) {
          const i64 vu = v + u * g.lanes_p;
          if (vu < end) {
            Vec<V> out;
#pragma unroll
            for (int j = 0; j < V; ++j) out.v[j] = Element<kDivide>(in[u].v[j], ch, chain);
            StoreVec<V>(y + base + vu * V, aligned, out);
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------- host side

template <int V, bool kDivide>
void LaunchRows(const batch_norm::Layout& l, const float* x, float* y, bool aligned, const Statistics& s,
                const Chain& chain, cudaStream_t stream) {
  RowsGeometry g;
  g.rows = l.rows();
  g.channels = l.channels;
  g.vectors = l.channels / V;
  g.lanes_c = LanesFor(g.vectors, 32);
  g.log_lanes_c = Log2(g.lanes_c);
  g.lanes_r = kThreads / g.lanes_c;
  g.groups = CeilDiv(g.vectors, g.lanes_c);
  const dim3 grid(BlocksX(CeilDiv(g.rows, g.lanes_r * kVectorsPerThread)), BlocksY(g.groups));
  RowsKernel<V, kDivide><<<grid, kThreads, 0, stream>>>(g, x, y, aligned, s, chain);
}

template <int V, bool kDivide>
void LaunchPlanes(const batch_norm::Layout& l, const float* x, float* y, bool aligned, const Statistics& s,
                  const Chain& chain, cudaStream_t stream) {
  PlanesGeometry g;
  g.outer = l.outer;
  g.channels = l.channels;
  g.inner = l.inner;
  g.vectors = l.inner / V;
  g.lanes_p = LanesFor(g.vectors, kThreads);
  g.log_lanes_p = Log2(g.lanes_p);
  g.lanes_o = kThreads / g.lanes_p;
  g.width = g.lanes_p * kVectorsPerThread;
  g.chunks = CeilDiv(g.vectors, g.width);
  g.items = g.outer * g.chunks;
  // Small planes give a thread one vector of an item: then it takes several items.
  const i64 per_item = CeilDiv(g.vectors < g.width ? g.vectors : g.width, g.lanes_p);
  const i64 items_per_thread = per_item >= kVectorsPerThread ? 1 : kVectorsPerThread / per_item;
  const dim3 grid(BlocksX(CeilDiv(g.items, g.lanes_o * items_per_thread)), BlocksY(g.channels));
  PlanesKernel<V, kDivide><<<grid, kThreads, 0, stream>>>(g, x, y, aligned, s, chain);
}

template <bool kDivide>
void Launch(const batch_norm::Layout& l, const float* x, float* y, const Statistics& s, const Chain& chain,
            cudaStream_t stream) {
  // V is a shape-only choice (a vector never crosses a row or a plane); the alignment only picks
  // 16-byte or scalar accesses for it.
  const bool aligned = Aligned16(x) && Aligned16(y);
  if (l.inner == 1) {
    if (l.channels % 4 == 0) LaunchRows<4, kDivide>(l, x, y, aligned, s, chain, stream);
    else LaunchRows<1, kDivide>(l, x, y, aligned, s, chain, stream);
  } else {
    if (l.inner % 4 == 0) LaunchPlanes<4, kDivide>(l, x, y, aligned, s, chain, stream);
    else LaunchPlanes<1, kDivide>(l, x, y, aligned, s, chain, stream);
  }
}

}  // namespace

void BatchNormClipFakeQuantForward(const batch_norm::Layout& layout, const float* x, const float* scale,
                                   const float* offset, const float* mean, const float* variance, float epsilon,
                                   float clip_min, float clip_max, const fused::FakeQuantStep& step, float* y,
                                   const CudaLaunch& launch) {
  const i64 n = layout.size();
  if (n <= 0) return;  // nothing to read or write (and no channels to normalize)
  if (step.zero_output) {
    // Vars with min == max == 0: zeros whatever x is, as the CPU kernel (+0.0f is all-zero bits).
    ZeroFloats(y, n, launch, "FusedBatchNormClipFakeQuant: zero range");
    return;
  }
  const Statistics s{mean, variance, scale, offset, epsilon};
  const Chain chain{clip_min, clip_max, step.grid};
  if (step.use_division) Launch<true>(layout, x, y, s, chain, StreamOf(launch));
  else Launch<false>(layout, x, y, s, chain, StreamOf(launch));
  CheckLaunch("FusedBatchNormClipFakeQuant");
}

}  // namespace cuda
}  // namespace tfops
