// QuantizeAndDequantize{V2,V3,V4} and QuantizeAndDequantizeV4Grad as plain functions over float or
// double buffers, reproducing TensorFlow's CPU kernels bit for bit (docs/semantics.md section 2).
// No ONNX Runtime types here; the adapters in cpp_ops/src/ort/quantize_dequantize_ops.cc validate.
//
// Every tensor is viewed as [pre, depth, post] (depth = dims[axis]; axis -1: [1, 1, n]); channel c
// is x[:, c, :].
#pragma once

#include <cstdint>

#include "kernels/parallel.h"

namespace tfops {

enum class QdqRoundMode { kHalfToEven, kHalfUp };

struct QdqOptions {
  bool signed_input = true;
  int64_t num_bits = 8;  // validated by the caller: 1..61 signed, 1..62 unsigned
  bool narrow_range = false;
  bool range_given = false;
  QdqRoundMode round_mode = QdqRoundMode::kHalfToEven;
};

struct QdqView {
  int64_t pre = 1;
  int64_t depth = 1;
  int64_t post = 0;
  bool per_axis = false;  // an axis was given (a per-tensor op is [1, 1, n] with this false)
};

// Forward. `given_min`/`given_max` hold `depth` values when options.range_given, else they are
// ignored and each channel's range is the min/max of its data. Where TF's result depends on Eigen's
// evaluation order (which NaN or signed zero a reduction keeps; which NaN `rounded * inverse` keeps
// when both are NaN), the rules of ort_ops/reference/_qdq_eigen_order.py apply.
template <typename T>
void QuantizeDequantize(const T* x, T* y, const QdqView& view, const T* given_min, const T* given_max,
                        const QdqOptions& options, const Parallel& parallel);

// V4Grad: dx = g * (min[c] <= x <= max[c] ? 1 : 0) per channel.
template <typename T>
void QuantizeDequantizeGradient(const T* g, const T* x, T* dx, const QdqView& view, const T* min, const T* max,
                                const Parallel& parallel);

}  // namespace tfops
