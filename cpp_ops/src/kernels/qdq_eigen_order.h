// Which NaN, or which signed zero, QuantizeAndDequantize keeps when the choice is one of order.
// Values never depend on these rules, only NaN bits and zero signs. They mirror
// ort_ops/reference/_qdq_eigen_order.py (which explains how they were matched against TF 2.21):
//  - the per-tensor data range: Eigen's vectorized full reduction (EigenExtreme);
//  - the per-axis data range: a scalar scan of each channel in (post, pre) order with
//    std::min(t, acc) / std::max(t, acc) (PerAxisExtremes computes its result without scanning in
//    that cache-hostile order unless a NaN or a zero extreme makes the order matter);
//  - `rounded * inverse` with both NaN: the input's NaN or the step's (KeepsInputNan).
//
// The part above the `#if !defined(__CUDACC__)` line is shared with the CUDA kernels (TFOPS_HD, no
// host-only constructs): the end of Eigen's full reduction (EigenFinish), the NaN rule, and the same
// range rules in an associative form (LaneExtreme, AxisExtremes) for reductions that combine partial
// results in any grouping. The CPU implementations below that line use GCC vector extensions.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/device.h"
#include "kernels/parallel.h"
#include "kernels/quantize_dequantize.h"
#include "kernels/simd.h"

namespace tfops {
namespace qdq_order {

template <typename T>
TFOPS_HD constexpr int PacketWidth() {
  return sizeof(T) == 4 ? 8 : 4;  // AVX: 8 floats or 4 doubles, as in TF's x86 build
}

// Coefficients per block of Eigen's tiled executor for the per-axis, data-range, HALF_UP expression.
template <typename T>
constexpr int64_t TileCoeffs() {
  return sizeof(T) == 4 ? 11428 : 5714;
}

// ---- per-tensor: Eigen's single-threaded vectorized full reduction.
// first if it strictly wins, else second (MINPS/MAXPS order); A compares (qdq::NativeArith under
// the CPU's DAZ mode, or qdq::ExplicitArith).
template <class A, typename T, bool kMax>
TFOPS_HD inline T Pick(T first, T second) {
  return (kMax ? A::Less(second, first) : A::Less(first, second)) ? first : second;
}

template <typename T, bool kMax>
TFOPS_HD inline T ReductionInit() {
  return kMax ? -qdq::Infinity<T>() : qdq::Infinity<T>();
}

// EigenExtreme after its packet loop: `acc` holds the four packet accumulators after reducing
// [0, whole4) (each lane (k, l) over the elements j + k * W + l), value(j) reads element j. Folds the
// accumulators, reduces the remaining whole packets and the scalar tail, then folds horizontally.
template <class A, typename T, bool kMax, typename F>
TFOPS_HD T EigenFinish(T (&acc)[4][PacketWidth<T>()], const F& value, int64_t n) {
  constexpr int W = PacketWidth<T>();
  const int64_t whole4 = (n / (4 * W)) * (4 * W);
  const int64_t whole = (n / W) * W;
  if (whole4 > 0) {
    for (int k = 1; k < 4; ++k) {
      for (int l = 0; l < W; ++l) acc[0][l] = Pick<A, T, kMax>(acc[k][l], acc[0][l]);
    }
  }
  for (int64_t j = whole4; j < whole; j += W) {
    for (int l = 0; l < W; ++l) acc[0][l] = Pick<A, T, kMax>(value(j + l), acc[0][l]);
  }
  T scalar = ReductionInit<T, kMax>();
  for (int64_t j = whole; j < n; ++j) scalar = Pick<A, T, kMax>(scalar, value(j));
  // Horizontal fold, upper half onto lower: MINPS/MAXPS(upper, lower), so a tie (+0 against -0, or
  // two NaNs) keeps the lower half's value.
  for (int width = W / 2; width >= 1; width /= 2) {
    for (int l = 0; l < width; ++l) acc[0][l] = Pick<A, T, kMax>(acc[0][l + width], acc[0][l]);
  }
  return Pick<A, T, kMax>(acc[0][0], scalar);
}

// ---- the range rules in associative form. Values are stored flushed: the reductions compare with
// denormals-are-zero, and a data range only ever enters arithmetic, which flushes it anyway. NaNs
// are never stored as extremes.

// Per-tensor: lane L = k * W + l of EigenExtreme's packet loop sees the elements i < whole4 with
// i % (4 * W) == L and keeps the first of them (smallest i) whose value is the lane's strict extreme:
// Pick(value, acc) keeps the accumulator on a tie, and a NaN never enters.
template <typename T>
struct LaneExtreme {
  T value;
  int64_t index;  // INT64_MAX: none yet (value is then the reduction's init)
};

template <typename T, bool kMax>
TFOPS_HD inline LaneExtreme<T> LaneInit() {
  return {ReductionInit<T, kMax>(), INT64_MAX};
}

// Element i (raw value v) into a lane that has seen only smaller indices.
template <typename T, bool kMax>
TFOPS_HD inline void LaneAdd(LaneExtreme<T>& acc, T v, int64_t i) {
  if (qdq::IsNan(v)) return;
  const T f = qdq::Flush(v);
  if (kMax ? acc.value < f : f < acc.value) acc = {f, i};
}

// Two partial results of one lane over disjoint sets of elements.
template <typename T, bool kMax>
TFOPS_HD inline LaneExtreme<T> LaneCombine(LaneExtreme<T> a, LaneExtreme<T> b) {
  if (kMax ? b.value < a.value : a.value < b.value) return a;
  if (kMax ? a.value < b.value : b.value < a.value) return b;
  return b.index < a.index ? b : a;
}

// Per-axis: channel c of [pre, depth, post] is scanned in the order key = q * pre + r over x[r, c, q]
// with acc = std::min(t, acc), so the result is the element with the last key if that is NaN;
// otherwise the extreme of the elements after the last NaN, a tie (+0/-0) going to the later element.
// AxisExtremes keeps, over any subset of a channel, the last NaN and the extremes of all its non-NaN
// elements with their keys (a tie to the larger key). When the last NaN is not the final element and
// comes after an extreme, that extreme may not count: the channel is then scanned again over the keys
// after the last NaN (Resolve says so; the rare case).
template <typename T>
struct KeyedValue {
  T value;
  int64_t key;  // -1: none yet (value is then the reduction's init)
};

template <typename T>
struct AxisExtremes {
  KeyedValue<T> lo, hi;
  int64_t nan_key;  // -1: no NaN
  T nan_value;

  TFOPS_HD static AxisExtremes Init() {
    AxisExtremes e;
    e.lo = {ReductionInit<T, false>(), -1};
    e.hi = {ReductionInit<T, true>(), -1};
    e.nan_key = -1;
    e.nan_value = T(0);
    return e;
  }

  // A non-NaN value (raw) with its key.
  TFOPS_HD void AddNumber(T v, int64_t key) {
    const T f = qdq::Flush(v);
    if (f < lo.value || (f == lo.value && key > lo.key)) lo = {f, key};
    if (hi.value < f || (f == hi.value && key > hi.key)) hi = {f, key};
  }

  TFOPS_HD void Add(T v, int64_t key) {
    if (qdq::IsNan(v)) {
      if (key > nan_key) {
        nan_key = key;
        nan_value = v;
      }
      return;
    }
    AddNumber(v, key);
  }

  TFOPS_HD void Merge(const AxisExtremes& o) {
    if (o.lo.value < lo.value || (o.lo.value == lo.value && o.lo.key > lo.key)) lo = o.lo;
    if (hi.value < o.hi.value || (o.hi.value == hi.value && o.hi.key > hi.key)) hi = o.hi;
    if (o.nan_key > nan_key) {
      nan_key = o.nan_key;
      nan_value = o.nan_value;
    }
  }

  // The channel's range when this covers all its `count` elements. False: scan the channel again,
  // adding (AddNumber) only the elements with a key above nan_key (none of them is NaN) into a fresh
  // AxisExtremes, whose Resolve then succeeds.
  TFOPS_HD bool Resolve(int64_t count, T* min_range, T* max_range) const {
    if (nan_key == count - 1) {
      *min_range = *max_range = nan_value;
      return true;
    }
    if (nan_key >= 0 && (lo.key < nan_key || hi.key < nan_key)) return false;
    *min_range = lo.value;
    *max_range = hi.value;
    return true;
  }
};

// ---- `rounded * inverse` when both are NaN: does element (r, q) of a channel keep the input's NaN
// (true) or the step's (false)? TF's packet code keeps the input's, its scalar code the step's.
struct NanRule {
  enum Kind { kStepEverywhere, kRuns } kind = kStepEverywhere;
  int64_t run = 1;         // inner runs of this many elements of the channel's flat [pre, post] index...
  bool per_row = false;    // ...restarting at each row (r) when set
  int64_t width = 8;       // packet width: a run's last (length % width) elements are scalar steps

  TFOPS_HD bool KeepsInputNan(int64_t r, int64_t q, int64_t pre, int64_t post) const {
    if (kind == kStepEverywhere) return false;
    const int64_t length = per_row ? post : pre * post;
    const int64_t pos = per_row ? q : r * post + q;
    const int64_t start = (pos / run) * run;
    const int64_t len = run < length - start ? run : length - start;
    return pos - start < len - len % width;
  }
};

template <typename T>
NanRule MakeNanRule(int64_t pre, int64_t depth, int64_t post, bool per_axis, bool range_given, bool half_up) {
  NanRule rule;
  rule.width = PacketWidth<T>();
  if (!range_given && (!per_axis || !half_up)) return rule;  // the step's NaN everywhere
  rule.kind = NanRule::kRuns;
  if (range_given) {  // the clamped expression runs flat over each channel
    rule.run = std::max<int64_t>(pre * post, 1);
    return rule;
  }
  // Eigen's tiled executor: blocks of [rows, cols] with cols = min(post, tile) and
  // rows = min(pre, ceil(tile / cols)); a block's rows merge into one run when contiguous in memory.
  const int64_t tile = TileCoeffs<T>();
  const int64_t cols = std::max<int64_t>(std::min(post, tile), 1);
  if (cols < post || depth > 1) {
    rule.run = cols;
    rule.per_row = true;
  } else {
    rule.run = std::max<int64_t>(std::min(pre, (tile + cols - 1) / cols) * post, 1);
  }
  return rule;
}

#if !defined(__CUDACC__)
// ---- CPU implementations (GCC vector extensions, std::vector, the thread pool).

// Reduces value(0..n-1) to its min (kMax false) or max, in Eigen's order.
template <typename T, bool kMax, typename F>
T EigenExtreme(const F& value, int64_t n) {
  constexpr int W = PacketWidth<T>();
  T acc[4][W];
  for (auto& a : acc) std::fill(a, a + W, ReductionInit<T, kMax>());
  const int64_t whole4 = (n / (4 * W)) * (4 * W);
  for (int64_t j = 0; j < whole4; j += 4 * W) {
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < W; ++l) acc[k][l] = Pick<qdq::NativeArith, T, kMax>(value(j + k * W + l), acc[k][l]);
    }
  }
  return EigenFinish<qdq::ExplicitArith, T, kMax>(acc, value, n);
}

// ---- per-axis.
// Channel c of [pre, depth, post] is scanned in the order k = q * pre + r over x[r, c, q]. Since
// std::min(t, acc) returns t unless acc strictly wins, a NaN is kept only if it is the last element,
// the elements before the last NaN never matter, and a +0/-0 tie goes to the later zero.
template <typename T>
struct ChannelScan {
  const T* x;
  int64_t pre, depth, post, c;
  T at(int64_t k) const { return x[((k % pre) * depth + c) * post + k / pre]; }
  int64_t size() const { return pre * post; }
  // The largest k below `end` whose element satisfies pred, or -1.
  template <typename P>
  int64_t LastWhere(int64_t end, const P& pred) const {
    for (int64_t k = end - 1; k >= 0; --k) {
      if (pred(at(k))) return k;
    }
    return -1;
  }
};

// The exact per-channel (min, max) given a value-exact, NaN-ignoring min/max and whether the channel
// holds a NaN. Only a NaN or a zero extreme needs the scan order.
template <typename T>
void ExactChannelExtremes(const ChannelScan<T>& s, bool has_nan, T* lo, T* hi) {
  const int64_t n = s.size();
  int64_t after = 0;  // the elements that count start here
  if (has_nan) {
    const int64_t last_nan = s.LastWhere(n, [](T v) { return std::isnan(v); });
    if (last_nan == n - 1) {
      *lo = *hi = s.at(last_nan);
      return;
    }
    after = last_nan + 1;
    T mn = std::numeric_limits<T>::infinity(), mx = -mn;
    for (int64_t k = after; k < n; ++k) {
      const T v = s.at(k);
      mn = v < mn ? v : mn;
      mx = mx < v ? v : mx;
    }
    *lo = mn;
    *hi = mx;
  }
  if (*lo == T(0) || *hi == T(0)) {
    // A zero extreme is an element at or after `after`, so the last zero lies there.
    const int64_t last_zero = s.LastWhere(n, [](T v) { return v == T(0); });
    if (last_zero < after) return;  // unreachable; never read outside the channel
    if (*lo == T(0)) *lo = s.at(last_zero);
    if (*hi == T(0)) *hi = s.at(last_zero);
  }
}

// Value-exact min/max of n contiguous values, NaNs ignored (`v < lo` is false for a NaN), and
// whether any is NaN. GCC does not vectorize these reductions by itself, so the main loop is
// written with 16-byte vector extensions; `v < acc ? v : acc` is MINPS/MINPD exactly, lane by
// lane, so the vector and scalar forms select alike.
template <typename T>
inline void SegmentRangeScalar(const T* x, int64_t n, T* lo, T* hi, bool* nan) {
  for (int64_t j = 0; j < n; ++j) {
    const T v = x[j];
    *lo = v < *lo ? v : *lo;
    *hi = v > *hi ? v : *hi;
    *nan = *nan || v != v;
  }
}

template <typename T>
inline void SegmentRange(const T* x, int64_t n, T* lo, T* hi, bool* nan) {
  typedef T V __attribute__((vector_size(16)));
  constexpr int64_t W = 16 / sizeof(T);
  V l0, h0;
  for (int64_t i = 0; i < W; ++i) {
    l0[i] = *lo;
    h0[i] = *hi;
  }
  V l1 = l0, h1 = h0;
  decltype(l0 != l0) bad = {};
  int64_t j = 0;
  for (; j + 2 * W <= n; j += 2 * W) {
    V a, b;
    std::memcpy(&a, x + j, sizeof a);
    std::memcpy(&b, x + j + W, sizeof b);
    l0 = a < l0 ? a : l0;
    l1 = b < l1 ? b : l1;
    h0 = a > h0 ? a : h0;
    h1 = b > h1 ? b : h1;
    bad |= (a != a) | (b != b);
  }
  const V l = l0 < l1 ? l0 : l1, h = h0 > h1 ? h0 : h1;
  for (int64_t i = 0; i < W; ++i) {
    *lo = l[i] < *lo ? l[i] : *lo;
    *hi = h[i] > *hi ? h[i] : *hi;
    *nan = *nan || bad[i] != 0;
  }
  SegmentRangeScalar(x + j, n - j, lo, hi, nan);
}

// Per-tensor (min, max) of n values: a parallel, value-exact pass; Eigen's order only when it can
// matter (a NaN, or a zero extreme whose sign depends on which zero wins).
template <typename T>
void PerTensorExtremes(const T* x, int64_t n, T* lo, T* hi, const Parallel& parallel) {
  constexpr int64_t kChunk = int64_t{1} << 16;
  const int64_t chunks = std::max<int64_t>(1, (n + kChunk - 1) / kChunk);
  const T inf = std::numeric_limits<T>::infinity();
  std::vector<T> part_lo(static_cast<std::size_t>(chunks), inf), part_hi(part_lo.size(), -inf);
  std::vector<char> part_nan(part_lo.size(), 0);
  parallel.For(part_lo.size(), [&](std::size_t i) {
    ScopedFlushDenormals flush;
    const int64_t begin = static_cast<int64_t>(i) * kChunk;
    bool nan = false;
    SegmentRange(x + begin, std::min(n, begin + kChunk) - begin, &part_lo[i], &part_hi[i], &nan);
    part_nan[i] = nan;
  });
  T mn = inf, mx = -inf;
  bool has_nan = false;
  for (std::size_t i = 0; i < part_lo.size(); ++i) {
    mn = part_lo[i] < mn ? part_lo[i] : mn;
    mx = mx < part_hi[i] ? part_hi[i] : mx;
    has_nan = has_nan || part_nan[i];
  }
  if (has_nan || mn == T(0) || mx == T(0)) {
    auto value = [&](int64_t j) { return x[j]; };
    mn = EigenExtreme<T, false>(value, n);
    mx = EigenExtreme<T, true>(value, n);
  }
  *lo = mn;
  *hi = mx;
}

// Per-channel data range of [pre, depth, post] as TF's per-axis kernel finds it: lo[c], hi[c].
template <typename T>
void PerAxisExtremes(const T* x, int64_t pre, int64_t depth, int64_t post, T* lo, T* hi, const Parallel& parallel) {
  const T inf = std::numeric_limits<T>::infinity();
  // Rows of `rows_per_task` x [depth, post] each, reduced into per-task partials, combined in order.
  const int64_t row = depth * post;
  const int64_t rows_per_task = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(row, 1));
  const int64_t tasks = (pre + rows_per_task - 1) / rows_per_task;
  std::vector<T> part_lo(static_cast<std::size_t>(tasks * depth), inf), part_hi(part_lo.size(), -inf);
  std::vector<T> part_nan(part_lo.size(), T(0));
  parallel.For(static_cast<std::size_t>(tasks), [&](std::size_t t) {
    ScopedFlushDenormals flush;  // TF compares with denormals-are-zero: a subnormal ties with 0
    T* l = part_lo.data() + t * depth;
    T* h = part_hi.data() + t * depth;
    T* bad = part_nan.data() + t * depth;
    const int64_t r_end = std::min(pre, static_cast<int64_t>(t + 1) * rows_per_task);
    for (int64_t r = static_cast<int64_t>(t) * rows_per_task; r < r_end; ++r) {
      const T* xr = x + r * row;
      if (post == 1) {  // one value per channel per row: vectorize across channels
        for (int64_t c = 0; c < depth; ++c) {
          const T v = xr[c];
          l[c] = v < l[c] ? v : l[c];
          h[c] = h[c] < v ? v : h[c];
          bad[c] = v != v ? T(1) : bad[c];
        }
      } else {
        for (int64_t c = 0; c < depth; ++c) {
          bool nan = bad[c] != T(0);
          SegmentRange(xr + c * post, post, &l[c], &h[c], &nan);
          bad[c] = nan ? T(1) : T(0);
        }
      }
    }
  });
  parallel.For(static_cast<std::size_t>(depth), [&](std::size_t c) {
    ScopedFlushDenormals flush;
    T mn = inf, mx = -inf;
    bool has_nan = false;
    for (int64_t t = 0; t < tasks; ++t) {
      const std::size_t i = static_cast<std::size_t>(t * depth) + c;
      mn = part_lo[i] < mn ? part_lo[i] : mn;
      mx = mx < part_hi[i] ? part_hi[i] : mx;
      has_nan = has_nan || part_nan[i] != T(0);
    }
    lo[c] = mn;
    hi[c] = mx;
    ExactChannelExtremes(ChannelScan<T>{x, pre, depth, post, static_cast<int64_t>(c)}, has_nan, &lo[c], &hi[c]);
  });
}

#endif  // !defined(__CUDACC__)

}  // namespace qdq_order
}  // namespace tfops
