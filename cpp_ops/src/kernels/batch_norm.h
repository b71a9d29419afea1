// FusedBatchNorm{,V2,V3} and FusedBatchNormGrad{,V2,V3} as plain functions over pointers and
// shapes (no ONNX Runtime types). The math is the NumPy reference's (ort_ops/reference/
// _batch_norm.py, docs/semantics.md section 3): x is a matrix X[R, C] (C = channels), statistics are
// float32, y is rounded back to T once. The checks throw OpError (kernels/op_error.h) with TF's
// message, without the op name (the adapter adds it).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "kernels/half.h"
#include "kernels/op_error.h"
#include "kernels/parallel.h"

namespace tfops {
namespace batch_norm {

// ---------------------------------------------------------------------------------------------
// The arithmetic the CPU kernels (batch_norm.cc) and the CUDA kernels (cuda/batch_norm.cu) share:
// every per-element and per-channel formula is one of these, so the two compute the same IEEE
// float32 operations in the same order (docs/semantics.md section 3). Only the order of the
// column sums differs between them. Under TF's denormal mode (the CPU's FTZ/DAZ bits, the GPU's
// .ftz instructions) every operation here flushes its operands and its result.

// rsqrt as the reference: the correctly rounded 1/sqrt (NaN for a negative argument).
TFOPS_HD inline float Rsqrt(float a) { return 1.0f / sqrtf(a); }

// k = rsqrt(variance + epsilon) * scale: the per-channel factor of y (and of the inference dx).
TFOPS_HD inline float ScaleFactor(float variance, float epsilon, float scale) {
  return Rsqrt(variance + epsilon) * scale;
}

// The per-element formulas are templates over V, float or a vector of floats (the CPU's 16-channel
// blocks, batch_norm.cc): the same operations lane by lane.

// y = (x - mean) * k + offset.
template <typename V>
TFOPS_HD inline V Normalize(V x, V mean, V k, V offset) { return (x - mean) * k + offset; }

// The summand of the training forward's variance: (x - mean)^2.
template <typename V>
TFOPS_HD inline V SquaredDeviation(V x, V mean) {
  const V d = x - mean;
  return d * d;
}

// Bessel's correction R / max(R - 1, 1), in float32 as TF computes it.
TFOPS_HD inline float BesselFactor(std::int64_t rows) {
  return static_cast<float>(rows) / static_cast<float>(rows > 1 ? rows - 1 : 1);
}

// The running statistics with exponential_avg_factor f != 1: keep * old + weight * batch, where
// keep = 1 - f, and weight = f for the mean, f * bessel for the (biased) batch variance.
TFOPS_HD inline float RunningAverage(float keep, float old, float weight, float batch) {
  return keep * old + weight * batch;
}

// Training gradient. Summands over rows: dy * ((x - mean) * c0) (scale_backprop), dy
// (offset_backprop) and dy * (x - mean), with c0 = rsqrt(saved variance + epsilon).
template <typename V>
TFOPS_HD inline void GradTrainingSummands(V dy, V x, V mean, V c0, V out[3]) {
  const V xc = x - mean;
  out[0] = dy * (xc * c0);
  out[1] = dy;
  out[2] = dy * xc;
}

// The per-channel coefficients of the training dx from the sums S(dy) and S(dy * (x - mean)):
// mean(dy) = S(dy) * (1/R) but S(dy * (x - mean)) / R (TF multiplies in one, divides in the other).
struct GradTrainingCoefficients {
  float dy_mean, coef1, coef2;
};
TFOPS_HD inline GradTrainingCoefficients GradTrainingChannel(float sum_dy, float sum_dy_xc, float scale, float c0,
                                                             float inv_rows, float rows) {
  GradTrainingCoefficients k;
  k.dy_mean = sum_dy * inv_rows;
  const float m = sum_dy_xc / rows;
  k.coef1 = scale * c0;
  k.coef2 = (c0 * c0) * m;
  return k;
}

// dx = coef1 * ((dy - mean(dy)) - (x - mean) * coef2).
template <typename V>
TFOPS_HD inline V GradTrainingElement(V dy, V x, V mean, V dy_mean, V coef1, V coef2) {
  const V xc = x - mean;
  return coef1 * ((dy - dy_mean) - xc * coef2);
}

// Inference ("frozen") gradient: summands dy (offset_backprop) and dy * (x - mean); then
// scale_backprop = S(dy * (x - mean)) * c0 and dx = dy * (c0 * scale).
template <typename V>
TFOPS_HD inline void GradInferenceSummands(V dy, V x, V mean, V out[2]) {
  out[0] = dy;
  out[1] = dy * (x - mean);
}
template <typename V>
TFOPS_HD inline V GradInferenceElement(V dy, V k) { return dy * k; }

// ---------------------------------------------------------------------------------------------

// x viewed as [outer, channels, inner]: channels-last formats have inner == 1.
struct Layout {
  std::int64_t outer = 0, channels = 0, inner = 1;
  std::int64_t rows() const { return outer * inner; }
  std::int64_t size() const { return outer * channels * inner; }
};

// The data formats an op version accepts ("Invalid data format" otherwise).
void CheckDataFormat(const std::string& data_format, bool allow_3d_names);

// The forward op's checks in TF's order; fills `layout` from x's shape.
void CheckForward(const std::vector<std::int64_t>& x, const std::vector<std::int64_t>& scale,
                  const std::vector<std::int64_t>& offset, const std::vector<std::int64_t>& mean,
                  const std::vector<std::int64_t>& variance, const std::string& data_format, bool allow_3d_names,
                  bool is_training, float exponential_avg_factor, Layout* layout);

// The gradient op's checks in TF's order.
void CheckGrad(const std::vector<std::int64_t>& y_backprop, const std::vector<std::int64_t>& x,
               const std::vector<std::int64_t>& scale, const std::vector<std::int64_t>& reserve_space_1,
               const std::vector<std::int64_t>& reserve_space_2, const std::string& data_format,
               bool allow_3d_names, Layout* layout);

// T is float, Half or BFloat16. mean/variance are read only when !is_training or f != 1.
template <typename T>
void Forward(const Layout& layout, const T* x, const float* scale, const float* offset, const float* mean,
             const float* variance, float epsilon, float exponential_avg_factor, bool is_training, T* y,
             float* batch_mean, float* batch_variance, float* reserve_space_1, float* reserve_space_2,
             const Parallel& par);

template <typename T>
void Grad(const Layout& layout, const T* y_backprop, const T* x, const float* scale, const float* reserve_space_1,
          const float* reserve_space_2, float epsilon, bool is_training, T* x_backprop, float* scale_backprop,
          float* offset_backprop, const Parallel& par);

}  // namespace batch_norm
}  // namespace tfops
