// CUDA kernels of DepthwiseConv2dNative and its backprops (launchers declared in depthwise.h).
//
// Every kernel body is a TFOPS_HD function of its thread's coordinates (the __global__ functions
// only loop over the grid and place the barriers), so the bodies also compile for the host.
//
// Forward and BackpropInput: one thread computes whole output elements, each with the CPU kernels'
// steps (depthwise::TapStep, MultiplierBlock, AddStep) in their order: taps in row-major filter
// order, padding taps skipped, float16/bfloat16 computed in float and rounded to T after each tap.
// The results are therefore the CPU kernels' bits.
//  - NHWC fast path (32-bit indices, >= 16 channels; BackpropInput with multiplier 1): a block is
//    32 channels x 8 groups of kCols consecutive output columns of one output row; a thread keeps
//    kCols accumulators and loads each filter tap once for them; loads and stores are coalesced
//    along the channels, and the taps of neighbouring columns hit L1.
//  - Otherwise (NCHW, few channels, BackpropInput with a multiplier, huge tensors): one thread per
//    output element in the output's memory order (coalesced along W for NCHW, along C for NHWC),
//    with 64-bit indices when a tensor or coordinate could pass 2^30.
//
// BackpropFilter (another summation order than the CPU's, deterministic): the output rows of all
// batches, flattened, are cut into Q fixed chunks of R rows (shape-only choice). A block owns one
// chunk and up to 32 channels (NHWC) or one channel (NCHW); each thread keeps a running sum per tap
// over the chunk's output positions p = ty, ty + BY, ... in order, then the BY threads of a channel
// are combined by a fixed binary tree in shared memory. The Q chunk partials go to scratch and a
// second kernel adds them in a fixed order (contiguous chunk ranges per thread, then a fixed tree).
// When Q == 1 the first kernel writes the result itself. 16-bit types accumulate in float and are
// rounded once; float64 flushes subnormals explicitly (the CPU's FTZ/DAZ mode).
#include "kernels/cuda/depthwise.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/depthwise.h"
#include "kernels/half.h"

namespace tfops {
namespace cuda {
namespace {

using depthwise::Geometry;

// Loop unrolling in the device pass only (the host pass of these TFOPS_HD bodies has no such pragma).
#if defined(__CUDA_ARCH__)
#define TFOPS_UNROLL _Pragma("unroll")
#else
#define TFOPS_UNROLL
#endif

// ---------------------------------------------------------------------------------------------
// Storage types on the device.

// Float64 flush-to-zero (and, applied to loaded operands, denormals-are-zero): TF's CPU kernels run
// with MXCSR FTZ/DAZ, which acts on double too; the GPU has no .ftz for f64.
struct FlushDouble {
  TFOPS_HD double operator()(double v) const { return fabs(v) < 2.2250738585072014e-308 ? copysign(0.0, v) : v; }
};

// Rounding a float to the 16-bit type and back: round to nearest even, overflow to infinity
// (cvt.rn on the device), what kernels/half.h computes bit by bit on the CPU.
struct RoundHalf {
  TFOPS_HD float operator()(float v) const { return __half2float(__float2half_rn(v)); }
};
struct RoundBFloat16 {
  TFOPS_HD float operator()(float v) const { return __bfloat162float(__float2bfloat16_rn(v)); }
};

// A read-only load (the non-coherent cache path on the device).
template <typename U>
TFOPS_HD U LoadRO(const U* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(p);
#else
  return *p;
#endif
}

// Per storage type: the compute type A, Ftz and Round for the shared steps, Load (storage to A,
// denormals-are-zero included) and Store (A to storage; exact for a value already rounded to T).
template <typename T>
struct Dev;

template <>
struct Dev<float> {
  using A = float;
  using Ftz = depthwise::Keep;  // -ftz=true: every float instruction flushes, as the CPU's MXCSR mode
  using Round = depthwise::Keep;
  static TFOPS_HD float Load(const float* p) { return LoadRO(p); }
  static TFOPS_HD float Store(float v) { return v; }
};

template <>
struct Dev<double> {
  using A = double;
  using Ftz = FlushDouble;
  using Round = depthwise::Keep;
  static TFOPS_HD double Load(const double* p) { return FlushDouble()(LoadRO(p)); }
  static TFOPS_HD double Store(double v) { return v; }
};

template <>
struct Dev<Half> {
  using A = float;
  using Ftz = depthwise::Keep;
  using Round = RoundHalf;
  static TFOPS_HD float Load(const Half* p) { return __half2float(__ushort_as_half(LoadRO(&p->bits))); }
  static TFOPS_HD Half Store(float v) { return Half{__half_as_ushort(__float2half_rn(v))}; }
};

template <>
struct Dev<BFloat16> {
  using A = float;
  using Ftz = depthwise::Keep;
  using Round = RoundBFloat16;
  static TFOPS_HD float Load(const BFloat16* p) { return __bfloat162float(__ushort_as_bfloat16(LoadRO(&p->bits))); }
  static TFOPS_HD BFloat16 Store(float v) { return BFloat16{__bfloat16_as_ushort(__float2bfloat16_rn(v))}; }
};

// ---------------------------------------------------------------------------------------------
// Geometry in the index type of a kernel (int when everything fits in 2^30, else long long).

template <typename I>
struct Dims {
  I batch, in_rows, in_cols, in_depth;
  I filter_rows, filter_cols, mult;
  I out_rows, out_cols, out_depth;
  I stride, dil_rows, dil_cols, pad_top, pad_left;
  bool nchw;
};

template <typename I>
Dims<I> DimsOf(const Geometry& g) {
  Dims<I> d;
  d.batch = static_cast<I>(g.batch);
  d.in_rows = static_cast<I>(g.in_rows);
  d.in_cols = static_cast<I>(g.in_cols);
  d.in_depth = static_cast<I>(g.in_depth);
  d.filter_rows = static_cast<I>(g.filter_rows);
  d.filter_cols = static_cast<I>(g.filter_cols);
  d.mult = static_cast<I>(g.depth_multiplier);
  d.out_rows = static_cast<I>(g.out_rows);
  d.out_cols = static_cast<I>(g.out_cols);
  d.out_depth = static_cast<I>(g.out_depth);
  d.stride = static_cast<I>(g.stride);
  d.dil_rows = static_cast<I>(g.dilation_rows);
  d.dil_cols = static_cast<I>(g.dilation_cols);
  d.pad_top = static_cast<I>(g.pad_top);
  d.pad_left = static_cast<I>(g.pad_left);
  d.nchw = g.nchw;
  return d;
}

// Fast-path tiles: 32 channels x kColGroups groups of kCols consecutive output columns.
constexpr int kTileChannels = 32;
constexpr int kColGroups = 8;
constexpr int kCols = 4;

// True when every tensor index and coordinate any kernel forms stays below 2^30, so that int
// arithmetic (with a grid stride or a tile's overhang added) cannot overflow. Computed in double:
// the operands (dims and window values) are below 2^32, so no intermediate here overflows.
bool Fits32(const Geometry& g) {
  const double lim = 1073741824.0;  // 2^30
  const double in = static_cast<double>(g.batch) * g.in_rows * g.in_cols * g.in_depth;
  const double out = static_cast<double>(g.batch) * g.out_rows * g.out_cols * g.out_depth;
  const double filter = static_cast<double>(g.filter_rows) * g.filter_cols * g.in_depth * g.depth_multiplier;
  const double slack = kColGroups * kCols;
  const double rows = (static_cast<double>(g.out_rows) + slack) * g.stride +
                      static_cast<double>(g.filter_rows) * g.dilation_rows + g.pad_top + g.in_rows + slack;
  const double cols = (static_cast<double>(g.out_cols) + slack) * g.stride +
                      static_cast<double>(g.filter_cols) * g.dilation_cols + g.pad_left + g.in_cols + slack;
  return in < lim && out < lim && filter < lim && rows < lim && cols < lim;
}

// Offsets of a 4-D tensor in the op's data format: Base(b, c) + row * row_step + col * col_step.
template <typename I>
struct Layout {
  I rows, cols, depth;
  bool nchw;
  TFOPS_HD I Base(I b, I c) const { return nchw ? (b * depth + c) * rows * cols : b * rows * cols * depth + c; }
  TFOPS_HD I RowStep() const { return nchw ? cols : cols * depth; }
  TFOPS_HD I ColStep() const { return nchw ? I(1) : depth; }
};
template <typename I>
TFOPS_HD Layout<I> InputLayout(const Dims<I>& d) {
  return Layout<I>{d.in_rows, d.in_cols, d.in_depth, d.nchw};
}
template <typename I>
TFOPS_HD Layout<I> OutputLayout(const Dims<I>& d) {
  return Layout<I>{d.out_rows, d.out_cols, d.out_depth, d.nchw};
}

// Position of element e of a tensor [batch, rows, cols, depth] stored in the op's data format.
template <typename I>
struct Position {
  I b, row, col, ch;
};
template <typename I>
TFOPS_HD Position<I> Decompose(I e, I rows, I cols, I depth, bool nchw) {
  Position<I> p;
  if (nchw) {
    p.col = e % cols;
    e /= cols;
    p.row = e % rows;
    e /= rows;
    p.ch = e % depth;
    p.b = e / depth;
  } else {
    p.ch = e % depth;
    e /= depth;
    p.col = e % cols;
    e /= cols;
    p.row = e % rows;
    p.b = e / rows;
  }
  return p;
}

// ---------------------------------------------------------------------------------------------
// Forward.

// Output element e (in the output's memory order).
template <typename T, typename I>
TFOPS_HD void ForwardElement(const Dims<I>& d, const T* x, const T* w, T* y, I e) {
  using D = Dev<T>;
  using A = typename D::A;
  const typename D::Ftz ftz;
  const typename D::Round round;
  const Position<I> o = Decompose(e, d.out_rows, d.out_cols, d.out_depth, d.nchw);
  const I k = o.ch, c = k / d.mult;
  const Layout<I> in = InputLayout(d);
  const I base = in.Base(o.b, c), row_step = in.RowStep(), col_step = in.ColStep();
  A acc = A(0);
  for (I r = 0; r < d.filter_rows; ++r) {
    const I in_r = o.row * d.stride + r * d.dil_rows - d.pad_top;
    if (in_r < 0 || in_r >= d.in_rows) continue;  // padding: skipped, not multiplied by zero
    for (I s = 0; s < d.filter_cols; ++s) {
      const I in_c = o.col * d.stride + s * d.dil_cols - d.pad_left;
      if (in_c < 0 || in_c >= d.in_cols) continue;
      acc = depthwise::TapStep(acc, D::Load(w + (r * d.filter_cols + s) * d.out_depth + k),
                               D::Load(x + base + in_r * row_step + in_c * col_step), ftz, round);
    }
  }
  y[e] = D::Store(acc);
}

template <typename T, typename I>
__global__ void __launch_bounds__(kThreadsPerBlock)
    ForwardKernel(Dims<I> d, const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, I n) {
  const I step = static_cast<I>(blockDim.x) * static_cast<I>(gridDim.x);
  for (I e = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += step) ForwardElement(d, x, w, y, e);
}

// NHWC fast path: output row `row` (= b * out_rows + i), column tile and channel tile of the block,
// thread (tx, ty): channel k = c_tile * 32 + tx, columns j0 .. j0 + kCols - 1.
template <typename T>
TFOPS_HD void ForwardNhwcThread(const Dims<int>& d, const T* x, const T* w, T* y, int row, int col_tile, int c_tile,
                                int tx, int ty) {
  using D = Dev<T>;
  using A = typename D::A;
  const typename D::Ftz ftz;
  const typename D::Round round;
  const int k = c_tile * kTileChannels + tx;
  const int j0 = (col_tile * kColGroups + ty) * kCols;
  if (k >= d.out_depth || j0 >= d.out_cols) return;
  const int c = k / d.mult, C = d.in_depth, K = d.out_depth, S = d.stride;
  const int b = row / d.out_rows, i = row - b * d.out_rows;
  A acc[kCols];
TFOPS_UNROLL
  for (int u = 0; u < kCols; ++u) acc[u] = A(0);
  for (int r = 0; r < d.filter_rows; ++r) {
    const int in_r = i * S + r * d.dil_rows - d.pad_top;
    if (in_r < 0 || in_r >= d.in_rows) continue;  // the same for the whole block
    const T* xrow = x + (b * d.in_rows + in_r) * d.in_cols * C + c;
    const T* wrow = w + r * d.filter_cols * K + k;
    for (int s = 0; s < d.filter_cols; ++s) {
      const A wv = D::Load(wrow + s * K);
      const int col0 = j0 * S + s * d.dil_cols - d.pad_left;
TFOPS_UNROLL
      for (int u = 0; u < kCols; ++u) {
        const int col = col0 + u * S;
        if (static_cast<unsigned>(col) < static_cast<unsigned>(d.in_cols))
          acc[u] = depthwise::TapStep(acc[u], wv, D::Load(xrow + col * C), ftz, round);
      }
    }
  }
  T* yrow = y + (row * d.out_cols + j0) * K + k;
TFOPS_UNROLL
  for (int u = 0; u < kCols; ++u)
    if (j0 + u < d.out_cols) yrow[u * K] = D::Store(acc[u]);
}

// The tiled grid of the NHWC fast paths: blockIdx.x = col_tile * c_tiles + c_tile (one column tile
// and channel tile), blockIdx.y strides over the rows.
struct TileGrid {
  int c_tiles, col_tiles, rows;
};
inline TileGrid TilesFor(int channels, int cols, int rows) {
  return TileGrid{(channels + kTileChannels - 1) / kTileChannels, (cols + kColGroups * kCols - 1) / (kColGroups * kCols),
                  rows};
}

template <typename T>
TFOPS_HD void ForwardNhwcBlockThread(const Dims<int>& d, const T* x, const T* w, T* y, const TileGrid& grid, int row,
                                     int block_x, int tx, int ty) {
  ForwardNhwcThread(d, x, w, y, row, block_x / grid.c_tiles, block_x % grid.c_tiles, tx, ty);
}

template <typename T>
__global__ void __launch_bounds__(kTileChannels* kColGroups, 2)
    ForwardNhwcKernel(Dims<int> d, const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, TileGrid grid) {
  for (int row = blockIdx.y; row < grid.rows; row += gridDim.y)
    ForwardNhwcBlockThread(d, x, w, y, grid, row, blockIdx.x, threadIdx.x, threadIdx.y);
}

// ---------------------------------------------------------------------------------------------
// BackpropInput.

// The sum over taps of output channel k at input position (b, y, x): the CPU's per-channel
// accumulator (taps in ascending order, each reaching the position at most once). kStride > 0 fixes
// the stride at compile time (no division), 0 reads it from d.
template <int kStride, typename T, typename I>
TFOPS_HD typename Dev<T>::A BackpropInputTaps(const Dims<I>& d, const T* f, const T* dy, I b, I y, I x, I k) {
  using D = Dev<T>;
  using A = typename D::A;
  const typename D::Ftz ftz;
  const typename D::Round round;
  const Layout<I> out = OutputLayout(d);
  const I base = out.Base(b, k), row_step = out.RowStep(), col_step = out.ColStep();
  const I S = kStride > 0 ? I(kStride) : d.stride;
  A acc = A(0);
  for (I fr = 0; fr < d.filter_rows; ++fr) {
    const I oy_num = y + d.pad_top - fr * d.dil_rows;
    if (oy_num < 0 || oy_num % S != 0) continue;
    const I oy = oy_num / S;
    if (oy >= d.out_rows) continue;
    for (I fc = 0; fc < d.filter_cols; ++fc) {
      const I ox_num = x + d.pad_left - fc * d.dil_cols;
      if (ox_num < 0 || ox_num % S != 0) continue;
      const I ox = ox_num / S;
      if (ox >= d.out_cols) continue;
      acc = depthwise::TapStep(acc, D::Load(f + (fr * d.filter_cols + fc) * d.out_depth + k),
                               D::Load(dy + base + oy * row_step + ox * col_step), ftz, round);
    }
  }
  return acc;
}

// Input-gradient element e (in the input's memory order): the M channel sums of its input channel,
// combined in TF's register order (whole blocks as a tree, then one by one).
template <int kStride, typename T, typename I>
TFOPS_HD void BackpropInputElement(const Dims<I>& d, const T* f, const T* dy, T* dx, I e) {
  using D = Dev<T>;
  using A = typename D::A;
  const typename D::Ftz ftz;
  const typename D::Round round;
  const Position<I> p = Decompose(e, d.in_rows, d.in_cols, d.in_depth, d.nchw);
  const I M = d.mult;
  if (M == 1) {  // the taps sum straight into the result, as on the CPU
    dx[e] = D::Store(BackpropInputTaps<kStride>(d, f, dy, p.b, p.row, p.col, p.ch));
    return;
  }
  constexpr int kWidth = depthwise::MultiplierWidth<A>::value;
  const I k0 = p.ch * M, full = M / kWidth * kWidth;
  A s = A(0);
  for (I blk = 0; blk < full; blk += kWidth) {
    A v[kWidth];
TFOPS_UNROLL
    for (int q = 0; q < kWidth; ++q) v[q] = BackpropInputTaps<kStride>(d, f, dy, p.b, p.row, p.col, k0 + blk + q);
    s = depthwise::AddStep(s, depthwise::MultiplierBlock<kWidth>(v, ftz, round), ftz, round);
  }
  for (I m = full; m < M; ++m)
    s = depthwise::AddStep(s, BackpropInputTaps<kStride>(d, f, dy, p.b, p.row, p.col, k0 + m), ftz, round);
  dx[e] = D::Store(s);
}

template <typename T, typename I, int kStride>
__global__ void __launch_bounds__(kThreadsPerBlock, 2)
    BackpropInputKernel(Dims<I> d, const T* __restrict__ f, const T* __restrict__ dy, T* __restrict__ dx, I n) {
  const I step = static_cast<I>(blockDim.x) * static_cast<I>(gridDim.x);
  for (I e = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += step)
    BackpropInputElement<kStride>(d, f, dy, dx, e);
}

// Calls fn(std::integral_constant<int, S>()) with S = the stride when it is 1 or 2, else 0 (read at
// run time): the BackpropInput kernels divide by a compile-time stride where they can.
template <typename F>
void WithStride(long long stride, F&& fn) {
  if (stride == 1)
    fn(std::integral_constant<int, 1>());
  else if (stride == 2)
    fn(std::integral_constant<int, 2>());
  else
    fn(std::integral_constant<int, 0>());
}

// NHWC fast path, multiplier 1 (channel k = input channel): input row `row` (= b * in_rows + y),
// columns x0 .. x0 + kCols - 1. kStride > 0 fixes the stride at compile time (no division).
template <typename T, int kStride>
TFOPS_HD void BackpropInputNhwcThread(const Dims<int>& d, const T* f, const T* dy, T* dx, int row, int col_tile,
                                      int c_tile, int tx, int ty) {
  using D = Dev<T>;
  using A = typename D::A;
  const typename D::Ftz ftz;
  const typename D::Round round;
  const int k = c_tile * kTileChannels + tx;
  const int x0 = (col_tile * kColGroups + ty) * kCols;
  if (k >= d.out_depth || x0 >= d.in_cols) return;
  const int K = d.out_depth, S = kStride > 0 ? kStride : d.stride;
  const int b = row / d.in_rows, y = row - b * d.in_rows;
  A acc[kCols];
TFOPS_UNROLL
  for (int u = 0; u < kCols; ++u) acc[u] = A(0);
  for (int fr = 0; fr < d.filter_rows; ++fr) {
    const int oy_num = y + d.pad_top - fr * d.dil_rows;  // the same for the whole block
    if (oy_num < 0 || oy_num % S != 0) continue;
    const int oy = oy_num / S;
    if (oy >= d.out_rows) continue;
    const T* dyrow = dy + (b * d.out_rows + oy) * d.out_cols * K + k;
    const T* frow = f + fr * d.filter_cols * K + k;
    for (int fc = 0; fc < d.filter_cols; ++fc) {
      const A wv = D::Load(frow + fc * K);
      const int num0 = x0 + d.pad_left - fc * d.dil_cols;
TFOPS_UNROLL
      for (int u = 0; u < kCols; ++u) {
        const int ox_num = num0 + u;
        if (ox_num < 0 || ox_num % S != 0) continue;
        const int ox = ox_num / S;
        if (ox < d.out_cols) acc[u] = depthwise::TapStep(acc[u], wv, D::Load(dyrow + ox * K), ftz, round);
      }
    }
  }
  T* xrow = dx + (row * d.in_cols + x0) * K + k;
TFOPS_UNROLL
  for (int u = 0; u < kCols; ++u)
    if (x0 + u < d.in_cols) xrow[u * K] = D::Store(acc[u]);
}

template <typename T, int kStride>
TFOPS_HD void BackpropInputNhwcBlockThread(const Dims<int>& d, const T* f, const T* dy, T* dx, const TileGrid& grid,
                                           int row, int block_x, int tx, int ty) {
  BackpropInputNhwcThread<T, kStride>(d, f, dy, dx, row, block_x / grid.c_tiles, block_x % grid.c_tiles, tx, ty);
}

template <typename T, int kStride>
__global__ void __launch_bounds__(kTileChannels* kColGroups, 2)
    BackpropInputNhwcKernel(Dims<int> d, const T* __restrict__ f, const T* __restrict__ dy, T* __restrict__ dx,
                            TileGrid grid) {
  for (int row = blockIdx.y; row < grid.rows; row += gridDim.y)
    BackpropInputNhwcBlockThread<T, kStride>(d, f, dy, dx, grid, row, blockIdx.x, threadIdx.x, threadIdx.y);
}

// ---------------------------------------------------------------------------------------------
// BackpropFilter.

// The plan of the first kernel, chosen on the host from the shape only.
template <typename I>
struct FilterPlan {
  I rows_per_chunk;  // R: output rows (of all batches, flattened) per chunk
  I chunks;          // Q
  I c_tiles;         // ceil(K / bx)
  I tap_groups;      // 1 when a thread sums every tap (kTaps > 0), else one task per tap
  I tasks;           // tap_groups * chunks * c_tiles
  int bx, by;        // block: bx channels x by position lanes (by a power of two)
};

// Taps per thread: 9 for 3x3 filters (compile time), else 1 (one tap per task).
template <int kTaps>
struct TapCount {
  static constexpr int value = kTaps > 0 ? kTaps : 1;
};

// Phase 1 of a task: thread (tx, ty)'s running sums over its positions of the chunk, into
// smem[(q * by + ty) * bx + tx] for its taps q.
template <typename T, typename I, int kTaps>
TFOPS_HD void FilterAccumulate(const Dims<I>& d, const FilterPlan<I>& plan, const T* x, const T* dy, I task, int tx,
                               int ty, typename Dev<T>::A* smem) {
  using D = Dev<T>;
  using A = typename D::A;
  static_assert(kTaps == 0 || kTaps == 9, "every tap of a 3x3 filter, or one tap per task");
  constexpr int kN = TapCount<kTaps>::value;
  const typename D::Ftz ftz;
  const I c_tile = task % plan.c_tiles;
  const I chunk = (task / plan.c_tiles) % plan.chunks;
  const I tap0 = kTaps > 0 ? I(0) : task / plan.c_tiles / plan.chunks;
  const I k = c_tile * plan.bx + tx;
  A acc[kN];
TFOPS_UNROLL
  for (int q = 0; q < kN; ++q) acc[q] = A(0);
  const I all_rows = d.batch * d.out_rows;
  const I row_begin = chunk * plan.rows_per_chunk;
  const I row_end = row_begin + plan.rows_per_chunk < all_rows ? row_begin + plan.rows_per_chunk : all_rows;
  if (k < d.out_depth && row_begin < row_end) {
    const I c = k / d.mult;
    const Layout<I> in = InputLayout(d), out = OutputLayout(d);
    const I in_row_step = in.RowStep(), in_col_step = in.ColStep();
    const I out_row_step = out.RowStep(), out_col_step = out.ColStep();
    // The filter rows and columns of this thread's taps (kTaps > 0: all 3 x 3, taps row-major),
    // as offsets from an output position's window corner.
    constexpr int kR = kTaps > 0 ? 3 : 1;
    I tap_r[kR], tap_c[kR];
TFOPS_UNROLL
    for (int q = 0; q < kR; ++q) {
      tap_r[q] = (kTaps > 0 ? I(q) : tap0 / d.filter_cols) * d.dil_rows - d.pad_top;
      tap_c[q] = (kTaps > 0 ? I(q) : tap0 % d.filter_cols) * d.dil_cols - d.pad_left;
    }
    // Position p = ty, ty + by, ... of the chunk, kept as (b, i, j) and stepped without division.
    const I positions = (row_end - row_begin) * d.out_cols;
    I flat_row = row_begin + ty / d.out_cols, j = ty % d.out_cols;
    I b = flat_row / d.out_rows, i = flat_row % d.out_rows;
    for (I p = ty; p < positions; p += plan.by) {
      const A g = D::Load(dy + out.Base(b, k) + i * out_row_step + j * out_col_step);
      const I in_base = in.Base(b, c);
      I row_off[kR], col_off[kR];
      bool row_ok[kR], col_ok[kR];
TFOPS_UNROLL
      for (int q = 0; q < kR; ++q) {
        const I in_r = i * d.stride + tap_r[q], in_c = j * d.stride + tap_c[q];
        row_ok[q] = in_r >= 0 && in_r < d.in_rows;
        col_ok[q] = in_c >= 0 && in_c < d.in_cols;
        row_off[q] = in_base + in_r * in_row_step;
        col_off[q] = in_c * in_col_step;
      }
TFOPS_UNROLL
      for (int r = 0; r < kR; ++r) {
TFOPS_UNROLL
        for (int q = 0; q < kR; ++q) {
          if (!row_ok[r] || !col_ok[q]) continue;  // padding: skipped
          acc[r * kR + q] =
              depthwise::TapStep(acc[r * kR + q], g, D::Load(x + row_off[r] + col_off[q]), ftz, depthwise::Keep());
        }
      }
      j += plan.by;
      while (j >= d.out_cols) {
        j -= d.out_cols;
        if (++i == d.out_rows) {
          i = 0;
          ++b;
        }
      }
    }
  }
TFOPS_UNROLL
  for (int q = 0; q < kN; ++q) smem[(q * plan.by + ty) * plan.bx + tx] = acc[q];
}

// Phase 2, one level of the tree (every thread with ty < half, then a barrier).
template <typename T, typename I, int kTaps>
TFOPS_HD void FilterTreeStep(const FilterPlan<I>& plan, int half, int tx, int ty, typename Dev<T>::A* smem) {
  constexpr int kN = TapCount<kTaps>::value;
  const typename Dev<T>::Ftz ftz;
TFOPS_UNROLL
  for (int q = 0; q < kN; ++q) {
    auto* a = smem + (q * plan.by + ty) * plan.bx + tx;
    *a = depthwise::AddStep(*a, a[half * plan.bx], ftz, depthwise::Keep());
  }
}

// Phase 3: the block's sums (lane ty == 0 of smem) to the chunk's partials, or to the output when
// there is one chunk.
template <typename T, typename I, int kTaps>
TFOPS_HD void FilterStore(const Dims<I>& d, const FilterPlan<I>& plan, I task, int tx, int ty,
                          const typename Dev<T>::A* smem, typename Dev<T>::A* partial, T* out) {
  constexpr int kN = TapCount<kTaps>::value;
  const I c_tile = task % plan.c_tiles;
  const I chunk = (task / plan.c_tiles) % plan.chunks;
  const I tap0 = kTaps > 0 ? I(0) : task / plan.c_tiles / plan.chunks;
  const I k = c_tile * plan.bx + tx;
  if (k >= d.out_depth) return;
  const I filter_size = d.filter_rows * d.filter_cols * d.out_depth;
  for (int q = ty; q < kN; q += plan.by) {
    const auto v = smem[(q * plan.by) * plan.bx + tx];
    const I at = (tap0 + q) * d.out_depth + k;
    if (plan.chunks == 1)
      out[at] = Dev<T>::Store(v);
    else
      partial[chunk * filter_size + at] = v;
  }
}

template <typename T, typename I, int kTaps>
__global__ void __launch_bounds__(kThreadsPerBlock, 2)
    FilterPartialKernel(Dims<I> d, FilterPlan<I> plan, const T* __restrict__ x, const T* __restrict__ dy,
                        typename Dev<T>::A* __restrict__ partial, T* __restrict__ out) {
  extern __shared__ unsigned char filter_smem[];
  auto* smem = reinterpret_cast<typename Dev<T>::A*>(filter_smem);
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (I task = blockIdx.x; task < plan.tasks; task += gridDim.x) {
    FilterAccumulate<T, I, kTaps>(d, plan, x, dy, task, tx, ty, smem);
    __syncthreads();
    for (int half = plan.by / 2; half > 0; half /= 2) {
      if (ty < half) FilterTreeStep<T, I, kTaps>(plan, half, tx, ty, smem);
      __syncthreads();
    }
    FilterStore<T, I, kTaps>(d, plan, task, tx, ty, smem, partial, out);
    __syncthreads();  // smem is reused by the next task
  }
}

// The second kernel: out[f] = sum over chunks of partial[chunk][f]. Block: 32 filter elements x 8
// groups; group ty sums chunks [ty * per_group, (ty + 1) * per_group) in order, then a fixed tree.
constexpr int kSumColumns = 32;
constexpr int kSumGroups = 8;

template <typename T>
TFOPS_HD void ChunkSumAccumulate(const typename Dev<T>::A* partial, int chunks, int filter_size, int tile, int tx,
                                 int ty, typename Dev<T>::A* smem) {
  using A = typename Dev<T>::A;
  const typename Dev<T>::Ftz ftz;
  const int f = tile * kSumColumns + tx;
  const int per_group = (chunks + kSumGroups - 1) / kSumGroups;
  const int q0 = ty * per_group, q1 = q0 + per_group < chunks ? q0 + per_group : chunks;
  A s = A(0);
  if (f < filter_size)
    for (int q = q0; q < q1; ++q) s = depthwise::AddStep(s, LoadRO(partial + q * filter_size + f), ftz, depthwise::Keep());
  smem[ty * kSumColumns + tx] = s;
}

template <typename T>
TFOPS_HD void ChunkSumTreeStep(int half, int tx, int ty, typename Dev<T>::A* smem) {
  auto* a = smem + ty * kSumColumns + tx;
  *a = depthwise::AddStep(*a, a[half * kSumColumns], typename Dev<T>::Ftz(), depthwise::Keep());
}

template <typename T>
TFOPS_HD void ChunkSumStore(int filter_size, int tile, int tx, const typename Dev<T>::A* smem, T* out) {
  const int f = tile * kSumColumns + tx;
  if (f < filter_size) out[f] = Dev<T>::Store(smem[tx]);
}

template <typename T>
__global__ void __launch_bounds__(kSumColumns* kSumGroups)
    ChunkSumKernel(const typename Dev<T>::A* __restrict__ partial, int chunks, int filter_size, T* __restrict__ out) {
  __shared__ typename Dev<T>::A smem[kSumGroups * kSumColumns];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int tiles = (filter_size + kSumColumns - 1) / kSumColumns;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    ChunkSumAccumulate<T>(partial, chunks, filter_size, tile, tx, ty, smem);
    __syncthreads();
    for (int half = kSumGroups / 2; half > 0; half /= 2) {
      if (ty < half) ChunkSumTreeStep<T>(half, tx, ty, smem);
      __syncthreads();
    }
    if (ty == 0) ChunkSumStore<T>(filter_size, tile, tx, smem, out);
    __syncthreads();
  }
}

// Zeros (what nothing flowing back gives), as the storage type's +0.
template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock) FillZeroKernel(T* __restrict__ out, long long n) {
  const long long step = static_cast<long long>(blockDim.x) * gridDim.x;
  for (long long e = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += step)
    out[e] = Dev<T>::Store(typename Dev<T>::A(0));
}

// ---------------------------------------------------------------------------------------------
// Launch decisions (host, shape only).

enum class Path { kNhwcTiles, kElements32, kElements64 };

Path ForwardPath(const Geometry& g) {
  if (!Fits32(g)) return Path::kElements64;
  return !g.nchw && g.out_depth >= 16 ? Path::kNhwcTiles : Path::kElements32;
}

Path BackpropInputPath(const Geometry& g) {
  if (!Fits32(g)) return Path::kElements64;
  return !g.nchw && g.depth_multiplier == 1 && g.out_depth >= 16 ? Path::kNhwcTiles : Path::kElements32;
}

// BackpropFilter sums every tap of a 3x3 filter in one thread; other filters take one task per tap.
bool FilterAllTaps(const Geometry& g) { return g.filter_rows == 3 && g.filter_cols == 3; }

// Chunks and block shape (shape-only): about 16 positions per thread and tap; at most
// kMaxFilterPartials partial values unless a single chunk (no partials) is needed for that.
template <typename I>
FilterPlan<I> PlanFilter(const Geometry& g, bool all_taps, long long max_partials = kMaxFilterPartials,
                         long long positions_per_lane = 16) {
  FilterPlan<I> plan;
  if (g.nchw) {  // one channel per block, the positions along the lanes (coalesced along W)
    plan.bx = 1;
    plan.by = kThreadsPerBlock;
  } else {  // channels along the lanes (coalesced along C)
    int bx = 1;
    while (bx < kTileChannels && bx < g.out_depth) bx *= 2;
    plan.bx = bx;
    plan.by = kThreadsPerBlock / bx;
  }
  const long long all_rows = g.batch * g.out_rows;
  const long long target_positions = positions_per_lane * plan.by;
  long long rows = std::min<long long>(all_rows, std::max<long long>(1, (target_positions + g.out_cols - 1) / g.out_cols));
  long long chunks = (all_rows + rows - 1) / rows;
  const long long filter_size = g.FilterSize();
  if (chunks > 1 && chunks > max_partials / filter_size) {
    const long long limit = std::max<long long>(1, max_partials / filter_size);
    rows = (all_rows + limit - 1) / limit;
    chunks = (all_rows + rows - 1) / rows;
  }
  const long long c_tiles = (g.out_depth + plan.bx - 1) / plan.bx;
  const long long tap_groups = all_taps ? 1 : g.filter_rows * g.filter_cols;
  plan.rows_per_chunk = static_cast<I>(rows);
  plan.chunks = static_cast<I>(chunks);
  plan.c_tiles = static_cast<I>(c_tiles);
  plan.tap_groups = static_cast<I>(tap_groups);
  plan.tasks = static_cast<I>(tap_groups * chunks * c_tiles);
  return plan;
}

// Blocks for a loop over `tasks` block-sized tasks: all of them up to a bound that is valid for any
// launch (the kernels loop over the rest).
unsigned BlocksFor(long long tasks) {
  return static_cast<unsigned>(std::max<long long>(1, std::min<long long>(tasks, 1ll << 20)));
}

template <typename T, typename I, int kTaps>
void LaunchFilterPartial(const Geometry& g, const T* x, const T* dy, T* out, const CudaLaunch& launch) {
  using A = typename Dev<T>::A;
  const FilterPlan<I> plan = PlanFilter<I>(g, kTaps > 0);
  A* partial = nullptr;
  if (plan.chunks > 1) partial = launch.scratch->Array<A>(static_cast<std::size_t>(plan.chunks) * g.FilterSize());
  const std::size_t smem = sizeof(A) * TapCount<kTaps>::value * plan.bx * plan.by;
  FilterPartialKernel<T, I, kTaps><<<BlocksFor(plan.tasks), dim3(plan.bx, plan.by), smem, StreamOf(launch)>>>(
      DimsOf<I>(g), plan, x, dy, partial, out);
  CheckLaunch("DepthwiseConv2dNativeBackpropFilter (partial sums)");
  if (plan.chunks > 1) {
    const int filter_size = static_cast<int>(g.FilterSize());  // chunks > 1: below kMaxFilterPartials
    const long long tiles = (filter_size + kSumColumns - 1) / kSumColumns;
    ChunkSumKernel<T><<<BlocksFor(tiles), dim3(kSumColumns, kSumGroups), 0, StreamOf(launch)>>>(
        partial, static_cast<int>(plan.chunks), filter_size, out);
    CheckLaunch("DepthwiseConv2dNativeBackpropFilter (chunk sums)");
  }
}

template <typename T, typename I>
void LaunchFilter(const Geometry& g, const T* x, const T* dy, T* out, const CudaLaunch& launch) {
  if (FilterAllTaps(g))
    LaunchFilterPartial<T, I, 9>(g, x, dy, out, launch);
  else
    LaunchFilterPartial<T, I, 0>(g, x, dy, out, launch);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Launchers.

template <typename T>
void DepthwiseForward(const Geometry& g, const T* input, const T* filter, T* output, const CudaLaunch& launch) {
  const long long n = g.OutputSize();
  if (n == 0) return;
  const cudaStream_t stream = StreamOf(launch);
  switch (ForwardPath(g)) {
    case Path::kNhwcTiles: {
      const Dims<int> d = DimsOf<int>(g);
      const TileGrid grid = TilesFor(d.out_depth, d.out_cols, d.batch * d.out_rows);
      ForwardNhwcKernel<T><<<dim3(grid.c_tiles * grid.col_tiles, std::min(grid.rows, 65535)),
                             dim3(kTileChannels, kColGroups), 0, stream>>>(d, input, filter, output, grid);
      break;
    }
    case Path::kElements32:
      ForwardKernel<T, int><<<GridFor(n), kThreadsPerBlock, 0, stream>>>(DimsOf<int>(g), input, filter, output,
                                                                         static_cast<int>(n));
      break;
    case Path::kElements64:
      ForwardKernel<T, long long><<<GridFor(n), kThreadsPerBlock, 0, stream>>>(DimsOf<long long>(g), input, filter,
                                                                               output, n);
      break;
  }
  CheckLaunch("DepthwiseConv2dNative");
}

template <typename T>
void DepthwiseBackpropInput(const Geometry& g, const T* filter, const T* out_backprop, T* in_backprop,
                            const CudaLaunch& launch) {
  const long long n = g.InputSize();
  if (n == 0) return;
  const cudaStream_t stream = StreamOf(launch);
  switch (BackpropInputPath(g)) {
    case Path::kNhwcTiles: {
      const Dims<int> d = DimsOf<int>(g);
      const TileGrid grid = TilesFor(d.in_depth, d.in_cols, d.batch * d.in_rows);
      const dim3 blocks(grid.c_tiles * grid.col_tiles, std::min(grid.rows, 65535)), threads(kTileChannels, kColGroups);
      WithStride(g.stride, [&](auto stride) {
        BackpropInputNhwcKernel<T, decltype(stride)::value>
            <<<blocks, threads, 0, stream>>>(d, filter, out_backprop, in_backprop, grid);
      });
      break;
    }
    case Path::kElements32:
      WithStride(g.stride, [&](auto stride) {
        BackpropInputKernel<T, int, decltype(stride)::value><<<GridFor(n), kThreadsPerBlock, 0, stream>>>(
            DimsOf<int>(g), filter, out_backprop, in_backprop, static_cast<int>(n));
      });
      break;
    case Path::kElements64:
      BackpropInputKernel<T, long long, 0><<<GridFor(n), kThreadsPerBlock, 0, stream>>>(
          DimsOf<long long>(g), filter, out_backprop, in_backprop, n);
      break;
  }
  CheckLaunch("DepthwiseConv2dNativeBackpropInput");
}

template <typename T>
void DepthwiseBackpropFilter(const Geometry& g, const T* input, const T* out_backprop, T* filter_backprop,
                             const CudaLaunch& launch) {
  const long long n = g.FilterSize();
  if (n == 0) return;
  if (g.OutputSize() == 0) {  // nothing flows back
    FillZeroKernel<T><<<GridFor(n), kThreadsPerBlock, 0, StreamOf(launch)>>>(filter_backprop, n);
    CheckLaunch("DepthwiseConv2dNativeBackpropFilter (zeros)");
    return;
  }
  if (Fits32(g))
    LaunchFilter<T, int>(g, input, out_backprop, filter_backprop, launch);
  else
    LaunchFilter<T, long long>(g, input, out_backprop, filter_backprop, launch);
}

#define TFOPS_DEPTHWISE_CUDA_INSTANTIATE(T)                                                                    \
  template void DepthwiseForward<T>(const Geometry&, const T*, const T*, T*, const CudaLaunch&);              \
  template void DepthwiseBackpropInput<T>(const Geometry&, const T*, const T*, T*, const CudaLaunch&);        \
  template void DepthwiseBackpropFilter<T>(const Geometry&, const T*, const T*, T*, const CudaLaunch&);

TFOPS_DEPTHWISE_CUDA_INSTANTIATE(float)
TFOPS_DEPTHWISE_CUDA_INSTANTIATE(double)
TFOPS_DEPTHWISE_CUDA_INSTANTIATE(Half)
TFOPS_DEPTHWISE_CUDA_INSTANTIATE(BFloat16)

}  // namespace cuda
}  // namespace tfops
