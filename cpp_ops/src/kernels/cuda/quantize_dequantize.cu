// CUDA kernels of the QuantizeAndDequantize family (kernels/cuda/quantize_dequantize.h, docs/cuda.md).
//
// Exactness. Every value is computed by the TFOPS_HD functions of kernels/quantize_dequantize.h and
// kernels/qdq_eigen_order.h with qdq::ExplicitArith: x86's flush-to-zero, denormals-are-zero and NaN
// propagation written out, because the GPU returns a canonical NaN from arithmetic and has no
// flush-to-zero for float64. A data range follows the CPU's order rules through their associative
// form (qdq_order::LaneExtreme per tensor, qdq_order::AxisExtremes per axis): the result of those
// reductions does not depend on how the elements are grouped, so any launch shape gives the same bits.
//
// Kernels, per call:
//  - given range: one element-wise launch per tensor, or per chunk of channels (parameters computed on
//    the host, passed by value, staged in shared memory);
//  - per-tensor data range: TensorLanesKernel (the 4 * W packet lanes of Eigen's reduction, per block)
//    -> TensorRangeKernel (one block: combines the lanes, runs the rest of Eigen's reduction on the
//    tail, computes the parameters into scratch) -> the element-wise kernel, which reads them;
//  - per-axis data range: AxisColumnsKernel (post == 1) or AxisRunsKernel -> AxisRangeKernel (a warp
//    per channel; rescans the channel when a NaN makes the order matter) -> the element-wise kernel.
#include "kernels/cuda/quantize_dequantize.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/qdq_eigen_order.h"
#include "kernels/quantize_dequantize.h"

namespace tfops {
namespace cuda {
namespace {

using detail::DivMod32;
using detail::DivMod64;
using qdq::ExplicitArith;
using qdq_order::AxisExtremes;
using qdq_order::LaneExtreme;
using qdq_order::NanRule;

constexpr int kThreads = kThreadsPerBlock;  // 256
constexpr int kUnroll = 4;                  // independent loads in flight per thread

template <typename T>
constexpr int kLanes = 4 * qdq_order::PacketWidth<T>();  // Eigen's four packet accumulators

// 16 bytes of T, for vector loads and stores.
template <typename T>
struct alignas(16) Pack {
  T v[16 / sizeof(T)];
};

template <typename I>
struct DividerFor;
template <>
struct DividerFor<uint32_t> {
  using type = DivMod32;
};
template <>
struct DividerFor<uint64_t> {
  using type = DivMod64;
};
template <typename I>
using Divider = typename DividerFor<I>::type;

// ---------------------------------------------------------------- parameters

// Given-range parameters of channels [c0, c0 + count), by value (kernel arguments).
template <typename T>
struct ParamChunk {
  static constexpr int kCapacity = static_cast<int>(kGivenChannelsPerLaunch<T>);
  T lo[kCapacity];
  T hi[kCapacity];
  T scale[kCapacity];
  T inverse[kCapacity];
};
static_assert(sizeof(ParamChunk<float>) <= 3584 && sizeof(ParamChunk<double>) <= 3584,
              "given-range parameters must leave room in 4 KB of kernel arguments");

// Where an element-wise kernel finds channel cc's parameters (cc counted from the launch's first channel).
template <typename T>
struct DeviceParams {  // computed on the device (a data range), in global memory
  const QdqParams<T>* params;
  __device__ void Prepare() const {}
  __device__ QdqParams<T> Get(int64_t cc) const { return params[cc]; }
};

template <typename T>
struct ValueParams {  // one given range: a kernel argument
  QdqParams<T> params;
  __device__ void Prepare() const {}
  __device__ QdqParams<T> Get(int64_t) const { return params; }
};

template <typename T>
struct ChunkParams {  // given ranges of several channels: kernel arguments, staged in shared memory
  ParamChunk<T> chunk;
  int count;
  __device__ void Prepare() const {
    for (int c = threadIdx.x; c < count; c += blockDim.x) {
      Shared()[c] = QdqParams<T>{chunk.lo[c], chunk.hi[c], chunk.scale[c], chunk.inverse[c]};
    }
    __syncthreads();
  }
  __device__ QdqParams<T> Get(int64_t cc) const { return Shared()[cc]; }
  __device__ static QdqParams<T>* Shared() {
    __shared__ QdqParams<T> params[ParamChunk<T>::kCapacity];
    return params;
  }
};

// ---------------------------------------------------------------- forward, element-wise

// One element: the shared arithmetic, then TF's choice where the input and the step are both NaN.
// position(&r, &q) gives the element's place in its channel; it is called only in that rare case.
template <typename T, bool kClamp, bool kHalfUp, typename Position>
__device__ __forceinline__ T QuantizeElement(T v, const QdqParams<T>& p, const NanRule& rule, const Position& position,
                                             int64_t pre, int64_t post) {
  T out = qdq::QuantizeOne<ExplicitArith, kClamp, kHalfUp>(v, p.min_range, p.max_range, p.scale, p.inverse);
  if (qdq::IsNan(v) && qdq::IsNan(p.inverse)) {
    int64_t r, q;
    position(&r, &q);
    out = qdq::NanResult(v, p.inverse, rule.KeepsInputNan(r, q, pre, post));
  }
  return out;
}

// One channel over n contiguous elements (per tensor, or an axis of size 1): element i is (r, q) =
// (i / post, i % post) of the channel, needed only by the NaN rule. kVector: x and y are 16-byte aligned.
template <typename T, bool kClamp, bool kHalfUp, bool kVector, class Source>
__global__ void __launch_bounds__(kThreads) QdqFlatKernel(const T* __restrict__ x, T* __restrict__ y, int64_t n,
                                                          Source source, NanRule rule, int64_t pre, int64_t post) {
  source.Prepare();
  const QdqParams<T> p = source.Get(0);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  auto one = [&](int64_t i, T v) {
    auto position = [i, post](int64_t* r, int64_t* q) {
      *r = i / post;
      *q = i % post;
    };
    return QuantizeElement<T, kClamp, kHalfUp>(v, p, rule, position, pre, post);
  };
  int64_t tail = 0;
  if constexpr (kVector) {
    constexpr int V = 16 / sizeof(T);
    const int64_t packs = n / V;
    const Pack<T>* xv = reinterpret_cast<const Pack<T>*>(x);
    Pack<T>* yv = reinterpret_cast<Pack<T>*>(y);
    for (int64_t j = start; j < packs; j += stride) {
      const Pack<T> a = xv[j];
      Pack<T> b;
#pragma unroll
      for (int k = 0; k < V; ++k) b.v[k] = one(j * V + k, a.v[k]);
      yv[j] = b;
    }
    tail = packs * V;
  }
  for (int64_t base = tail + start; base < n; base += kUnroll * stride) {
    T v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * stride;
      v[u] = i < n ? x[i] : T(0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * stride;
      if (i < n) y[i] = one(i, v[u]);
    }
  }
}

// Channels [c0, c0 + span / post) of every row of [pre, depth, post]: `count` = pre * span elements,
// element f is (r, j) = (f / span, f % span) at x[r * row_width + col0 + j], channel c0 + j / post.
template <typename T, bool kClamp, bool kHalfUp, typename I, class Source>
__global__ void __launch_bounds__(kThreads)
    QdqAxisKernel(const T* __restrict__ x, T* __restrict__ y, I count, Divider<I> span, Divider<I> post_div,
                  int64_t row_width, int64_t col0, Source source, NanRule rule, int64_t pre, int64_t post) {
  source.Prepare();
  // Positions are counted in 64 bits (a 32-bit count may lie just below 2^32); I is the type of the
  // divisions.
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t base = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; base < count;
       base += kUnroll * stride) {
    T v[kUnroll];
    int64_t index[kUnroll];
    I row[kUnroll], channel[kUnroll], q[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint64_t f = base + u * stride;
      if (f < count) {
        I j;
        span.DivMod(static_cast<I>(f), &row[u], &j);
        post_div.DivMod(j, &channel[u], &q[u]);
        index[u] = static_cast<int64_t>(row[u]) * row_width + col0 + static_cast<int64_t>(j);
        v[u] = x[index[u]];
      } else {
        index[u] = -1;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (index[u] < 0) continue;
      const QdqParams<T> p = source.Get(channel[u]);
      const int64_t r = static_cast<int64_t>(row[u]), qu = static_cast<int64_t>(q[u]);
      auto position = [r, qu](int64_t* rp, int64_t* qp) {
        *rp = r;
        *qp = qu;
      };
      y[index[u]] = QuantizeElement<T, kClamp, kHalfUp>(v[u], p, rule, position, pre, post);
    }
  }
}

// ---------------------------------------------------------------- per-tensor data range

// Eigen's packet lanes over [0, whole4): block b writes lane l's partial extreme to partial_*[b * L + l].
// The grid's stride is a multiple of L, so each thread stays in one lane and sees its elements in
// index order (LaneAdd's assumption); partials of the same lane are combined by index.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    TensorLanesKernel(const T* __restrict__ x, int64_t whole4, LaneExtreme<T>* partial_lo, LaneExtreme<T>* partial_hi) {
  constexpr int L = kLanes<T>;
  static_assert(kThreads % L == 0, "a block must hold whole sets of lanes");
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  LaneExtreme<T> lo = qdq_order::LaneInit<T, false>(), hi = qdq_order::LaneInit<T, true>();
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; base < whole4;
       base += kUnroll * stride) {
    T v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * stride;
      v[u] = i < whole4 ? x[i] : T(0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * stride;
      if (i < whole4) {
        qdq_order::LaneAdd<T, false>(lo, v[u], i);
        qdq_order::LaneAdd<T, true>(hi, v[u], i);
      }
    }
  }
  __shared__ LaneExtreme<T> s_lo[kThreads], s_hi[kThreads];
  s_lo[threadIdx.x] = lo;
  s_hi[threadIdx.x] = hi;
  __syncthreads();
  if (threadIdx.x < L) {
    for (int t = threadIdx.x + L; t < kThreads; t += L) {
      lo = qdq_order::LaneCombine<T, false>(lo, s_lo[t]);
      hi = qdq_order::LaneCombine<T, true>(hi, s_hi[t]);
    }
    partial_lo[static_cast<int64_t>(blockIdx.x) * L + threadIdx.x] = lo;
    partial_hi[static_cast<int64_t>(blockIdx.x) * L + threadIdx.x] = hi;
  }
}

// One block of kRangeThreads threads: lane l's partials over all blocks (kRangeThreads / L threads per
// lane, then one), the elements [whole4, n) staged in shared memory, then one thread runs the rest of
// Eigen's reduction and computes the parameters.
constexpr int kRangeThreads = 1024;

template <typename T>
__global__ void __launch_bounds__(kRangeThreads)
    TensorRangeKernel(const T* __restrict__ x, int64_t n, const LaneExtreme<T>* partial_lo,
                      const LaneExtreme<T>* partial_hi, int64_t blocks, QdqGrid grid, QdqParams<T>* params) {
  constexpr int L = kLanes<T>;
  constexpr int W = qdq_order::PacketWidth<T>();
  constexpr int kPerLane = kRangeThreads / L;
  static_assert(kRangeThreads % L == 0, "whole sets of lanes");
  __shared__ LaneExtreme<T> s_lo[kRangeThreads], s_hi[kRangeThreads];
  __shared__ T s_tail[L];
  const int lane = threadIdx.x % L;
  const int slot = threadIdx.x / L;
  LaneExtreme<T> lo = qdq_order::LaneInit<T, false>(), hi = qdq_order::LaneInit<T, true>();
  for (int64_t b = slot; b < blocks; b += kPerLane) {
    lo = qdq_order::LaneCombine<T, false>(lo, partial_lo[b * L + lane]);
    hi = qdq_order::LaneCombine<T, true>(hi, partial_hi[b * L + lane]);
  }
  s_lo[threadIdx.x] = lo;
  s_hi[threadIdx.x] = hi;
  const int64_t whole4 = (n / L) * L;
  if (whole4 + threadIdx.x < n) s_tail[threadIdx.x] = x[whole4 + threadIdx.x];  // fewer than L elements
  __syncthreads();
  if (threadIdx.x < L) {
    for (int k = 1; k < kPerLane; ++k) {
      lo = qdq_order::LaneCombine<T, false>(lo, s_lo[k * L + lane]);
      hi = qdq_order::LaneCombine<T, true>(hi, s_hi[k * L + lane]);
    }
    s_lo[lane] = lo;  // slot 0 is this thread's own entry
    s_hi[lane] = hi;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  T acc_lo[4][W], acc_hi[4][W];
  for (int k = 0; k < 4; ++k) {
    for (int l = 0; l < W; ++l) {
      acc_lo[k][l] = s_lo[k * W + l].value;
      acc_hi[k][l] = s_hi[k * W + l].value;
    }
  }
  auto value = [whole4](int64_t j) { return s_tail[j - whole4]; };  // EigenFinish reads only [whole4, n)
  const T min_range = qdq_order::EigenFinish<ExplicitArith, T, false>(acc_lo, value, n);
  const T max_range = qdq_order::EigenFinish<ExplicitArith, T, true>(acc_hi, value, n);
  params[0] = qdq::ComputeRange<ExplicitArith>(min_range, max_range, grid);
}

// ---------------------------------------------------------------- per-axis data range

// Block reduction of AxisExtremes over blockDim.x (a power of two) threads; the result in s[0].
// Any grouping gives the same result (unique keys), so this is deterministic.
template <typename T>
__device__ void BlockMerge(AxisExtremes<T>* s) {
  for (int offset = blockDim.x / 2; offset > 0; offset /= 2) {
    if (static_cast<int>(threadIdx.x) < offset) s[threadIdx.x].Merge(s[threadIdx.x + offset]);
    __syncthreads();
  }
}

template <typename T>
__device__ AxisExtremes<T> ShuffleDown(const AxisExtremes<T>& e, int offset) {
  AxisExtremes<T> o;
  o.lo.value = __shfl_down_sync(0xffffffffu, e.lo.value, offset);
  o.lo.key = __shfl_down_sync(0xffffffffu, static_cast<long long>(e.lo.key), offset);
  o.hi.value = __shfl_down_sync(0xffffffffu, e.hi.value, offset);
  o.hi.key = __shfl_down_sync(0xffffffffu, static_cast<long long>(e.hi.key), offset);
  o.nan_key = __shfl_down_sync(0xffffffffu, static_cast<long long>(e.nan_key), offset);
  o.nan_value = __shfl_down_sync(0xffffffffu, e.nan_value, offset);
  return o;
}

// Warp reduction; the result in lane 0.
template <typename T>
__device__ void WarpMerge(AxisExtremes<T>& e) {
  for (int offset = 16; offset > 0; offset /= 2) e.Merge(ShuffleDown(e, offset));
}

// post == 1 ([pre, depth]): blocks of 32 channels x 8 row slots over `rows_per_group` rows each;
// partial[c * groups + g].
template <typename T>
__global__ void __launch_bounds__(kThreads)
    AxisColumnsKernel(const T* __restrict__ x, int64_t pre, int64_t depth, int64_t rows_per_group, int64_t groups,
                      AxisExtremes<T>* partial) {
  constexpr int kCols = 32, kRows = kThreads / kCols;
  __shared__ AxisExtremes<T> s[kRows][kCols];
  const int tx = threadIdx.x % kCols, ty = threadIdx.x / kCols;
  const int64_t tiles = (depth + kCols - 1) / kCols;
  for (int64_t g = blockIdx.y; g < groups; g += gridDim.y) {
    const int64_t r0 = g * rows_per_group;
    const int64_t r1 = pre - r0 < rows_per_group ? pre : r0 + rows_per_group;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const int64_t c = tile * kCols + tx;
      AxisExtremes<T> e = AxisExtremes<T>::Init();
      if (c < depth) {
        for (int64_t base = r0 + ty; base < r1; base += kUnroll * kRows) {
          T v[kUnroll];
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            const int64_t r = base + u * kRows;
            v[u] = r < r1 ? x[r * depth + c] : T(0);
          }
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            const int64_t r = base + u * kRows;
            if (r < r1) e.Add(v[u], r);  // post == 1: the scan key q * pre + r is r
          }
        }
      }
      s[ty][tx] = e;
      __syncthreads();
      if (ty == 0 && c < depth) {
        for (int k = 1; k < kRows; ++k) e.Merge(s[k][tx]);
        partial[c * groups + g] = e;
      }
      __syncthreads();
    }
  }
}

// post > 1: channel c's pre * post elements, flattened as t = r * post + q, in `chunks` chunks of
// `chunk` elements, one block per (chunk, channel); partial[c * chunks + k].
template <typename T, typename I>
__global__ void __launch_bounds__(kThreads)
    AxisRunsKernel(const T* __restrict__ x, int64_t pre, int64_t depth, int64_t post, Divider<I> post_div,
                   I channel_size, I chunk, int64_t chunks, AxisExtremes<T>* partial) {
  __shared__ AxisExtremes<T> s[kThreads];
  for (int64_t c = blockIdx.y; c < depth; c += gridDim.y) {
    for (int64_t k = blockIdx.x; k < chunks; k += gridDim.x) {
      const I t0 = static_cast<I>(k) * chunk;
      const I t1 = channel_size - t0 < chunk ? channel_size : t0 + chunk;
      AxisExtremes<T> e = AxisExtremes<T>::Init();
      for (uint64_t base = t0 + threadIdx.x; base < t1; base += kUnroll * kThreads) {
        T v[kUnroll];
        int64_t key[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const uint64_t t = base + u * kThreads;
          if (t < t1) {
            I r, q;
            post_div.DivMod(static_cast<I>(t), &r, &q);
            key[u] = static_cast<int64_t>(q) * pre + static_cast<int64_t>(r);
            v[u] = x[(static_cast<int64_t>(r) * depth + c) * post + static_cast<int64_t>(q)];
          } else {
            key[u] = -1;
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (key[u] >= 0) e.Add(v[u], key[u]);
        }
      }
      s[threadIdx.x] = e;
      __syncthreads();
      BlockMerge(s);
      if (threadIdx.x == 0) partial[c * chunks + k] = s[0];
      __syncthreads();
    }
  }
}

// A warp per channel: merges the channel's `per_channel` partials, rescans the channel after its
// last NaN when AxisExtremes::Resolve asks (the rare case), and writes the channel's parameters.
template <typename T, typename I>
__global__ void __launch_bounds__(kThreads)
    AxisRangeKernel(const T* __restrict__ x, int64_t pre, int64_t depth, int64_t post, Divider<I> post_div,
                    I channel_size, const AxisExtremes<T>* partial, int64_t per_channel, QdqGrid grid,
                    QdqParams<T>* params) {
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x % 32;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t c = warp; c < depth; c += warps) {  // uniform per warp
    AxisExtremes<T> e = AxisExtremes<T>::Init();
    for (int64_t s = lane; s < per_channel; s += 32) e.Merge(partial[c * per_channel + s]);
    WarpMerge(e);
    T lo = T(0), hi = T(0);
    const int resolved = __shfl_sync(0xffffffffu, lane == 0 ? static_cast<int>(e.Resolve(channel_size, &lo, &hi)) : 0, 0);
    if (!resolved) {
      const int64_t after = __shfl_sync(0xffffffffu, static_cast<long long>(e.nan_key), 0);
      AxisExtremes<T> f = AxisExtremes<T>::Init();
      for (uint64_t t = lane; t < channel_size; t += 32) {
        I r, q;
        post_div.DivMod(static_cast<I>(t), &r, &q);
        const int64_t key = static_cast<int64_t>(q) * pre + static_cast<int64_t>(r);
        if (key > after) f.AddNumber(x[(static_cast<int64_t>(r) * depth + c) * post + static_cast<int64_t>(q)], key);
      }
      WarpMerge(f);
      if (lane == 0) f.Resolve(channel_size, &lo, &hi);
    }
    if (lane == 0) params[c] = qdq::ComputeRange<ExplicitArith>(lo, hi, grid);
  }
}

// ---------------------------------------------------------------- V4Grad

template <typename T, bool kVector>
__global__ void __launch_bounds__(kThreads)
    GradFlatKernel(const T* __restrict__ g, const T* __restrict__ x, T* __restrict__ dx, int64_t n,
                   const T* __restrict__ min, const T* __restrict__ max) {
  const T lo = min[0], hi = max[0];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t tail = 0;
  if constexpr (kVector) {
    constexpr int V = 16 / sizeof(T);
    const int64_t packs = n / V;
    const Pack<T>* gv = reinterpret_cast<const Pack<T>*>(g);
    const Pack<T>* xv = reinterpret_cast<const Pack<T>*>(x);
    Pack<T>* dv = reinterpret_cast<Pack<T>*>(dx);
    for (int64_t j = start; j < packs; j += stride) {
      const Pack<T> a = gv[j], b = xv[j];
      Pack<T> d;
#pragma unroll
      for (int k = 0; k < V; ++k) d.v[k] = qdq::GradientOne<ExplicitArith>(a.v[k], b.v[k], lo, hi);
      dv[j] = d;
    }
    tail = packs * V;
  }
  for (int64_t i = tail + start; i < n; i += stride) dx[i] = qdq::GradientOne<ExplicitArith>(g[i], x[i], lo, hi);
}

// Per axis: element f is channel (f / post) % depth.
template <typename T, typename I>
__global__ void __launch_bounds__(kThreads)
    GradAxisKernel(const T* __restrict__ g, const T* __restrict__ x, T* __restrict__ dx, I n, Divider<I> post_div,
                   Divider<I> depth_div, const T* __restrict__ min, const T* __restrict__ max) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t base = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; base < n;
       base += kUnroll * stride) {
    T gv[kUnroll], xv[kUnroll];
    I channel[kUnroll];
    bool in[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint64_t f = base + u * stride;
      in[u] = f < n;
      if (in[u]) {
        I row, q, r;
        post_div.DivMod(static_cast<I>(f), &row, &q);
        depth_div.DivMod(row, &r, &channel[u]);
        gv[u] = g[f];
        xv[u] = x[f];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (in[u]) dx[base + u * stride] = qdq::GradientOne<ExplicitArith>(gv[u], xv[u], min[channel[u]], max[channel[u]]);
    }
  }
}

// ---------------------------------------------------------------- launchers

bool Aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The 32-bit index path applies when every index and divisor fits it.
bool Fits32(uint64_t count, std::initializer_list<uint64_t> divisors) {
  if (count >= (uint64_t{1} << 32)) return false;
  for (uint64_t d : divisors) {
    if (d == 0 || d > detail::kMaxDivMod32Divisor) return false;
  }
  return true;
}

// Blocks for a grid-stride loop whose threads each take kUnroll items per round.
unsigned UnrolledGrid(int64_t items) { return GridFor(CeilDiv(items, kUnroll)); }

template <typename T, bool kClamp, bool kHalfUp, class Source>
void LaunchFlat(const T* x, T* y, int64_t n, const Source& source, const NanRule& rule, const QdqView& view,
                const CudaLaunch& launch) {
  const cudaStream_t stream = StreamOf(launch);
  if (Aligned16(x) && Aligned16(y)) {
    QdqFlatKernel<T, kClamp, kHalfUp, true, Source>
        <<<GridFor(CeilDiv(n, 16 / sizeof(T))), kThreads, 0, stream>>>(x, y, n, source, rule, view.pre, view.post);
  } else {
    QdqFlatKernel<T, kClamp, kHalfUp, false, Source>
        <<<UnrolledGrid(n), kThreads, 0, stream>>>(x, y, n, source, rule, view.pre, view.post);
  }
  CheckLaunch("QuantizeAndDequantize");
}

// Channels [c0, c0 + channels) of every row.
template <typename T, bool kClamp, bool kHalfUp, class Source>
void LaunchAxis(const T* x, T* y, const QdqView& view, int64_t c0, int64_t channels, const Source& source,
                const NanRule& rule, const CudaLaunch& launch) {
  const cudaStream_t stream = StreamOf(launch);
  const int64_t span = channels * view.post;
  const int64_t count = view.pre * span;
  const int64_t row_width = view.depth * view.post;
  const int64_t col0 = c0 * view.post;
  if (Fits32(count, {static_cast<uint64_t>(span), static_cast<uint64_t>(view.post)})) {
    QdqAxisKernel<T, kClamp, kHalfUp, uint32_t, Source><<<UnrolledGrid(count), kThreads, 0, stream>>>(
        x, y, static_cast<uint32_t>(count), DivMod32::Make(span), DivMod32::Make(view.post), row_width, col0, source,
        rule, view.pre, view.post);
  } else {
    QdqAxisKernel<T, kClamp, kHalfUp, uint64_t, Source><<<UnrolledGrid(count), kThreads, 0, stream>>>(
        x, y, static_cast<uint64_t>(count), DivMod64::Make(span), DivMod64::Make(view.post), row_width, col0, source,
        rule, view.pre, view.post);
  }
  CheckLaunch("QuantizeAndDequantize");
}

// The per-tensor data range into params[0] (device).
template <typename T>
void TensorRange(const T* x, int64_t n, QdqGrid grid, QdqParams<T>* params, const CudaLaunch& launch) {
  constexpr int L = kLanes<T>;
  const cudaStream_t stream = StreamOf(launch);
  const int64_t whole4 = (n / L) * L;
  const int64_t blocks = std::min<int64_t>(1024, CeilDiv(whole4, int64_t{kThreads} * kUnroll * 4));
  LaneExtreme<T>* partial_lo = nullptr;
  LaneExtreme<T>* partial_hi = nullptr;
  if (blocks > 0) {
    partial_lo = launch.scratch->Array<LaneExtreme<T>>(static_cast<std::size_t>(blocks * L));
    partial_hi = launch.scratch->Array<LaneExtreme<T>>(static_cast<std::size_t>(blocks * L));
    TensorLanesKernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, whole4, partial_lo, partial_hi);
    CheckLaunch("QuantizeAndDequantize (range)");
  }
  TensorRangeKernel<T><<<1, kRangeThreads, 0, stream>>>(x, n, partial_lo, partial_hi, blocks, grid, params);
  CheckLaunch("QuantizeAndDequantize (range)");
}

// The per-axis data ranges into params[0, depth) (device).
template <typename T, typename I>
void AxisRangeWith(const T* x, const QdqView& v, QdqGrid grid, QdqParams<T>* params, const CudaLaunch& launch) {
  const cudaStream_t stream = StreamOf(launch);
  const int64_t channel_size = v.pre * v.post;
  const Divider<I> post_div = Divider<I>::Make(static_cast<uint64_t>(v.post));
  AxisExtremes<T>* partial = nullptr;
  int64_t per_channel = 0;
  if (v.post == 1) {
    const int64_t tiles = CeilDiv(v.depth, 32);
    int64_t groups = std::min<int64_t>(std::max<int64_t>(1, 1024 / tiles), std::max<int64_t>(1, CeilDiv(v.pre, 64)));
    const int64_t rows_per_group = CeilDiv(v.pre, groups);
    groups = CeilDiv(v.pre, rows_per_group);
    per_channel = groups;
    partial = launch.scratch->Array<AxisExtremes<T>>(static_cast<std::size_t>(v.depth * per_channel));
    const dim3 blocks(static_cast<unsigned>(std::min<int64_t>(tiles, 65536)),
                      static_cast<unsigned>(std::min<int64_t>(groups, 65535)));
    AxisColumnsKernel<T><<<blocks, kThreads, 0, stream>>>(x, v.pre, v.depth, rows_per_group, groups, partial);
  } else {
    int64_t chunks = std::min<int64_t>(std::max<int64_t>(1, 1024 / v.depth),
                                       std::max<int64_t>(1, CeilDiv(channel_size, int64_t{kThreads} * kUnroll * 4)));
    const int64_t chunk = CeilDiv(channel_size, chunks);
    chunks = CeilDiv(channel_size, chunk);
    per_channel = chunks;
    partial = launch.scratch->Array<AxisExtremes<T>>(static_cast<std::size_t>(v.depth * per_channel));
    const dim3 blocks(static_cast<unsigned>(std::min<int64_t>(chunks, 65536)),
                      static_cast<unsigned>(std::min<int64_t>(v.depth, 65535)));
    AxisRunsKernel<T, I><<<blocks, kThreads, 0, stream>>>(x, v.pre, v.depth, v.post, post_div, static_cast<I>(channel_size),
                                                          static_cast<I>(chunk), chunks, partial);
  }
  CheckLaunch("QuantizeAndDequantize (range)");
  const unsigned range_blocks = static_cast<unsigned>(std::min<int64_t>(CeilDiv(v.depth, kThreads / 32), 1 << 20));
  AxisRangeKernel<T, I><<<range_blocks, kThreads, 0, stream>>>(x, v.pre, v.depth, v.post, post_div,
                                                                static_cast<I>(channel_size), partial, per_channel, grid,
                                                                params);
  CheckLaunch("QuantizeAndDequantize (range)");
}

template <typename T>
void AxisRange(const T* x, const QdqView& v, QdqGrid grid, QdqParams<T>* params, const CudaLaunch& launch) {
  if (Fits32(static_cast<uint64_t>(v.pre * v.post), {static_cast<uint64_t>(v.post)})) {
    AxisRangeWith<T, uint32_t>(x, v, grid, params, launch);
  } else {
    AxisRangeWith<T, uint64_t>(x, v, grid, params, launch);
  }
}

template <typename T, bool kClamp, bool kHalfUp>
void Forward(const T* x, T* y, const QdqView& view, const T* given_min, const T* given_max, const QdqOptions& options,
             const CudaLaunch& launch) {
  const int64_t n = view.pre * view.depth * view.post;
  const NanRule rule =
      qdq_order::MakeNanRule<T>(view.pre, view.depth, view.post, view.per_axis, options.range_given, kHalfUp);
  if constexpr (kClamp) {
    // Given ranges: parameters on the host, exactly as the CPU kernel computes them, then by value.
    const std::vector<QdqParams<T>> host = GivenRangeParams(given_min, given_max, view.depth, options);
    if (view.depth == 1) {
      LaunchFlat<T, kClamp, kHalfUp>(x, y, n, ValueParams<T>{host[0]}, rule, view, launch);
      return;
    }
    constexpr int64_t kChunk = ParamChunk<T>::kCapacity;
    for (int64_t c0 = 0; c0 < view.depth; c0 += kChunk) {
      ChunkParams<T> source{};
      source.count = static_cast<int>(std::min(kChunk, view.depth - c0));
      for (int c = 0; c < source.count; ++c) {
        source.chunk.lo[c] = host[c0 + c].min_range;
        source.chunk.hi[c] = host[c0 + c].max_range;
        source.chunk.scale[c] = host[c0 + c].scale;
        source.chunk.inverse[c] = host[c0 + c].inverse;
      }
      LaunchAxis<T, kClamp, kHalfUp>(x, y, view, c0, source.count, source, rule, launch);
    }
  } else {
    (void)given_min;
    (void)given_max;
    QdqParams<T>* params = launch.scratch->Array<QdqParams<T>>(static_cast<std::size_t>(view.depth));
    const QdqGrid grid = GridOf(options);
    if (view.per_axis) {
      AxisRange(x, view, grid, params, launch);
    } else {
      TensorRange(x, n, grid, params, launch);
    }
    const DeviceParams<T> source{params};
    if (view.depth == 1) {
      LaunchFlat<T, kClamp, kHalfUp>(x, y, n, source, rule, view, launch);
    } else {
      LaunchAxis<T, kClamp, kHalfUp>(x, y, view, 0, view.depth, source, rule, launch);
    }
  }
}

}  // namespace

template <typename T>
void QuantizeDequantize(const T* x, T* y, const QdqView& view, const T* given_min, const T* given_max,
                        const QdqOptions& options, const CudaLaunch& launch) {
  if (view.pre * view.depth * view.post == 0) return;
  const bool half_up = options.round_mode == QdqRoundMode::kHalfUp;
  if (options.range_given) {
    if (half_up) {
      Forward<T, true, true>(x, y, view, given_min, given_max, options, launch);
    } else {
      Forward<T, true, false>(x, y, view, given_min, given_max, options, launch);
    }
  } else {
    if (half_up) {
      Forward<T, false, true>(x, y, view, given_min, given_max, options, launch);
    } else {
      Forward<T, false, false>(x, y, view, given_min, given_max, options, launch);
    }
  }
}

template <typename T>
void QuantizeDequantizeGradient(const T* g, const T* x, T* dx, const QdqView& view, const T* min, const T* max,
                                const CudaLaunch& launch) {
  const int64_t n = view.pre * view.depth * view.post;
  if (n == 0) return;
  const cudaStream_t stream = StreamOf(launch);
  if (view.depth == 1) {
    if (Aligned16(g) && Aligned16(x) && Aligned16(dx)) {
      GradFlatKernel<T, true><<<GridFor(CeilDiv(n, 16 / sizeof(T))), kThreads, 0, stream>>>(g, x, dx, n, min, max);
    } else {
      GradFlatKernel<T, false><<<GridFor(n), kThreads, 0, stream>>>(g, x, dx, n, min, max);
    }
  } else if (Fits32(static_cast<uint64_t>(n), {static_cast<uint64_t>(view.post), static_cast<uint64_t>(view.depth)})) {
    GradAxisKernel<T, uint32_t><<<UnrolledGrid(n), kThreads, 0, stream>>>(
        g, x, dx, static_cast<uint32_t>(n), DivMod32::Make(view.post), DivMod32::Make(view.depth), min, max);
  } else {
    GradAxisKernel<T, uint64_t><<<UnrolledGrid(n), kThreads, 0, stream>>>(
        g, x, dx, static_cast<uint64_t>(n), DivMod64::Make(view.post), DivMod64::Make(view.depth), min, max);
  }
  CheckLaunch("QuantizeAndDequantizeV4Grad");
}

template <typename T>
void Zeros(T* p, int64_t count, const CudaLaunch& launch) {
  if (count == 0) return;
  CheckCuda(cudaMemsetAsync(p, 0, static_cast<std::size_t>(count) * sizeof(T), StreamOf(launch)),
            "QuantizeAndDequantizeV4Grad (zeros)");
}

template void QuantizeDequantize<float>(const float*, float*, const QdqView&, const float*, const float*,
                                        const QdqOptions&, const CudaLaunch&);
template void QuantizeDequantize<double>(const double*, double*, const QdqView&, const double*, const double*,
                                         const QdqOptions&, const CudaLaunch&);
template void QuantizeDequantizeGradient<float>(const float*, const float*, float*, const QdqView&, const float*,
                                                const float*, const CudaLaunch&);
template void QuantizeDequantizeGradient<double>(const double*, const double*, double*, const QdqView&,
                                                 const double*, const double*, const CudaLaunch&);
template void Zeros<float>(float*, int64_t, const CudaLaunch&);
template void Zeros<double>(double*, int64_t, const CudaLaunch&);

}  // namespace cuda
}  // namespace tfops
