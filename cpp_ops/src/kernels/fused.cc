// CPU kernels of the fused ops (fused.h). One pass: each task reads its part of x once and writes y
// once; the element arithmetic is fused.h's, so the vectorized copies (one per ISA, simd.h) and the
// scalar loop give the same bits. The library is built with -ffp-contract=off, so nothing fuses
// Normalize's product into its sum.
//
// Vector blocks pass 64-byte vectors only between always-inlined functions, as in batch_norm.cc.
#pragma GCC diagnostic ignored "-Wpsabi"

#include "kernels/fused.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/simd.h"

namespace tfops {
namespace fused {
namespace {

using i64 = std::int64_t;

// Elements per task (a shape-only choice): large enough to amortize scheduling, small enough to
// split the network's smaller tensors over two threads.
constexpr i64 kGrain = 1 << 14;

// Channels-first planes [q0, q1) of P elements (channel q % C), or channels-last rows [r0, r1) of C.
template <bool kDivide>
TFOPS_ALWAYS_INLINE void PlanesBody(const float* x, float* y, i64 q0, i64 q1, i64 C, i64 P, const float* m,
                                    const float* k, const float* off, float clip_lo, float clip_hi,
                                    const FakeQuantGrid& g) {
  for (i64 q = q0; q < q1; ++q) {
    const i64 c = q % C;
    const float mc = m[c], kc = k[c], oc = off[c];
    const float* __restrict in = x + q * P;
    float* __restrict out = y + q * P;
    for (i64 p = 0; p < P; ++p) out[p] = BatchNormClipFakeQuantElement<kDivide>(in[p], mc, kc, oc, clip_lo, clip_hi, g);
  }
}
template <bool kDivide>
TFOPS_ALWAYS_INLINE void RowsBody(const float* x, float* y, i64 r0, i64 r1, i64 C, const float* m, const float* k,
                                  const float* off, float clip_lo, float clip_hi, const FakeQuantGrid& g) {
  for (i64 r = r0; r < r1; ++r) {
    const float* __restrict in = x + r * C;
    float* __restrict out = y + r * C;
    for (i64 c = 0; c < C; ++c) out[c] = BatchNormClipFakeQuantElement<kDivide>(in[c], m[c], k[c], off[c], clip_lo, clip_hi, g);
  }
}

#define TFOPS_FUSED_PLANES_PARAMS                                                                          \
  (const float* x, float* y, i64 q0, i64 q1, i64 C, i64 P, const float* m, const float* k, const float* off, \
   float clip_lo, float clip_hi, const FakeQuantGrid& g)
#define TFOPS_FUSED_ROWS_PARAMS                                                                          \
  (const float* x, float* y, i64 r0, i64 r1, i64 C, const float* m, const float* k, const float* off, \
   float clip_lo, float clip_hi, const FakeQuantGrid& g)
TFOPS_ISA_VARIANTS(DividePlanes, TFOPS_FUSED_PLANES_PARAMS, (x, y, q0, q1, C, P, m, k, off, clip_lo, clip_hi, g),
                   PlanesBody<true>)
TFOPS_ISA_VARIANTS(MultiplyPlanes, TFOPS_FUSED_PLANES_PARAMS, (x, y, q0, q1, C, P, m, k, off, clip_lo, clip_hi, g),
                   PlanesBody<false>)
TFOPS_ISA_VARIANTS(DivideRows, TFOPS_FUSED_ROWS_PARAMS, (x, y, r0, r1, C, m, k, off, clip_lo, clip_hi, g),
                   RowsBody<true>)
TFOPS_ISA_VARIANTS(MultiplyRows, TFOPS_FUSED_ROWS_PARAMS, (x, y, r0, r1, C, m, k, off, clip_lo, clip_hi, g),
                   RowsBody<false>)
#undef TFOPS_FUSED_PLANES_PARAMS
#undef TFOPS_FUSED_ROWS_PARAMS

// A grid with a NaN (a NaN or infinite range): the scalar loop with x86's NaN rules spelled out, as
// fake_quant.cc's ForwardNanGrid (an operation may meet two NaNs only then).
void NanGridElements(const batch_norm::Layout& l, const float* x, float* y, i64 b, i64 e, const float* m,
                     const float* k, const float* off, float clip_lo, float clip_hi, const FakeQuantStep& s) {
  const i64 C = l.channels, P = l.inner;
  for (i64 i = b; i < e; ++i) {
    const i64 c = P == 1 ? i % C : (i / P) % C;
    y[i] = s.use_division
               ? BatchNormClipFakeQuantElement<true, FakeQuantX86Ops>(x[i], m[c], k[c], off[c], clip_lo, clip_hi, s.grid)
               : BatchNormClipFakeQuantElement<false, FakeQuantX86Ops>(x[i], m[c], k[c], off[c], clip_lo, clip_hi,
                                                                       s.grid);
  }
}

}  // namespace

FakeQuantStep MakeFakeQuantStep(bool args, float min, float max, const FakeQuantBits& bits) {
  FakeQuantStep step;
  step.use_division = !args;
  if (args) {
    step.grid = CheckArgsRange(min, max, bits);
  } else if (FakeQuantRangeIsZero(min, max)) {
    step.zero_output = true;
  } else {
    step.grid = NudgeFakeQuantRange(min, max, bits.quant_min, bits.quant_max);
  }
  return step;
}

void CheckClipBounds(float clip_min, float clip_max) {
  if (!(clip_min <= clip_max))  // false for a NaN bound too
    throw OpError("clip_min must be <= clip_max (and neither NaN), got " + FloatString(clip_min) + " and " +
                  FloatString(clip_max));
}

void BatchNormClipFakeQuantForward(const batch_norm::Layout& l, const float* x, const float* scale,
                                   const float* offset, const float* mean, const float* variance, float epsilon,
                                   float clip_min, float clip_max, const FakeQuantStep& step, float* y,
                                   const Parallel& par) {
  const i64 n = l.size(), C = l.channels, P = l.inner;
  if (n == 0) return;
  if (step.zero_output) {
    par.ForRange(n, kGrain, [&](i64 b, i64 e) { std::fill(y + b, y + e, 0.0f); });
    return;
  }
  // The batch norm's per-channel factor, as batch_norm.cc computes it (this thread is in TF's mode).
  std::vector<float> k(static_cast<size_t>(C));
  for (i64 c = 0; c < C; ++c) k[c] = batch_norm::ScaleFactor(variance[c], epsilon, scale[c]);
  const float* kp = k.data();
  if (FakeQuantGridHasNan(step.grid)) {
    par.ForRange(n, kGrain, [&](i64 b, i64 e) { NanGridElements(l, x, y, b, e, mean, kp, offset, clip_min, clip_max, step); });
    return;
  }
  const FakeQuantGrid& g = step.grid;
  if (P == 1) {
    par.ForRange(l.rows(), std::max<i64>(1, kGrain / std::max<i64>(C, 1)), [&](i64 b, i64 e) {
      if (step.use_division)
        DivideRows(x, y, b, e, C, mean, kp, offset, clip_min, clip_max, g);
      else
        MultiplyRows(x, y, b, e, C, mean, kp, offset, clip_min, clip_max, g);
    });
  } else {
    par.ForRange(l.outer * C, std::max<i64>(1, kGrain / P), [&](i64 b, i64 e) {
      if (step.use_division)
        DividePlanes(x, y, b, e, C, P, mean, kp, offset, clip_min, clip_max, g);
      else
        MultiplyPlanes(x, y, b, e, C, P, mean, kp, offset, clip_min, clip_max, g);
    });
  }
}

}  // namespace fused
}  // namespace tfops
