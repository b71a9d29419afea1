// CUDA kernels of FusedBatchNorm{,V2,V3} and FusedBatchNormGrad{,V2,V3} (see batch_norm.h here and
// kernels/batch_norm.h). x is viewed as the CPU kernels view it: [outer, channels, inner], with
// channels-last formats (and channels-first ones whose spatial size is 1) as a row matrix X[R, C].
//
// Work layout (every block has 256 threads):
//  * Column sums, two levels. Level 1 (a "partial" kernel): the rows are cut into tiles of a size
//    fixed by the shape; one block sums one tile for a group of channels and writes one partial
//    sum per (tile, channel) to scratch. Level 2 (FoldKernel): one thread column per channel adds
//    the tiles' partials. Both levels add in a fixed order (below), so a result depends on the
//    shape only: not on the GPU, the number of SMs, the alignment of the buffers or the run.
//    - Channels-last (RowsPartialKernel): a block is lanes_c x lanes_r threads; thread (tx, ty)
//      owns V adjacent channels (V = 16 bytes of T when C allows it) and sums rows
//      r0 + ty, r0 + ty + lanes_r, ... of its tile in order; then the lanes_r row lanes are added
//      as a binary tree (lane ty += lane ty + s for s = lanes_r/2, ..., 1). A warp reads whole
//      rows: coalesced.
//    - Channels-first (PlanesPartialKernel): a block sums one channel over a tile of "items"
//      (V-element vectors along the contiguous spatial axis, at most kTileItems per tile, in
//      (plane, position) order); thread t takes items t, t + 256, ... in order, then the 256
//      threads are added as a binary tree.
//    - FoldKernel: thread (tx, ty) of a block adds tiles tx, tx + lanes_t, ... of channel
//      c0 + ty in order, then the lanes_t tile lanes are added as a binary tree; lanes_t depends
//      on the number of tiles only (a thread adds at most kBatch partials first).
//  * Element-wise outputs (y, x_backprop): one thread per V-element vector, coefficients of its
//    channel(s) in registers (RowsMapKernel: a thread keeps its channels and walks rows;
//    PlanesMapKernel: a thread walks planes, one channel per plane).
//  * The inference gradient's dx needs no statistics: its partial kernel writes dx while it sums,
//    so that op reads dy and x once.
// Scratch: the partial sums ([kN][C][tiles] floats) and the per-channel coefficients (2 or 3 x C).
#include "kernels/cuda/batch_norm.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/half.h"

namespace tfops {
namespace cuda {
namespace {

using i64 = std::int64_t;
using batch_norm::Layout;

constexpr int kThreads = kThreadsPerBlock;  // 256 everywhere below (the trees assume it)
static_assert(kThreads == 256, "the reduction trees are written for 256-thread blocks");
constexpr int kRowsPerThread = 8;           // channels-last level 1: rows a thread sums per tile
constexpr int kItemsPerThread = 8;          // channels-first level 1: vectors a thread sums per tile
constexpr int kTileItems = kThreads * kItemsPerThread;
constexpr int kBatch = 4;                   // loads issued together before they are added
constexpr int kMaxGridY = 65535;
constexpr std::int64_t kMaxBlocksX = 1 << 20;  // grid-stride loops cover the rest
constexpr int kMinBlocks = 2;               // per SM: at most 128 registers a thread

// ------------------------------------------------------------------------------ element types

// The conversions of kernels/half.h: widening is exact; narrowing rounds to nearest even and
// overflows to infinity, as the CPU's. float16 uses the GPU's conversion instructions (the same
// values; a NaN comes out as the GPU's canonical NaN, and NaN bits differ from the CPU's anyway
// because GPU arithmetic returns the canonical NaN, so outputs match the CPU's NaN for NaN, not
// bit for bit); bfloat16 is the CPU's integer rounding.
template <typename T>
struct Dev;
template <>
struct Dev<float> {
  static __device__ __forceinline__ float Widen(float v) { return v; }
  static __device__ __forceinline__ float Narrow(float v) { return v; }
};
template <>
struct Dev<Half> {
  static __device__ __forceinline__ float Widen(Half v) { return __half2float(__ushort_as_half(v.bits)); }
  static __device__ __forceinline__ Half Narrow(float f) { return Half{__half_as_ushort(__float2half_rn(f))}; }
};
template <>
struct Dev<BFloat16> {
  static __device__ __forceinline__ float Widen(BFloat16 v) {
    return __uint_as_float(static_cast<unsigned>(v.bits) << 16);
  }
  static __device__ __forceinline__ BFloat16 Narrow(float f) {
    const unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<std::uint16_t>((u >> 16) | 0x40u)};
    const unsigned rounded = u + 0x7fffu + ((u >> 16) & 1u);
    return BFloat16{static_cast<std::uint16_t>(rounded >> 16)};
  }
};

// V adjacent elements: one 16-byte (or smaller) load or store when the address allows it.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// Elements per vector: 16 bytes of T when `contiguous` (the length of the contiguous axis) is a
// multiple of it, else 1. A shape-only choice: it decides which elements a thread sums, so the
// pointers' alignment must not (a misaligned buffer is read element by element instead).
template <typename T>
constexpr int kVector = 16 / static_cast<int>(sizeof(T));
template <typename T>
int VectorFor(i64 contiguous) {
  return contiguous % kVector<T> == 0 ? kVector<T> : 1;
}

template <typename T, int V>
__device__ __forceinline__ Pack<T, V> LoadPack(const T* p, bool aligned) {
  Pack<T, V> pack;
  if (V > 1 && aligned) {
    pack = *reinterpret_cast<const Pack<T, V>*>(p);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) pack.v[j] = p[j];
  }
  return pack;
}

template <typename T, int V>
__device__ __forceinline__ void StorePack(T* p, bool aligned, const Pack<T, V>& pack) {
  if (V > 1 && aligned) {
    *reinterpret_cast<Pack<T, V>*>(p) = pack;
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) p[j] = pack.v[j];
  }
}

bool Aligned(const void* p, std::size_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

int Log2(int v) {
  int l = 0;
  while ((1 << l) < v) ++l;
  return l;
}

i64 CeilDiv(i64 a, i64 b) { return (a + b - 1) / b; }

// ------------------------------------------------------------------------------ operations
// A "sum op" gives kN summands per element (and, when kWrites, an output element too); a "map op"
// gives one output element; a "fold op" turns a channel's kN sums into its outputs. Channel()
// loads what the op needs of one channel. Each formula is a TFOPS_HD function of batch_norm.h.

// mean: S(x).
struct SumX {
  static constexpr int kN = 1;
  static constexpr bool kTwoInputs = false, kWrites = false;
  struct Channel {};
  __device__ Channel Load(i64) const { return {}; }
  __device__ void Summands(const Channel&, float x, float, float* s) const { s[0] = x; }
  __device__ float Element(const Channel&, float, float) const { return 0.0f; }
};

// variance: S((x - mean)^2).
struct SumSquaredDeviation {
  static constexpr int kN = 1;
  static constexpr bool kTwoInputs = false, kWrites = false;
  const float* mean;
  struct Channel {
    float mean;
  };
  __device__ Channel Load(i64 c) const { return {mean[c]}; }
  __device__ void Summands(const Channel& ch, float x, float, float* s) const {
    s[0] = batch_norm::SquaredDeviation(x, ch.mean);
  }
  __device__ float Element(const Channel&, float, float) const { return 0.0f; }
};

// Training gradient: S(dy * ((x - mean) * c0)), S(dy), S(dy * (x - mean)). a = dy, b = x.
struct SumGradTraining {
  static constexpr int kN = 3;
  static constexpr bool kTwoInputs = true, kWrites = false;
  const float* mean;
  const float* variance;
  float epsilon;
  struct Channel {
    float mean, c0;
  };
  __device__ Channel Load(i64 c) const { return {mean[c], batch_norm::Rsqrt(variance[c] + epsilon)}; }
  __device__ void Summands(const Channel& ch, float dy, float x, float* s) const {
    batch_norm::GradTrainingSummands(dy, x, ch.mean, ch.c0, s);
  }
  __device__ float Element(const Channel&, float, float) const { return 0.0f; }
};

// Inference gradient: S(dy), S(dy * (x - mean)), and dx = dy * (c0 * scale) on the way.
struct SumGradInference {
  static constexpr int kN = 2;
  static constexpr bool kTwoInputs = true, kWrites = true;
  const float* mean;
  const float* variance;
  const float* scale;
  float epsilon;
  struct Channel {
    float mean, k;
  };
  __device__ Channel Load(i64 c) const {
    const float c0 = batch_norm::Rsqrt(variance[c] + epsilon);
    return {mean[c], c0 * scale[c]};
  }
  __device__ void Summands(const Channel& ch, float dy, float x, float* s) const {
    batch_norm::GradInferenceSummands(dy, x, ch.mean, s);
  }
  __device__ float Element(const Channel& ch, float dy, float) const {
    return batch_norm::GradInferenceElement(dy, ch.k);
  }
};

// y = (x - mean) * k + offset with the batch statistics (k from the variance fold).
struct MapNormalize {
  static constexpr bool kTwoInputs = false;
  const float* mean;
  const float* k;
  const float* offset;
  struct Channel {
    float mean, k, offset;
  };
  __device__ Channel Load(i64 c) const { return {mean[c], k[c], offset[c]}; }
  __device__ float Element(const Channel& ch, float x, float) const {
    return batch_norm::Normalize(x, ch.mean, ch.k, ch.offset);
  }
  __device__ void PerChannel(i64) const {}
};

// Inference: y with the given statistics (k computed per channel as the CPU does), and the
// statistics outputs as copies of the given ones (copies: nothing flushed).
struct MapNormalizeInference {
  static constexpr bool kTwoInputs = false;
  const float* mean;
  const float* variance;
  const float* scale;
  const float* offset;
  float epsilon;
  float *batch_mean, *batch_variance, *reserve_1, *reserve_2, *reserve_3;
  struct Channel {
    float mean, k, offset;
  };
  __device__ Channel Load(i64 c) const {
    return {mean[c], batch_norm::ScaleFactor(variance[c], epsilon, scale[c]), offset[c]};
  }
  __device__ float Element(const Channel& ch, float x, float) const {
    return batch_norm::Normalize(x, ch.mean, ch.k, ch.offset);
  }
  __device__ void PerChannel(i64 c) const {
    const float m = mean[c], v = variance[c];
    batch_mean[c] = m;
    reserve_1[c] = m;
    batch_variance[c] = v;
    reserve_2[c] = v;
    if (c == 0 && reserve_3 != nullptr) *reserve_3 = 0.0f;
  }
};

// Training dx = coef1 * ((dy - mean(dy)) - (x - mean) * coef2). a = dy, b = x.
struct MapGradTraining {
  static constexpr bool kTwoInputs = true;
  const float* mean;
  const float* coefficients;  // [3][C]: dy_mean, coef1, coef2
  i64 channels;
  struct Channel {
    float mean, dy_mean, coef1, coef2;
  };
  __device__ Channel Load(i64 c) const {
    return {mean[c], coefficients[c], coefficients[channels + c], coefficients[2 * channels + c]};
  }
  __device__ float Element(const Channel& ch, float dy, float x) const {
    return batch_norm::GradTrainingElement(dy, x, ch.mean, ch.dy_mean, ch.coef1, ch.coef2);
  }
  __device__ void PerChannel(i64) const {}
};

// Fold ops.
struct FoldMean {
  static constexpr int kN = 1;
  float inv_rows;
  float* mean;
  __device__ void operator()(i64 c, const float* s) const { mean[c] = s[0] * inv_rows; }
};

struct FoldVariance {
  static constexpr int kN = 1;
  i64 rows;
  float inv_rows, epsilon, factor;
  const float* scale;
  const float* old_mean;      // read only when factor != 1
  const float* old_variance;  // read only when factor != 1
  const float* mean;          // the batch mean (FoldMean)
  float* k;
  float *batch_mean, *batch_variance, *reserve_1, *reserve_2, *reserve_3;
  __device__ void operator()(i64 c, const float* s) const {
    const float bm = mean[c];
    const float bv = s[0] * inv_rows;
    k[c] = batch_norm::ScaleFactor(bv, epsilon, scale[c]);
    const float bessel = batch_norm::BesselFactor(rows);
    if (factor == 1.0f) {
      batch_mean[c] = bm;
      batch_variance[c] = bv * bessel;
    } else {
      const float keep = 1.0f - factor, factor_bessel = factor * bessel;
      batch_mean[c] = batch_norm::RunningAverage(keep, old_mean[c], factor, bm);
      batch_variance[c] = batch_norm::RunningAverage(keep, old_variance[c], factor_bessel, bv);
    }
    reserve_1[c] = bm;
    reserve_2[c] = bv;
    if (c == 0 && reserve_3 != nullptr) *reserve_3 = 0.0f;
  }
};

// TF's sum over a single row is a copy: offset_backprop is then dy's row as it is (not flushed).
template <typename T>
__device__ __forceinline__ float OffsetBackprop(float sum, i64 rows, const T* dy, i64 c) {
  return rows == 1 ? Dev<T>::Widen(dy[c]) : sum;
}

template <typename T>
struct FoldGradTraining {
  static constexpr int kN = 3;
  i64 rows;
  float inv_rows, rows_f, epsilon;
  const float* scale;
  const float* variance;
  const T* dy;
  float *scale_backprop, *offset_backprop;
  float* coefficients;  // [3][C]
  i64 channels;
  __device__ void operator()(i64 c, const float* s) const {
    const float c0 = batch_norm::Rsqrt(variance[c] + epsilon);
    scale_backprop[c] = s[0];
    const batch_norm::GradTrainingCoefficients k =
        batch_norm::GradTrainingChannel(s[1], s[2], scale[c], c0, inv_rows, rows_f);
    coefficients[c] = k.dy_mean;
    coefficients[channels + c] = k.coef1;
    coefficients[2 * channels + c] = k.coef2;
    offset_backprop[c] = OffsetBackprop(s[1], rows, dy, c);
  }
};

template <typename T>
struct FoldGradInference {
  static constexpr int kN = 2;
  i64 rows;
  float epsilon;
  const float* variance;
  const T* dy;
  float *scale_backprop, *offset_backprop;
  __device__ void operator()(i64 c, const float* s) const {
    const float c0 = batch_norm::Rsqrt(variance[c] + epsilon);
    scale_backprop[c] = s[1] * c0;
    offset_backprop[c] = OffsetBackprop(s[0], rows, dy, c);
  }
};

// ------------------------------------------------------------------------------ level 1: partial sums

struct RowsGeometry {
  i64 rows, channels, vectors;  // vectors = channels / V
  int lanes_c, log_lanes_c, lanes_r;
  i64 tile_rows, tiles, groups;
};

struct PlanesGeometry {
  i64 outer, channels, inner, vectors;  // vectors = inner / V (per plane)
  i64 width, chunks, tile_planes, tiles;
};

template <typename T, int V, typename Op>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    RowsPartialKernel(RowsGeometry g, const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                      bool aligned, Op op, float* __restrict__ partial) {
  constexpr int kN = Op::kN;
  __shared__ float shared[kN][V][kThreads];
  const int tid = threadIdx.x;
  const int tx = tid & (g.lanes_c - 1), ty = tid >> g.log_lanes_c;
  const i64 tile = blockIdx.x;
  const i64 r_begin = tile * g.tile_rows;
  const i64 r_end = r_begin + g.tile_rows < g.rows ? r_begin + g.tile_rows : g.rows;
  const i64 C = g.channels;
  for (i64 group = blockIdx.y; group < g.groups; group += gridDim.y) {
    const i64 cv = group * g.lanes_c + tx;
    const bool active = cv < g.vectors;
    const i64 c0 = cv * V;
    float acc[kN][V];
#pragma unroll
    for (int k = 0; k < kN; ++k)
#pragma unroll
      for (int j = 0; j < V; ++j) acc[k][j] = 0.0f;
    if (active) {
      typename Op::Channel ch[V];
#pragma unroll
      for (int j = 0; j < V; ++j) ch[j] = op.Load(c0 + j);
      const i64 step = g.lanes_r;
      for (i64 r = r_begin + ty; r < r_end; r += kBatch * step) {
        Pack<T, V> pa[kBatch], pb[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const i64 row = r + u * step;
          if (row < r_end) {
            pa[u] = LoadPack<T, V>(a + row * C + c0, aligned);
            if (Op::kTwoInputs) pb[u] = LoadPack<T, V>(b + row * C + c0, aligned);
          }
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const i64 row = r + u * step;
          if (row < r_end) {
            Pack<T, V> po;
#pragma unroll
            for (int j = 0; j < V; ++j) {
              const float va = Dev<T>::Widen(pa[u].v[j]);
              const float vb = Op::kTwoInputs ? Dev<T>::Widen(pb[u].v[j]) : 0.0f;
              float s[kN];
              op.Summands(ch[j], va, vb, s);
#pragma unroll
              for (int k = 0; k < kN; ++k) acc[k][j] = acc[k][j] + s[k];
              if (Op::kWrites) po.v[j] = Dev<T>::Narrow(op.Element(ch[j], va, vb));
            }
            if (Op::kWrites) StorePack<T, V>(out + row * C + c0, aligned, po);
          }
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kN; ++k)
#pragma unroll
      for (int j = 0; j < V; ++j) shared[k][j][tid] = acc[k][j];
    __syncthreads();
    for (int s = g.lanes_r / 2; s > 0; s >>= 1) {
      if (ty < s) {
        const int other = tid + s * g.lanes_c;
#pragma unroll
        for (int k = 0; k < kN; ++k)
#pragma unroll
          for (int j = 0; j < V; ++j) shared[k][j][tid] = shared[k][j][tid] + shared[k][j][other];
      }
      __syncthreads();
    }
    if (ty == 0 && active) {
#pragma unroll
      for (int k = 0; k < kN; ++k)
#pragma unroll
        for (int j = 0; j < V; ++j) partial[(k * C + c0 + j) * g.tiles + tile] = shared[k][j][tx];
    }
    __syncthreads();  // the next group reuses `shared`
  }
}

template <typename T, int V, typename Op>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    PlanesPartialKernel(PlanesGeometry g, const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                        bool aligned, Op op, float* __restrict__ partial) {
  constexpr int kN = Op::kN;
  __shared__ float shared[kN][kThreads];
  const int tid = threadIdx.x;
  const i64 tile = blockIdx.x;
  const i64 plane_group = tile / g.chunks, chunk = tile % g.chunks;
  const i64 n0 = plane_group * g.tile_planes;
  const i64 v0 = chunk * g.width;
  const int planes = static_cast<int>(g.outer - n0 < g.tile_planes ? g.outer - n0 : g.tile_planes);
  const int width = static_cast<int>(g.vectors - v0 < g.width ? g.vectors - v0 : g.width);
  const int items = planes * width;  // <= kTileItems
  const i64 C = g.channels, P = g.inner;
  for (i64 c = blockIdx.y; c < C; c += gridDim.y) {
    const typename Op::Channel ch = op.Load(c);
    float acc[kN];
#pragma unroll
    for (int k = 0; k < kN; ++k) acc[k] = 0.0f;
#pragma unroll
    for (int m0 = 0; m0 < kItemsPerThread; m0 += kBatch) {
      Pack<T, V> pa[kBatch], pb[kBatch];
      i64 index[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int item = tid + (m0 + u) * kThreads;
        index[u] = -1;
        if (item < items) {
          const int plane = item / width, vec = item - plane * width;
          index[u] = ((n0 + plane) * C + c) * P + (v0 + vec) * V;
          pa[u] = LoadPack<T, V>(a + index[u], aligned);
          if (Op::kTwoInputs) pb[u] = LoadPack<T, V>(b + index[u], aligned);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (index[u] >= 0) {
          Pack<T, V> po;
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const float va = Dev<T>::Widen(pa[u].v[j]);
            const float vb = Op::kTwoInputs ? Dev<T>::Widen(pb[u].v[j]) : 0.0f;
            float s[kN];
            op.Summands(ch, va, vb, s);
#pragma unroll
            for (int k = 0; k < kN; ++k) acc[k] = acc[k] + s[k];
            if (Op::kWrites) po.v[j] = Dev<T>::Narrow(op.Element(ch, va, vb));
          }
          if (Op::kWrites) StorePack<T, V>(out + index[u], aligned, po);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kN; ++k) shared[k][tid] = acc[k];
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s >>= 1) {
      if (tid < s) {
#pragma unroll
        for (int k = 0; k < kN; ++k) shared[k][tid] = shared[k][tid] + shared[k][tid + s];
      }
      __syncthreads();
    }
    if (tid == 0) {
#pragma unroll
      for (int k = 0; k < kN; ++k) partial[(k * C + c) * g.tiles + tile] = shared[k][0];
    }
    __syncthreads();
  }
}

// ------------------------------------------------------------------------------ level 2: fold

template <typename Fold>
__global__ void __launch_bounds__(kThreads)
    FoldKernel(const float* __restrict__ partial, i64 tiles, i64 channels, int lanes_t, int log_lanes_t, Fold fold) {
  constexpr int kN = Fold::kN;
  __shared__ float shared[kN][kThreads];
  const int tid = threadIdx.x;
  const int tx = tid & (lanes_t - 1), ty = tid >> log_lanes_t;  // tile lane, channel lane
  const int lanes_c = kThreads / lanes_t;
  for (i64 group = blockIdx.x; group * lanes_c < channels; group += gridDim.x) {
    const i64 c = group * lanes_c + ty;
    const bool active = c < channels;
    float acc[kN];
#pragma unroll
    for (int k = 0; k < kN; ++k) acc[k] = 0.0f;
    if (active) {
      for (i64 t = tx; t < tiles; t += kBatch * lanes_t) {
        float v[kBatch][kN];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const i64 tu = t + u * lanes_t;
#pragma unroll
          for (int k = 0; k < kN; ++k) v[u][k] = tu < tiles ? partial[(k * channels + c) * tiles + tu] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          if (t + u * lanes_t < tiles) {
#pragma unroll
            for (int k = 0; k < kN; ++k) acc[k] = acc[k] + v[u][k];
          }
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kN; ++k) shared[k][tid] = acc[k];
    __syncthreads();
    for (int s = lanes_t / 2; s > 0; s >>= 1) {
      if (tx < s) {
#pragma unroll
        for (int k = 0; k < kN; ++k) shared[k][tid] = shared[k][tid] + shared[k][tid + s];
      }
      __syncthreads();
    }
    if (tx == 0 && active) {
      float sums[kN];
#pragma unroll
      for (int k = 0; k < kN; ++k) sums[k] = shared[k][tid];
      fold(c, sums);
    }
    __syncthreads();
  }
}

// ------------------------------------------------------------------------------ element-wise maps

// Runs op.PerChannel(c) for every channel, spread over all the grid's threads.
template <typename Op>
__device__ __forceinline__ void PerChannelPass(const Op& op, i64 channels) {
  const i64 block = static_cast<i64>(blockIdx.y) * gridDim.x + blockIdx.x;
  const i64 stride = static_cast<i64>(gridDim.x) * gridDim.y * blockDim.x;
  for (i64 c = block * blockDim.x + threadIdx.x; c < channels; c += stride) op.PerChannel(c);
}

struct RowsMapGeometry {
  i64 rows, channels, vectors;
  int lanes_c, log_lanes_c, lanes_r;
  i64 groups;
};

template <typename T, int V, typename Op>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    RowsMapKernel(RowsMapGeometry g, const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                  bool aligned, Op op) {
  PerChannelPass(op, g.channels);
  const int tid = threadIdx.x;
  const int tx = tid & (g.lanes_c - 1), ty = tid >> g.log_lanes_c;
  const i64 C = g.channels;
  const i64 step = static_cast<i64>(gridDim.x) * g.lanes_r;
  for (i64 group = blockIdx.y; group < g.groups; group += gridDim.y) {
    const i64 cv = group * g.lanes_c + tx;
    if (cv >= g.vectors) continue;
    const i64 c0 = cv * V;
    typename Op::Channel ch[V];
#pragma unroll
    for (int j = 0; j < V; ++j) ch[j] = op.Load(c0 + j);
    for (i64 r = static_cast<i64>(blockIdx.x) * g.lanes_r + ty; r < g.rows; r += kBatch * step) {
      Pack<T, V> pa[kBatch], pb[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const i64 row = r + u * step;
        if (row < g.rows) {
          pa[u] = LoadPack<T, V>(a + row * C + c0, aligned);
          if (Op::kTwoInputs) pb[u] = LoadPack<T, V>(b + row * C + c0, aligned);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const i64 row = r + u * step;
        if (row < g.rows) {
          Pack<T, V> po;
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const float va = Dev<T>::Widen(pa[u].v[j]);
            const float vb = Op::kTwoInputs ? Dev<T>::Widen(pb[u].v[j]) : 0.0f;
            po.v[j] = Dev<T>::Narrow(op.Element(ch[j], va, vb));
          }
          StorePack<T, V>(out + row * C + c0, aligned, po);
        }
      }
    }
  }
}

struct PlanesMapGeometry {
  i64 planes, channels, inner, vectors;  // planes = outer * channels; vectors = inner / V
  int lanes_p, log_lanes_p, lanes_q;
};

template <typename T, int V, typename Op>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    PlanesMapKernel(PlanesMapGeometry g, const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                    bool aligned, Op op) {
  PerChannelPass(op, g.channels);
  const int tid = threadIdx.x;
  const int tx = tid & (g.lanes_p - 1), ty = tid >> g.log_lanes_p;
  const i64 C = g.channels, P = g.inner;
  const i64 step = static_cast<i64>(gridDim.x) * g.lanes_q;
  const i64 c_step = step % C;
  i64 q = static_cast<i64>(blockIdx.x) * g.lanes_q + ty;
  i64 c = q % C;
  for (; q < g.planes; q += step) {
    const typename Op::Channel ch = op.Load(c);
    const i64 base = q * P;
    for (i64 v = tx; v < g.vectors; v += kBatch * g.lanes_p) {
      Pack<T, V> pa[kBatch], pb[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const i64 vu = v + u * g.lanes_p;
        if (vu < g.vectors) {
          pa[u] = LoadPack<T, V>(a + base + vu * V, aligned);
          if (Op::kTwoInputs) pb[u] = LoadPack<T, V>(b + base + vu * V, aligned);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const i64 vu = v + u * g.lanes_p;
        if (vu < g.vectors) {
          Pack<T, V> po;
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const float va = Dev<T>::Widen(pa[u].v[j]);
            const float vb = Op::kTwoInputs ? Dev<T>::Widen(pb[u].v[j]) : 0.0f;
            po.v[j] = Dev<T>::Narrow(op.Element(ch, va, vb));
          }
          StorePack<T, V>(out + base + vu * V, aligned, po);
        }
      }
    }
    c += c_step;
    if (c >= C) c -= C;
  }
}

// ------------------------------------------------------------------------------ small kernels

// Statistics of an empty x: NaN (as TF); the reserve spaces zeros.
__global__ void ForwardEmptyKernel(i64 channels, float* batch_mean, float* batch_variance, float* reserve_1,
                                   float* reserve_2, float* reserve_3) {
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 c = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; c < channels; c += stride) {
    batch_mean[c] = batch_variance[c] = __uint_as_float(0x7fc00000u);
    reserve_1[c] = reserve_2[c] = 0.0f;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0 && reserve_3 != nullptr) *reserve_3 = 0.0f;
}

__global__ void GradEmptyKernel(i64 channels, float* scale_backprop, float* offset_backprop) {
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 c = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; c < channels; c += stride)
    scale_backprop[c] = offset_backprop[c] = 0.0f;
}

// ------------------------------------------------------------------------------ host side: plans

int LanesFor(i64 count, int max_lanes) {  // the smallest power of two >= count, within [1, max_lanes]
  int lanes = 1;
  while (lanes < max_lanes && lanes < count) lanes *= 2;
  return lanes;
}

unsigned GridY(i64 count) { return static_cast<unsigned>(count < kMaxGridY ? (count > 0 ? count : 1) : kMaxGridY); }

// The level-1 tiling of x's sums: a function of the shape (and of T's size) only.
template <typename T>
struct ReductionPlan {
  bool rows_layout;
  int vector;
  RowsGeometry rows;
  PlanesGeometry planes;
  i64 tiles;

  explicit ReductionPlan(const Layout& l) {
    rows_layout = l.inner == 1;
    if (rows_layout) {
      vector = VectorFor<T>(l.channels);
      RowsGeometry& g = rows;
      g.rows = l.rows();
      g.channels = l.channels;
      g.vectors = l.channels / vector;
      g.lanes_c = LanesFor(g.vectors, 32);
      g.log_lanes_c = Log2(g.lanes_c);
      g.lanes_r = kThreads / g.lanes_c;
      g.tile_rows = static_cast<i64>(g.lanes_r) * kRowsPerThread;
      g.tiles = CeilDiv(g.rows, g.tile_rows);
      g.groups = CeilDiv(g.vectors, g.lanes_c);
      tiles = g.tiles;
    } else {
      vector = VectorFor<T>(l.inner);
      PlanesGeometry& g = planes;
      g.outer = l.outer;
      g.channels = l.channels;
      g.inner = l.inner;
      g.vectors = l.inner / vector;
      g.width = g.vectors < kTileItems ? g.vectors : kTileItems;
      g.chunks = CeilDiv(g.vectors, g.width);
      g.tile_planes = kTileItems / g.width;
      g.tiles = CeilDiv(g.outer, g.tile_planes) * g.chunks;
      tiles = g.tiles;
    }
  }
};

template <typename T, int V, typename Op>
void LaunchPartialV(const ReductionPlan<T>& plan, const T* a, const T* b, T* out, const Op& op, float* partial,
                    cudaStream_t stream) {
  const std::size_t bytes = sizeof(T) * V;
  const bool aligned =
      Aligned(a, bytes) && (!Op::kTwoInputs || Aligned(b, bytes)) && (!Op::kWrites || Aligned(out, bytes));
  if (plan.rows_layout) {
    const dim3 grid(static_cast<unsigned>(plan.tiles), GridY(plan.rows.groups));
    RowsPartialKernel<T, V, Op><<<grid, kThreads, 0, stream>>>(plan.rows, a, b, out, aligned, op, partial);
  } else {
    const dim3 grid(static_cast<unsigned>(plan.tiles), GridY(plan.planes.channels));
    PlanesPartialKernel<T, V, Op><<<grid, kThreads, 0, stream>>>(plan.planes, a, b, out, aligned, op, partial);
  }
  CheckLaunch("batch norm: column sums");
}

template <typename T, typename Op>
void LaunchPartial(const ReductionPlan<T>& plan, const T* a, const T* b, T* out, const Op& op, float* partial,
                   cudaStream_t stream) {
  if (plan.tiles > 0x7fffffff) throw DeviceError("batch norm: x has too many rows for one grid");
  if (plan.vector == kVector<T>) LaunchPartialV<T, kVector<T>>(plan, a, b, out, op, partial, stream);
  else LaunchPartialV<T, 1>(plan, a, b, out, op, partial, stream);
}

// Tile lanes: enough that a thread adds at most about kBatch partials before the tree (a function
// of the tile count only, so the order is fixed by the shape).
template <typename Fold>
void LaunchFold(const float* partial, i64 tiles, i64 channels, const Fold& fold, cudaStream_t stream) {
  const int lanes_t = LanesFor(CeilDiv(tiles, kBatch), kThreads);
  const i64 groups = CeilDiv(channels, kThreads / lanes_t);
  const unsigned grid = static_cast<unsigned>(groups < kMaxBlocksX ? groups : kMaxBlocksX);
  FoldKernel<Fold><<<grid, kThreads, 0, stream>>>(partial, tiles, channels, lanes_t, Log2(lanes_t), fold);
  CheckLaunch("batch norm: statistics");
}

// Element-wise blocks: about kMapVectorsPerThread vectors per thread (grid-stride beyond a cap).
constexpr i64 kMapVectorsPerThread = 8;

template <typename T, int V, typename Op>
void LaunchMapV(const Layout& l, const T* a, const T* b, T* out, const Op& op, cudaStream_t stream) {
  const std::size_t bytes = sizeof(T) * V;
  const bool aligned = Aligned(a, bytes) && (!Op::kTwoInputs || Aligned(b, bytes)) && Aligned(out, bytes);
  if (l.inner == 1) {
    RowsMapGeometry g;
    g.rows = l.rows();
    g.channels = l.channels;
    g.vectors = l.channels / V;
    g.lanes_c = LanesFor(g.vectors, 32);
    g.log_lanes_c = Log2(g.lanes_c);
    g.lanes_r = kThreads / g.lanes_c;
    g.groups = CeilDiv(g.vectors, g.lanes_c);
    const i64 blocks = CeilDiv(g.rows, g.lanes_r * kMapVectorsPerThread);
    const dim3 grid(static_cast<unsigned>(blocks < kMaxBlocksX ? blocks : kMaxBlocksX), GridY(g.groups));
    RowsMapKernel<T, V, Op><<<grid, kThreads, 0, stream>>>(g, a, b, out, aligned, op);
  } else {
    PlanesMapGeometry g;
    g.planes = l.outer * l.channels;
    g.channels = l.channels;
    g.inner = l.inner;
    g.vectors = l.inner / V;
    g.lanes_p = LanesFor(g.vectors, kThreads);
    g.log_lanes_p = Log2(g.lanes_p);
    g.lanes_q = kThreads / g.lanes_p;
    const i64 per_plane = CeilDiv(g.vectors, g.lanes_p);  // vectors a thread takes in one plane
    const i64 planes_per_thread = per_plane >= kMapVectorsPerThread ? 1 : kMapVectorsPerThread / per_plane;
    const i64 blocks = CeilDiv(g.planes, g.lanes_q * planes_per_thread);
    const dim3 grid(static_cast<unsigned>(blocks < kMaxBlocksX ? blocks : kMaxBlocksX));
    PlanesMapKernel<T, V, Op><<<grid, kThreads, 0, stream>>>(g, a, b, out, aligned, op);
  }
  CheckLaunch("batch norm: element-wise output");
}

template <typename T, typename Op>
void LaunchMap(const Layout& l, const T* a, const T* b, T* out, const Op& op, cudaStream_t stream) {
  // Element-wise: the vector width changes no value, so the alignment may pick it too.
  const i64 contiguous = l.inner == 1 ? l.channels : l.inner;
  if (VectorFor<T>(contiguous) == kVector<T>) LaunchMapV<T, kVector<T>>(l, a, b, out, op, stream);
  else LaunchMapV<T, 1>(l, a, b, out, op, stream);
}

unsigned SmallGrid(i64 n) { return GridFor(n > 0 ? n : 1); }

}  // namespace

// ------------------------------------------------------------------------------ launchers

template <typename T>
void BatchNormForward(const Layout& l, const T* x, const float* scale, const float* offset, const float* mean,
                      const float* variance, float epsilon, float factor, bool is_training, T* y, float* batch_mean,
                      float* batch_variance, float* reserve_1, float* reserve_2, float* reserve_3,
                      const CudaLaunch& launch) {
  const cudaStream_t stream = StreamOf(launch);
  const i64 C = l.channels;
  if (l.size() == 0) {
    if (C == 0 && reserve_3 == nullptr) return;
    ForwardEmptyKernel<<<SmallGrid(C), kThreads, 0, stream>>>(C, batch_mean, batch_variance, reserve_1, reserve_2,
                                                               reserve_3);
    CheckLaunch("batch norm: empty statistics");
    return;
  }
  if (!is_training) {
    MapNormalizeInference op{mean, variance, scale, offset, epsilon, batch_mean, batch_variance,
                             reserve_1, reserve_2, reserve_3};
    LaunchMap<T>(l, x, nullptr, y, op, stream);
    return;
  }
  const ReductionPlan<T> plan(l);
  const i64 R = l.rows();
  float* partial = launch.scratch->Array<float>(static_cast<std::size_t>(plan.tiles * C));
  float* batch_stats = launch.scratch->Array<float>(static_cast<std::size_t>(2 * C));  // mean, k
  float* bm = batch_stats;
  float* k = batch_stats + C;
  const float inv = 1.0f / static_cast<float>(R);
  LaunchPartial<T>(plan, x, nullptr, nullptr, SumX{}, partial, stream);
  LaunchFold(partial, plan.tiles, C, FoldMean{inv, bm}, stream);
  LaunchPartial<T>(plan, x, nullptr, nullptr, SumSquaredDeviation{bm}, partial, stream);
  FoldVariance fold{R, inv, epsilon, factor, scale, mean, variance, bm, k,
                    batch_mean, batch_variance, reserve_1, reserve_2, reserve_3};
  LaunchFold(partial, plan.tiles, C, fold, stream);
  LaunchMap<T>(l, x, nullptr, y, MapNormalize{bm, k, offset}, stream);
}

template <typename T>
void BatchNormGrad(const Layout& l, const T* dy, const T* x, const float* scale, const float* saved_mean,
                   const float* saved_variance, float epsilon, bool is_training, T* dx, float* scale_backprop,
                   float* offset_backprop, const CudaLaunch& launch) {
  const cudaStream_t stream = StreamOf(launch);
  const i64 C = l.channels;
  if (C == 0) return;
  if (l.size() == 0) {
    GradEmptyKernel<<<SmallGrid(C), kThreads, 0, stream>>>(C, scale_backprop, offset_backprop);
    CheckLaunch("batch norm gradient: empty sums");
    return;
  }
  const ReductionPlan<T> plan(l);
  const i64 R = l.rows();
  if (is_training) {
    float* partial = launch.scratch->Array<float>(static_cast<std::size_t>(3 * plan.tiles * C));
    float* coefficients = launch.scratch->Array<float>(static_cast<std::size_t>(3 * C));
    LaunchPartial<T>(plan, dy, x, nullptr, SumGradTraining{saved_mean, saved_variance, epsilon}, partial, stream);
    FoldGradTraining<T> fold{R, 1.0f / static_cast<float>(R), static_cast<float>(R), epsilon, scale,
                             saved_variance, dy, scale_backprop, offset_backprop, coefficients, C};
    LaunchFold(partial, plan.tiles, C, fold, stream);
    LaunchMap<T>(l, dy, x, dx, MapGradTraining{saved_mean, coefficients, C}, stream);
  } else {
    float* partial = launch.scratch->Array<float>(static_cast<std::size_t>(2 * plan.tiles * C));
    LaunchPartial<T>(plan, dy, x, dx, SumGradInference{saved_mean, saved_variance, scale, epsilon}, partial, stream);
    LaunchFold(partial, plan.tiles, C, FoldGradInference<T>{R, epsilon, saved_variance, dy, scale_backprop,
                                                            offset_backprop},
               stream);
  }
}

#define TFOPS_CUDA_BATCH_NORM_INSTANTIATE(T)                                                                       \
  template void BatchNormForward<T>(const Layout&, const T*, const float*, const float*, const float*,             \
                                    const float*, float, float, bool, T*, float*, float*, float*, float*, float*, \
                                    const CudaLaunch&);                                                            \
  template void BatchNormGrad<T>(const Layout&, const T*, const T*, const float*, const float*, const float*, float, \
                                 bool, T*, float*, float*, const CudaLaunch&);

TFOPS_CUDA_BATCH_NORM_INSTANTIATE(float)
TFOPS_CUDA_BATCH_NORM_INSTANTIATE(Half)
TFOPS_CUDA_BATCH_NORM_INSTANTIATE(BFloat16)

}  // namespace cuda
}  // namespace tfops
