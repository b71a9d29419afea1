// Host emulation of the FusedBatchNormClipFakeQuant CUDA kernel (kernels/cuda/fused.cu) against the CPU
// kernel (kernels/fused.cc), bit for bit, NaN payloads included. Built and run by
// tests/test_cuda_emulation_fused.py, which writes the fused_emu_*.inc files: fused.cu with each launch
// rewritten for fake/cuda_runtime.h (every thread of the launcher's own grid runs on the host, FTZ/DAZ on)
// and, for all but "main", wrapped in a namespace of its own and changed as follows:
//   gpu_nan              the hardware arithmetic (the first try of every element and of every channel's k)
//                        replaced by emu_gpu below, a model of the GPU's: the same operations, but every
//                        NaN result is the GPU's canonical NaN 0x7fffffff instead of x86's. The host's
//                        own arithmetic is x86's, so without this model a kernel that let a hardware NaN
//                        through would still pass.
//   gpu_nan_small_grids  gpu_nan with the grid capped at 3 x 2 blocks, so that every grid-stride loop
//                        (rows, planes, channel groups, channels) takes several turns.
//   no_recompute         gpu_nan without the x86 recompute of NaN results: must fail.
//   header_recompute     gpu_nan recomputing NaNs with fused.h's BatchNormClipFakeQuantElement<kDivide,
//                        FakeQuantX86Ops> as a GPU runs it (its Normalize uses plain operators, so on
//                        the GPU only the quantizer's operations follow x86): must fail on NaN inputs.
// A fifth check, clip_skipped, runs "main" with the clip bounds (-inf, inf) against the CPU kernel with
// the case's bounds: must fail wherever the bounds clip something.
//
// Every case: both layouts, Vars (divide) and Args (multiply), several clip bounds, misaligned x and y,
// output buffers with guard zones (nothing written outside y, every element of y written), the number
// of launches and memsets, and whether 16-byte vectors were used exactly when the pointers allow them.
// The program prints one "variant NAME cases N fails M k_swapped K sse2_swapped S" line per variant (K, S:
// elements where the CPU kernel's NaN is another operand's, see CpuSwappedOperands) and a final
// "cases N fails M" line; the test reads them.
//
// What this cannot check: anything only the GPU does (its instructions, its .ftz rounding, the memory
// model, launch limits beyond the grid sizes, speed).
#include "cuda_runtime.h"  // the fake one (fake/): must come first, it defines the CUDA keywords

#include <cfloat>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "kernels/batch_norm.h"
#include "kernels/device.h"
#include "kernels/eigen_sum.h"
#include "kernels/fake_quant.h"
#include "kernels/fused.h"
#include "kernels/parallel.h"
#include "kernels/simd.h"

// ---------------------------------------------------------------- the GPU's NaN rules (model)

namespace emu_gpu {

using tfops::FakeQuantGrid;
using tfops::float_ops::FromBits;
using tfops::float_ops::IsNan;

inline float Canonical(float r) { return IsNan(r) ? FromBits(0x7fffffffu) : r; }

// The float operations as a GPU does them: the numbers are the host's (FTZ/DAZ on during a launch),
// every NaN result the canonical NaN.
struct Ops {
  static float Add(float a, float b) { return Canonical(a + b); }
  static float Sub(float a, float b) { return Canonical(a - b); }
  static float Mul(float a, float b) { return Canonical(a * b); }
  static float Div(float a, float b) { return Canonical(a / b); }
  static float Neg(float a) { return Canonical(-a); }
  static float Floor(float a) { return Canonical(std::floor(a)); }
};

// fused::BatchNormClipFakeQuantElement<kDivide> as the GPU computes it (the same operations in the
// same order: batch_norm::Normalize, ClipValue, the quantizer).
template <bool kDivide>
float BatchNormClipFakeQuantElement(float x, float mean, float k, float offset, float lo, float hi,
                                    const FakeQuantGrid& g) {
  const float v = tfops::fused::ClipValue(Ops::Add(Ops::Mul(Ops::Sub(x, mean), k), offset), lo, hi);
  return kDivide ? tfops::FakeQuantDivide<Ops>(v, g.nudged_min, g.nudged_max, g.scale, g.quant_zero)
                 : tfops::FakeQuantMultiply<Ops>(v, g.nudged_min, g.nudged_max, g.inv_scale, g.quant_zero, g.scale);
}

// batch_norm::ScaleFactor (1 / sqrt(variance + epsilon) * scale) as the GPU computes it.
inline float ScaleFactor(float variance, float epsilon, float scale) {
  return Ops::Mul(Ops::Div(1.0f, Canonical(std::sqrt(Ops::Add(variance, epsilon)))), scale);
}

// fused::BatchNormClipFakeQuantElement<kDivide, FakeQuantX86Ops> as the GPU computes it: the
// quantizer's operations are x86's, Normalize's plain operators give the canonical NaN.
template <bool kDivide>
float HeaderX86Element(float x, float mean, float k, float offset, float lo, float hi, FakeQuantGrid g) {
  using X86 = tfops::float_ops::X86;
  const float v = tfops::fused::ClipValue(Ops::Add(Ops::Mul(Ops::Sub(x, mean), k), offset), lo, hi);
  return kDivide ? tfops::FakeQuantDivide<X86>(v, g.nudged_min, g.nudged_max, g.scale, g.quant_zero)
                 : tfops::FakeQuantMultiply<X86>(v, g.nudged_min, g.nudged_max, g.inv_scale, g.quant_zero, g.scale);
}

}  // namespace emu_gpu

// ---------------------------------------------------------------- the kernels under test

#include "fused_emu_main.inc"                 // tfops::cuda
#include "fused_emu_gpu_nan.inc"              // tfops::cuda::gpu_nan
#include "fused_emu_gpu_nan_small_grids.inc"  // tfops::cuda::gpu_nan_small_grids
#include "fused_emu_no_recompute.inc"         // tfops::cuda::no_recompute
#include "fused_emu_header_recompute.inc"     // tfops::cuda::header_recompute

namespace {

using namespace tfops;
using i64 = std::int64_t;

using Launcher = void (*)(const batch_norm::Layout&, const float*, const float*, const float*, const float*,
                          const float*, float, float, float, const fused::FakeQuantStep&, float*, const CudaLaunch&);

struct Variant {
  const char* name;
  Launcher launch;
  bool must_pass;
};

const Variant kVariants[] = {
    {"main", &cuda::BatchNormClipFakeQuantForward, true},
    {"gpu_nan", &cuda::gpu_nan::BatchNormClipFakeQuantForward, true},
    {"gpu_nan_small_grids", &cuda::gpu_nan_small_grids::BatchNormClipFakeQuantForward, true},
    {"no_recompute", &cuda::no_recompute::BatchNormClipFakeQuantForward, false},
    {"header_recompute", &cuda::header_recompute::BatchNormClipFakeQuantForward, false},
};
constexpr int kNumVariants = sizeof(kVariants) / sizeof(kVariants[0]);

// The fused kernel asks for no scratch; one that did would get NaN-filled memory here.
struct HostScratch : DeviceScratch {
  std::vector<std::vector<float>> blocks;
  void* Allocate(std::size_t bytes) override {
    blocks.emplace_back(bytes / sizeof(float) + 1, std::nanf(""));
    return blocks.back().data();
  }
};

uint32_t Bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}
float FromBits(uint32_t u) {
  float v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

constexpr uint32_t kGuard = 0x7f8badadu;  // a signaling NaN: no kernel output is ever one

std::mt19937 rng(20261123);

float Uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }

// NaNs of both signs, quiet and signaling, with payloads.
float SomeNan() {
  static const uint32_t kPatterns[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800123u,
                                       0x7fc12345u, 0xffd00001u, 0x7fffffffu, 0xffbfffffu};
  return FromBits(kPatterns[rng() % 8]);
}

// x: 0 plain numbers around the quantization range, 1 a quarter special values, 2 mostly NaNs.
float XValue(int kind) {
  if (kind == 1 && rng() % 4 == 0) {
    switch (rng() % 12) {
      case 0: return SomeNan();
      case 1: return SomeNan();
      case 2: return INFINITY;
      case 3: return -INFINITY;
      case 4: return 0.0f;
      case 5: return -0.0f;
      case 6: return 1e-40f;   // subnormal
      case 7: return -3e-39f;  // subnormal
      case 8: return 3e38f;
      case 9: return -3e38f;
      case 10: return FLT_MIN;
      default: return -FLT_MIN;
    }
  }
  if (kind == 2 && rng() % 4 != 0) return SomeNan();
  const float v = Uniform(-6.0f, 12.0f);
  return rng() % 5 == 0 ? std::round(v * 4.0f) / 4.0f : v;  // some on quarter steps: ties of the grid
}

struct Stats {
  std::vector<float> scale, offset, mean, variance;
};

// Statistics: 0 ordinary, 1 with special values (NaN and negative variances, zero and infinite scales,
// NaN means and offsets, subnormals), which make k, Normalize or both NaN or infinite.
Stats MakeStats(i64 C, int kind) {
  Stats s;
  for (i64 c = 0; c < C; ++c) {
    float scale = Uniform(0.3f, 2.0f) * (rng() % 4 == 0 ? -1.0f : 1.0f), offset = Uniform(-1.0f, 3.0f),
          mean = Uniform(-2.0f, 2.0f), variance = Uniform(0.05f, 3.0f);
    if (kind == 1 && rng() % 2 == 0) {
      switch (rng() % 13) {
        case 0: variance = SomeNan(); break;
        case 1: variance = -1.0f; break;      // sqrt of a negative: x86's default NaN
        case 2: variance = 0.0f; break;       // with epsilon 0: k = inf
        case 3: scale = SomeNan(); break;
        case 4: scale = INFINITY; break;
        case 5: scale = -0.0f; break;
        case 6: mean = SomeNan(); break;
        case 7: mean = -INFINITY; break;
        case 8: offset = SomeNan(); break;
        case 9: offset = INFINITY; break;
        case 10: variance = 1e-40f; break;   // subnormal: flushed
        case 11: variance = SomeNan(), scale = SomeNan(); break;  // two NaNs meet in k
        default: mean = SomeNan(), offset = SomeNan(); break;
      }
    }
    s.scale.push_back(scale), s.offset.push_back(offset), s.mean.push_back(mean), s.variance.push_back(variance);
  }
  return s;
}

struct Case {
  std::string what;
  i64 outer, channels, inner;
  bool args;            // FakeQuantWithMinMaxArgs (multiply); else Vars (divide)
  float min, max;       // the quantization range
  int num_bits;
  bool narrow;
  float clip_lo, clip_hi;
  float epsilon;
  int x_kind, stats_kind;
  int x_off, y_off;     // misalignment in floats
};

// Two places where the CPU kernel does not pin which of two NaNs survives, and the CUDA kernel follows the
// written operand order (kernels/cuda/fused.cu):
//  - k = (1 / sqrt(variance + epsilon)) * scale with a NaN variance and a NaN scale: GCC vectorizes
//    fused.cc's loop over the channels with the product's operands swapped, so the channels of its vector
//    part get the scale's NaN and those of its scalar tail the variance's (on every ISA: the loop has one
//    copy). Tolerated on every copy.
//  - Normalize, (x - mean) * k + offset, where a NaN x - mean meets a NaN k or a NaN product a NaN offset:
//    the SSE2 copy of the element loop (TFOPS_ISA=sse2) commutes the product and the sum; the AVX2 and
//    AVX-512 copies keep the written order. Tolerated on the SSE2 copy only.
// An element is counted, not failed, only when the kernel's bits (`got`) are the chain's in the written order
// and the CPU's (`want`) those of the chain with one of the tolerated swaps. Returns 0 (neither), 1 (a swap in
// k only) or 2 (a swap in Normalize, with or without one in k).
int CpuSwappedOperands(float want, float got, float x, float mean, float variance, float epsilon, float scale,
                        float offset, float lo, float hi, const FakeQuantGrid& g, bool divide, bool sse2) {
  using X86 = float_ops::X86;
  using float_ops::IsNan;
  const bool k_swaps = IsNan(variance) && IsNan(scale);
  const float r = X86::Div(1.0f, std::sqrt(X86::Add(variance, epsilon)));  // a NaN here is the variance's
  const float ks[2] = {X86::Mul(r, scale), X86::Mul(scale, r)};
  const float d = X86::Sub(x, mean);
  const bool normalize_swaps = sse2 && ((IsNan(d) && IsNan(ks[0])) || IsNan(offset));
  if (!k_swaps && !normalize_swaps) return 0;
  float y[8];
  for (int order = 0; order < 8; ++order) {
    const float k = ks[order >> 2];
    const float p = order & 1 ? X86::Mul(k, d) : X86::Mul(d, k);
    const float n = order & 2 ? X86::Add(offset, p) : X86::Add(p, offset);
    const float v = fused::ClipValue(n, lo, hi);
    y[order] = divide ? FakeQuantDivide<X86>(v, g.nudged_min, g.nudged_max, g.scale, g.quant_zero)
                      : FakeQuantMultiply<X86>(v, g.nudged_min, g.nudged_max, g.inv_scale, g.quant_zero, g.scale);
  }
  if (Bits(got) != Bits(y[0])) return 0;
  for (int order = 1; order < 8; ++order) {
    const bool allowed = ((order & 3) == 0 || normalize_swaps) && ((order >> 2) == 0 || k_swaps);
    if (allowed && Bits(want) == Bits(y[order])) return (order & 3) == 0 ? 1 : 2;
  }
  return 0;
}

struct Totals {
  long cases = 0, fails = 0, k_swapped = 0, sse2_swapped = 0;
};
Totals g_totals[kNumVariants + 1];  // the last one: clip_skipped

int RunCase(const Case& k) {
  const i64 n = k.outer * k.channels * k.inner;
  batch_norm::Layout l;
  l.outer = k.outer, l.channels = k.channels, l.inner = k.inner;
  std::vector<float> xb(n + k.x_off);  // exactly x's end: AddressSanitizer sees a read past it
  float* x = xb.data() + k.x_off;
  for (i64 i = 0; i < n; ++i) x[i] = XValue(k.x_kind);
  const Stats s = MakeStats(k.channels, k.stats_kind);
  fused::FakeQuantStep step;
  std::vector<float> want(n + 1);
  {
    ScopedFlushDenormals ftz;  // the adapter's Compute runs in TF's mode
    step = fused::MakeFakeQuantStep(k.args, k.min, k.max, FakeQuantBitsOf(k.num_bits, k.narrow));
    fused::BatchNormClipFakeQuantForward(l, x, s.scale.data(), s.offset.data(), s.mean.data(), s.variance.data(),
                                         k.epsilon, k.clip_lo, k.clip_hi, step, want.data(), Parallel());
  }
  const bool vectorizable = (k.inner == 1 ? k.channels % 4 == 0 : k.inner % 4 == 0);
  int case_fails = 0;
  for (int v = 0; v <= kNumVariants; ++v) {
    const bool clip_skipped = v == kNumVariants;
    if (clip_skipped && !(std::isfinite(k.clip_lo) || std::isfinite(k.clip_hi))) continue;
    const Variant& var = kVariants[clip_skipped ? 0 : v];
    // y: y_off floats past a 64-byte boundary, inside guard zones (x: x_off floats past its buffer's start,
    // which is 16-byte aligned).
    std::vector<float> yb(n + 64, FromBits(kGuard));
    const std::size_t base = (64 - (reinterpret_cast<std::uintptr_t>(yb.data()) & 63)) / 4 % 16;
    float* y = yb.data() + base + 16 + k.y_off;
    emu::g_counters = emu::Counters{};
    HostScratch scratch;
    const CudaLaunch launch{nullptr, &scratch};
    const float lo = clip_skipped ? -INFINITY : k.clip_lo, hi = clip_skipped ? INFINITY : k.clip_hi;
    std::string error;
    try {
      var.launch(l, x, s.scale.data(), s.offset.data(), s.mean.data(), s.variance.data(), k.epsilon, lo, hi, step, y,
                 launch);
    } catch (const std::exception& e) {
      error = e.what();
    }
    long mismatches = 0, k_swapped = 0, sse2_swapped = 0;
    std::string first;
    for (i64 i = 0; i < n && error.empty(); ++i) {
      if (Bits(want[i]) == Bits(y[i])) continue;
      if (!step.zero_output) {
        const i64 c = k.inner == 1 ? i % k.channels : (i / k.inner) % k.channels;
        ScopedFlushDenormals ftz;
        const int swap =
            CpuSwappedOperands(want[i], y[i], x[i], s.mean[c], s.variance[c], k.epsilon, s.scale[c], s.offset[c], lo,
                               hi, step.grid, step.use_division, ActiveIsa() == Isa::kSse2);
        if (swap != 0) {
          ++(swap == 1 ? k_swapped : sse2_swapped);
          continue;
        }
      }
      if (mismatches++ == 0) {
        const i64 c = k.inner == 1 ? i % k.channels : (i / k.inner) % k.channels;
        char line[400];
        std::snprintf(line, sizeof line,
                      "element %" PRId64 ": cpu %08x emu %08x (x %08x mean %08x var %08x scale %08x offset %08x)", i,
                      Bits(want[i]), Bits(y[i]), Bits(x[i]), Bits(s.mean[c]), Bits(s.variance[c]), Bits(s.scale[c]),
                      Bits(s.offset[c]));
        first = line;
      }
    }
    // The guard zones are untouched (nothing written outside y).
    for (float* p = yb.data(); p < y && error.empty(); ++p)
      if (Bits(*p) != kGuard) error = "wrote before y";
    for (float* p = y + n; p < yb.data() + yb.size() && error.empty(); ++p)
      if (Bits(*p) != kGuard) error = "wrote after y";
    // Launches: none for an empty x, one memset for a zero range, else one kernel; 16-byte vectors
    // exactly when the shape and both pointers allow them.
    const emu::Counters& cnt = emu::g_counters;
    const bool aligned =
        reinterpret_cast<std::uintptr_t>(x) % 16 == 0 && reinterpret_cast<std::uintptr_t>(y) % 16 == 0;
    if (error.empty()) {
      if (n == 0 && (cnt.launches || cnt.memsets)) error = "launched for an empty x";
      if (n > 0 && step.zero_output && (cnt.launches != 0 || cnt.memsets != 1)) error = "zero range: not one memset";
      if (n > 0 && !step.zero_output && (cnt.launches != 1 || cnt.memsets != 0)) error = "not one launch";
      if (n > 0 && !step.zero_output) {
        const bool vectors = cnt.vector_loads > 0 && cnt.vector_stores > 0;
        if (vectors != (vectorizable && aligned)) error = vectors ? "vectors on misaligned pointers" : "no vectors";
        if (cnt.vector_loads != cnt.vector_stores) error = "vector loads != stores";
      }
      if (!scratch.blocks.empty()) error = "asked for scratch memory";
    }
    const bool failed = mismatches > 0 || !error.empty();
    Totals& t = g_totals[v];
    ++t.cases;
    t.fails += failed;
    t.k_swapped += k_swapped;
    t.sse2_swapped += sse2_swapped;
    if (failed && (var.must_pass && !clip_skipped)) {
      ++case_fails;
      std::printf("FAIL %s [%s]: %ld mismatches%s%s %s\n", var.name, k.what.c_str(), mismatches,
                  error.empty() ? "" : ", ", error.c_str(), first.c_str());
    }
  }
  return case_fails;
}

const float kInf = INFINITY;

std::string Describe(const char* layout, i64 outer, i64 C, i64 inner, bool args, float lo, float hi, int xk, int sk,
                     int xo, int yo) {
  char b[300];
  std::snprintf(b, sizeof b,
                "%s outer=%" PRId64 " C=%" PRId64 " inner=%" PRId64 " %s clip=(%g,%g) x%d stats%d off=%d/%d", layout,
                outer, C, inner, args ? "Args" : "Vars", lo, hi, xk, sk, xo, yo);
  return b;
}

}  // namespace

int main() {
  struct Shape {
    i64 outer, channels, inner;
  };
  // Channels last (inner 1): C a multiple of 4 (vectors) or not, one or many channel groups (32
  // vectors a group), a row count that is not a multiple of the block's rows.
  const Shape rows_shapes[] = {{1, 1, 1},   {7, 3, 1},   {64, 4, 1},   {33, 8, 1},   {50, 19, 1}, {16, 32, 1},
                               {5, 64, 1},  {9, 130, 1}, {300, 19, 1}, {257, 24, 1}, {3, 516, 1}, {1000, 12, 1}};
  // Channels first: P = 63 (C = 19), tiny planes, planes with several chunks (more than 2048 vectors).
  const Shape plane_shapes[] = {{2, 19, 63}, {1, 3, 2},    {2, 4, 64},   {3, 5, 7},    {1, 2, 49},
                                {2, 3, 300}, {1, 2, 8200}, {1, 2, 2051}, {2, 19, 3136}, {5, 7, 16}};
  const float clips[][2] = {{0.0f, 6.0f}, {-kInf, kInf}, {-1.0f, 2.0f}};
  int cases = 0, fails = 0, offs = 0;
  auto offset_pair = [&](int i, int* xo, int* yo) {
    static const int kOffsets[][2] = {{0, 0}, {1, 1}, {0, 3}, {2, 0}, {3, 3}, {0, 1}};
    *xo = kOffsets[i % 6][0], *yo = kOffsets[i % 6][1];
  };
  for (int layout = 0; layout < 2; ++layout) {
    const Shape* shapes = layout == 0 ? rows_shapes : plane_shapes;
    const int count = layout == 0 ? int(std::size(rows_shapes)) : int(std::size(plane_shapes));
    for (int si = 0; si < count; ++si) {
      const Shape sh = shapes[si];
      for (int args = 0; args < 2; ++args)
        for (const auto& clip : clips)
          for (int xk = 0; xk < 2; ++xk) {
            Case k;
            k.outer = sh.outer, k.channels = sh.channels, k.inner = sh.inner;
            k.args = args;
            k.min = -Uniform(0.0f, 3.0f), k.max = Uniform(1.0f, 8.0f);
            k.num_bits = (cases % 7 == 3) ? 4 : (cases % 11 == 5) ? 16 : 8;
            k.narrow = cases % 3 == 1;
            k.clip_lo = clip[0], k.clip_hi = clip[1];
            k.epsilon = 0.001f;
            k.x_kind = xk, k.stats_kind = 0;
            offset_pair(offs++, &k.x_off, &k.y_off);
            k.what = Describe(layout ? "first" : "last", sh.outer, sh.channels, sh.inner, args, clip[0], clip[1], xk, 0,
                              k.x_off, k.y_off);
            fails += RunCase(k);
            ++cases;
          }
    }
  }
  // Special ranges, statistics and inputs, over one shape of each layout.
  const Shape specials[] = {{40, 19, 1}, {2, 19, 63}, {24, 16, 1}, {3, 4, 64}};
  struct Range {
    bool args;
    float min, max;
    const char* what;
  };
  const Range ranges[] = {
      {false, 0.0f, 0.0f, "zero range"},           {false, -1e-40f, 1e-40f, "subnormal range (zero)"},
      {false, -kInf, 6.0f, "NaN grid (min -inf)"}, {false, 0.0f, kInf, "max inf"},
      {false, -kInf, kInf, "both infinite"},       {false, std::nanf(""), 6.0f, "NaN min"},
      {false, 0.0f, 6.0f, "ReLU6 range"},          {true, 0.0f, 6.0f, "Args ReLU6 range"},
      {true, -1.5f, 1.5f, "Args symmetric"},       {false, 3e38f, 3.4e38f, "huge range"},
      {false, -0.5f, 0.25f, "small range"},        {true, -2e-38f, 2e-38f, "Args tiny range"},
  };
  for (const Shape& sh : specials)
    for (const Range& r : ranges)
      for (int xk = 0; xk < 3; ++xk)
        for (int sk = 0; sk < 2; ++sk) {
          Case k;
          k.outer = sh.outer, k.channels = sh.channels, k.inner = sh.inner;
          k.args = r.args, k.min = r.min, k.max = r.max;
          k.num_bits = 8, k.narrow = (xk == 1);
          const auto& clip = clips[(xk + sk) % 3];
          k.clip_lo = clip[0], k.clip_hi = clip[1];
          k.epsilon = sk == 1 && xk == 2 ? 0.0f : 0.001f;  // epsilon 0: a zero variance gives k = inf
          k.x_kind = xk, k.stats_kind = sk;
          offset_pair(offs++, &k.x_off, &k.y_off);
          k.what = std::string(r.what) + " " +
                   Describe(sh.inner == 1 ? "last" : "first", sh.outer, sh.channels, sh.inner, r.args, clip[0], clip[1],
                            xk, sk, k.x_off, k.y_off);
          fails += RunCase(k);
          ++cases;
        }
  // Other clip bounds: signed zeros, a point, bounds outside the grid.
  const float more_clips[][2] = {{-0.0f, 6.0f}, {-0.0f, 0.0f}, {2.0f, 2.0f}, {-100.0f, 100.0f}, {-kInf, 0.0f}};
  for (const auto& clip : more_clips)
    for (int layout = 0; layout < 2; ++layout)
      for (int args = 0; args < 2; ++args) {
        Case k;
        k.outer = layout ? 2 : 31, k.channels = layout ? 5 : 12, k.inner = layout ? 36 : 1;
        k.args = args, k.min = -1.0f, k.max = 3.0f, k.num_bits = 8, k.narrow = false;
        k.clip_lo = clip[0], k.clip_hi = clip[1], k.epsilon = 1e-5f;
        k.x_kind = 1, k.stats_kind = 0;
        offset_pair(offs++, &k.x_off, &k.y_off);
        k.what = Describe(layout ? "first" : "last", k.outer, k.channels, k.inner, args, clip[0], clip[1], 1, 0,
                          k.x_off, k.y_off);
        fails += RunCase(k);
        ++cases;
      }
  // Empty tensors: nothing launched.
  const Shape empties[] = {{0, 4, 1}, {0, 3, 5}, {2, 0, 1}, {2, 3, 0}};
  for (const Shape& sh : empties) {
    Case k;
    k.outer = sh.outer, k.channels = sh.channels, k.inner = sh.inner;
    k.args = false, k.min = -1.0f, k.max = 1.0f, k.num_bits = 8, k.narrow = false;
    k.clip_lo = 0.0f, k.clip_hi = 6.0f, k.epsilon = 0.001f, k.x_kind = 0, k.stats_kind = 0, k.x_off = 0, k.y_off = 0;
    k.what = Describe("empty", sh.outer, sh.channels, sh.inner, false, 0, 6, 0, 0, 0, 0);
    fails += RunCase(k);
    ++cases;
  }
  std::printf("isa %s\n", IsaName(ActiveIsa()));
  for (int v = 0; v <= kNumVariants; ++v) {
    const char* name = v == kNumVariants ? "clip_skipped" : kVariants[v].name;
    std::printf("variant %s cases %ld fails %ld k_swapped %ld sse2_swapped %ld\n", name, g_totals[v].cases,
                g_totals[v].fails, g_totals[v].k_swapped, g_totals[v].sse2_swapped);
  }
  std::printf("cases %d fails %d\n", cases, fails);
  return fails != 0;
}
