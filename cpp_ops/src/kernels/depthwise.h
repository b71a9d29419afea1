// DepthwiseConv2dNative and its input/filter gradients as plain functions over pointers and
// shapes (no ONNX Runtime types). Validation first (depthwise_geometry.cc: it throws OpError,
// kernels/op_error.h, with the message without the op name, which the adapter prefixes), then kernels
// that trust a validated Geometry (depthwise.cc, depthwise_nchw.cc).
//
// Arithmetic follows TensorFlow's CPU kernels (docs/semantics.md section 4): taps in
// row-major filter order, multiply then add with no fused multiply-add; 16-bit types compute
// each tap in float and round the accumulator to the storage type after every tap. Deviations
// (see ort_ops/specs/depthwise.py): true dilations, NCHW, padding taps skipped.
//
// The per-element arithmetic (one tap, the multiplier sum of BackpropInput) is a set of TFOPS_HD
// functions at the end of this header, called by these CPU kernels and by the CUDA kernels
// (kernels/cuda/depthwise.cu), so that both compute the same operations in the same order. Geometry
// is trivially copyable and passed by value to the CUDA kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "kernels/half.h"
#include "kernels/op_error.h"
#include "kernels/parallel.h"

namespace tfops {
namespace depthwise {

// The attributes every op of the family has, as found on the node.
struct Attrs {
  std::vector<std::int64_t> strides;
  std::string padding;  // SAME, VALID, EXPLICIT
  std::vector<std::int64_t> explicit_paddings;
  std::string data_format = "NHWC";
  std::vector<std::int64_t> dilations = {1, 1, 1, 1};
};

// Everything a kernel needs, in NHWC terms whatever the data format.
struct Geometry {
  std::int64_t batch = 0, in_rows = 0, in_cols = 0, in_depth = 0;
  std::int64_t filter_rows = 0, filter_cols = 0, depth_multiplier = 0;
  std::int64_t out_rows = 0, out_cols = 0, out_depth = 0;
  std::int64_t stride = 1, dilation_rows = 1, dilation_cols = 1;
  std::int64_t pad_top = 0, pad_left = 0;
  bool nchw = false;

  TFOPS_HD std::int64_t InputSize() const { return batch * in_rows * in_cols * in_depth; }
  TFOPS_HD std::int64_t FilterSize() const { return filter_rows * filter_cols * in_depth * depth_multiplier; }
  TFOPS_HD std::int64_t OutputSize() const { return batch * out_rows * out_cols * out_depth; }
  // Shapes in the op's data format.
  std::vector<std::int64_t> InputShape() const;
  std::vector<std::int64_t> OutputShape() const;
  std::vector<std::int64_t> FilterShape() const { return {filter_rows, filter_cols, in_depth, depth_multiplier}; }
};

// Checks strides/padding/dilations/data_format (messages as TF's).
void CheckAttrs(const Attrs& attrs);

// The library's size cap, the same as the NumPy kernels' (docs/semantics.md section 4.5): an error for
// outputs of more than 2^31 elements. The backprops' output shapes come from input_sizes/filter_sizes
// values (`source` names the input for the message): call this on the shape to be allocated before
// running a kernel (it is what keeps every size product far from overflow).
constexpr std::int64_t kMaxOutputElements = std::int64_t{1} << 31;
void CheckOutputSize(const std::vector<std::int64_t>& shape, const char* source);

// Forward: input [N,H,W,C] (or NCHW), filter [kh,kw,C,M].
void ForwardGeometry(const Attrs& attrs, const std::vector<std::int64_t>& input_shape,
                     const std::vector<std::int64_t>& filter_shape, Geometry* g);

// BackpropInput: input_sizes (int32 values and the tensor's shape), filter, out_backprop.
void BackpropInputGeometry(const Attrs& attrs, const std::vector<std::int64_t>& input_sizes_shape,
                           const std::int32_t* input_sizes, const std::vector<std::int64_t>& filter_shape,
                           const std::vector<std::int64_t>& out_backprop_shape, Geometry* g);

// BackpropFilter: input, filter_sizes (int32 values and shape), out_backprop.
void BackpropFilterGeometry(const Attrs& attrs, const std::vector<std::int64_t>& input_shape,
                            const std::vector<std::int64_t>& filter_sizes_shape, const std::int32_t* filter_sizes,
                            const std::vector<std::int64_t>& out_backprop_shape, Geometry* g);

// T is float, double, Half or BFloat16. Outputs are fully written (zeros where nothing flows).
template <typename T>
void Forward(const Geometry& g, const T* input, const T* filter, T* output, const Parallel& par);
// The float NCHW forward without layout copies (depthwise_nchw.cc), the same bits as the general path;
// Forward tries it first. Returns false, having done nothing, where it does not apply (NHWC, or a
// filter with an infinity or a NaN).
bool ForwardNchw(const Geometry& g, const float* input, const float* filter, float* output, const Parallel& par);
template <typename T>
void BackpropInput(const Geometry& g, const T* filter, const T* out_backprop, T* in_backprop, const Parallel& par);
template <typename T>
void BackpropFilter(const Geometry& g, const T* input, const T* out_backprop, T* filter_backprop,
                    const Parallel& par);

// ---------------------------------------------------------------------------------------------
// Per-element arithmetic shared by the CPU and the CUDA kernels (docs/semantics.md sections 4.2-4.4).
// A is the compute type (float for the 16-bit types). Two functors adapt it to the machine:
//  - `ftz` is applied to every product and sum: the identity on the CPU, whose MXCSR FTZ/DAZ mode
//    flushes in hardware (float and double), and on the GPU for float (-ftz=true); the CUDA kernels
//    pass an explicit flush for double, which has no .ftz instructions;
//  - `round` rounds an accumulator to the storage precision after each step (float16/bfloat16),
//    the identity otherwise.

// The identity, for either functor.
struct Keep {
  template <typename A>
  TFOPS_HD A operator()(A v) const {
    return v;
  }
};

// One filter tap: acc + w * x, the product rounded, then the sum (never a fused multiply-add: the
// CPU build uses -ffp-contract=off, the CUDA build --fmad=false).
template <typename A, typename Ftz, typename Round>
TFOPS_HD inline A TapStep(A acc, A w, A x, Ftz ftz, Round round) {
  return round(ftz(acc + ftz(w * x)));
}

// One addition of a running sum.
template <typename A, typename Ftz, typename Round>
TFOPS_HD inline A AddStep(A s, A v, Ftz ftz, Round round) {
  return round(ftz(s + v));
}

// BackpropInput's multiplier sum reduces the M per-channel sums in blocks of one SIMD register of
// TF's CPU build (8 floats, 4 doubles; 16-bit types use the float tree), then the rest one by one.
template <typename A>
struct MultiplierWidth {
  static constexpr int value = sizeof(A) == 4 ? 8 : 4;
};

// One whole block v[0..kWidth) as Eigen's register reduction: (for 8 lanes the upper half is first
// folded onto the lower) then (h0 + h2) + (h1 + h3), rounded once. The caller adds it to its
// running sum with AddStep.
template <int kWidth, typename A, typename Ftz, typename Round>
TFOPS_HD inline A MultiplierBlock(const A* v, Ftz ftz, Round round) {
  static_assert(kWidth == 8 || kWidth == 4, "a register of 8 floats or 4 doubles");
  A h0 = v[0], h1 = v[1], h2 = v[2], h3 = v[3];
  if constexpr (kWidth == 8) {
    h0 = ftz(h0 + v[4]);
    h1 = ftz(h1 + v[5]);
    h2 = ftz(h2 + v[6]);
    h3 = ftz(h3 + v[7]);
  }
  return round(ftz(ftz(h0 + h2) + ftz(h1 + h3)));
}

}  // namespace depthwise
}  // namespace tfops
