// How every op of the library reports bad attributes or inputs: by throwing tfops::OpError, whose
// message is the problem only (TF's wording where TF has one). The ORT adapter framework
// (ort/op_base.h) turns it into ORT_INVALID_ARGUMENT with the "<op name>: " prefix; other callers
// (the CUDA host emulations in tests/) catch it themselves.
//
// Why an exception and not a returned message: the checks nest several calls deep (a geometry
// check calls an output-size check), and with one exception type no level can drop an error by
// forgetting to test a return value. Why here and not in ort/: the checks belong to the kernels,
// which stay ORT-free, so the CPU and the CUDA execution paths share one set of checks.
//
// Also here: the number and shape formats TF's messages use, for the checks to build them.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace tfops {

class OpError : public std::runtime_error {
 public:
  explicit OpError(const std::string& message) : std::runtime_error(message) {}
};

// A gradient op's incoming gradient must have its input's shape (FakeQuant and QuantizeAndDequantize
// gradients alike; ort_ops/checks/_common.py is the Python side of this rule).
inline void CheckGradientSameSize(const std::vector<std::int64_t>& gradients, const std::vector<std::int64_t>& inputs) {
  if (gradients != inputs) throw OpError("gradient and input must be the same size");
}

// "[2,3]", the way TF prints shapes in messages.
inline std::string ShapeString(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// Numbers the way TF's StrCat prints them in messages: 6 (float) or 15 (double) significant digits,
// or 9 / 17 when that is needed to read back the same value.
inline std::string FloatString(float value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*g", 6, static_cast<double>(value));
  if (std::strtof(buffer, nullptr) != value) std::snprintf(buffer, sizeof(buffer), "%.*g", 9, static_cast<double>(value));
  return buffer;
}

inline std::string DoubleString(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*g", 15, value);
  if (std::strtod(buffer, nullptr) != value) std::snprintf(buffer, sizeof(buffer), "%.*g", 17, value);
  return buffer;
}

}  // namespace tfops
