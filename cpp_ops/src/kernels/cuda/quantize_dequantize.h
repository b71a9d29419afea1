// CUDA kernels of QuantizeAndDequantize{V2,V3,V4} and QuantizeAndDequantizeV4Grad (float, double),
// bit-identical to the CPU kernels of kernels/quantize_dequantize.h (docs/cuda.md). Plain C++ (no CUDA
// includes): the adapters, compiled by g++, include it. Pointers are device memory unless a comment
// says otherwise; every launch goes on launch.stream, nothing waits on the host, and a failed launch
// throws DeviceError.
#pragma once

#include <cstdint>

#include "kernels/device.h"
#include "kernels/quantize_dequantize.h"

namespace tfops {
namespace cuda {

// Forward, x -> y over `view`. With options.range_given, `given_min`/`given_max` are HOST memory
// (view.depth values; the adapter declares them host inputs, which TF's range check reads anyway):
// the host computes each channel's parameters as the CPU kernel does and passes them to the kernels
// as launch arguments, at most kGivenChannelsPerLaunch channels per launch. Otherwise the range is
// taken from the data on the device (given_min/given_max are not read) with the CPU's order rules
// (qdq_eigen_order.h), in scratch memory.
template <typename T>
void QuantizeDequantize(const T* x, T* y, const QdqView& view, const T* given_min, const T* given_max,
                        const QdqOptions& options, const CudaLaunch& launch);

// V4Grad: dx = g * (min[c] <= x <= max[c] ? 1 : 0); min/max are device memory (view.depth values).
template <typename T>
void QuantizeDequantizeGradient(const T* g, const T* x, T* dx, const QdqView& view, const T* min, const T* max,
                                const CudaLaunch& launch);

// count zeros (+0.0) at p, on the stream (V4Grad's input_min_backprop / input_max_backprop).
template <typename T>
void Zeros(T* p, int64_t count, const CudaLaunch& launch);

// Channels of given-range parameters per launch: four arrays of T per channel in at most 3.5 KB of
// kernel arguments, below the 4 KB every CUDA version accepts.
template <typename T>
constexpr int64_t kGivenChannelsPerLaunch = 3584 / (4 * sizeof(T));

namespace detail {

// Division by a divisor fixed for a launch, for the index arithmetic of the kernels (a GPU has no
// integer divide instruction). The round-up method of Granlund and Montgomery for 32-bit operands:
// with s = ceil(log2 d) and m = floor(2^32 (2^s - d) / d) + 1, n / d = (umulhi(n, m) + n) >> s for
// every n < 2^32 (the sum taken in 64 bits). Valid for 1 <= d <= 2^31. TFOPS_HD so that host tests
// can check it.
struct DivMod32 {
  uint32_t divisor = 1, magic = 0, shift = 0;

  static DivMod32 Make(uint64_t d) {  // host
    DivMod32 r;
    r.divisor = static_cast<uint32_t>(d);
    while ((uint64_t{1} << r.shift) < d) ++r.shift;
    r.magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << r.shift) - d)) / d + 1);
    return r;
  }
  TFOPS_HD uint32_t Div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, magic);
#else
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * magic) >> 32);
#endif
    return static_cast<uint32_t>((static_cast<uint64_t>(hi) + n) >> shift);
  }
  // n = quotient * divisor + remainder
  TFOPS_HD void DivMod(uint32_t n, uint32_t* quotient, uint32_t* remainder) const {
    *quotient = Div(n);
    *remainder = n - *quotient * divisor;
  }
};

// The same interface for indices of 2^32 and beyond: the hardware's (slow) 64-bit division.
struct DivMod64 {
  uint64_t divisor = 1;

  static DivMod64 Make(uint64_t d) { return DivMod64{d}; }
  TFOPS_HD uint64_t Div(uint64_t n) const { return n / divisor; }
  TFOPS_HD void DivMod(uint64_t n, uint64_t* quotient, uint64_t* remainder) const {
    *quotient = n / divisor;
    *remainder = n - *quotient * divisor;
  }
};

constexpr uint64_t kMaxDivMod32Divisor = uint64_t{1} << 31;

}  // namespace detail
}  // namespace cuda
}  // namespace tfops
