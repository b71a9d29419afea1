// The run-time ISA choice of simd.h: the CPU's widest supported ISA, capped by TFOPS_ISA.
#include "kernels/simd.h"

#include <cstdlib>
#include <cstring>

namespace tfops {
namespace {

Isa CpuIsa() {
#if defined(TFOPS_ISA_DISPATCH)
  // libgcc's feature bits also check that the OS saves the ymm/zmm state (XCR0).
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2")) return Isa::kSse2;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return Isa::kAvx512;
  return Isa::kAvx2;
#else
  return Isa::kSse2;
#endif
}

// TFOPS_ISA's cap; an unset, empty or unknown value caps nothing (ort_ops.library.cpu_isa() shows
// what was chosen).
Isa RequestedCap() {
  const char* v = std::getenv("TFOPS_ISA");
  if (v == nullptr) return Isa::kAvx512;
  if (std::strcmp(v, "sse2") == 0 || std::strcmp(v, "baseline") == 0) return Isa::kSse2;
  if (std::strcmp(v, "avx2") == 0) return Isa::kAvx2;
  return Isa::kAvx512;
}

Isa Choose() {
  const Isa cpu = CpuIsa(), cap = RequestedCap();
  return static_cast<int>(cap) < static_cast<int>(cpu) ? cap : cpu;
}

}  // namespace

Isa ActiveIsa() {
  static const Isa isa = Choose();  // thread-safe one-time initialization
  return isa;
}

const char* IsaName(Isa isa) {
#if defined(TFOPS_ISA_DISPATCH)
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    default:
      return "sse2";
  }
#else
  (void)isa;
  return "baseline";
#endif
}

}  // namespace tfops
