// Run-time choice of the vector ISA (docs/cpu.md). Hot loops are compiled three times inside the one
// library, for AVX-512 (F/BW/DQ/VL), AVX2 and the x86-64 baseline (SSE2), and a dispatcher calls the
// copy of the ISA picked once per process: the best the CPU has, capped by the environment variable
// TFOPS_ISA=avx512|avx2|sse2 (tests and benchmarks force each path that way). Every copy computes the
// same IEEE operations in the same order (no FMA contraction: the library is built with
// -ffp-contract=off), so the choice changes speed only; tests/test_cpp_isa.py runs every path and
// compares the outputs bit for bit (NaN payloads too for the quantization ops; where two NaNs meet,
// the surviving payload follows the compiler's operand order, which only the quantization kernels
// pin down, docs/cpu.md). TFOPS_NO_CLONES (or a non-x86 target) builds the baseline copy alone.
#pragma once

#if defined(__x86_64__) && defined(__ELF__) && !defined(TFOPS_NO_CLONES)
#define TFOPS_ISA_DISPATCH 1
// Feature lists, not arch=: a function with another arch cannot inline the (baseline) helpers the
// hot loops call. prefer-vector-width=512 lets the vectorizer use zmm registers (GCC's generic tuning
// would otherwise stop at 256 bits). No "fma": nothing may fuse a product into a sum.
#define TFOPS_TARGET_AVX512 \
  __attribute__((target("avx2,avx512f,avx512bw,avx512dq,avx512vl,prefer-vector-width=512")))
#define TFOPS_TARGET_AVX2 __attribute__((target("avx2")))
#else
#define TFOPS_TARGET_AVX512
#define TFOPS_TARGET_AVX2
#endif

namespace tfops {

// Ordered: a larger value is a wider ISA.
enum class Isa : int { kSse2 = 0, kAvx2 = 1, kAvx512 = 2 };

// The ISA the kernels run with: decided on the first call (CPU features, then TFOPS_ISA), the same
// for the rest of the process. Defined in simd.cc.
Isa ActiveIsa();
// "avx512", "avx2" or "sse2" ("baseline" for a build without dispatch).
const char* IsaName(Isa isa);

}  // namespace tfops

// Defines NAME##Avx512, NAME##Avx2 and NAME##Sse2, each a copy of the void function BODY (which
// must be always-inline, so that each copy is compiled for its ISA) with the parenthesized PARAMS,
// and an inline NAME(PARAMS) calling the active one. Use inside an unnamed namespace.
#if defined(TFOPS_ISA_DISPATCH)
#define TFOPS_ISA_VARIANTS(NAME, PARAMS, ARGS, BODY)     \
  TFOPS_TARGET_AVX512 void NAME##Avx512 PARAMS { BODY ARGS; } \
  TFOPS_TARGET_AVX2 void NAME##Avx2 PARAMS { BODY ARGS; }     \
  void NAME##Sse2 PARAMS { BODY ARGS; }                       \
  inline void NAME PARAMS {                                   \
    switch (::tfops::ActiveIsa()) {                           \
      case ::tfops::Isa::kAvx512:                             \
        NAME##Avx512 ARGS;                                    \
        return;                                               \
      case ::tfops::Isa::kAvx2:                               \
        NAME##Avx2 ARGS;                                      \
        return;                                               \
      default:                                                \
        NAME##Sse2 ARGS;                                      \
    }                                                         \
  }
#else
#define TFOPS_ISA_VARIANTS(NAME, PARAMS, ARGS, BODY) \
  inline void NAME PARAMS { BODY ARGS; }
#endif

#define TFOPS_ALWAYS_INLINE inline __attribute__((always_inline))

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
