// float16 / bfloat16 storage types and exact conversions to and from float, with no ONNX
// Runtime types in them (ORT's Ort::Float16_t / Ort::BFloat16_t have the same 2-byte layout,
// so adapters may reinterpret their buffers as these).
//
// Conversions: widening is exact; narrowing rounds to nearest, ties to even, keeps NaN a NaN
// (quiet) and overflows to infinity -- what TensorFlow's Eigen::half / bfloat16 casts do.
#pragma once

#include <cstdint>
#include <cstring>

namespace tfops {

struct Half {
  std::uint16_t bits;
};
struct BFloat16 {
  std::uint16_t bits;
};
static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2, "16-bit storage types must be 2 bytes");

inline std::uint32_t FloatBits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float BitsFloat(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float HalfToFloat(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return BitsFloat(sign | 0x7f800000u | (man << 13));  // inf / NaN (payload kept)
  if (exp != 0) return BitsFloat(sign | ((exp + 112u) << 23) | (man << 13));
  // zero or subnormal: man * 2^-24 is exact in float
  const float mag = static_cast<float>(man) * 5.9604644775390625e-8f;
  return BitsFloat(sign | FloatBits(mag));
}

inline std::uint16_t FloatToHalf(float f) {
  const std::uint32_t u = FloatBits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN, quiet
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a >= 0x38800000u) {                                                   // normal half range
    // Round the 13 dropped mantissa bits to nearest even; a carry into the exponent is correct.
    const std::uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  // Subnormal or zero: add 0.5 (2^-1) so the float adder rounds the magnitude to a multiple of
  // 2^-24 with ties to even; the low bits then hold the half mantissa.
  const float biased = BitsFloat(a) + 0.5f;
  return static_cast<std::uint16_t>(sign | (FloatBits(biased) - 0x3f000000u));
}

inline float BFloat16ToFloat(std::uint16_t b) { return BitsFloat(static_cast<std::uint32_t>(b) << 16); }

inline std::uint16_t FloatToBFloat16(float f) {
  const std::uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // NaN, quiet
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

// Uniform access for templated kernels: Widen<T> gives the compute value, Narrow<T> stores it.
template <typename T>
struct Storage {
  using Compute = T;
  static Compute Widen(T v) { return v; }
  static T Narrow(Compute v) { return v; }
  // Round a compute value to the precision of T (identity for float/double).
  static Compute Round(Compute v) { return v; }
  static constexpr bool kNarrow = false;
};
template <>
struct Storage<Half> {
  using Compute = float;
  static float Widen(Half v) { return HalfToFloat(v.bits); }
  static Half Narrow(float v) { return Half{FloatToHalf(v)}; }
  static float Round(float v) { return HalfToFloat(FloatToHalf(v)); }
  static constexpr bool kNarrow = true;
};
template <>
struct Storage<BFloat16> {
  using Compute = float;
  static float Widen(BFloat16 v) { return BFloat16ToFloat(v.bits); }
  static BFloat16 Narrow(float v) { return BFloat16{FloatToBFloat16(v)}; }
  static float Round(float v) { return BFloat16ToFloat(FloatToBFloat16(v)); }
  static constexpr bool kNarrow = true;
};

// Block conversions (the hot loops of the 16-bit kernels convert whole rows at a time).
template <typename T, typename C>
inline void WidenBlock(const T* src, C* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<C>(Storage<T>::Widen(src[i]));
}
template <typename T, typename C>
inline void NarrowBlock(const C* src, T* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = Storage<T>::Narrow(static_cast<typename Storage<T>::Compute>(src[i]));
}

}  // namespace tfops
