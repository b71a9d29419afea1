// FakeQuantWithMinMax{Args,Vars,VarsPerChannel} and their gradients as plain functions over float
// buffers, reproducing TensorFlow's CPU kernels bit for bit (docs/semantics.md section 1).
// No ONNX Runtime types here; the adapters in cpp_ops/src/ort/fake_quant_ops.cc validate the inputs.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/parallel.h"

namespace tfops {

// The nudged quantization grid for one (min, max) pair.
struct FakeQuantGrid {
  float nudged_min;
  float nudged_max;
  float scale;       // grid step
  float inv_scale;   // (qmax - qmin) / (max - min), computed on its own (not 1 / scale)
  float quant_zero;  // the grid index of 0, as TF computes it from the nudged range
};

// quant_min = narrow_range ? 1 : 0, quant_max = 2^num_bits - 1 (num_bits already checked to be 2..16).
FakeQuantGrid NudgeFakeQuantRange(float min, float max, int quant_min, int quant_max);

// Vars and PerChannel skip the nudge and output zeros when min == max == 0. TF compares with
// denormals-are-zero on, so subnormal bounds count as 0.
inline bool FakeQuantRangeIsZero(float min, float max) {
  return std::fabs(min) < std::numeric_limits<float>::min() && std::fabs(max) < std::numeric_limits<float>::min();
}

// Forward. `use_division`: Vars divides by scale; Args and PerChannel multiply by inv_scale.
void FakeQuantForward(const float* x, float* y, int64_t n, const FakeQuantGrid& grid, bool use_division,
                      const Parallel& parallel);

// PerChannel forward: x viewed as [rows, channels], channel c uses min[c], max[c].
void FakeQuantPerChannelForward(const float* x, float* y, int64_t rows, int64_t channels, const float* min,
                                const float* max, int quant_min, int quant_max, const Parallel& parallel);

// dx = g * (nudged_min <= x <= nudged_max ? 1 : 0): a product, as in TF, so a NaN or infinite
// gradient outside the range gives NaN and a negative one gives -0.
void FakeQuantGradientInput(const float* g, const float* x, float* dx, int64_t n, const FakeQuantGrid& grid,
                            const Parallel& parallel);

// Vars gradient: dx as above; dmin = sum of g*(x < nudged_min), dmax = sum of g*(x > nudged_max), in
// Eigen's full-reduction order. With min == max == 0: dx = g, dmin = dmax = 0.
void FakeQuantVarsGradient(const float* g, const float* x, int64_t n, float min, float max, int quant_min,
                           int quant_max, float* dx, float* dmin, float* dmax, const Parallel& parallel);

// PerChannel gradient over x viewed as [rows, channels]; dmin/dmax have `channels` entries, each the
// column sum in the order of Eigen's vectorized full reduction (as TF sums each channel's chip).
void FakeQuantPerChannelGradient(const float* g, const float* x, int64_t rows, int64_t channels, const float* min,
                                 const float* max, int quant_min, int quant_max, float* dx, float* dmin,
                                 float* dmax, const Parallel& parallel);

}  // namespace tfops
