// FakeQuant CPU kernels. Every float operation is one IEEE binary32 operation in the order TF's
// Eigen expressions perform it (the library is built with -ffp-contract=off, so no FMA fusing); the
// per-element arithmetic is the TFOPS_HD functions of fake_quant.h, shared with the CUDA kernels.
#include "kernels/fake_quant.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/eigen_sum.h"
#include "kernels/simd.h"

namespace tfops {

namespace {

// Elements per parallel task: a shape-only choice, large enough to amortize scheduling.
constexpr int64_t kGrain = 1 << 15;

// The vectorized loops: one copy per ISA (simd.h), the active one called.
TFOPS_ALWAYS_INLINE void ForwardMultiplyBody(const float* x, float* y, int64_t n, float lo, float hi, float inv_scale,
                                             float quant_zero, float scale) {
  for (int64_t i = 0; i < n; ++i) y[i] = FakeQuantMultiply(x[i], lo, hi, inv_scale, quant_zero, scale);
}
TFOPS_ISA_VARIANTS(ForwardMultiply,
                   (const float* x, float* y, int64_t n, float lo, float hi, float inv_scale, float quant_zero,
                    float scale),
                   (x, y, n, lo, hi, inv_scale, quant_zero, scale), ForwardMultiplyBody)

TFOPS_ALWAYS_INLINE void ForwardDivideBody(const float* x, float* y, int64_t n, float lo, float hi, float scale,
                                           float quant_zero) {
  for (int64_t i = 0; i < n; ++i) y[i] = FakeQuantDivide(x[i], lo, hi, scale, quant_zero);
}
TFOPS_ISA_VARIANTS(ForwardDivide, (const float* x, float* y, int64_t n, float lo, float hi, float scale,
                                   float quant_zero),
                   (x, y, n, lo, hi, scale, quant_zero), ForwardDivideBody)

// A grid with a NaN (from a NaN or infinite range) is the one case where an operation of the
// forward can meet two NaNs, and which one x86 returns then depends on the operand order the
// compiler picked, which differs between the ISA copies. Such grids take this scalar loop, whose
// operations return the NaN that FakeQuantX86Ops spells out (the first operand's), on every CPU;
// the CUDA kernels recompute NaN elements with the same operations. With a NaN-free grid each
// operation has at most one NaN operand, so the vectorized loops give the same NaNs in any order.
void ForwardNanGrid(const float* x, float* y, int64_t n, const FakeQuantGrid& g, bool use_division) {
  for (int64_t i = 0; i < n; ++i) {
    y[i] = use_division
               ? FakeQuantDivide<FakeQuantX86Ops>(x[i], g.nudged_min, g.nudged_max, g.scale, g.quant_zero)
               : FakeQuantMultiply<FakeQuantX86Ops>(x[i], g.nudged_min, g.nudged_max, g.inv_scale, g.quant_zero,
                                                    g.scale);
  }
}

TFOPS_ALWAYS_INLINE void GradientInRangeBody(const float* g, const float* x, float* dx, int64_t n, float lo,
                                             float hi) {
  for (int64_t i = 0; i < n; ++i) dx[i] = FakeQuantMasked(g[i], x[i], lo, hi);
}
TFOPS_ISA_VARIANTS(GradientInRange, (const float* g, const float* x, float* dx, int64_t n, float lo, float hi),
                   (g, x, dx, n, lo, hi), GradientInRangeBody)

// Per-channel grids as arrays, so rows vectorize across channels. keep[c] is 0 for a channel whose
// range is min == max == 0 (its output is 0, its dx is g and its sums are 0), else 1.
struct ChannelGrids {
  std::vector<float> lo, hi, inv_scale, quant_zero, scale, keep;
  bool any_nan = false;  // some kept channel's grid has a NaN (see ForwardNanGrid)
  ChannelGrids(const float* min, const float* max, int64_t channels, int quant_min, int quant_max)
      : lo(channels, 0.0f), hi(lo), inv_scale(lo), quant_zero(lo), scale(lo), keep(lo) {
    for (int64_t c = 0; c < channels; ++c) {
      if (FakeQuantRangeIsZero(min[c], max[c])) continue;
      const FakeQuantGrid grid = NudgeFakeQuantRange(min[c], max[c], quant_min, quant_max);
      any_nan = any_nan || FakeQuantGridHasNan(grid);
      lo[c] = grid.nudged_min;
      hi[c] = grid.nudged_max;
      inv_scale[c] = grid.inv_scale;
      quant_zero[c] = grid.quant_zero;
      scale[c] = grid.scale;
      keep[c] = 1.0f;
    }
  }
};

TFOPS_ALWAYS_INLINE void PerChannelForwardRowBody(const float* __restrict x, float* __restrict y, int64_t n,
                                                  const float* lo, const float* hi, const float* inv_scale,
                                                  const float* quant_zero, const float* scale, const float* keep) {
  for (int64_t c = 0; c < n; ++c) {
    const float v = FakeQuantMultiply(x[c], lo[c], hi[c], inv_scale[c], quant_zero[c], scale[c]);
    y[c] = keep[c] != 0.0f ? v : 0.0f;
  }
}
TFOPS_ISA_VARIANTS(PerChannelForwardRowImpl,
                   (const float* __restrict x, float* __restrict y, int64_t n, const float* lo, const float* hi,
                    const float* inv_scale, const float* quant_zero, const float* scale, const float* keep),
                   (x, y, n, lo, hi, inv_scale, quant_zero, scale, keep), PerChannelForwardRowBody)

inline void PerChannelForwardRow(const float* x, float* y, int64_t n, const ChannelGrids& g) {
  if (g.any_nan) {
    for (int64_t c = 0; c < n; ++c) {
      const float v = FakeQuantMultiply<FakeQuantX86Ops>(x[c], g.lo[c], g.hi[c], g.inv_scale[c], g.quant_zero[c],
                                                         g.scale[c]);
      y[c] = g.keep[c] != 0.0f ? v : 0.0f;
    }
    return;
  }
  PerChannelForwardRowImpl(x, y, n, g.lo.data(), g.hi.data(), g.inv_scale.data(), g.quant_zero.data(),
                           g.scale.data(), g.keep.data());
}

// One row of the per-channel gradient over n channels: dx, and each channel's terms added into
// its accumulator lanes sum_min[c], sum_max[c].
TFOPS_ALWAYS_INLINE void PerChannelGradientRowBody(const float* __restrict g, const float* __restrict x,
                                                   float* __restrict dx, int64_t n, const float* lo, const float* hi,
                                                   const float* keep, float* __restrict sum_min,
                                                   float* __restrict sum_max) {
  for (int64_t c = 0; c < n; ++c) {
    const float gv = g[c], xv = x[c];
    // As GradientInRange; a min == max == 0 channel copies g unflushed, as TF's Eigen copy does.
    const float masked = FakeQuantMasked(gv, xv, lo[c], hi[c]);
    dx[c] = keep[c] != 0.0f ? masked : gv;
    sum_min[c] = sum_min[c] + FakeQuantBelowTerm(gv, xv, lo[c]);
    sum_max[c] = sum_max[c] + FakeQuantAboveTerm(gv, xv, hi[c]);
  }
}
TFOPS_ISA_VARIANTS(PerChannelGradientRow,
                   (const float* __restrict g, const float* __restrict x, float* __restrict dx, int64_t n,
                    const float* lo, const float* hi, const float* keep, float* __restrict sum_min,
                    float* __restrict sum_max),
                   (g, x, dx, n, lo, hi, keep, sum_min, sum_max), PerChannelGradientRowBody)

constexpr int64_t kChannelBlock = 64;

// eigen_sum::PacketLeaf over the rows of one leaf, for channels [c0, c0 + n) at once: row o of the
// leaf goes to lane o % 8 of accumulator (o / 8) % 4 while whole blocks of 32 rows last, then to
// lane o % 8 of the first accumulator (after the other three are folded into it), then to the tail.
void PerChannelGradientLeaf(const float* g, const float* x, float* dx, int64_t channels, int64_t c0, int64_t n,
                            eigen_sum::Leaf leaf, const ChannelGrids& grids, float* out_min, float* out_max) {
  constexpr int64_t P = eigen_sum::kPacket;
  float acc_min[4][P][kChannelBlock] = {}, acc_max[4][P][kChannelBlock] = {};
  float tail_min[kChannelBlock] = {}, tail_max[kChannelBlock] = {};
  const float* lo = grids.lo.data() + c0;
  const float* hi = grids.hi.data() + c0;
  const float* keep = grids.keep.data() + c0;
  auto row = [&](int64_t o, float* sum_min, float* sum_max) {
    const int64_t base = (leaf.first + o) * channels + c0;
    PerChannelGradientRow(g + base, x + base, dx + base, n, lo, hi, keep, sum_min, sum_max);
  };
  const int64_t blocks = leaf.count >= 4 * P ? (leaf.count / (4 * P)) * (4 * P) : 0;
  const int64_t whole = (leaf.count / P) * P;
  for (int64_t o = 0; o < blocks; ++o) row(o, acc_min[(o / P) % 4][o % P], acc_max[(o / P) % 4][o % P]);
  if (blocks > 0) {
    for (int64_t l = 0; l < P; ++l) {
      for (int64_t c = 0; c < n; ++c) {
        acc_min[0][l][c] = eigen_sum::FoldAccumulators(acc_min[0][l][c], acc_min[1][l][c], acc_min[2][l][c],
                                                       acc_min[3][l][c]);
        acc_max[0][l][c] = eigen_sum::FoldAccumulators(acc_max[0][l][c], acc_max[1][l][c], acc_max[2][l][c],
                                                       acc_max[3][l][c]);
      }
    }
  }
  for (int64_t o = blocks; o < whole; ++o) row(o, acc_min[0][o % P], acc_max[0][o % P]);
  for (int64_t o = whole; o < leaf.count; ++o) row(o, tail_min, tail_max);
  for (int64_t c = 0; c < n; ++c) {
    float lanes_min[P], lanes_max[P];
    for (int64_t l = 0; l < P; ++l) {
      lanes_min[l] = acc_min[0][l][c];
      lanes_max[l] = acc_max[0][l][c];
    }
    out_min[c] = tail_min[c] + eigen_sum::HorizontalSum(lanes_min);
    out_max[c] = tail_max[c] + eigen_sum::HorizontalSum(lanes_max);
    // A NaN sum again with x86's NaN rules in the written operand order (see eigen_sum.h).
    if (FakeQuantIsNan(out_min[c]) || FakeQuantIsNan(out_max[c])) {
      const int64_t column = c0 + c;
      const float lo_c = lo[c], hi_c = hi[c];
      out_min[c] = eigen_sum::PacketLeaf<FakeQuantX86Ops>(
          [&](int64_t r) {
            const int64_t e = r * channels + column;
            return FakeQuantBelowTerm<FakeQuantX86Ops>(g[e], x[e], lo_c);
          },
          leaf.first, leaf.count);
      out_max[c] = eigen_sum::PacketLeaf<FakeQuantX86Ops>(
          [&](int64_t r) {
            const int64_t e = r * channels + column;
            return FakeQuantAboveTerm<FakeQuantX86Ops>(g[e], x[e], hi_c);
          },
          leaf.first, leaf.count);
    }
  }
}

// The per-channel gradient's last step, whatever the layout: each channel's leaf sums (leaf-major,
// `channels` apart) folded by Eigen's tree over `rows` terms; a channel TF skips gets zero sums.
void CombineChannelLeaves(const std::vector<float>& leaf_min, const std::vector<float>& leaf_max, int64_t channels,
                          int64_t rows, const ChannelGrids& grids, float* dmin, float* dmax) {
  ScopedFlushDenormals flush;
  for (int64_t c = 0; c < channels; ++c) {
    const float* next_min = leaf_min.data() + c;  // TreeCombine advances these leaf by leaf
    const float* next_max = leaf_max.data() + c;
    const float sum_min = eigen_sum::TreeCombine<FakeQuantX86Ops>(0, rows, next_min, channels);
    const float sum_max = eigen_sum::TreeCombine<FakeQuantX86Ops>(0, rows, next_max, channels);
    const bool keep = grids.keep[c] != 0.0f;
    dmin[c] = keep ? sum_min : 0.0f;
    dmax[c] = keep ? sum_max : 0.0f;
  }
}

// The per-channel gradient over [outer, channels, inner] with inner > 1 (an `axis` other than the last
// dim). dx block by block with the element-wise loop; channel c's terms are its elements in memory
// order, r = o * inner + i for element (o, c, i), summed in the same Eigen tree and leaf order as a
// column of the inner == 1 view, so the sums equal that view's on the transposed input.
void PerChannelGradientStrided(const float* g, const float* x, int64_t outer, int64_t channels, int64_t inner,
                               const ChannelGrids& grids, float* dx, float* dmin, float* dmax,
                               const Parallel& parallel) {
  const int64_t grain_blocks = std::max<int64_t>(1, kGrain / inner);
  parallel.ForRange(outer * channels, grain_blocks, [&](int64_t begin, int64_t end) {
    ScopedFlushDenormals flush;
    for (int64_t b = begin; b < end; ++b) {
      const int64_t c = b % channels;
      const int64_t e = b * inner;
      if (grids.keep[c] != 0.0f) {
        GradientInRange(g + e, x + e, dx + e, inner, grids.lo[c], grids.hi[c]);
      } else {
        std::copy(g + e, g + e + inner, dx + e);  // unflushed, as the inner == 1 path copies it
      }
    }
  });
  const int64_t rows = outer * inner;
  std::vector<eigen_sum::Leaf> leaves;
  eigen_sum::TreeLeaves(0, rows, &leaves);
  std::vector<float> leaf_min(leaves.size() * channels), leaf_max(leaf_min.size());
  parallel.For(leaves.size() * channels, [&](std::size_t task) {
    ScopedFlushDenormals flush;
    const std::size_t leaf_index = task / channels;
    const int64_t c = static_cast<int64_t>(task % channels);
    const eigen_sum::Leaf leaf = leaves[leaf_index];
    const float lo = grids.lo[c], hi = grids.hi[c];
    auto element = [&](int64_t r) { return (r / inner) * channels * inner + c * inner + r % inner; };
    float sum_min = eigen_sum::PacketLeaf(
        [&](int64_t r) { const int64_t e = element(r); return FakeQuantBelowTerm(g[e], x[e], lo); }, leaf.first,
        leaf.count);
    float sum_max = eigen_sum::PacketLeaf(
        [&](int64_t r) { const int64_t e = element(r); return FakeQuantAboveTerm(g[e], x[e], hi); }, leaf.first,
        leaf.count);
    // A NaN sum again with x86's NaN rules in the written operand order (see eigen_sum.h).
    if (FakeQuantIsNan(sum_min)) {
      sum_min = eigen_sum::PacketLeaf<FakeQuantX86Ops>(
          [&](int64_t r) { const int64_t e = element(r); return FakeQuantBelowTerm<FakeQuantX86Ops>(g[e], x[e], lo); },
          leaf.first, leaf.count);
    }
    if (FakeQuantIsNan(sum_max)) {
      sum_max = eigen_sum::PacketLeaf<FakeQuantX86Ops>(
          [&](int64_t r) { const int64_t e = element(r); return FakeQuantAboveTerm<FakeQuantX86Ops>(g[e], x[e], hi); },
          leaf.first, leaf.count);
    }
    leaf_min[leaf_index * channels + c] = sum_min;
    leaf_max[leaf_index * channels + c] = sum_max;
  });
  CombineChannelLeaves(leaf_min, leaf_max, channels, rows, grids, dmin, dmax);
}

}  // namespace

FakeQuantGrid NudgeFakeQuantRange(float min, float max, int quant_min, int quant_max) {
  ScopedFlushDenormals flush;
  // FakeQuantX86Ops: a NaN or infinite range gives the same grid NaNs whatever order the compiler
  // picks for the two-NaN product in quant_zero, and the same as the CUDA kernels' nudge.
  return NudgeFakeQuantGrid<FakeQuantX86Ops>(min, max, quant_min, quant_max);
}

void FakeQuantForward(const float* x, float* y, int64_t n, const FakeQuantGrid& grid, bool use_division,
                      const Parallel& parallel) {
  const bool nan_grid = FakeQuantGridHasNan(grid);
  parallel.ForRange(n, kGrain, [&](int64_t begin, int64_t end) {
    ScopedFlushDenormals flush;
    if (nan_grid) {
      ForwardNanGrid(x + begin, y + begin, end - begin, grid, use_division);
    } else if (use_division) {
      ForwardDivide(x + begin, y + begin, end - begin, grid.nudged_min, grid.nudged_max, grid.scale, grid.quant_zero);
    } else {
      ForwardMultiply(x + begin, y + begin, end - begin, grid.nudged_min, grid.nudged_max, grid.inv_scale,
                      grid.quant_zero, grid.scale);
    }
  });
}

void FakeQuantVarsForward(const float* x, float* y, int64_t n, float min, float max, int quant_min, int quant_max,
                          const Parallel& parallel) {
  if (FakeQuantRangeIsZero(min, max)) {
    parallel.ForRange(n, kGrain, [&](int64_t begin, int64_t end) { std::fill(y + begin, y + end, 0.0f); });
    return;
  }
  const FakeQuantGrid grid = NudgeFakeQuantRange(min, max, quant_min, quant_max);
  FakeQuantForward(x, y, n, grid, /*use_division=*/true, parallel);
}

void FakeQuantPerChannelForward(const float* x, float* y, int64_t outer, int64_t channels, int64_t inner,
                                const float* min, const float* max, int quant_min, int quant_max,
                                const Parallel& parallel) {
  if (channels <= 0 || outer <= 0 || inner <= 0) return;
  const ChannelGrids grids(min, max, channels, quant_min, quant_max);  // once; then rows are independent
  if (inner > 1) {
    // Each (outer, channel) block is `inner` contiguous elements of one grid: the element-wise loops.
    const int64_t grain_blocks = std::max<int64_t>(1, kGrain / inner);
    parallel.ForRange(outer * channels, grain_blocks, [&](int64_t begin, int64_t end) {
      ScopedFlushDenormals flush;
      for (int64_t b = begin; b < end; ++b) {
        const int64_t c = b % channels;
        const FakeQuantGrid grid{grids.lo[c], grids.hi[c], grids.scale[c], grids.inv_scale[c], grids.quant_zero[c]};
        if (grids.keep[c] == 0.0f) {
          std::fill(y + b * inner, y + (b + 1) * inner, 0.0f);
        } else if (FakeQuantGridHasNan(grid)) {
          ForwardNanGrid(x + b * inner, y + b * inner, inner, grid, /*use_division=*/false);
        } else {
          ForwardMultiply(x + b * inner, y + b * inner, inner, grid.nudged_min, grid.nudged_max, grid.inv_scale,
                          grid.quant_zero, grid.scale);
        }
      }
    });
    return;
  }
  const int64_t rows = outer;
  const int64_t grain_rows = std::max<int64_t>(1, kGrain / channels);
  parallel.ForRange(rows, grain_rows, [&](int64_t begin, int64_t end) {
    ScopedFlushDenormals flush;
    for (int64_t r = begin; r < end; ++r) PerChannelForwardRow(x + r * channels, y + r * channels, channels, grids);
  });
}

void FakeQuantGradientInput(const float* g, const float* x, float* dx, int64_t n, const FakeQuantGrid& grid,
                            const Parallel& parallel) {
  parallel.ForRange(n, kGrain, [&](int64_t begin, int64_t end) {
    ScopedFlushDenormals flush;
    GradientInRange(g + begin, x + begin, dx + begin, end - begin, grid.nudged_min, grid.nudged_max);
  });
}

void FakeQuantVarsGradient(const float* g, const float* x, int64_t n, float min, float max, int quant_min,
                           int quant_max, float* dx, float* dmin, float* dmax, const Parallel& parallel) {
  if (FakeQuantRangeIsZero(min, max)) {
    parallel.ForRange(n, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) dx[i] = g[i];
    });
    *dmin = 0.0f;
    *dmax = 0.0f;
    return;
  }
  const FakeQuantGrid grid = NudgeFakeQuantRange(min, max, quant_min, quant_max);
  const float lo = grid.nudged_min, hi = grid.nudged_max;
  // The sums' leaves are independent: each task writes its part of dx and sums its leaf twice while
  // the leaf is in cache; the leaf sums are then added in Eigen's tree order.
  std::vector<eigen_sum::Leaf> leaves;
  eigen_sum::TreeLeaves(0, n, &leaves);
  std::vector<float> sums(2 * leaves.size());
  parallel.For(leaves.size(), [&](std::size_t i) {
    ScopedFlushDenormals flush;
    const eigen_sum::Leaf leaf = leaves[i];
    GradientInRange(g + leaf.first, x + leaf.first, dx + leaf.first, leaf.count, lo, hi);
    float sum_min = eigen_sum::PacketLeaf([&](int64_t j) { return FakeQuantBelowTerm(g[j], x[j], lo); }, leaf.first,
                                          leaf.count);
    float sum_max = eigen_sum::PacketLeaf([&](int64_t j) { return FakeQuantAboveTerm(g[j], x[j], hi); },
                                          leaf.first, leaf.count);
    // A NaN sum again with x86's NaN rules in the written operand order (see eigen_sum.h).
    if (FakeQuantIsNan(sum_min)) {
      sum_min = eigen_sum::PacketLeaf<FakeQuantX86Ops>(
          [&](int64_t j) { return FakeQuantBelowTerm<FakeQuantX86Ops>(g[j], x[j], lo); }, leaf.first, leaf.count);
    }
    if (FakeQuantIsNan(sum_max)) {
      sum_max = eigen_sum::PacketLeaf<FakeQuantX86Ops>(
          [&](int64_t j) { return FakeQuantAboveTerm<FakeQuantX86Ops>(g[j], x[j], hi); }, leaf.first, leaf.count);
    }
    sums[2 * i] = sum_min;
    sums[2 * i + 1] = sum_max;
  });
  ScopedFlushDenormals flush;  // for the combining additions on this thread
  const float* next = sums.data();
  *dmin = eigen_sum::TreeCombine<FakeQuantX86Ops>(0, n, next, 2);
  next = sums.data() + 1;
  *dmax = eigen_sum::TreeCombine<FakeQuantX86Ops>(0, n, next, 2);
}

void FakeQuantPerChannelGradient(const float* g, const float* x, int64_t outer, int64_t channels, int64_t inner,
                                 const float* min, const float* max, int quant_min, int quant_max, float* dx,
                                 float* dmin, float* dmax, const Parallel& parallel) {
  if (channels <= 0) return;
  const ChannelGrids grids(min, max, channels, quant_min, quant_max);
  if (inner > 1) {
    PerChannelGradientStrided(g, x, outer, channels, inner, grids, dx, dmin, dmax, parallel);
    return;
  }
  const int64_t rows = inner == 1 ? outer : 0;  // inner == 0: no elements
  // Every channel's sums share one tree over the rows. Tasks are (leaf, block of channels); each
  // walks its rows in memory order, vectorized across the block's channels.
  std::vector<eigen_sum::Leaf> leaves;
  eigen_sum::TreeLeaves(0, rows, &leaves);
  const int64_t blocks = (channels + kChannelBlock - 1) / kChannelBlock;
  std::vector<float> leaf_min(leaves.size() * channels), leaf_max(leaf_min.size());
  parallel.For(leaves.size() * blocks, [&](std::size_t task) {
    ScopedFlushDenormals flush;
    const std::size_t leaf = task / blocks;
    const int64_t c0 = static_cast<int64_t>(task % blocks) * kChannelBlock;
    PerChannelGradientLeaf(g, x, dx, channels, c0, std::min(kChannelBlock, channels - c0), leaves[leaf], grids,
                           leaf_min.data() + leaf * channels + c0, leaf_max.data() + leaf * channels + c0);
  });
  CombineChannelLeaves(leaf_min, leaf_max, channels, rows, grids, dmin, dmax);
}

}  // namespace tfops
