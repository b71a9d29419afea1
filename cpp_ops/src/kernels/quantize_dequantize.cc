// QuantizeAndDequantize kernels. All arithmetic is in the element type T, one IEEE operation at a
// time in TF's order (built with -ffp-contract=off).
#include "kernels/quantize_dequantize.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <limits>
#include <vector>

#include "kernels/qdq_eigen_order.h"
#include "kernels/simd.h"

namespace tfops {

namespace {

constexpr int64_t kGrain = 1 << 15;  // elements per parallel task (a shape-only choice)

// ---- the elementwise pass
// qdq::QuantizeOne with NativeArith: the CPU's FTZ/DAZ mode and x86's NaN rules make it TF's, and it
// vectorizes (the AVX2 and AVX-512 copies round with vroundps/vrndscaleps).
template <typename T, bool kClamp, bool kHalfUp>
TFOPS_ALWAYS_INLINE void QdqLoop(const T* x, T* y, int64_t n, T lo, T hi, T scale, T inverse) {
  for (int64_t i = 0; i < n; ++i) {
    y[i] = qdq::QuantizeOne<qdq::NativeArith, kClamp, kHalfUp>(x[i], lo, hi, scale, inverse);
  }
}

// One copy of each loop per ISA (simd.h).
#define TFOPS_QDQ_LOOP(NAME, T, CLAMP)                                                                         \
  TFOPS_ALWAYS_INLINE void NAME##Body(const T* x, T* y, int64_t n, T lo, T hi, T scale, T inverse, bool half_up) { \
    if (half_up) {                                                                                            \
      QdqLoop<T, CLAMP, true>(x, y, n, lo, hi, scale, inverse);                                              \
    } else {                                                                                                  \
      QdqLoop<T, CLAMP, false>(x, y, n, lo, hi, scale, inverse);                                             \
    }                                                                                                         \
  }                                                                                                           \
  TFOPS_ISA_VARIANTS(NAME, (const T* x, T* y, int64_t n, T lo, T hi, T scale, T inverse, bool half_up),      \
                     (x, y, n, lo, hi, scale, inverse, half_up), NAME##Body)
TFOPS_QDQ_LOOP(QdqFloat, float, false)
TFOPS_QDQ_LOOP(QdqFloatClamped, float, true)
TFOPS_QDQ_LOOP(QdqDouble, double, false)
TFOPS_QDQ_LOOP(QdqDoubleClamped, double, true)
#undef TFOPS_QDQ_LOOP

inline void QdqSegment(const float* x, float* y, int64_t n, const QdqParams<float>& p, bool clamp, bool half_up) {
  (clamp ? QdqFloatClamped : QdqFloat)(x, y, n, p.min_range, p.max_range, p.scale, p.inverse, half_up);
}
inline void QdqSegment(const double* x, double* y, int64_t n, const QdqParams<double>& p, bool clamp,
                       bool half_up) {
  (clamp ? QdqDoubleClamped : QdqDouble)(x, y, n, p.min_range, p.max_range, p.scale, p.inverse, half_up);
}

// One row of a [pre, depth] view (post == 1): channel c has its own parameters, so the row is
// vectorized across channels with the parameters as arrays.
template <typename T, bool kClamp, bool kHalfUp>
TFOPS_ALWAYS_INLINE void QdqRowLoop(const T* __restrict x, T* __restrict y, int64_t n, const T* lo, const T* hi, const T* scale,
                       const T* inverse) {
  for (int64_t c = 0; c < n; ++c) {
    y[c] = qdq::QuantizeOne<qdq::NativeArith, kClamp, kHalfUp>(x[c], lo[c], hi[c], scale[c], inverse[c]);
  }
}

#define TFOPS_QDQ_ROW(NAME, T)                                                                             \
  TFOPS_ALWAYS_INLINE void NAME##Body(const T* x, T* y, int64_t n, const T* lo, const T* hi, const T* scale, \
                                      const T* inverse, bool clamp, bool half_up) {                         \
    if (clamp) {                                                                                            \
      if (half_up) QdqRowLoop<T, true, true>(x, y, n, lo, hi, scale, inverse);                              \
      else QdqRowLoop<T, true, false>(x, y, n, lo, hi, scale, inverse);                                     \
    } else {                                                                                                \
      if (half_up) QdqRowLoop<T, false, true>(x, y, n, lo, hi, scale, inverse);                             \
      else QdqRowLoop<T, false, false>(x, y, n, lo, hi, scale, inverse);                                    \
    }                                                                                                       \
  }                                                                                                         \
  TFOPS_ISA_VARIANTS(NAME, (const T* x, T* y, int64_t n, const T* lo, const T* hi, const T* scale,             \
                            const T* inverse, bool clamp, bool half_up),                                      \
                     (x, y, n, lo, hi, scale, inverse, clamp, half_up), NAME##Body)
TFOPS_QDQ_ROW(QdqRowFloat, float)
TFOPS_QDQ_ROW(QdqRowDouble, double)
#undef TFOPS_QDQ_ROW

inline void QdqRow(const float* x, float* y, int64_t n, const float* lo, const float* hi, const float* scale,
                   const float* inverse, bool clamp, bool half_up) {
  QdqRowFloat(x, y, n, lo, hi, scale, inverse, clamp, half_up);
}
inline void QdqRow(const double* x, double* y, int64_t n, const double* lo, const double* hi, const double* scale,
                   const double* inverse, bool clamp, bool half_up) {
  QdqRowDouble(x, y, n, lo, hi, scale, inverse, clamp, half_up);
}

// Runs seg(begin, end, channel) over [0, pre*depth*post) in chunks of kGrain elements, each chunk cut
// at channel-row boundaries.
template <typename F>
void ForEachChannelSegment(const QdqView& v, const Parallel& parallel, const F& seg) {
  const int64_t n = v.pre * v.depth * v.post;
  if (n == 0) return;
  parallel.ForRange(n, kGrain, [&](int64_t begin, int64_t end) {
    int64_t i = begin;
    while (i < end) {
      const int64_t row = i / v.post;
      const int64_t stop = std::min(end, (row + 1) * v.post);
      seg(i, stop, row % v.depth);
      i = stop;
    }
  });
}

}  // namespace

template <typename T>
void QuantizeDequantize(const T* x, T* y, const QdqView& view, const T* given_min, const T* given_max,
                        const QdqOptions& options, const Parallel& parallel) {
  const int64_t n = view.pre * view.depth * view.post;
  if (n == 0) return;
  ScopedFlushDenormals flush;  // TF's mode; each parallel task below sets it on its own thread too
  std::vector<QdqParams<T>> params;
  const QdqGrid grid = GridOf(options);
  if (options.range_given) {
    params = GivenRangeParams(given_min, given_max, view.depth, options);
  } else if (view.per_axis) {
    params.resize(static_cast<std::size_t>(view.depth));
    std::vector<T> lo(static_cast<std::size_t>(view.depth)), hi(lo.size());
    qdq_order::PerAxisExtremes(x, view.pre, view.depth, view.post, lo.data(), hi.data(), parallel);
    for (int64_t c = 0; c < view.depth; ++c) params[c] = qdq::ComputeRange<qdq::ExplicitArith>(lo[c], hi[c], grid);
  } else {
    params.resize(1);
    T lo, hi;
    qdq_order::PerTensorExtremes(x, n, &lo, &hi, parallel);
    params[0] = qdq::ComputeRange<qdq::ExplicitArith>(lo, hi, grid);
  }
  const bool half_up = options.round_mode == QdqRoundMode::kHalfUp;
  if (view.post == 1 && view.depth > 1) {
    std::vector<T> lo(static_cast<std::size_t>(view.depth)), hi(lo.size()), scale(lo.size()), inverse(lo.size());
    for (int64_t c = 0; c < view.depth; ++c) {
      lo[c] = params[c].min_range;
      hi[c] = params[c].max_range;
      scale[c] = params[c].scale;
      inverse[c] = params[c].inverse;
    }
    parallel.ForRange(view.pre, std::max<int64_t>(1, kGrain / view.depth), [&](int64_t begin, int64_t end) {
      ScopedFlushDenormals flush_task;
      for (int64_t r = begin; r < end; ++r) {
        QdqRow(x + r * view.depth, y + r * view.depth, view.depth, lo.data(), hi.data(), scale.data(),
               inverse.data(), options.range_given, half_up);
      }
    });
  } else {
    ForEachChannelSegment(view, parallel, [&](int64_t begin, int64_t end, int64_t c) {
      ScopedFlushDenormals flush_task;
      QdqSegment(x + begin, y + begin, end - begin, params[c], options.range_given, half_up);
    });
  }
  // Where the input and the step are both NaN the loop above keeps whichever NaN the compiler's
  // operand order gives; set the one TF keeps. The step is NaN only when the range's max is NaN.
  const qdq_order::NanRule rule =
      qdq_order::MakeNanRule<T>(view.pre, view.depth, view.post, view.per_axis, options.range_given, half_up);
  for (int64_t c = 0; c < view.depth; ++c) {
    const QdqParams<T>& p = params[c];
    if (!std::isnan(p.inverse)) continue;
    for (int64_t r = 0; r < view.pre; ++r) {
      const int64_t base = (r * view.depth + c) * view.post;
      for (int64_t q = 0; q < view.post; ++q) {
        const T v = x[base + q];
        if (!std::isnan(v)) continue;  // a NaN input stays NaN through the clamp, the scaling and the rounding
        y[base + q] = qdq::NanResult(v, p.inverse, rule.KeepsInputNan(r, q, view.pre, view.post));
      }
    }
  }
}

template <typename T>
void QuantizeDequantizeGradient(const T* g, const T* x, T* dx, const QdqView& view, const T* min, const T* max,
                                const Parallel& parallel) {
  ForEachChannelSegment(view, parallel, [&](int64_t begin, int64_t end, int64_t c) {
    ScopedFlushDenormals flush;
    const T lo = min[c], hi = max[c];
    for (int64_t i = begin; i < end; ++i) dx[i] = qdq::GradientOne<qdq::NativeArith>(g[i], x[i], lo, hi);
  });
}

template <typename T>
std::vector<QdqParams<T>> GivenRangeParams(const T* given_min, const T* given_max, int64_t depth,
                                           const QdqOptions& options) {
  const QdqGrid grid = GridOf(options);
  std::vector<QdqParams<T>> params(static_cast<std::size_t>(depth));
  for (int64_t c = 0; c < depth; ++c) {
    params[c] = qdq::ComputeRange<qdq::ExplicitArith>(given_min[c], given_max[c], grid);
  }
  return params;
}

template std::vector<QdqParams<float>> GivenRangeParams<float>(const float*, const float*, int64_t,
                                                               const QdqOptions&);
template std::vector<QdqParams<double>> GivenRangeParams<double>(const double*, const double*, int64_t,
                                                                 const QdqOptions&);
template void QuantizeDequantize<float>(const float*, float*, const QdqView&, const float*, const float*,
                                        const QdqOptions&, const Parallel&);
template void QuantizeDequantize<double>(const double*, double*, const QdqView&, const double*, const double*,
                                         const QdqOptions&, const Parallel&);
template void QuantizeDequantizeGradient<float>(const float*, const float*, float*, const QdqView&, const float*,
                                                const float*, const Parallel&);
template void QuantizeDequantizeGradient<double>(const double*, const double*, double*, const QdqView&,
                                                 const double*, const double*, const Parallel&);

}  // namespace tfops
