// CUDA kernels for the FakeQuant family (cuda/fake_quant.h). The arithmetic of one element is the
// TFOPS_HD functions of kernels/fake_quant.h, compiled here with -ftz=true --fmad=false and IEEE
// division (common.cuh), so each output element is the CPU kernel's bits.
//
// The summed gradients dmin/dmax follow eigen_sum.h's order exactly (docs/semantics.md section
// 1.4), for the per-tensor sums (one channel) and for each channel of the per-channel sums:
//  - The tree over the rows (PacketTreeSum's recursive halving) is complete down to its shallowest
//    leaf level `depth`, and each node on that level is a leaf or splits into two leaves
//    (eigen_sum::TreeLevelsOf checks this on the host). A node's position comes from the bits of
//    its index (eigen_sum::NodeAt), so no leaf table has to reach the device.
//  - Inside a leaf, row o (leaf-relative) of the 4-accumulator blocks belongs to the sequence
//    o % 32 (accumulator (o / 8) % 4, lane o % 8): pass 1 gives each (leaf, sequence, channel) one
//    thread, which adds its rows in order, and writes dx of the same elements on the way (one read
//    of g and x for dx and both sums). Adjacent threads read adjacent addresses: the thread for
//    (sequence q, channel c) reads element (first + q + 32 m) * channels + c.
//  - Pass 2, one thread per (node, channel): folds the four accumulators of each lane in the
//    CPU's order, adds the remaining whole packets and the scalar tail (fewer than 32 rows, read
//    again), takes the horizontal sum, and combines the two leaves of a split node.
//  - Pass 3 combines the nodes of the level as the CPU's TreeCombine does, 0 + left then + right at
//    every inner node: each thread reduces an aligned power-of-two group of nodes, then the block
//    finishes the complete binary tree in shared memory. Every inner node is one fixed operation on
//    its two children, so any schedule gives the same bits.
//  - NaN sums: pass 1 recomputes a chain that ends NaN with float_ops::X86, passes 2 and 3 always use
//    them (a few operations per leaf), so a NaN dmin/dmax has the bits of the CPU kernel, which
//    recomputes its NaN leaf sums the same way (eigen_sum.h).
// No atomics, fixed shapes: the same bits on every run.
#include "kernels/cuda/fake_quant.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "kernels/cuda/common.cuh"
#include "kernels/eigen_sum.h"
#include "kernels/fake_quant.h"

namespace tfops {
namespace cuda {
namespace {

using X86 = float_ops::X86;  // the CPU's NaN results (kernels/eigen_sum.h)

bool Aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// ---------------------------------------------------------------- element-wise kernels

// Each element is computed with the hardware's operations; the rare element whose result is NaN is
// computed again with float_ops::X86, so that it carries the CPU kernel's NaN (the GPU's own NaN
// results are all one canonical NaN). Numbers are the same either way.
__device__ inline float Multiply(const FakeQuantGrid& g, float x) {
  const float y = FakeQuantMultiply(x, g.nudged_min, g.nudged_max, g.inv_scale, g.quant_zero, g.scale);
  if (!FakeQuantIsNan(y)) return y;
  return FakeQuantMultiply<X86>(x, g.nudged_min, g.nudged_max, g.inv_scale, g.quant_zero, g.scale);
}

__device__ inline float Divide(const FakeQuantGrid& g, float x) {
  const float y = FakeQuantDivide(x, g.nudged_min, g.nudged_max, g.scale, g.quant_zero);
  if (!FakeQuantIsNan(y)) return y;
  return FakeQuantDivide<X86>(x, g.nudged_min, g.nudged_max, g.scale, g.quant_zero);
}

__device__ inline float Masked(float g, float x, float lo, float hi) {
  const float dx = FakeQuantMasked(g, x, lo, hi);
  if (!FakeQuantIsNan(dx)) return dx;
  return FakeQuantMasked<X86>(g, x, lo, hi);
}

struct MultiplyOp {
  FakeQuantGrid grid;
  __device__ float operator()(float x) const { return Multiply(grid, x); }
};

struct DivideOp {
  FakeQuantGrid grid;
  __device__ float operator()(float x) const { return Divide(grid, x); }
};

struct MaskOp {
  float lo, hi;
  __device__ float operator()(float g, float x) const { return Masked(g, x, lo, hi); }
};

// y = op(x), grid-stride; float4 loads and stores when every pointer is 16-byte aligned.
template <class Op>
__global__ void __launch_bounds__(kThreadsPerBlock)
    UnaryKernel(const float* __restrict__ x, float* __restrict__ y, int64_t n, bool vectorized, Op op) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t scalar_begin = 0;
  if (vectorized) {
    const int64_t n4 = n / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* y4 = reinterpret_cast<float4*>(y);
    for (int64_t i = first; i < n4; i += stride) {
      float4 v = x4[i];
      v.x = op(v.x);
      v.y = op(v.y);
      v.z = op(v.z);
      v.w = op(v.w);
      y4[i] = v;
    }
    scalar_begin = n4 * 4;
  }
  for (int64_t i = scalar_begin + first; i < n; i += stride) y[i] = op(x[i]);
}

// y = op(a, b), as UnaryKernel.
template <class Op>
__global__ void __launch_bounds__(kThreadsPerBlock)
    BinaryKernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y, int64_t n,
                 bool vectorized, Op op) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t scalar_begin = 0;
  if (vectorized) {
    const int64_t n4 = n / 4;
    const float4* a4 = reinterpret_cast<const float4*>(a);
    const float4* b4 = reinterpret_cast<const float4*>(b);
    float4* y4 = reinterpret_cast<float4*>(y);
    for (int64_t i = first; i < n4; i += stride) {
      const float4 u = a4[i], v = b4[i];
      y4[i] = make_float4(op(u.x, v.x), op(u.y, v.y), op(u.z, v.z), op(u.w, v.w));
    }
    scalar_begin = n4 * 4;
  }
  for (int64_t i = scalar_begin + first; i < n; i += stride) y[i] = op(a[i], b[i]);
}

template <class Op>
void LaunchUnary(const float* x, float* y, int64_t n, Op op, const CudaLaunch& launch, const char* what) {
  if (n <= 0) return;
  const bool vectorized = Aligned16(x) && Aligned16(y);
  UnaryKernel<<<GridFor(vectorized ? (n + 3) / 4 : n), kThreadsPerBlock, 0, StreamOf(launch)>>>(x, y, n, vectorized,
                                                                                               op);
  CheckLaunch(what);
}

// ---------------------------------------------------------------- per-channel ranges

// One channel's grid as the CPU's ChannelGrids holds it: a min == max == 0 channel keeps zeros
// (its forward output is 0, its dx is g, its sums are 0).
struct ChannelGrid {
  FakeQuantGrid grid;
  bool keep;
};

__device__ inline ChannelGrid ChannelGridOf(float min, float max, int quant_min, int quant_max) {
  ChannelGrid c{{0.0f, 0.0f, 0.0f, 0.0f, 0.0f}, false};
  if (FakeQuantRangeIsZero(min, max)) return c;
  c.grid = NudgeFakeQuantGrid<X86>(min, max, quant_min, quant_max);  // the CPU's NaNs, if any
  c.keep = true;
  return c;
}

__device__ inline float PerChannelValue(const ChannelGrid& c, float x) {
  const float v = Multiply(c.grid, x);
  return c.keep ? v : 0.0f;
}

// PerChannel forward. `threads` is a multiple of `units_per_row` (a unit is W consecutive
// elements of one row), so every unit a thread visits has the same channels: the thread nudges its
// W channels once.
template <int W>
__global__ void __launch_bounds__(kThreadsPerBlock)
    PerChannelForwardKernel(const float* __restrict__ x, float* __restrict__ y, int64_t units,
                            int64_t units_per_row, int64_t threads, const float* __restrict__ min,
                            const float* __restrict__ max, int quant_min, int quant_max) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= threads) return;
  const int64_t c0 = (i % units_per_row) * W;
  ChannelGrid grids[W];
#pragma unroll
  for (int w = 0; w < W; ++w) grids[w] = ChannelGridOf(min[c0 + w], max[c0 + w], quant_min, quant_max);
  if constexpr (W == 4) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* y4 = reinterpret_cast<float4*>(y);
    for (int64_t u = i; u < units; u += threads) {
      float4 v = x4[u];
      v.x = PerChannelValue(grids[0], v.x);
      v.y = PerChannelValue(grids[1], v.y);
      v.z = PerChannelValue(grids[2], v.z);
      v.w = PerChannelValue(grids[3], v.w);
      y4[u] = v;
    }
  } else {
    for (int64_t u = i; u < units; u += threads) y[u] = PerChannelValue(grids[0], x[u]);
  }
}

// PerChannel forward over [outer, channels, inner] with inner > 1 (an `axis` other than the last dim):
// element e belongs to channel (e / inner) % channels. Each thread nudges the grid of every element it
// visits; the grid is a few operations next to the memory traffic.
__global__ void __launch_bounds__(kThreadsPerBlock)
    PerChannelInnerForwardKernel(const float* __restrict__ x, float* __restrict__ y, int64_t n, int64_t channels,
                                 int64_t inner, const float* __restrict__ min, const float* __restrict__ max,
                                 int quant_min, int quant_max) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const int64_t c = (e / inner) % channels;
    y[e] = PerChannelValue(ChannelGridOf(min[c], max[c], quant_min, quant_max), x[e]);
  }
}

// [outer, channels, inner] <-> [outer, inner, channels]: the moved-axis gradient's copies, to channels-last
// (kToLast) or back. Element e of the channels-last view is (row, c) with row = o * inner + i, the order in
// which the CPU kernel (and TF, on the transposed input) sums each channel; one thread per element,
// coalesced on the channels-last side.
template <bool kToLast>
__global__ void __launch_bounds__(kThreadsPerBlock)
    ChannelsLastCopyKernel(const float* __restrict__ from, float* __restrict__ to, int64_t n, int64_t channels,
                           int64_t inner) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const int64_t c = e % channels, row = e / channels, o = row / inner, i = row % inner;
    const int64_t strided = (o * channels + c) * inner + i;
    if (kToLast) {
      to[e] = from[strided];
    } else {
      to[strided] = from[e];
    }
  }
}

// The range of channel c for the gradients: nudged bounds and whether the channel is kept.
struct ChannelRange {
  float lo, hi;
  bool keep;
};

// Vars gradient: one channel, nudged on the host.
struct UniformRanges {
  float lo, hi;
  __device__ ChannelRange operator()(int64_t) const { return {lo, hi, true}; }
  __device__ bool Keep(int64_t) const { return true; }
};

// PerChannel gradient: device vectors, nudged here (as the CPU's ChannelGrids: lo = hi = 0 for a
// min == max == 0 channel).
struct PerChannelRanges {
  const float* min;
  const float* max;
  int quant_min, quant_max;
  __device__ ChannelRange operator()(int64_t c) const {
    const ChannelGrid g = ChannelGridOf(min[c], max[c], quant_min, quant_max);
    return {g.grid.nudged_min, g.grid.nudged_max, g.keep};
  }
  __device__ bool Keep(int64_t c) const { return !FakeQuantRangeIsZero(min[c], max[c]); }
};

__device__ inline float GradientValue(const ChannelRange& r, float g, float x) {
  return r.keep ? Masked(g, x, r.lo, r.hi) : g;  // a dropped channel copies g unflushed
}

// ---------------------------------------------------------------- the gradient sums

constexpr int64_t kBlockRows = eigen_sum::kBlock;  // 32 sequences per leaf and channel
constexpr int kUnroll = 16;                        // rows loaded ahead per thread in pass 1
constexpr int kCombineThreadsLog = 8;              // pass 3 threads per channel, at most 2^8
static_assert((1 << kCombineThreadsLog) <= kThreadsPerBlock, "pass 3 block");

// Slot s of the level: node s / slots_per_node, its leaf s % slots_per_node (slots_per_node is 2
// when some node splits; the second slot of a node that does not split is empty).
__device__ inline bool SlotLeaf(int64_t rows, int depth, int slots_per_node, int64_t slot, eigen_sum::Leaf* leaf) {
  const int64_t j = slots_per_node == 2 ? slot >> 1 : slot;
  const int k = slots_per_node == 2 ? static_cast<int>(slot & 1) : 0;
  const eigen_sum::Leaf node = eigen_sum::NodeAt(rows, depth, j);
  if (eigen_sum::IsLeafRange(node.count)) {
    *leaf = node;
    return k == 0;
  }
  const int64_t left = eigen_sum::LeftCount(node.first, node.count);
  *leaf = k == 0 ? eigen_sum::Leaf{node.first, left} : eigen_sum::Leaf{node.first + left, node.count - left};
  return true;
}

// Rows of a leaf that go through the four accumulators (whole blocks of 32, if there are any).
__device__ inline int64_t BlockRows(int64_t count) {
  return count >= kBlockRows ? (count / kBlockRows) * kBlockRows : 0;
}

// Pass 1: thread (slot, t), t = q * channels + c, adds the leaf's rows q, q + 32, ... below
// BlockRows (its accumulator lane), writes dx of those elements and of the leftover row
// BlockRows + q, and stores its two accumulators at part_*[slot * sequences * channels + t].
// `sequences` is 32, or the row count when there are fewer rows (then no leaf has blocks and
// pass 1 only writes dx).
template <class Ranges>
__global__ void __launch_bounds__(kThreadsPerBlock)
    GradientLeafPass(const float* __restrict__ g, const float* __restrict__ x, float* __restrict__ dx, int64_t rows,
                     int64_t channels, int64_t sequences, int depth, int slots_per_node, Ranges ranges,
                     float* __restrict__ part_min, float* __restrict__ part_max) {
  const int64_t per_slot = sequences * channels;
  const int64_t items = (static_cast<int64_t>(slots_per_node) << depth) * per_slot;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; id < items; id += stride) {
    const int64_t slot = id / per_slot;
    const int64_t t = id - slot * per_slot;
    eigen_sum::Leaf leaf;
    if (!SlotLeaf(rows, depth, slots_per_node, slot, &leaf)) continue;
    const int64_t q = t / channels;
    const int64_t c = t - q * channels;
    const ChannelRange r = ranges(c);
    const int64_t blocks = BlockRows(leaf.count);
    const int64_t step = kBlockRows * channels;  // 32 rows
    float acc_min = 0.0f, acc_max = 0.0f;
    int64_t o = q;
    int64_t e = leaf.first * channels + t;  // element (leaf.first + o, c)
    // Batches of kUnroll rows, the next batch's loads issued before the current one is added, so
    // that each thread keeps loads in flight while its two chains of additions run.
    constexpr int64_t kBatch = kUnroll * kBlockRows;
    if (o + kBatch - kBlockRows < blocks) {
      float gv[kUnroll], xv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        gv[u] = g[e + u * step];
        xv[u] = x[e + u * step];
      }
      for (;;) {
        const bool more = o + 2 * kBatch - kBlockRows < blocks;
        float gn[kUnroll], xn[kUnroll];
        if (more) {
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            gn[u] = g[e + (kUnroll + u) * step];
            xn[u] = x[e + (kUnroll + u) * step];
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          dx[e + u * step] = GradientValue(r, gv[u], xv[u]);
          acc_min = acc_min + FakeQuantBelowTerm(gv[u], xv[u], r.lo);
          acc_max = acc_max + FakeQuantAboveTerm(gv[u], xv[u], r.hi);
        }
        o += kBatch;
        e += kUnroll * step;
        if (!more) break;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          gv[u] = gn[u];
          xv[u] = xn[u];
        }
      }
    }
    for (; o < blocks; o += kBlockRows, e += step) {
      const float gv = g[e], xv = x[e];
      dx[e] = GradientValue(r, gv, xv);
      acc_min = acc_min + FakeQuantBelowTerm(gv, xv, r.lo);
      acc_max = acc_max + FakeQuantAboveTerm(gv, xv, r.hi);
    }
    if (FakeQuantIsNan(acc_min) || FakeQuantIsNan(acc_max)) {
      // A NaN chain again with x86's NaN rules, so that it ends with the CPU's NaN (eigen_sum.h).
      acc_min = acc_max = 0.0f;
      for (int64_t o2 = q, e2 = leaf.first * channels + t; o2 < blocks; o2 += kBlockRows, e2 += step) {
        const float gv = g[e2], xv = x[e2];
        acc_min = X86::Add(acc_min, FakeQuantBelowTerm<X86>(gv, xv, r.lo));
        acc_max = X86::Add(acc_max, FakeQuantAboveTerm<X86>(gv, xv, r.hi));
      }
    }
    const int64_t rest = blocks + q;  // fewer than 32 rows follow the blocks: one each
    if (rest < leaf.count) {
      const int64_t e_rest = (leaf.first + rest) * channels + c;
      dx[e_rest] = GradientValue(r, g[e_rest], x[e_rest]);
    }
    part_min[id] = acc_min;
    part_max[id] = acc_max;
  }
}

struct SumPair {
  float min, max;
};

// eigen_sum::PacketLeaf's end for one leaf and channel, from pass 1's accumulators: the folds,
// the remaining whole packets, the scalar tail, tail + horizontal sum. With x86's NaN rules (a few
// operations per leaf), so that a NaN sum ends with the CPU's NaN.
__device__ SumPair FinishLeaf(const float* __restrict__ g, const float* __restrict__ x, int64_t channels, int64_t c,
                              const ChannelRange& r, eigen_sum::Leaf leaf, int64_t slot,
                              const float* __restrict__ part_min, const float* __restrict__ part_max) {
  // Only a leaf with blocks reads pass 1's accumulators; it has 32 or more rows, so pass 1 ran with
  // 32 sequences per slot.
  constexpr int P = static_cast<int>(eigen_sum::kPacket);
  const int64_t blocks = BlockRows(leaf.count);
  const int64_t whole = (leaf.count / P) * P;
  float lanes_min[P], lanes_max[P];
  if (blocks > 0) {
    const int64_t base = slot * kBlockRows * channels + c;
#pragma unroll
    for (int l = 0; l < P; ++l) {
      const int64_t k0 = base + l * channels, k1 = k0 + P * channels, k2 = k1 + P * channels, k3 = k2 + P * channels;
      lanes_min[l] = eigen_sum::FoldAccumulators<X86>(part_min[k0], part_min[k1], part_min[k2], part_min[k3]);
      lanes_max[l] = eigen_sum::FoldAccumulators<X86>(part_max[k0], part_max[k1], part_max[k2], part_max[k3]);
    }
  } else {
#pragma unroll
    for (int l = 0; l < P; ++l) lanes_min[l] = lanes_max[l] = 0.0f;
  }
  // At most three whole packets follow the blocks (row o goes to lane o % 8; blocks is a multiple of 8).
#pragma unroll
  for (int p = 0; p < 3; ++p) {
    const int64_t o0 = blocks + p * P;
    if (o0 + P > whole) break;
#pragma unroll
    for (int l = 0; l < P; ++l) {
      const int64_t e = (leaf.first + o0 + l) * channels + c;
      const float gv = g[e], xv = x[e];
      lanes_min[l] = X86::Add(lanes_min[l], FakeQuantBelowTerm<X86>(gv, xv, r.lo));
      lanes_max[l] = X86::Add(lanes_max[l], FakeQuantAboveTerm<X86>(gv, xv, r.hi));
    }
  }
  float tail_min = 0.0f, tail_max = 0.0f;
  for (int64_t o = whole; o < leaf.count; ++o) {
    const int64_t e = (leaf.first + o) * channels + c;
    const float gv = g[e], xv = x[e];
    tail_min = X86::Add(tail_min, FakeQuantBelowTerm<X86>(gv, xv, r.lo));
    tail_max = X86::Add(tail_max, FakeQuantAboveTerm<X86>(gv, xv, r.hi));
  }
  return {X86::Add(tail_min, eigen_sum::HorizontalSum<X86>(lanes_min)),
          X86::Add(tail_max, eigen_sum::HorizontalSum<X86>(lanes_max))};
}

// Pass 2: thread (node j, channel c) writes the node's sums at node_*[j * channels + c].
template <class Ranges>
__global__ void __launch_bounds__(kThreadsPerBlock)
    GradientNodePass(const float* __restrict__ g, const float* __restrict__ x, int64_t rows, int64_t channels,
                     int depth, int slots_per_node, Ranges ranges, const float* __restrict__ part_min,
                     const float* __restrict__ part_max, float* __restrict__ node_min, float* __restrict__ node_max) {
  const int64_t items = (static_cast<int64_t>(1) << depth) * channels;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; id < items; id += stride) {
    const int64_t j = id / channels;
    const int64_t c = id - j * channels;
    const ChannelRange r = ranges(c);
    const eigen_sum::Leaf node = eigen_sum::NodeAt(rows, depth, j);
    const int64_t slot = j * slots_per_node;
    SumPair sums;
    if (eigen_sum::IsLeafRange(node.count)) {
      sums = FinishLeaf(g, x, channels, c, r, node, slot, part_min, part_max);
    } else {
      const int64_t left = eigen_sum::LeftCount(node.first, node.count);
      const SumPair a = FinishLeaf(g, x, channels, c, r, {node.first, left}, slot, part_min, part_max);
      const SumPair b =
          FinishLeaf(g, x, channels, c, r, {node.first + left, node.count - left}, slot + 1, part_min, part_max);
      sums = {eigen_sum::CombineHalves<X86>(a.min, b.min), eigen_sum::CombineHalves<X86>(a.max, b.max)};
    }
    node_min[id] = sums.min;
    node_max[id] = sums.max;
  }
}

// Pass 3: 2^log_threads threads per channel; thread p reduces nodes [p * 2^log_group, (p + 1) *
// 2^log_group) of its channel (log_group = depth - log_threads) with a stack (a binary counter: after
// value k, merge once per trailing zero bit of k + 1), then the block finishes the tree over the
// threads' values level by level. dmin/dmax of a dropped channel are 0.
template <class Ranges>
__global__ void __launch_bounds__(kThreadsPerBlock)
    GradientCombinePass(const float* __restrict__ node_min, const float* __restrict__ node_max, int64_t channels,
                        int depth, int log_threads, Ranges ranges, float* __restrict__ dmin,
                        float* __restrict__ dmax) {
  __shared__ float tree_min[kThreadsPerBlock], tree_max[kThreadsPerBlock];
  const int threads = 1 << log_threads;
  const int channels_per_block = kThreadsPerBlock >> log_threads;
  const int local = static_cast<int>(threadIdx.x);
  const int group_in_block = local >> log_threads;
  const int p = local & (threads - 1);
  const int64_t c = static_cast<int64_t>(blockIdx.x) * channels_per_block + group_in_block;
  const int log_group = depth - log_threads;
  float v_min = 0.0f, v_max = 0.0f;
  if (c < channels) {
    constexpr int kStack = 64;
    float stack_min[kStack], stack_max[kStack];
    int top = 0;
    const int64_t group = static_cast<int64_t>(1) << log_group;
    const int64_t begin = static_cast<int64_t>(p) << log_group;
    for (int64_t k = 0; k < group; ++k) {
      float a_min = node_min[(begin + k) * channels + c];
      float a_max = node_max[(begin + k) * channels + c];
      for (int64_t m = k + 1; (m & 1) == 0; m >>= 1) {
        --top;
        a_min = eigen_sum::CombineHalves<X86>(stack_min[top], a_min);
        a_max = eigen_sum::CombineHalves<X86>(stack_max[top], a_max);
      }
      stack_min[top] = a_min;
      stack_max[top] = a_max;
      ++top;
    }
    v_min = stack_min[0];  // a power-of-two group leaves one value
    v_max = stack_max[0];
  }
  tree_min[local] = v_min;
  tree_max[local] = v_max;
  __syncthreads();
  const int base = group_in_block << log_threads;
  for (int width = threads >> 1; width >= 1; width >>= 1) {
    float a_min = 0.0f, a_max = 0.0f;
    if (p < width) {
      a_min = eigen_sum::CombineHalves<X86>(tree_min[base + 2 * p], tree_min[base + 2 * p + 1]);
      a_max = eigen_sum::CombineHalves<X86>(tree_max[base + 2 * p], tree_max[base + 2 * p + 1]);
    }
    __syncthreads();
    if (p < width) {
      tree_min[base + p] = a_min;
      tree_max[base + p] = a_max;
    }
    __syncthreads();
  }
  if (p == 0 && c < channels) {
    const bool keep = ranges.Keep(c);
    dmin[c] = keep ? tree_min[base] : 0.0f;
    dmax[c] = keep ? tree_max[base] : 0.0f;
  }
}

unsigned BlocksFor(int64_t items) {
  // Grid-stride kernels: GridFor bounds the grid; larger problems loop.
  return GridFor(items);
}

// dx and the sums over x viewed as [rows, channels] (rows > 0, channels > 0).
template <class Ranges>
void LaunchGradient(const float* g, const float* x, int64_t rows, int64_t channels, Ranges ranges, float* dx,
                    float* dmin, float* dmax, const CudaLaunch& launch) {
  eigen_sum::TreeLevels levels;
  if (!eigen_sum::TreeLevelsOf(rows, &levels)) {
    throw DeviceError("FakeQuant gradient: unsupported summation tree for " + std::to_string(rows) + " rows");
  }
  const int slots_per_node = levels.any_split ? 2 : 1;
  const int64_t nodes = static_cast<int64_t>(1) << levels.depth;
  const int64_t sequences = rows < kBlockRows ? rows : kBlockRows;  // fewer rows: one leaf without blocks
  const int64_t part_items = nodes * slots_per_node * sequences * channels;
  const int64_t node_items = nodes * channels;
  if (launch.scratch == nullptr) throw DeviceError("FakeQuant gradient: no scratch allocator");
  float* scratch = launch.scratch->Array<float>(static_cast<std::size_t>(2 * part_items + 2 * node_items));
  float* part_min = scratch;
  float* part_max = part_min + part_items;
  float* node_min = part_max + part_items;
  float* node_max = node_min + node_items;
  const cudaStream_t stream = StreamOf(launch);

  GradientLeafPass<Ranges><<<BlocksFor(part_items), kThreadsPerBlock, 0, stream>>>(
      g, x, dx, rows, channels, sequences, levels.depth, slots_per_node, ranges, part_min, part_max);
  CheckLaunch("FakeQuant gradient (leaf pass)");
  GradientNodePass<Ranges><<<BlocksFor(node_items), kThreadsPerBlock, 0, stream>>>(
      g, x, rows, channels, levels.depth, slots_per_node, ranges, part_min, part_max, node_min, node_max);
  CheckLaunch("FakeQuant gradient (node pass)");
  const int log_threads = levels.depth < kCombineThreadsLog ? levels.depth : kCombineThreadsLog;
  const int64_t channels_per_block = kThreadsPerBlock >> log_threads;
  const int64_t combine_blocks = (channels + channels_per_block - 1) / channels_per_block;
  if (combine_blocks > std::numeric_limits<int>::max()) throw DeviceError("FakeQuant gradient: too many channels");
  GradientCombinePass<Ranges><<<static_cast<unsigned>(combine_blocks), kThreadsPerBlock, 0, stream>>>(
      node_min, node_max, channels, levels.depth, log_threads, ranges, dmin, dmax);
  CheckLaunch("FakeQuant gradient (combine pass)");
}

}  // namespace

void FakeQuantForward(const float* x, float* y, int64_t n, const FakeQuantGrid& grid, bool use_division,
                      const CudaLaunch& launch) {
  if (use_division) {
    LaunchUnary(x, y, n, DivideOp{grid}, launch, "FakeQuant forward (divide)");
  } else {
    LaunchUnary(x, y, n, MultiplyOp{grid}, launch, "FakeQuant forward (multiply)");
  }
}

void FakeQuantVarsForward(const float* x, float* y, int64_t n, float min, float max, int quant_min, int quant_max,
                          const CudaLaunch& launch) {
  if (FakeQuantRangeIsZero(min, max)) {
    ZeroFloats(y, n, launch, "FakeQuantWithMinMaxVars: zero range");  // +0.0f is all-zero bits
    return;
  }
  const FakeQuantGrid grid = NudgeFakeQuantRange(min, max, quant_min, quant_max);  // on the host, once
  FakeQuantForward(x, y, n, grid, /*use_division=*/true, launch);
}

void FakeQuantPerChannelForward(const float* x, float* y, int64_t outer, int64_t channels, int64_t inner,
                                const float* min, const float* max, int quant_min, int quant_max,
                                const CudaLaunch& launch) {
  if (outer <= 0 || channels <= 0 || inner <= 0) return;
  if (inner > 1) {
    PerChannelInnerForwardKernel<<<GridFor(outer * channels * inner), kThreadsPerBlock, 0, StreamOf(launch)>>>(
        x, y, outer * channels * inner, channels, inner, min, max, quant_min, quant_max);
    CheckLaunch("FakeQuantWithMinMaxVarsPerChannel");
    return;
  }
  const int64_t rows = outer;
  const bool vectorized = channels % 4 == 0 && Aligned16(x) && Aligned16(y);
  const int width = vectorized ? 4 : 1;
  const int64_t units_per_row = channels / width;
  const int64_t units = rows * units_per_row;
  // About 2^18 threads (a full H100 at 2048 per SM), each on one column of units.
  constexpr int64_t kTargetThreads = int64_t(1) << 18;
  int64_t rows_at_once = (kTargetThreads + units_per_row - 1) / units_per_row;
  if (rows_at_once > rows) rows_at_once = rows;
  const int64_t threads = units_per_row * rows_at_once;
  const int64_t blocks = (threads + kThreadsPerBlock - 1) / kThreadsPerBlock;
  if (blocks > std::numeric_limits<int>::max()) {
    throw DeviceError("FakeQuantWithMinMaxVarsPerChannel: too many channels");
  }
  const cudaStream_t stream = StreamOf(launch);
  if (vectorized) {
    PerChannelForwardKernel<4><<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(
        x, y, units, units_per_row, threads, min, max, quant_min, quant_max);
  } else {
    PerChannelForwardKernel<1><<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(
        x, y, units, units_per_row, threads, min, max, quant_min, quant_max);
  }
  CheckLaunch("FakeQuantWithMinMaxVarsPerChannel");
}

void FakeQuantGradientInput(const float* g, const float* x, float* dx, int64_t n, const FakeQuantGrid& grid,
                            const CudaLaunch& launch) {
  if (n <= 0) return;
  const bool vectorized = Aligned16(g) && Aligned16(x) && Aligned16(dx);
  BinaryKernel<<<GridFor(vectorized ? (n + 3) / 4 : n), kThreadsPerBlock, 0, StreamOf(launch)>>>(
      g, x, dx, n, vectorized, MaskOp{grid.nudged_min, grid.nudged_max});
  CheckLaunch("FakeQuant gradient (input)");
}

void FakeQuantVarsGradient(const float* g, const float* x, int64_t n, float min, float max, int quant_min,
                           int quant_max, float* dx, float* dmin, float* dmax, const CudaLaunch& launch) {
  if (FakeQuantRangeIsZero(min, max) || n <= 0) {
    // dx = g (a copy: subnormals stay, as in TF's Eigen copy), dmin = dmax = +0.
    if (n > 0) {
      CheckCuda(cudaMemcpyAsync(dx, g, static_cast<std::size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice,
                                StreamOf(launch)),
                "FakeQuantWithMinMaxVarsGradient: copy");
    }
    ZeroFloats(dmin, 1, launch, "FakeQuantWithMinMaxVarsGradient: zero sums");
    ZeroFloats(dmax, 1, launch, "FakeQuantWithMinMaxVarsGradient: zero sums");
    return;
  }
  const FakeQuantGrid grid = NudgeFakeQuantRange(min, max, quant_min, quant_max);  // on the host, once
  LaunchGradient(g, x, n, 1, UniformRanges{grid.nudged_min, grid.nudged_max}, dx, dmin, dmax, launch);
}

void FakeQuantPerChannelGradient(const float* g, const float* x, int64_t outer, int64_t channels, int64_t inner,
                                 const float* min, const float* max, int quant_min, int quant_max, float* dx,
                                 float* dmin, float* dmax, const CudaLaunch& launch) {
  if (channels <= 0) return;
  const int64_t rows = inner > 0 ? outer * inner : 0;
  if (rows <= 0) {  // every sum is the empty leaf's +0 (0 for a dropped channel too)
    ZeroFloats(dmin, channels, launch, "FakeQuantWithMinMaxVarsPerChannelGradient: zero sums");
    ZeroFloats(dmax, channels, launch, "FakeQuantWithMinMaxVarsPerChannelGradient: zero sums");
    return;
  }
  const PerChannelRanges ranges{min, max, quant_min, quant_max};
  if (inner == 1) {
    LaunchGradient(g, x, rows, channels, ranges, dx, dmin, dmax, launch);
    return;
  }
  // An axis before the last dim: the passes index element (row, c) as row * channels + c, so g and x are
  // copied channels-last, the last-dim gradient runs on the copies, and dx is copied back. Each channel's
  // terms keep their order (row = o * inner + i), so the sums are the CPU kernel's bit for bit.
  const int64_t n = rows * channels;
  if (launch.scratch == nullptr) throw DeviceError("FakeQuantWithMinMaxVarsPerChannelGradient: no scratch allocator");
  float* g_last = launch.scratch->Array<float>(static_cast<std::size_t>(3 * n));
  float* x_last = g_last + n;
  float* dx_last = x_last + n;
  const cudaStream_t stream = StreamOf(launch);
  ChannelsLastCopyKernel<true><<<GridFor(n), kThreadsPerBlock, 0, stream>>>(g, g_last, n, channels, inner);
  CheckLaunch("FakeQuantWithMinMaxVarsPerChannelGradient (gradients to channels-last)");
  ChannelsLastCopyKernel<true><<<GridFor(n), kThreadsPerBlock, 0, stream>>>(x, x_last, n, channels, inner);
  CheckLaunch("FakeQuantWithMinMaxVarsPerChannelGradient (inputs to channels-last)");
  LaunchGradient(g_last, x_last, rows, channels, ranges, dx_last, dmin, dmax, launch);
  ChannelsLastCopyKernel<false><<<GridFor(n), kThreadsPerBlock, 0, stream>>>(dx_last, dx, n, channels, inner);
  CheckLaunch("FakeQuantWithMinMaxVarsPerChannelGradient (dx back from channels-last)");
}

}  // namespace cuda
}  // namespace tfops
