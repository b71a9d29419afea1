// FusedBatchNorm{,V2,V3} and FusedBatchNormGrad{,V2,V3} as plain functions over pointers and
// shapes (no ONNX Runtime types). The math is the NumPy reference's (ort_ops/reference/
// _batch_norm.py, docs/semantics.md section 3): x is a matrix X[R, C] (C = channels), statistics are
// float32, y is rounded back to T once. Validation returns an error message without the op name
// (the adapter adds it), "" when the input is fine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/half.h"
#include "kernels/parallel.h"

namespace tfops {
namespace batch_norm {

// x viewed as [outer, channels, inner]: channels-last formats have inner == 1.
struct Layout {
  std::int64_t outer = 0, channels = 0, inner = 1;
  std::int64_t rows() const { return outer * inner; }
  std::int64_t size() const { return outer * channels * inner; }
};

// The data formats an op version accepts ("Invalid data format" otherwise).
std::string CheckDataFormat(const std::string& data_format, bool allow_3d_names);

// The forward op's checks in TF's order; fills `layout` from x's shape.
std::string CheckForward(const std::vector<std::int64_t>& x, const std::vector<std::int64_t>& scale,
                         const std::vector<std::int64_t>& offset, const std::vector<std::int64_t>& mean,
                         const std::vector<std::int64_t>& variance, const std::string& data_format, bool allow_3d_names,
                         bool is_training, float exponential_avg_factor, Layout* layout);

// The gradient op's checks in TF's order.
std::string CheckGrad(const std::vector<std::int64_t>& y_backprop, const std::vector<std::int64_t>& x,
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
