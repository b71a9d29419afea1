// FakeQuant kernels. Every float operation below is one IEEE binary32 operation in the order TF's
// Eigen expressions perform it (the library is built with -ffp-contract=off, so no FMA fusing).
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

// TF stores the zero point as uint16 after std::round. A NaN zero point (min or max infinite) converts
// the way x86 does it (cvttss2si gives INT_MIN, whose low 16 bits are 0), without C++ UB.
uint16_t ZeroPointToUint16(float rounded) {
  if (!(rounded >= 0.0f && rounded <= 65535.0f)) return 0;
  return static_cast<uint16_t>(rounded);
}

// Eigen's cwiseMin/cwiseMax follow std::min/std::max: the first operand wins when a comparison
// involves NaN, so a NaN input stays NaN.
inline float ClampToGrid(float x, float lo, float hi) {
  float c = hi < x ? hi : x;
  return c < lo ? lo : c;
}

TFOPS_VECTOR_CLONES
void ForwardMultiply(const float* x, float* y, int64_t n, float lo, float hi, float inv_scale, float quant_zero,
                     float scale) {
  for (int64_t i = 0; i < n; ++i) {
    const float shifted = ClampToGrid(x[i], lo, hi) - lo;
    y[i] = std::floor((shifted * inv_scale - quant_zero) + 0.5f) * scale;
  }
}

TFOPS_VECTOR_CLONES
void ForwardDivide(const float* x, float* y, int64_t n, float lo, float hi, float scale, float quant_zero) {
  for (int64_t i = 0; i < n; ++i) {
    const float shifted = ClampToGrid(x[i], lo, hi) - lo;
    y[i] = std::floor((shifted / scale - quant_zero) + 0.5f) * scale;
  }
}

TFOPS_VECTOR_CLONES
void GradientInRange(const float* g, const float* x, float* dx, int64_t n, float lo, float hi) {
  for (int64_t i = 0; i < n; ++i) {
    const float mask = (x[i] >= lo && x[i] <= hi) ? 1.0f : 0.0f;
    dx[i] = g[i] * mask;
  }
}

}  // namespace

FakeQuantGrid NudgeFakeQuantRange(float min, float max, int quant_min, int quant_max) {
  ScopedFlushDenormals flush;
  const float qmin = static_cast<float>(quant_min);
  const float qmax = static_cast<float>(quant_max);
  FakeQuantGrid grid;
  grid.scale = (max - min) / (qmax - qmin);
  grid.inv_scale = (qmax - qmin) / (max - min);
  const float zero_point_from_min = qmin - min / grid.scale;
  uint16_t zero_point;
  if (zero_point_from_min < qmin) {
    zero_point = static_cast<uint16_t>(quant_min);
  } else if (zero_point_from_min > qmax) {
    zero_point = static_cast<uint16_t>(quant_max);
  } else {
    zero_point = ZeroPointToUint16(std::round(zero_point_from_min));
  }
  const float zp = static_cast<float>(zero_point);
  grid.nudged_min = (qmin - zp) * grid.scale;
  grid.nudged_max = (qmax - zp) * grid.scale;
  grid.quant_zero = std::floor(-grid.nudged_min * grid.inv_scale + 0.5f);
  return grid;
}

void FakeQuantForward(const float* x, float* y, int64_t n, const FakeQuantGrid& grid, bool use_division,
                      const Parallel& parallel) {
  parallel.ForRange(n, kGrain, [&](int64_t begin, int64_t end) {
    ScopedFlushDenormals flush;
    if (use_division) {
      ForwardDivide(x + begin, y + begin, end - begin, grid.nudged_min, grid.nudged_max, grid.scale, grid.quant_zero);
    } else {
      ForwardMultiply(x + begin, y + begin, end - begin, grid.nudged_min, grid.nudged_max, grid.inv_scale,
                      grid.quant_zero, grid.scale);
    }
  });
}

void FakeQuantPerChannelForward(const float* x, float* y, int64_t rows, int64_t channels, const float* min,
                                const float* max, int quant_min, int quant_max, const Parallel& parallel) {
  if (channels <= 0 || rows <= 0) return;
  // One grid per channel, computed once; then rows are independent.
  std::vector<FakeQuantGrid> grids(static_cast<std::size_t>(channels));
  std::vector<char> zero(static_cast<std::size_t>(channels));
  for (int64_t c = 0; c < channels; ++c) {
    zero[c] = FakeQuantRangeIsZero(min[c], max[c]);
    if (!zero[c]) grids[c] = NudgeFakeQuantRange(min[c], max[c], quant_min, quant_max);
  }
  const int64_t grain_rows = std::max<int64_t>(1, kGrain / channels);
  parallel.ForRange(rows, grain_rows, [&](int64_t begin, int64_t end) {
    ScopedFlushDenormals flush;
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * channels;
      float* yr = y + r * channels;
      for (int64_t c = 0; c < channels; ++c) {
        if (zero[c]) {
          yr[c] = 0.0f;
          continue;
        }
        const FakeQuantGrid& g = grids[c];
        const float shifted = ClampToGrid(xr[c], g.nudged_min, g.nudged_max) - g.nudged_min;
        yr[c] = std::floor((shifted * g.inv_scale - g.quant_zero) + 0.5f) * g.scale;
      }
    }
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
  FakeQuantGradientInput(g, x, dx, n, grid, parallel);
  ScopedFlushDenormals flush;  // for the two sums on this thread
  const float lo = grid.nudged_min, hi = grid.nudged_max;
  *dmin = eigen_sum::PacketTreeSum([&](int64_t i) { return g[i] * (x[i] < lo ? 1.0f : 0.0f); }, 0, n);
  *dmax = eigen_sum::PacketTreeSum([&](int64_t i) { return g[i] * (x[i] > hi ? 1.0f : 0.0f); }, 0, n);
}

void FakeQuantPerChannelGradient(const float* g, const float* x, int64_t rows, int64_t channels, const float* min,
                                 const float* max, int quant_min, int quant_max, float* dx, float* dmin,
                                 float* dmax, const Parallel& parallel) {
  if (channels <= 0) return;
  // Channels are independent tasks: each computes its grid, its dx column and its two sums.
  parallel.For(static_cast<std::size_t>(channels), [&](std::size_t task) {
    ScopedFlushDenormals flush;
    const int64_t c = static_cast<int64_t>(task);
    if (FakeQuantRangeIsZero(min[c], max[c])) {
      for (int64_t r = 0; r < rows; ++r) dx[r * channels + c] = g[r * channels + c];
      dmin[c] = 0.0f;
      dmax[c] = 0.0f;
      return;
    }
    const FakeQuantGrid grid = NudgeFakeQuantRange(min[c], max[c], quant_min, quant_max);
    const float lo = grid.nudged_min, hi = grid.nudged_max;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r * channels + c;
      dx[i] = g[i] * ((x[i] >= lo && x[i] <= hi) ? 1.0f : 0.0f);
    }
    const float* gc = g + c;
    const float* xc = x + c;
    // TF reduces each channel as a chip of the [rows, channels] view; Eigen gathers the strided
    // column into packets, so the order is that of a full vectorized reduction.
    dmin[c] = eigen_sum::PacketTreeSum(
        [&](int64_t r) { return gc[r * channels] * (xc[r * channels] < lo ? 1.0f : 0.0f); }, 0, rows);
    dmax[c] = eigen_sum::PacketTreeSum(
        [&](int64_t r) { return gc[r * channels] * (xc[r * channels] > hi ? 1.0f : 0.0f); }, 0, rows);
  });
}

}  // namespace tfops
