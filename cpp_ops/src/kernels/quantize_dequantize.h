// QuantizeAndDequantize{V2,V3,V4} and QuantizeAndDequantizeV4Grad as plain functions over float or
// double buffers, reproducing TensorFlow's CPU kernels bit for bit (docs/semantics.md section 2).
// No ONNX Runtime types here. The checks (declared below, quantize_dequantize_checks.cc) throw OpError
// with TF's messages; the adapters in cpp_ops/src/ort/quantize_dequantize_ops.cc call them first.
//
// Every tensor is viewed as [pre, depth, post] (depth = dims[axis]; axis -1: [1, 1, n]); channel c
// is x[:, c, :].
//
// The per-channel and per-element arithmetic is in namespace qdq below, as TFOPS_HD functions that
// the CPU loops (quantize_dequantize.cc) and the CUDA kernels (cuda/quantize_dequantize.cu) both
// call. Each takes an arithmetic policy:
//  - NativeArith (host only): the operations as written. On the CPU the MXCSR flush-to-zero and
//    denormals-are-zero bits (held by every CPU kernel, simd.h) and x86's NaN rules make them TF's,
//    and the compiler vectorizes them.
//  - ExplicitArith (host and device): the same results without relying on the floating-point unit's
//    mode or NaN rules. A GPU returns one canonical NaN whatever the operands (x86 returns the NaN
//    operand, quieted) and has no flush-to-zero for float64, so this policy writes out what x86 does
//    under FTZ+DAZ: every operand flushed, every result flushed, a NaN operand returned quieted (the
//    first one when both are NaN; where that choice could show, the kernels set TF's choice
//    explicitly, qdq_order::NanRule), and an invalid operation (0 * inf, 0 / 0) giving x86's default
//    NaN (sign set, quiet bit set, zero payload).
// The CPU kernels use ExplicitArith for everything outside their element loops (the quantization
// parameters, the end of the Eigen-order reduction), so the CPU test suite runs that code too.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/device.h"
#include "kernels/op_error.h"
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

// The view of a tensor with `rank` dims `dims` around `axis` (-1: the whole tensor is one channel; the
// checks have validated the axis). Shared by the ORT adapters and the GPU check program.
inline QdqView QdqViewOf(const int64_t* dims, std::size_t rank, int64_t axis) {
  QdqView v;
  v.post = 1;
  for (std::size_t i = 0; i < rank; ++i) v.post *= dims[i];
  if (axis == -1) return v;
  v.per_axis = true;
  v.pre = 1;
  for (int64_t i = 0; i < axis; ++i) v.pre *= dims[i];
  v.depth = dims[axis];
  v.post = 1;
  for (std::size_t i = static_cast<std::size_t>(axis) + 1; i < rank; ++i) v.post *= dims[i];
  return v;
}

// The integer grid [lo, hi] of TF's ComputeQuantizationRange.
struct QdqGrid {
  int64_t lo = 0;
  int64_t hi = 0;
};

inline QdqGrid GridOf(const QdqOptions& o) {
  QdqGrid g;
  if (o.signed_input) {
    const int64_t half = int64_t{1} << (o.num_bits - 1);
    g.lo = o.narrow_range ? -half + 1 : -half;
    g.hi = half - 1;
  } else {
    g.lo = 0;
    g.hi = (int64_t{1} << o.num_bits) - 1;
  }
  return g;
}

// The per-channel parameters of TF's ComputeQuantizationRange.
template <typename T>
struct QdqParams {
  T min_range;  // the (adjusted) clamp range, used only when the range is given
  T max_range;
  T scale;    // quantization factor
  T inverse;  // dequantization step
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

// The parameters of each of `depth` given ranges (host memory), as both kernels use them.
template <typename T>
std::vector<QdqParams<T>> GivenRangeParams(const T* given_min, const T* given_max, int64_t depth,
                                           const QdqOptions& options);

// ---------------------------------------------------------------- validation (quantize_dequantize_checks.cc)
// In TF's order and wording (docs/semantics.md sections 2.4 and 2.5, as ort_ops/reference does it);
// each throws OpError. Shapes are dims vectors.

// num_bits: 1..61 signed, 1..62 unsigned. `signed_label` is how TF's message names signed_input.
void CheckQdqNumBits(int64_t num_bits, bool signed_input, const char* signed_label);
// The axis attribute of V2, V4 and V4Grad, before any input is seen: -1 or more.
void CheckQdqAxis(int64_t axis);
// V2/V4 at run time: the axis within the input's rank.
void CheckQdqAxisInRank(int64_t axis, int64_t rank);
// range_given: scalars with min <= max per tensor; vectors of dims[axis] values per axis (the
// documented intent; TF 2.21 V2/V4 demand scalars here too, so that mode never works there).
template <typename T>
void CheckQdqGivenRange(const std::vector<int64_t>& x, const std::vector<int64_t>& min_shape, const T* min,
                        const std::vector<int64_t>& max_shape, const T* max, int64_t axis);
// V3 at run time, before the range: axis against the rank, then the num_bits tensor's rank.
void CheckQdqV3Inputs(int64_t axis, int64_t rank, int64_t num_bits_rank);
// V4Grad at run time: axis, shapes of gradients and inputs, and the min/max shapes.
void CheckQdqV4GradInputs(int64_t axis, const std::vector<int64_t>& gradients, const std::vector<int64_t>& x,
                          const std::vector<int64_t>& min, const std::vector<int64_t>& max);

namespace qdq {

// ---- bits
template <typename T>
struct Bits;
template <>
struct Bits<float> {
  using U = uint32_t;
  static constexpr U kSign = 0x80000000u;
  static constexpr U kExponent = 0x7f800000u;
  static constexpr U kQuiet = 0x00400000u;
  static constexpr U kDefaultNan = 0xffc00000u;  // x86's "real indefinite"
};
template <>
struct Bits<double> {
  using U = uint64_t;
  static constexpr U kSign = 0x8000000000000000ull;
  static constexpr U kExponent = 0x7ff0000000000000ull;
  static constexpr U kQuiet = 0x0008000000000000ull;
  static constexpr U kDefaultNan = 0xfff8000000000000ull;
};

template <typename T>
TFOPS_HD inline typename Bits<T>::U ToBits(T v) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 4) {
    return __float_as_uint(v);
  } else {
    return static_cast<uint64_t>(__double_as_longlong(v));
  }
#else
  typename Bits<T>::U u;
  std::memcpy(&u, &v, sizeof u);
  return u;
#endif
}

template <typename T>
TFOPS_HD inline T FromBits(typename Bits<T>::U u) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 4) {
    return __uint_as_float(u);
  } else {
    return __longlong_as_double(static_cast<long long>(u));
  }
#else
  T v;
  std::memcpy(&v, &u, sizeof v);
  return v;
#endif
}

template <typename T>
TFOPS_HD inline bool IsNan(T v) {
  return v != v;
}

// A NaN as an arithmetic operation returns it: with the quiet bit set.
template <typename T>
TFOPS_HD inline T Quiet(T v) {
  return FromBits<T>(ToBits(v) | Bits<T>::kQuiet);
}

template <typename T>
TFOPS_HD inline T DefaultNan() {
  return FromBits<T>(Bits<T>::kDefaultNan);
}

template <typename T>
TFOPS_HD inline T MaxFinite() {
  if constexpr (sizeof(T) == 4) {
    return FLT_MAX;
  } else {
    return DBL_MAX;
  }
}

template <typename T>
TFOPS_HD inline T MinNormal() {
  if constexpr (sizeof(T) == 4) {
    return FLT_MIN;
  } else {
    return DBL_MIN;
  }
}

// A subnormal as flush-to-zero makes it: the zero of its sign. Other values (NaN included) unchanged.
// (A compare of |v|, not an integer test of the exponent bits: SSE2 has no 64-bit integer compare,
// and the CPU loops that call this must vectorize. Under the CPU's DAZ mode the compare sees a
// subnormal as 0, which is below the bound as well.)
template <typename T>
TFOPS_HD inline T Flush(T v) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 4) {
    return fabsf(v) < MinNormal<T>() ? copysignf(0.0f, v) : v;
  } else {
    return fabs(v) < MinNormal<T>() ? copysign(0.0, v) : v;
  }
#else
  return std::fabs(v) < MinNormal<T>() ? std::copysign(T(0), v) : v;
#endif
}

template <typename T>
TFOPS_HD inline T Infinity() {
  return FromBits<T>(Bits<T>::kExponent);
}

// ---- arithmetic policies (see the top of this file)
struct NativeArith {
  template <typename T>
  static T Mul(T a, T b) { return a * b; }
  template <typename T>
  static T Div(T a, T b) { return a / b; }
  template <typename T>
  static T Add(T a, T b) { return a + b; }
  template <typename T>
  static bool Less(T a, T b) { return a < b; }
  template <typename T>
  static bool LessEq(T a, T b) { return a <= b; }
  template <typename T>
  static T Floor(T v) { return std::floor(v); }
  template <typename T>
  static T Rint(T v) { return std::nearbyint(v); }  // round to nearest even (the default mode)
};

struct ExplicitArith {
  template <typename T>
  TFOPS_HD static T Mul(T a, T b) {
    if (IsNan(a)) return Quiet(a);
    if (IsNan(b)) return Quiet(b);
    const T r = Flush(a) * Flush(b);
    return IsNan(r) ? DefaultNan<T>() : Flush(r);
  }
  template <typename T>
  TFOPS_HD static T Div(T a, T b) {
    if (IsNan(a)) return Quiet(a);
    if (IsNan(b)) return Quiet(b);
    const T r = Flush(a) / Flush(b);
    return IsNan(r) ? DefaultNan<T>() : Flush(r);
  }
  template <typename T>
  TFOPS_HD static T Add(T a, T b) {
    if (IsNan(a)) return Quiet(a);
    if (IsNan(b)) return Quiet(b);
    const T r = Flush(a) + Flush(b);
    return IsNan(r) ? DefaultNan<T>() : Flush(r);
  }
  template <typename T>
  TFOPS_HD static bool Less(T a, T b) { return Flush(a) < Flush(b); }
  template <typename T>
  TFOPS_HD static bool LessEq(T a, T b) { return Flush(a) <= Flush(b); }
  template <typename T>
  TFOPS_HD static T Floor(T v) {
    if (IsNan(v)) return Quiet(v);
#if defined(__CUDA_ARCH__)
    if constexpr (sizeof(T) == 4) {
      return floorf(Flush(v));
    } else {
      return floor(Flush(v));
    }
#else
    return std::floor(Flush(v));
#endif
  }
  template <typename T>
  TFOPS_HD static T Rint(T v) {  // round to nearest, ties to even
    if (IsNan(v)) return Quiet(v);
#if defined(__CUDA_ARCH__)
    if constexpr (sizeof(T) == 4) {
      return rintf(Flush(v));
    } else {
      return rint(Flush(v));
    }
#else
    return std::nearbyint(Flush(v));
#endif
  }
};

// ---- TF's ComputeQuantizationRange for one channel (docs/semantics.md section 2.2).
template <class A, typename T>
TFOPS_HD inline QdqParams<T> ComputeRange(T min_range, T max_range, QdqGrid grid) {
  const T min_q = static_cast<T>(grid.lo);  // int64 -> T rounds to nearest, as in TF
  const T max_q = static_cast<T>(grid.hi);
  const T big = MaxFinite<T>();
  const T zero = T(0);
  const T scale_from_min = A::Less(zero, A::Mul(min_q, min_range)) ? A::Div(min_q, min_range) : big;
  const T scale_from_max = A::Less(zero, A::Mul(max_q, max_range)) ? A::Div(max_q, max_range) : big;
  QdqParams<T> p;
  if (A::Less(scale_from_min, scale_from_max)) {
    p.scale = scale_from_min;
    p.inverse = A::Div(min_range, min_q);
    p.min_range = min_range;
    p.max_range = A::Mul(max_q, p.inverse);
  } else {  // ties and the both-unbounded case take the max side
    p.scale = scale_from_max;
    p.inverse = A::Div(max_range, max_q);
    p.min_range = A::Mul(min_q, p.inverse);
    p.max_range = max_range;
  }
  return p;
}

// ---- one output element (docs/semantics.md section 2.3): clamp (given range only) with
// std::min/std::max semantics (a NaN input stays, a NaN bound is ignored), scale, round, step.
// Where `x` and `inverse` are both NaN the product's NaN is one of order: callers then take
// NanResult (the choice TF's evaluation order makes, qdq_order::NanRule).
template <class A, bool kClamp, bool kHalfUp, typename T>
TFOPS_HD inline T QuantizeOne(T x, T lo, T hi, T scale, T inverse) {
  T v = x;
  if constexpr (kClamp) {
    v = A::Less(hi, v) ? hi : v;  // Eigen cwiseMin(hi): std::min(v, hi)
    v = A::Less(v, lo) ? lo : v;  // cwiseMax(lo): std::max(v, lo)
  }
  const T scaled = A::Mul(v, scale);
  const T rounded = kHalfUp ? A::Floor(A::Add(scaled, T(0.5))) : A::Rint(scaled);
  return A::Mul(rounded, inverse);
}

// The output where the input and the step are both NaN: the input's NaN (quieted) or the step's.
template <typename T>
TFOPS_HD inline T NanResult(T x, T inverse, bool keeps_input_nan) {
  return keeps_input_nan ? Quiet(x) : inverse;
}

// ---- V4Grad, one element (docs/semantics.md section 2.7): g * mask under flush-to-zero. The
// pass-through side flushes explicitly (a compiler may fold g * 1 to g, which skips the FPU's
// flush); the other side is the product g * 0: -0 for a negative g, NaN for an infinite or NaN g.
template <class A, typename T>
TFOPS_HD inline T GradientOne(T g, T x, T lo, T hi) {
  const bool inside = A::LessEq(lo, x) && A::LessEq(x, hi);
  return inside ? Flush(g) : A::Mul(g, T(0));
}

}  // namespace qdq
}  // namespace tfops
