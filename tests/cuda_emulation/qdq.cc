// Host checks of the code the CUDA kernels of the QuantizeAndDequantize family run (no GPU needed):
//  1. qdq::ExplicitArith with the FPU in its default mode (no FTZ/DAZ, as on a GPU) against
//     qdq::NativeArith under MXCSR FTZ+DAZ (the CPU kernels), bit for bit: ComputeRange, QuantizeOne,
//     GradientOne over special values.
//  2. cuda::detail::DivMod32 against / and %.
//  3. The GPU's range reductions emulated on the host with the same HD pieces (LaneAdd/LaneCombine +
//     EigenFinish per tensor; AxisExtremes Add/Merge/Resolve + rescan per axis), with random groupings,
//     against the CPU's PerTensorExtremes / PerAxisExtremes.
//  4. End to end: the emulated GPU forward (parameters as the kernels compute them, QuantizeOne with
//     ExplicitArith, the NaN rule, the kernels' index arithmetic) against the CPU QuantizeDequantize.
// Built and run by tests/test_cuda_emulation_qdq.py (g++ with the CPU kernels' flags, no CUDA needed).
#include <cfloat>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cuda/quantize_dequantize.h"
#include "kernels/qdq_eigen_order.h"
#include "kernels/quantize_dequantize.h"
#include "kernels/simd.h"

using namespace tfops;

static int failures = 0;
static long checks = 0;

template <typename T>
typename qdq::Bits<T>::U B(T v) {
  return qdq::ToBits(v);
}

template <typename T>
bool Same(T a, T b) {
  return B(a) == B(b);
}

#define EXPECT(cond, ...)                   \
  do {                                      \
    ++checks;                               \
    if (!(cond)) {                          \
      if (++failures < 30) {                \
        std::printf("FAIL %s:%d: ", __FILE__, __LINE__); \
        std::printf(__VA_ARGS__);           \
        std::printf("\n");                  \
      }                                     \
    }                                       \
  } while (0)

static bool MxcsrFlushing() { return (_mm_getcsr() & 0x8040) != 0; }

template <typename T>
std::vector<T> Specials() {
  using U = typename qdq::Bits<T>::U;
  const T inf = std::numeric_limits<T>::infinity();
  const T tiny = std::numeric_limits<T>::denorm_min();
  const T mn = std::numeric_limits<T>::min();
  std::vector<T> v = {T(0), -T(0), tiny, -tiny, mn, -mn, mn / T(3), -mn / T(3), std::nextafter(mn, T(0)),
                      T(1), T(-1), T(0.5), T(-0.5), T(1.5), T(-2.5), T(2.5), T(3), T(-3), T(0.25), T(127), T(-128),
                      T(255), T(1e-3), T(-7e-4), inf, -inf, std::numeric_limits<T>::max(),
                      -std::numeric_limits<T>::max(), T(1e30), T(-1e30), T(1e-30), T(-1e-30)};
  // NaNs: quiet and signaling, both signs, payloads
  const U exp = qdq::Bits<T>::kExponent, quiet = qdq::Bits<T>::kQuiet, sign = qdq::Bits<T>::kSign;
  for (U bits : {exp | quiet, exp | quiet | 5, exp | 1, exp | 77, sign | exp | quiet, sign | exp | quiet | 3,
                 sign | exp | 9}) {
    v.push_back(qdq::FromBits<T>(bits));
  }
  return v;
}

// ---------------------------------------------------------------- 1. arithmetic
template <typename T>
__attribute__((noinline)) QdqParams<T> RangeNative(T lo, T hi, QdqGrid g) {
  ScopedFlushDenormals flush;
  return qdq::ComputeRange<qdq::NativeArith>(lo, hi, g);
}
template <typename T>
__attribute__((noinline)) QdqParams<T> RangeExplicit(T lo, T hi, QdqGrid g) {
  return qdq::ComputeRange<qdq::ExplicitArith>(lo, hi, g);
}

template <bool kClamp, bool kHalfUp, typename T>
__attribute__((noinline)) void QuantNative(const T* x, T* y, int n, QdqParams<T> p) {
  ScopedFlushDenormals flush;
  for (int i = 0; i < n; ++i) y[i] = qdq::QuantizeOne<qdq::NativeArith, kClamp, kHalfUp>(x[i], p.min_range, p.max_range, p.scale, p.inverse);
}
template <bool kClamp, bool kHalfUp, typename T>
__attribute__((noinline)) void QuantExplicit(const T* x, T* y, int n, QdqParams<T> p) {
  for (int i = 0; i < n; ++i) y[i] = qdq::QuantizeOne<qdq::ExplicitArith, kClamp, kHalfUp>(x[i], p.min_range, p.max_range, p.scale, p.inverse);
}

template <typename T>
void CheckArithmetic() {
  std::vector<T> s = Specials<T>();
  std::mt19937_64 rng(7);
  std::vector<T> xs = s;
  for (int i = 0; i < 200; ++i) xs.push_back(static_cast<T>(std::uniform_real_distribution<double>(-300, 300)(rng)));
  for (int k = -20; k <= 20; ++k) xs.push_back(T(k) + T(0.5));
  std::vector<QdqGrid> grids;
  for (int64_t bits : {1, 2, 8, 16, 23, 24, 25, 31, 52, 53, 54, 61, 62}) {
    for (int sgn = 0; sgn < 2; ++sgn) {
      for (int narrow = 0; narrow < 2; ++narrow) {
        if (sgn && bits > 61) continue;
        QdqOptions o;
        o.signed_input = sgn;
        o.num_bits = bits;
        o.narrow_range = narrow;
        grids.push_back(GridOf(o));
      }
    }
  }
  std::vector<T> y1(xs.size()), y2(xs.size());
  for (const QdqGrid& g : grids) {
    for (T lo : s) {
      for (T hi : s) {
        const QdqParams<T> a = RangeNative(lo, hi, g), b = RangeExplicit(lo, hi, g);
        EXPECT(Same(a.scale, b.scale) && Same(a.inverse, b.inverse) && Same(a.min_range, b.min_range) &&
                   Same(a.max_range, b.max_range),
               "ComputeRange(%g, %g, [%" PRId64 ", %" PRId64 "]) native %g %g %g %g explicit %g %g %g %g", (double)lo,
               (double)hi, g.lo, g.hi, (double)a.min_range, (double)a.max_range, (double)a.scale, (double)a.inverse,
               (double)b.min_range, (double)b.max_range, (double)b.scale, (double)b.inverse);
        auto run = [&](auto clamp, auto half_up) {
          constexpr bool kC = decltype(clamp)::value, kH = decltype(half_up)::value;
          QuantNative<kC, kH>(xs.data(), y1.data(), (int)xs.size(), a);
          QuantExplicit<kC, kH>(xs.data(), y2.data(), (int)xs.size(), a);
          for (std::size_t i = 0; i < xs.size(); ++i) {
            if (std::isnan(xs[i]) && std::isnan(a.inverse)) continue;  // the NaN rule decides
            EXPECT(Same(y1[i], y2[i]), "QuantizeOne<%d,%d>(%g) range (%g,%g) bits %d: native %a explicit %a", kC, kH,
                   (double)xs[i], (double)lo, (double)hi, (int)g.hi, (double)y1[i], (double)y2[i]);
          }
        };
        run(std::false_type{}, std::false_type{});
        run(std::false_type{}, std::true_type{});
        run(std::true_type{}, std::false_type{});
        run(std::true_type{}, std::true_type{});
      }
    }
  }
  // GradientOne
  for (T g : s) {
    for (T x : s) {
      for (T lo : {T(-1), T(0), -T(0), std::numeric_limits<T>::denorm_min(), T(-2.5)}) {
        for (T hi : {T(1), T(0), -std::numeric_limits<T>::denorm_min(), T(2.5), std::numeric_limits<T>::quiet_NaN()}) {
          T a, b;
          {
            ScopedFlushDenormals flush;
            volatile T gv = g, xv = x, lv = lo, hv = hi;
            a = qdq::GradientOne<qdq::NativeArith>(T(gv), T(xv), T(lv), T(hv));
          }
          b = qdq::GradientOne<qdq::ExplicitArith>(g, x, lo, hi);
          EXPECT(Same(a, b), "GradientOne(%g,%g,%g,%g) %a vs %a", (double)g, (double)x, (double)lo, (double)hi,
                 (double)a, (double)b);
        }
      }
    }
  }
}

// ---------------------------------------------------------------- 2. DivMod32
void CheckDivMod() {
  std::mt19937_64 rng(3);
  std::vector<uint64_t> ds = {1, 2, 3, 5, 7, 10, 31, 32, 33, 1000, 65535, 65536, 65537, (1u << 31) - 1, 1u << 31,
                              (1u << 30) + 1, 3u << 29, 641, 6700417};
  for (int i = 0; i < 3000; ++i) ds.push_back(1 + rng() % (uint64_t{1} << (1 + rng() % 31)));
  for (uint64_t d : ds) {
    const cuda::detail::DivMod32 dm = cuda::detail::DivMod32::Make(d);
    std::vector<uint32_t> ns = {0, 1, static_cast<uint32_t>(d - 1), static_cast<uint32_t>(d), 0xffffffffu, 0xfffffffeu,
                                0x80000000u, 0x7fffffffu};
    for (uint64_t m : {uint64_t{1}, uint64_t{2}, uint64_t{1000}, (uint64_t{1} << 32) / d}) {
      for (int64_t off : {-1, 0, 1}) {
        const uint64_t n = m * d + off;
        if (n < (uint64_t{1} << 32)) ns.push_back(static_cast<uint32_t>(n));
      }
    }
    for (int i = 0; i < 300; ++i) ns.push_back(static_cast<uint32_t>(rng()));
    for (uint32_t n : ns) {
      uint32_t q, r;
      dm.DivMod(n, &q, &r);
      EXPECT(q == n / d && r == n % d, "DivMod32 %u / %" PRIu64 " = %u r %u", n, d, q, r);
    }
  }
}

// ---------------------------------------------------------------- 3. reductions
template <typename T>
std::vector<T> RandomData(std::mt19937_64& rng, int64_t n, int flavor) {
  std::vector<T> s = Specials<T>();
  std::vector<T> x(static_cast<std::size_t>(n));
  for (auto& v : x) {
    const int k = static_cast<int>(rng() % 100);
    if (flavor == 0) {
      v = static_cast<T>(std::uniform_real_distribution<double>(-5, 5)(rng));
    } else if (flavor == 1) {  // zeros and subnormals at the extremes
      v = k < 50 ? (k % 2 ? T(0) : -T(0)) : (k < 70 ? std::numeric_limits<T>::denorm_min() * T(k % 3 - 1) : T(k % 7));
      if (k >= 70) v = std::fabs(v);
    } else if (flavor == 2) {  // a few NaNs
      v = k < 3 ? s[s.size() - 1 - rng() % 7] : static_cast<T>(std::uniform_real_distribution<double>(-5, 5)(rng));
    } else {  // anything
      v = s[rng() % s.size()];
    }
  }
  if (flavor >= 2 && n > 0 && rng() % 3 == 0) x[n - 1] = s[s.size() - 1 - rng() % 7];  // a NaN last
  return x;
}

// The GPU per-tensor range: TensorLanesKernel with `blocks` x `threads` then TensorRangeKernel.
template <typename T>
void EmulateTensorRange(const std::vector<T>& x, int64_t blocks, int threads, T* lo, T* hi) {
  using namespace qdq_order;
  constexpr int L = 4 * PacketWidth<T>();
  constexpr int W = PacketWidth<T>();
  const int64_t n = static_cast<int64_t>(x.size());
  const int64_t whole4 = (n / L) * L;
  std::vector<LaneExtreme<T>> plo(blocks * L), phi(blocks * L);
  const int64_t stride = blocks * threads;
  for (int64_t b = 0; b < blocks; ++b) {
    std::vector<LaneExtreme<T>> tlo(threads, LaneInit<T, false>()), thi(threads, LaneInit<T, true>());
    for (int t = 0; t < threads; ++t) {
      for (int64_t i = b * threads + t; i < whole4; i += stride) {
        LaneAdd<T, false>(tlo[t], x[i], i);
        LaneAdd<T, true>(thi[t], x[i], i);
      }
    }
    for (int l = 0; l < L; ++l) {
      LaneExtreme<T> a = tlo[l], c = thi[l];
      for (int t = l + L; t < threads; t += L) {
        a = LaneCombine<T, false>(a, tlo[t]);
        c = LaneCombine<T, true>(c, thi[t]);
      }
      plo[b * L + l] = a;
      phi[b * L + l] = c;
    }
  }
  T acc_lo[4][W], acc_hi[4][W];
  for (int l = 0; l < L; ++l) {
    LaneExtreme<T> a = LaneInit<T, false>(), c = LaneInit<T, true>();
    for (int64_t b = blocks - 1; b >= 0; --b) {  // any order: reverse on purpose
      a = LaneCombine<T, false>(a, plo[b * L + l]);
      c = LaneCombine<T, true>(c, phi[b * L + l]);
    }
    acc_lo[l / W][l % W] = a.value;
    acc_hi[l / W][l % W] = c.value;
  }
  auto value = [&](int64_t j) { return x[j]; };
  *lo = EigenFinish<qdq::ExplicitArith, T, false>(acc_lo, value, n);
  *hi = EigenFinish<qdq::ExplicitArith, T, true>(acc_hi, value, n);
}

// The GPU per-axis range of channel c: partials over random chunks of the channel, merged in random
// order, then Resolve (and the rescan).
template <typename T>
void EmulateAxisRange(const std::vector<T>& x, int64_t pre, int64_t depth, int64_t post, std::mt19937_64& rng,
                      T* lo, T* hi) {
  using namespace qdq_order;
  const int64_t size = pre * post;
  for (int64_t c = 0; c < depth; ++c) {
    auto at = [&](int64_t t, int64_t* key) {
      const int64_t r = t / post, q = t % post;
      *key = q * pre + r;
      return x[(r * depth + c) * post + q];
    };
    std::vector<AxisExtremes<T>> parts;
    int64_t t = 0;
    while (t < size) {
      const int64_t len = 1 + static_cast<int64_t>(rng() % (1 + size / 3));
      AxisExtremes<T> e = AxisExtremes<T>::Init();
      for (int64_t u = t; u < std::min(size, t + len); ++u) {
        int64_t key;
        const T v = at(u, &key);
        e.Add(v, key);
      }
      parts.push_back(e);
      t += len;
    }
    std::shuffle(parts.begin(), parts.end(), rng);
    AxisExtremes<T> e = AxisExtremes<T>::Init();
    for (auto& p : parts) e.Merge(p);
    if (!e.Resolve(size, &lo[c], &hi[c])) {
      AxisExtremes<T> f = AxisExtremes<T>::Init();
      for (int64_t u = size - 1; u >= 0; --u) {  // any order
        int64_t key;
        const T v = at(u, &key);
        if (key > e.nan_key) f.AddNumber(v, key);
      }
      const bool ok = f.Resolve(size, &lo[c], &hi[c]);
      EXPECT(ok, "rescan did not resolve");
    }
  }
}

template <typename T>
void CheckReductions() {
  std::mt19937_64 rng(11);
  for (int iter = 0; iter < 3000; ++iter) {
    const int flavor = iter % 4;
    // per tensor
    {
      const int64_t n = 1 + static_cast<int64_t>(rng() % (iter % 10 == 0 ? 20000 : 300));
      const std::vector<T> x = RandomData<T>(rng, n, flavor);
      T clo, chi;
      {
        ScopedFlushDenormals flush;
        qdq_order::PerTensorExtremes(x.data(), n, &clo, &chi, Parallel());
      }
      T glo, ghi;
      const int threads = (1 + static_cast<int>(rng() % 4)) * 4 * qdq_order::PacketWidth<T>();
      EmulateTensorRange(x, 1 + static_cast<int64_t>(rng() % 5), threads, &glo, &ghi);
      EXPECT(Same(qdq::Flush(clo), qdq::Flush(glo)) && Same(qdq::Flush(chi), qdq::Flush(ghi)),
             "per-tensor n=%" PRId64 " flavor %d: cpu (%a, %a) gpu (%a, %a)", n, flavor, (double)clo, (double)chi,
             (double)glo, (double)ghi);
    }
    // per axis
    {
      const int64_t pre = 1 + static_cast<int64_t>(rng() % 9), depth = 1 + static_cast<int64_t>(rng() % 5),
                    post = 1 + static_cast<int64_t>(rng() % 9);
      const std::vector<T> x = RandomData<T>(rng, pre * depth * post, flavor);
      std::vector<T> clo(depth), chi(depth), glo(depth), ghi(depth);
      {
        ScopedFlushDenormals flush;
        qdq_order::PerAxisExtremes(x.data(), pre, depth, post, clo.data(), chi.data(), Parallel());
      }
      EmulateAxisRange(x, pre, depth, post, rng, glo.data(), ghi.data());
      for (int64_t c = 0; c < depth; ++c) {
        EXPECT(Same(qdq::Flush(clo[c]), qdq::Flush(glo[c])) && Same(qdq::Flush(chi[c]), qdq::Flush(ghi[c])),
               "per-axis [%" PRId64 ",%" PRId64 ",%" PRId64 "] c=%" PRId64 " flavor %d: cpu (%a, %a) gpu (%a, %a)", pre,
               depth, post, c, flavor, (double)clo[c], (double)chi[c], (double)glo[c], (double)ghi[c]);
      }
    }
  }
}

// ---------------------------------------------------------------- 4. end to end
// The emulated GPU forward, mirroring cuda/quantize_dequantize.cu's Forward: element f of a launch over
// channels [c0, c0 + count) is (r, j) = divmod(f, span), (cc, q) = divmod(j, post).
template <typename T>
std::vector<T> EmulateForward(const std::vector<T>& x, const QdqView& v, const T* gmin, const T* gmax,
                              const QdqOptions& o, std::mt19937_64& rng) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<T> y(x.size(), T(12345));
  const bool half_up = o.round_mode == QdqRoundMode::kHalfUp;
  const qdq_order::NanRule rule = qdq_order::MakeNanRule<T>(v.pre, v.depth, v.post, v.per_axis, o.range_given, half_up);
  std::vector<QdqParams<T>> params;
  if (o.range_given) {
    ScopedFlushDenormals flush;  // the adapter's mode on the host
    params = GivenRangeParams(gmin, gmax, v.depth, o);
  } else {
    params.resize(v.depth);
    std::vector<T> lo(v.depth), hi(v.depth);
    if (v.per_axis) {
      EmulateAxisRange(x, v.pre, v.depth, v.post, rng, lo.data(), hi.data());
    } else {
      EmulateTensorRange(x, 1 + static_cast<int64_t>(rng() % 3), 4 * qdq_order::PacketWidth<T>() * 2, &lo[0], &hi[0]);
    }
    for (int64_t c = 0; c < v.depth; ++c) params[c] = qdq::ComputeRange<qdq::ExplicitArith>(lo[c], hi[c], GridOf(o));
  }
  auto one = [&](T xv, const QdqParams<T>& p, int64_t r, int64_t q) {
    T out;
    if (o.range_given) {
      out = half_up ? qdq::QuantizeOne<qdq::ExplicitArith, true, true>(xv, p.min_range, p.max_range, p.scale, p.inverse)
                    : qdq::QuantizeOne<qdq::ExplicitArith, true, false>(xv, p.min_range, p.max_range, p.scale, p.inverse);
    } else {
      out = half_up ? qdq::QuantizeOne<qdq::ExplicitArith, false, true>(xv, p.min_range, p.max_range, p.scale, p.inverse)
                    : qdq::QuantizeOne<qdq::ExplicitArith, false, false>(xv, p.min_range, p.max_range, p.scale, p.inverse);
    }
    if (qdq::IsNan(xv) && qdq::IsNan(p.inverse)) out = qdq::NanResult(xv, p.inverse, rule.KeepsInputNan(r, q, v.pre, v.post));
    return out;
  };
  if (v.depth == 1) {
    for (int64_t i = 0; i < n; ++i) y[i] = one(x[i], params[0], i / v.post, i % v.post);
    return y;
  }
  const int64_t chunk = o.range_given ? cuda::kGivenChannelsPerLaunch<T> : v.depth;
  for (int64_t c0 = 0; c0 < v.depth; c0 += chunk) {
    const int64_t channels = std::min(chunk, v.depth - c0);
    const int64_t span = channels * v.post, count = v.pre * span;
    const auto span_div = cuda::detail::DivMod32::Make(span), post_div = cuda::detail::DivMod32::Make(v.post);
    for (int64_t f = 0; f < count; ++f) {
      uint32_t r, j, cc, q;
      span_div.DivMod(static_cast<uint32_t>(f), &r, &j);
      post_div.DivMod(j, &cc, &q);
      const int64_t i = static_cast<int64_t>(r) * v.depth * v.post + c0 * v.post + j;
      y[i] = one(x[i], params[c0 + cc], r, q);
    }
  }
  return y;
}

template <typename T>
void CheckForward() {
  std::mt19937_64 rng(5);
  for (int iter = 0; iter < 4000; ++iter) {
    const int flavor = iter % 4;
    QdqOptions o;
    o.signed_input = rng() % 2;
    o.num_bits = 1 + static_cast<int64_t>(rng() % (rng() % 2 ? 8 : 61));
    o.narrow_range = rng() % 2;
    o.range_given = rng() % 2;
    o.round_mode = rng() % 2 ? QdqRoundMode::kHalfUp : QdqRoundMode::kHalfToEven;
    QdqView v;
    int64_t n;
    if (rng() % 3 == 0) {
      n = static_cast<int64_t>(rng() % (iter % 20 == 0 ? 30000 : 200));
      v.post = n;
    } else {
      v.per_axis = true;
      v.pre = 1 + static_cast<int64_t>(rng() % 7);
      v.depth = 1 + static_cast<int64_t>(rng() % (iter % 10 == 0 ? 500 : 6));
      v.post = 1 + static_cast<int64_t>(rng() % 7);
      n = v.pre * v.depth * v.post;
    }
    if (n == 0) continue;
    const std::vector<T> x = RandomData<T>(rng, n, flavor);
    std::vector<T> gmin(v.depth), gmax(v.depth);
    std::vector<T> s = Specials<T>();
    for (int64_t c = 0; c < v.depth; ++c) {
      gmin[c] = rng() % 4 == 0 ? s[rng() % s.size()] : static_cast<T>(-std::uniform_real_distribution<double>(0, 4)(rng));
      gmax[c] = rng() % 4 == 0 ? s[rng() % s.size()] : static_cast<T>(std::uniform_real_distribution<double>(0, 4)(rng));
      if (!v.per_axis && !(gmin[c] <= gmax[c])) gmin[c] = gmax[c] = T(1);  // the adapter rejects these
    }
    std::vector<T> cpu(x.size());
    QuantizeDequantize<T>(x.data(), cpu.data(), v, gmin.data(), gmax.data(), o, Parallel());
    const std::vector<T> gpu = EmulateForward(x, v, gmin.data(), gmax.data(), o, rng);
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (!Same(cpu[i], gpu[i]) && bad++ < 3) {
        EXPECT(false, "forward [%" PRId64 ",%" PRId64 ",%" PRId64 "] axis %d given %d bits %" PRId64
                      " signed %d narrow %d half_up %d flavor %d: i=%" PRId64 " x=%a cpu %a gpu %a",
               v.pre, v.depth, v.post, v.per_axis, o.range_given, o.num_bits, o.signed_input, o.narrow_range,
               o.round_mode == QdqRoundMode::kHalfUp, flavor, i, (double)x[i], (double)cpu[i], (double)gpu[i]);
      }
    }
    ++checks;
    // V4Grad
    std::vector<T> g = RandomData<T>(rng, n, 3), dcpu(x.size()), dgpu(x.size());
    QuantizeDequantizeGradient<T>(g.data(), x.data(), dcpu.data(), v, gmin.data(), gmax.data(), Parallel());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t c = (i / v.post) % v.depth;
      dgpu[i] = qdq::GradientOne<qdq::ExplicitArith>(g[i], x[i], gmin[c], gmax[c]);
      EXPECT(Same(dcpu[i], dgpu[i]), "grad i=%" PRId64 " g=%a x=%a: cpu %a gpu %a", i, (double)g[i], (double)x[i],
             (double)dcpu[i], (double)dgpu[i]);
    }
  }
}

int main() {
  if (MxcsrFlushing()) {
    std::printf("MXCSR already flushing at start\n");
    return 2;
  }
  CheckArithmetic<float>();
  CheckArithmetic<double>();
  std::printf("arithmetic: %ld checks, %d failures\n", checks, failures);
  CheckDivMod();
  std::printf("+divmod: %ld checks, %d failures\n", checks, failures);
  CheckReductions<float>();
  CheckReductions<double>();
  std::printf("+reductions: %ld checks, %d failures\n", checks, failures);
  CheckForward<float>();
  CheckForward<double>();
  std::printf("+forward: %ld checks, %d failures\n", checks, failures);
  if (MxcsrFlushing()) {
    std::printf("MXCSR left flushing\n");
    return 2;
  }
  return failures == 0 ? 0 : 1;
}
