// Hot elementwise loops get an AVX2 clone next to the baseline x86-64 one, picked at load time:
// the baseline (SSE2) cannot vectorize floor/rint, AVX2 can (vroundps). Both clones compute the same
// IEEE operations (no FMA contraction: the library is built with -ffp-contract=off), so the choice
// never changes a result. TFOPS_NO_CLONES (or a non-x86 target) turns the cloning off.
#pragma once

#if defined(__x86_64__) && defined(__ELF__) && !defined(TFOPS_NO_CLONES)
#define TFOPS_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TFOPS_VECTOR_CLONES
#endif

#include <cmath>
#include <limits>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace tfops {

// TensorFlow runs every kernel with the CPU's flush-to-zero and denormals-are-zero modes on
// (port::ScopedFlushDenormal in its executor): subnormal operands act as (signed) zeros and subnormal
// results become zeros. Kernels that must match TF bit for bit hold one of these on every thread
// that computes (the mode is per thread); it restores the caller's mode on exit.
class ScopedFlushDenormals {
 public:
#if defined(__x86_64__) || defined(__i386__)
  ScopedFlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFtzDaz); }
  ~ScopedFlushDenormals() { _mm_setcsr(saved_); }

 private:
  static constexpr unsigned kFtzDaz = 0x8040;  // MXCSR bit 15 (FTZ) and bit 6 (DAZ)
  unsigned saved_;
#else
  ScopedFlushDenormals() = default;
#endif
  ScopedFlushDenormals(const ScopedFlushDenormals&) = delete;
  ScopedFlushDenormals& operator=(const ScopedFlushDenormals&) = delete;
};

// A subnormal as the signed zero flush-to-zero makes of it; other values unchanged. For results the
// compiler may compute without an arithmetic instruction (g * 1 folded to g, a select instead of a
// multiply by a 0/1 mask), where the MXCSR mode cannot act.
template <typename T>
inline T FlushDenormal(T v) {
  return std::fabs(v) < std::numeric_limits<T>::min() ? std::copysign(T(0), v) : v;
}

}  // namespace tfops
