// The QuantizeAndDequantize ops' attribute and shape checks (see quantize_dequantize.h). Apart from
// quantize_dequantize.cc so that the kernels' CUDA host emulation (tests/cuda_emulation/qdq.cc) builds
// the arithmetic alone.
#include <string>
#include <vector>

#include "kernels/op_error.h"
#include "kernels/quantize_dequantize.h"
#include "kernels/simd.h"

namespace tfops {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

std::string ValueString(float v) { return FloatString(v); }
std::string ValueString(double v) { return DoubleString(v); }

}  // namespace

void CheckQdqNumBits(int64_t num_bits, bool signed_input, const char* signed_label) {
  if (!(num_bits > 0 && num_bits < (signed_input ? 62 : 63))) {
    throw OpError("num_bits is out of range: " + Str(num_bits) + " with " + signed_label + " " +
                  (signed_input ? "1" : "0"));
  }
}

void CheckQdqAxis(int64_t axis) {
  if (axis < -1) throw OpError("Axis must be at least -1. Found " + Str(axis));
}

void CheckQdqAxisInRank(int64_t axis, int64_t rank) {
  if (axis != -1 && axis >= rank) {
    // TF's message names neither the attribute nor the input; ours leads with both.
    throw OpError("axis " + Str(axis) + " is out of range for input of rank " + Str(rank) +
                  ": Shape must be at least rank " + Str(axis + 1) + " but is rank " + Str(rank));
  }
}

template <typename T>
void CheckQdqGivenRange(const std::vector<int64_t>& x, const std::vector<int64_t>& min_shape, const T* min,
                        const std::vector<int64_t>& max_shape, const T* max, int64_t axis) {
  if (axis == -1) {
    if (!min_shape.empty()) throw OpError("input_min must be a scalar.");
    if (!max_shape.empty()) throw OpError("input_max must be a scalar.");
    const T lo = *min, hi = *max;
    ScopedFlushDenormals flush;  // TF compares with denormals-are-zero on
    if (!(lo <= hi)) {
      throw OpError("Invalid range: input_min " + ValueString(lo) + " > input_max " + ValueString(hi));
    }
    return;
  }
  const int64_t depth = x[axis];
  if (min_shape.size() != 1) throw OpError("Shape must be rank 1 for input_min_tensor when the axis is specified");
  if (max_shape.size() != 1) throw OpError("Shape must be rank 1 for input_max_tensor when the axis is specified");
  for (const auto* t : {&min_shape, &max_shape}) {
    if ((*t)[0] != depth) {
      throw OpError(std::string(t == &min_shape ? "input_min" : "input_max") + "_tensor has incorrect size, was " +
                    Str((*t)[0]) + " expected " + Str(depth) + " to match dim " + Str(axis) + " of the input [" +
                    Str((*t)[0]) + "]");
    }
  }
}

template void CheckQdqGivenRange<float>(const std::vector<int64_t>&, const std::vector<int64_t>&, const float*,
                                        const std::vector<int64_t>&, const float*, int64_t);
template void CheckQdqGivenRange<double>(const std::vector<int64_t>&, const std::vector<int64_t>&, const double*,
                                         const std::vector<int64_t>&, const double*, int64_t);

void CheckQdqV3Inputs(int64_t axis, int64_t rank, int64_t num_bits_rank) {
  if (!(-rank <= axis && axis < rank)) {
    throw OpError("Axis requested is larger than input dimensions. Axis: " + Str(axis) +
                  " Input Dimensions: " + Str(rank));
  }
  // TF 2.21 aborts the process here (CHECK failure, TF issue #94116); its shape function says this.
  if (axis < -1) throw OpError("axis should be at least -1, got " + Str(axis));
  if (num_bits_rank != 0) {
    throw OpError("Invalid shape. The `num_bits` tensor should be a scalar. Got dimensions: " + Str(num_bits_rank));
  }
}

void CheckQdqV4GradInputs(int64_t axis, const std::vector<int64_t>& gradients, const std::vector<int64_t>& x,
                          const std::vector<int64_t>& min, const std::vector<int64_t>& max) {
  const int64_t rank = static_cast<int64_t>(x.size());
  if (axis != -1 && axis >= rank) {
    // TF's message, missing space included.
    throw OpError("Axis should be -1 or 0 or a positive value less than " + Str(rank) + "but given axis value was " +
                  Str(axis));
  }
  CheckGradientSameSize(gradients, x);
  for (const auto* t : {&min, &max}) {
    if (t->size() > 1) {
      throw OpError(std::string("Input ") + (t == &min ? "min" : "max") + " tensor must have dimension 0 or 1. Received " +
                    Str(t->size()) + ".");
    }
  }
  if (axis != -1) {
    const int64_t depth = x[axis];
    for (const auto* t : {&min, &max}) {
      if (t->size() != 1) {
        throw OpError(std::string("Shape must be rank 1 for input_") + (t == &min ? "min" : "max") +
                      "_tensor when the axis is specified");
      }
    }
    for (const auto* t : {&min, &max}) {
      if ((*t)[0] != depth) {
        throw OpError(std::string(t == &min ? "min" : "max") + " has incorrect size, expected " + Str(depth) +
                      " was " + Str((*t)[0]));
      }
    }
  } else {
    for (const auto* t : {&min, &max}) {
      if (!t->empty()) {
        throw OpError(std::string("input_") + (t == &min ? "min" : "max") + " must be a scalar if axis is unspecified");
      }
    }
  }
}

}  // namespace tfops
