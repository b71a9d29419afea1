// Depthwise convolution kernels (see depthwise.h). Layout of the work:
//  * NCHW and 16-bit types are handled by converting to an NHWC buffer of the compute type
//    (float, or double for double) once, so the hot loops see one layout and one type.
//  * Forward / BackpropInput: one task per block of (batch, row) output rows; each row is
//    accumulated in a row buffer with the filter taps as the outer loops and the contiguous
//    channels innermost (vectorizes), so no branch is taken per element. The float forward with
//    multiplier 1 or 2 instead sums each output pixel's taps in registers (ForwardRowsByPixelF32),
//    in the same order.
//  * BackpropFilter: one task per (batch, channel block) with its own partial filter buffer;
//    the partials are then summed in batch order, which is TF's order, for any thread count.
#include "kernels/depthwise.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/simd.h"

namespace tfops {
namespace depthwise {
namespace {

using i64 = std::int64_t;

// ---------------------------------------------------------------------------------------------
// Layout and type conversion helpers (parallel over the batch*channel or batch*pixel blocks).

// src [N, C, P] (storage T) -> dst [N, P, C] (compute A).
template <typename T, typename A>
void NchwToNhwc(const T* src, A* dst, i64 n, i64 c, i64 p, const Parallel& par) {
  par.ForRange(n * p, 256, [&](i64 begin, i64 end) {
    for (i64 q = begin; q < end; ++q) {
      const i64 b = q / p, pix = q % p;
      const T* s = src + b * c * p + pix;
      A* d = dst + q * c;
      for (i64 ch = 0; ch < c; ++ch) d[ch] = static_cast<A>(Storage<T>::Widen(s[ch * p]));
    }
  });
}

// src [N, P, C] (compute A) -> dst [N, C, P] (storage T).
template <typename T, typename A>
void NhwcToNchw(const A* src, T* dst, i64 n, i64 c, i64 p, const Parallel& par) {
  par.ForRange(n * c, 16, [&](i64 begin, i64 end) {
    for (i64 q = begin; q < end; ++q) {
      const i64 b = q / c, ch = q % c;
      const A* s = src + b * p * c + ch;
      T* d = dst + q * p;
      for (i64 pix = 0; pix < p; ++pix)
        d[pix] = Storage<T>::Narrow(static_cast<typename Storage<T>::Compute>(s[pix * c]));
    }
  });
}

template <typename T, typename A>
void WidenAll(const T* src, A* dst, i64 n, const Parallel& par) {
  par.ForRange(n, 1 << 14, [&](i64 b, i64 e) { WidenBlock(src + b, dst + b, e - b); });
}
template <typename T, typename A>
void NarrowAll(const A* src, T* dst, i64 n, const Parallel& par) {
  par.ForRange(n, 1 << 14, [&](i64 b, i64 e) { NarrowBlock(src + b, dst + b, e - b); });
}

// An NHWC view of an input in the compute type: the caller's buffer itself when it already is
// one, otherwise a converted copy.
template <typename T, typename A>
const A* NhwcCompute(const T* src, i64 n, i64 h, i64 w, i64 c, bool nchw, std::vector<A>* storage,
                     const Parallel& par) {
  if (!nchw && std::is_same<T, A>::value) return reinterpret_cast<const A*>(src);
  storage->resize(static_cast<size_t>(n * h * w * c));
  if (nchw)
    NchwToNhwc(src, storage->data(), n, c, h * w, par);
  else
    WidenAll(src, storage->data(), n * h * w * c, par);
  return storage->data();
}

// Writes an NHWC compute-type result into the caller's output (layout and type conversion).
template <typename T, typename A>
void StoreResult(const A* src, T* dst, i64 n, i64 h, i64 w, i64 c, bool nchw, const Parallel& par) {
  if (nchw)
    NhwcToNchw(src, dst, n, c, h * w, par);
  else
    NarrowAll(src, dst, n * h * w * c, par);
}

// Eight float lanes as a GCC vector, compiled by each ISA copy of a hot loop to its own registers.
// The build has no FMA contraction, so `a + w * x` on these rounds exactly as the scalar loop does.
// (The baseline copy passes these 32-byte vectors only between always-inlined functions, so the ABI
// note GCC gives for them does not apply.)
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float F8 __attribute__((vector_size(32)));
typedef float F4 __attribute__((vector_size(16)));

TFOPS_ALWAYS_INLINE F8 LoadF8(const float* p) {
  F8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Lanes x[0], x[0], x[1], x[1], ..., x[3], x[3]: the input channels of 8 outputs with multiplier 2.
TFOPS_ALWAYS_INLINE F8 LoadPairsF8(const float* p) {
  F4 q;
  std::memcpy(&q, p, sizeof q);
  return __builtin_shufflevector(q, q, 0, 0, 1, 1, 2, 2, 3, 3);
}

// Range of output positions j (0 <= j < out) whose input position j*stride + offset lies in
// [0, n): returns [lo, hi).
TFOPS_ALWAYS_INLINE void ValidRange(i64 offset, i64 stride, i64 n, i64 out, i64* lo, i64* hi) {
  // j*stride + offset >= 0  <=>  j >= ceil(-offset / stride)
  i64 l = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  // j*stride + offset <= n - 1  <=>  j <= floor((n - 1 - offset) / stride)
  i64 h = n - 1 - offset < 0 ? 0 : (n - 1 - offset) / stride + 1;
  *lo = std::min(l, out);
  *hi = std::max(std::min(h, out), *lo);
}

// ---------------------------------------------------------------------------------------------
// Forward. acc[k] = round(acc[k] + w[k] * x[k / M]) per tap, where round is to the storage
// precision for 16-bit types and the identity otherwise.

// `round` when the storage type is narrower than A, else the identity.
template <bool kRound, typename Round>
TFOPS_ALWAYS_INLINE auto Rounding(Round round) {
  if constexpr (kRound)
    return round;
  else
    return Keep();
}

template <typename A, bool kRound, typename Round>
TFOPS_ALWAYS_INLINE void TapM1(A* __restrict acc, const A* __restrict w, const A* __restrict x, i64 k, Round round) {
  const auto rnd = Rounding<kRound>(round);
  for (i64 i = 0; i < k; ++i) acc[i] = TapStep(acc[i], w[i], x[i], Keep(), rnd);
}

template <typename A, bool kRound, typename Round>
TFOPS_ALWAYS_INLINE void TapM(A* __restrict acc, const A* __restrict w, const A* __restrict x, i64 c, i64 m, Round round) {
  const auto rnd = Rounding<kRound>(round);
  if (m == 2) {  // the common multiplier, unrolled so the pair shares one broadcast
    for (i64 ch = 0; ch < c; ++ch) {
      const A v = x[ch];
      const A a0 = TapStep(acc[2 * ch], w[2 * ch], v, Keep(), rnd);
      const A a1 = TapStep(acc[2 * ch + 1], w[2 * ch + 1], v, Keep(), rnd);
      acc[2 * ch] = a0;
      acc[2 * ch + 1] = a1;
    }
    return;
  }
  for (i64 ch = 0; ch < c; ++ch) {
    const A v = x[ch];
    A* a = acc + ch * m;
    const A* f = w + ch * m;
    for (i64 j = 0; j < m; ++j) a[j] = TapStep(a[j], f[j], v, Keep(), rnd);
  }
}

// Forward for float with multiplier 1 or 2, one output pixel at a time: each block of channels sums all
// of the pixel's taps in registers and is stored once. The row-at-a-time loop below instead loads and
// stores the output row once per tap, and a row of outputs and one of inputs together overflow L1,
// so it is bound by L2 traffic; here the taps' input rows stream through in channel order (a few
// sequential streams the prefetchers follow) and the output is written once. Each output adds the
// same products in the same order (filter row, then filter column, padding taps skipped) as the row
// loop, so both give the same bits.
constexpr i64 kMaxTaps = 64;

// Input lanes for output channels [k, k + 8): x[k .. k + 8) with multiplier 1, x[k/2 .. k/2 + 4) each
// twice with multiplier 2.
template <i64 M>
TFOPS_ALWAYS_INLINE F8 InputLanes(const float* x, i64 k) {
  return M == 1 ? LoadF8(x + k) : LoadPairsF8(x + k / 2);
}

// One output pixel's K = C * M channels: the sum over its taps of w[tap][k] * x[tap][k / M].
template <i64 M>
TFOPS_ALWAYS_INLINE void PixelTapsF32(const float* const* w, const float* const* x, i64 taps, i64 K, float* out) {
  i64 k0 = 0;
  for (; k0 + 64 <= K; k0 += 64) {  // eight independent sums hide the adds' latency
    F8 a[8] = {};
    for (i64 t = 0; t < taps; ++t)
      for (int v = 0; v < 8; ++v) a[v] = a[v] + LoadF8(w[t] + k0 + 8 * v) * InputLanes<M>(x[t], k0 + 8 * v);
    for (int v = 0; v < 8; ++v) std::memcpy(out + k0 + 8 * v, &a[v], sizeof a[v]);
  }
  for (; k0 + 8 <= K; k0 += 8) {
    F8 a = {};
    for (i64 t = 0; t < taps; ++t) a = a + LoadF8(w[t] + k0) * InputLanes<M>(x[t], k0);
    std::memcpy(out + k0, &a, sizeof a);
  }
  for (; k0 < K; ++k0) {
    float a = 0.0f;
    for (i64 t = 0; t < taps; ++t) a = a + w[t][k0] * x[t][k0 / M];
    out[k0] = a;
  }
}

template <i64 M>
TFOPS_ALWAYS_INLINE void ForwardRowsByPixelF32(const Geometry& g, const float* in, const float* filter, float* out,
                                               i64 row_begin, i64 row_end) {
  const i64 C = g.in_depth, K = g.out_depth;
  const float* w[kMaxTaps];
  const float* x[kMaxTaps];
  for (i64 q = row_begin; q < row_end; ++q) {
    const i64 b = q / g.out_rows, i = q % g.out_rows;
    for (i64 j = 0; j < g.out_cols; ++j) {
      i64 taps = 0;
      for (i64 r = 0; r < g.filter_rows; ++r) {
        const i64 in_r = i * g.stride + r * g.dilation_rows - g.pad_top;
        if (in_r < 0 || in_r >= g.in_rows) continue;
        const float* irow = in + (b * g.in_rows + in_r) * g.in_cols * C;
        for (i64 s = 0; s < g.filter_cols; ++s) {
          const i64 col = j * g.stride + s * g.dilation_cols - g.pad_left;
          if (col < 0 || col >= g.in_cols) continue;
          w[taps] = filter + (r * g.filter_cols + s) * K;
          x[taps++] = irow + col * C;
        }
      }
      PixelTapsF32<M>(w, x, taps, K, out + (q * g.out_cols + j) * K);
    }
  }
}

template <typename A, bool kRound, typename Round>
TFOPS_ALWAYS_INLINE void ForwardRows(const Geometry& g, const A* in, const A* filter, A* out, i64 row_begin, i64 row_end, Round round) {
  const i64 K = g.out_depth, C = g.in_depth, M = g.depth_multiplier;
  if constexpr (std::is_same<A, float>::value && !kRound) {
    if ((M == 1 || M == 2) && g.filter_rows * g.filter_cols <= kMaxTaps) {
      if (M == 1)
        ForwardRowsByPixelF32<1>(g, in, filter, out, row_begin, row_end);
      else
        ForwardRowsByPixelF32<2>(g, in, filter, out, row_begin, row_end);
      return;
    }
  }
  for (i64 q = row_begin; q < row_end; ++q) {
    const i64 b = q / g.out_rows, i = q % g.out_rows;
    A* orow = out + q * g.out_cols * K;
    std::fill(orow, orow + g.out_cols * K, A(0));
    for (i64 r = 0; r < g.filter_rows; ++r) {
      const i64 in_r = i * g.stride + r * g.dilation_rows - g.pad_top;
      if (in_r < 0 || in_r >= g.in_rows) continue;  // padding row: contributes exact zeros
      const A* irow = in + (b * g.in_rows + in_r) * g.in_cols * C;
      for (i64 s = 0; s < g.filter_cols; ++s) {
        const i64 off = s * g.dilation_cols - g.pad_left;
        i64 lo, hi;
        ValidRange(off, g.stride, g.in_cols, g.out_cols, &lo, &hi);
        const A* w = filter + (r * g.filter_cols + s) * K;
        for (i64 j = lo; j < hi; ++j) {
          const A* x = irow + (j * g.stride + off) * C;
          if (M == 1)
            TapM1<A, kRound>(orow + j * K, w, x, K, round);
          else
            TapM<A, kRound>(orow + j * K, w, x, C, M, round);
        }
      }
    }
  }
}

// Rows per task: about 64k multiply-adds of work, from the shape only.
i64 RowGrain(i64 work_per_row) { return std::max<i64>(1, (i64{1} << 16) / std::max<i64>(work_per_row, 1)); }

template <typename T>
struct Types {
  using A = typename Storage<T>::Compute;
  static constexpr bool kRound = Storage<T>::kNarrow;
  struct RoundOp {  // a functor (not a function pointer) so the hot loops inline it
    A operator()(A v) const { return Storage<T>::Round(v); }
  };
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// BackpropInput. a[x][k] accumulates filter * out_backprop over the taps in ascending filter
// order; then the M products of one input channel are summed like TF's AVX reduction.

namespace {

template <typename A, bool kRound, typename Round>
TFOPS_ALWAYS_INLINE void BackpropInputRows(const Geometry& g, const A* w, const A* dy, A* dx, A* acc, i64 row_begin, i64 row_end,
                       Round round) {
  const i64 K = g.out_depth, C = g.in_depth, M = g.depth_multiplier, S = g.stride;
  for (i64 q = row_begin; q < row_end; ++q) {
    const i64 b = q / g.in_rows, y = q % g.in_rows;
    A* a = M == 1 ? dx + q * g.in_cols * C : acc;  // with M == 1 the taps sum straight into dx
    std::fill(a, a + g.in_cols * K, A(0));
    for (i64 fr = 0; fr < g.filter_rows; ++fr) {
      const i64 oy_num = y + g.pad_top - fr * g.dilation_rows;
      if (oy_num < 0 || oy_num % S != 0 || oy_num / S >= g.out_rows) continue;
      const A* dyrow = dy + (b * g.out_rows + oy_num / S) * g.out_cols * K;
      for (i64 fc = 0; fc < g.filter_cols; ++fc) {
        const i64 off = g.pad_left - fc * g.dilation_cols;  // ox_num = x + off
        // First x >= 0 with x + off >= 0 and divisible by S.
        i64 x0 = std::max<i64>(0, -off);
        const i64 rem = ((x0 + off) % S + S) % S;
        if (rem) x0 += S - rem;
        const A* f = w + (fr * g.filter_cols + fc) * K;
        for (i64 x = x0; x < g.in_cols; x += S) {
          const i64 ox = (x + off) / S;
          if (ox >= g.out_cols) break;
          TapM1<A, kRound>(a + x * K, f, dyrow + ox * K, K, round);
        }
      }
    }
    if (M == 1) continue;
    A* drow = dx + q * g.in_cols * C;
    // TF reduces the M products of a channel as SIMD registers: 8 floats or 4 doubles; 16-bit
    // types take the float tree and round each block and each running sum to T.
    constexpr int kWidth = MultiplierWidth<A>::value;
    const i64 full = M / kWidth * kWidth;
    const auto rnd = Rounding<kRound>(round);
    if (M == 2 && !kRound) {  // the same two additions per channel, as a loop that vectorizes over c
      for (i64 x = 0; x < g.in_cols; ++x) {
        const A* __restrict v = a + x * K;
        A* __restrict d = drow + x * C;
        for (i64 c = 0; c < C; ++c) d[c] = AddStep(AddStep(A(0), v[2 * c], Keep(), rnd), v[2 * c + 1], Keep(), rnd);
      }
      continue;
    }
    for (i64 x = 0; x < g.in_cols; ++x) {
      for (i64 c = 0; c < C; ++c) {
        const A* v = a + x * K + c * M;
        A s = 0;
        for (i64 blk = 0; blk < full; blk += kWidth)
          s = AddStep(s, MultiplierBlock<kWidth>(v + blk, Keep(), rnd), Keep(), rnd);
        for (i64 m = full; m < M; ++m) s = AddStep(s, v[m], Keep(), rnd);
        drow[x * C + c] = s;
      }
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// BackpropFilter.

namespace {

// Output channels per filter-gradient block (a shape-only choice): whole input channels each.
constexpr i64 kFilterBlock = 64;

// One tap's accumulator for a full float block of kFilterBlock output channels over output columns
// [lo, hi) of one row, held in eight 8-lane vector registers across the columns instead of being
// loaded and stored per column. Each lane adds the same products in the same (column) order as
// the scalar loop.
template <i64 M>
TFOPS_ALWAYS_INLINE void FilterTapRowF32(float* acc, const float* dyrow, const float* irow, i64 lo, i64 hi,
                                         i64 x_step, i64 K, i64 x_offset) {
  static_assert(kFilterBlock == 64, "eight vectors of eight lanes");
  F8 a[8];
  for (int v = 0; v < 8; ++v) a[v] = LoadF8(acc + 8 * v);
  for (i64 j = lo; j < hi; ++j) {
    const float* x = irow + j * x_step + x_offset;
    const float* d = dyrow + j * K;
    for (int v = 0; v < 8; ++v) a[v] = a[v] + LoadF8(d + 8 * v) * InputLanes<M>(x, 8 * v);
  }
  for (int v = 0; v < 8; ++v) std::memcpy(acc + 8 * v, &a[v], sizeof a[v]);
}

// Accumulates batch b's contributions for input channels [c0, c1) into buf [kh][kw][(c1-c0)*M].
template <typename A, bool kRound, typename Round>
TFOPS_ALWAYS_INLINE void FilterPartial(const Geometry& g, const A* in, const A* dy, i64 b, i64 c0, i64 c1, A* buf, Round round) {
  const i64 K = g.out_depth, C = g.in_depth, M = g.depth_multiplier;
  const i64 kb = (c1 - c0) * M;
  for (i64 i = 0; i < g.out_rows; ++i) {
    const A* dyrow = dy + (b * g.out_rows + i) * g.out_cols * K + c0 * M;
    for (i64 r = 0; r < g.filter_rows; ++r) {
      const i64 in_r = i * g.stride + r * g.dilation_rows - g.pad_top;
      if (in_r < 0 || in_r >= g.in_rows) continue;
      const A* irow = in + (b * g.in_rows + in_r) * g.in_cols * C + c0;
      for (i64 s = 0; s < g.filter_cols; ++s) {
        const i64 off = s * g.dilation_cols - g.pad_left;
        i64 lo, hi;
        ValidRange(off, g.stride, g.in_cols, g.out_cols, &lo, &hi);
        A* acc = buf + (r * g.filter_cols + s) * kb;
        if constexpr (std::is_same<A, float>::value && !kRound) {  // the register path, full float blocks
          if (kb == kFilterBlock && (M == 1 || M == 2)) {
            if (M == 1) FilterTapRowF32<1>(acc, dyrow, irow, lo, hi, g.stride * C, K, off * C);
            else FilterTapRowF32<2>(acc, dyrow, irow, lo, hi, g.stride * C, K, off * C);
            continue;
          }
        }
        for (i64 j = lo; j < hi; ++j) {
          const A* x = irow + (j * g.stride + off) * C;
          const A* d = dyrow + j * K;
          if (M == 1)
            TapM1<A, kRound>(acc, d, x, kb, round);
          else
            TapM<A, kRound>(acc, d, x, c1 - c0, M, round);
        }
      }
    }
  }
}

// The hot loops, one non-template entry per storage type, each compiled once per ISA (simd.h; the
// templated loops above are always-inline, so every copy carries its own vectorized code). All copies
// compute the same IEEE operations (the build disables FMA contraction).
#define TFOPS_DEPTHWISE_HOT(T)                                                                                   \
  TFOPS_ALWAYS_INLINE void ForwardBody(const T*, const Geometry& g, const Types<T>::A* in, const Types<T>::A* w, \
                                       Types<T>::A* out, i64 b, i64 e) {                                        \
    ForwardRows<Types<T>::A, Types<T>::kRound>(g, in, w, out, b, e, Types<T>::RoundOp());                        \
  }                                                                                                              \
  TFOPS_ISA_VARIANTS(ForwardHot, (const T* tag, const Geometry& g, const Types<T>::A* in, const Types<T>::A* w,  \
                                  Types<T>::A* out, i64 b, i64 e),                                               \
                     (tag, g, in, w, out, b, e), ForwardBody)                                                    \
  TFOPS_ALWAYS_INLINE void BackpropInputBody(const T*, const Geometry& g, const Types<T>::A* w,                  \
                                             const Types<T>::A* dy, Types<T>::A* dx, Types<T>::A* acc, i64 b,    \
                                             i64 e) {                                                            \
    BackpropInputRows<Types<T>::A, Types<T>::kRound>(g, w, dy, dx, acc, b, e, Types<T>::RoundOp());              \
  }                                                                                                              \
  TFOPS_ISA_VARIANTS(BackpropInputHot, (const T* tag, const Geometry& g, const Types<T>::A* w,                   \
                                        const Types<T>::A* dy, Types<T>::A* dx, Types<T>::A* acc, i64 b, i64 e), \
                     (tag, g, w, dy, dx, acc, b, e), BackpropInputBody)                                          \
  TFOPS_ALWAYS_INLINE void FilterPartialBody(const T*, const Geometry& g, const Types<T>::A* in,                 \
                                             const Types<T>::A* dy, i64 b, i64 c0, i64 c1, Types<T>::A* buf) {   \
    FilterPartial<Types<T>::A, Types<T>::kRound>(g, in, dy, b, c0, c1, buf, Types<T>::RoundOp());                \
  }                                                                                                              \
  TFOPS_ISA_VARIANTS(FilterPartialHot, (const T* tag, const Geometry& g, const Types<T>::A* in,                  \
                                        const Types<T>::A* dy, i64 b, i64 c0, i64 c1, Types<T>::A* buf),         \
                     (tag, g, in, dy, b, c0, c1, buf), FilterPartialBody)

TFOPS_DEPTHWISE_HOT(float)
TFOPS_DEPTHWISE_HOT(double)
TFOPS_DEPTHWISE_HOT(Half)
TFOPS_DEPTHWISE_HOT(BFloat16)

}  // namespace

template <typename T>
void Forward(const Geometry& g, const T* input, const T* filter, T* output, const Parallel& par) {
  using A = typename Types<T>::A;
  const i64 rows = g.batch * g.out_rows;
  if (g.OutputSize() == 0) return;
  if constexpr (std::is_same<T, float>::value) {
    if (ForwardNchw(g, input, filter, output, par)) return;
  }
  std::vector<A> in_buf, filter_buf, out_buf;
  const A* in = NhwcCompute(input, g.batch, g.in_rows, g.in_cols, g.in_depth, g.nchw, &in_buf, par);
  const A* w = NhwcCompute(filter, 1, 1, g.filter_rows * g.filter_cols, g.out_depth, false, &filter_buf, par);
  const bool direct = !g.nchw && std::is_same<T, A>::value;
  if (!direct) out_buf.resize(static_cast<size_t>(g.OutputSize()));
  A* out = direct ? reinterpret_cast<A*>(output) : out_buf.data();
  const i64 grain = RowGrain(g.out_cols * g.out_depth * std::max<i64>(g.filter_rows * g.filter_cols, 1));
  par.ForRange(rows, grain, [&](i64 b, i64 e) { ForwardHot(input, g, in, w, out, b, e); });
  if (!direct) StoreResult(out, output, g.batch, g.out_rows, g.out_cols, g.out_depth, g.nchw, par);
}

template <typename T>
void BackpropInput(const Geometry& g, const T* filter, const T* out_backprop, T* in_backprop, const Parallel& par) {
  using A = typename Types<T>::A;
  const i64 in_size = g.InputSize();
  if (in_size == 0) return;
  std::vector<A> dy_buf, filter_buf, dx_buf;
  const A* dy = NhwcCompute(out_backprop, g.batch, g.out_rows, g.out_cols, g.out_depth, g.nchw, &dy_buf, par);
  const A* w = NhwcCompute(filter, 1, 1, g.filter_rows * g.filter_cols, g.out_depth, false, &filter_buf, par);
  const bool direct = !g.nchw && std::is_same<T, A>::value;
  if (!direct) dx_buf.resize(static_cast<size_t>(in_size));
  A* dx = direct ? reinterpret_cast<A*>(in_backprop) : dx_buf.data();
  const i64 rows = g.batch * g.in_rows;
  const i64 grain = RowGrain(g.in_cols * g.out_depth * std::max<i64>(g.filter_rows * g.filter_cols, 1));
  par.ForRange(rows, grain, [&](i64 b, i64 e) {
    std::vector<A> acc(g.depth_multiplier == 1 ? 0 : static_cast<size_t>(g.in_cols * g.out_depth));
    BackpropInputHot(filter, g, w, dy, dx, acc.data(), b, e);
  });
  if (!direct) StoreResult(dx, in_backprop, g.batch, g.in_rows, g.in_cols, g.in_depth, g.nchw, par);
}

template <typename T>
void BackpropFilter(const Geometry& g, const T* input, const T* out_backprop, T* filter_backprop,
                    const Parallel& par) {
  using A = typename Types<T>::A;
  constexpr bool kRound = Types<T>::kRound;
  const i64 fsize = g.FilterSize();
  if (fsize == 0) return;
  const i64 taps = g.filter_rows * g.filter_cols;
  if (g.OutputSize() == 0) {  // nothing flows back (TF 2.21 returns uninitialized memory here)
    for (i64 i = 0; i < fsize; ++i) filter_backprop[i] = Storage<T>::Narrow(0);
    return;
  }
  std::vector<A> in_buf, dy_buf;
  const A* in = NhwcCompute(input, g.batch, g.in_rows, g.in_cols, g.in_depth, g.nchw, &in_buf, par);
  const A* dy = NhwcCompute(out_backprop, g.batch, g.out_rows, g.out_cols, g.out_depth, g.nchw, &dy_buf, par);
  // Channel blocks of about 64 output channels, whole input channels each (shape-only choice).
  const i64 C = g.in_depth, M = g.depth_multiplier, K = g.out_depth;
  const i64 block_c = std::max<i64>(1, kFilterBlock / M);
  const i64 blocks = (C + block_c - 1) / block_c;
  // partials[b] holds batch b's [kh][kw][K] buffer, laid out per channel block.
  std::vector<A> partials(static_cast<size_t>(g.batch * taps * K), A(0));
  par.For(static_cast<size_t>(g.batch * blocks), [&](size_t t) {
    const i64 b = static_cast<i64>(t) / blocks, blk = static_cast<i64>(t) % blocks;
    const i64 c0 = blk * block_c, c1 = std::min(C, c0 + block_c);
    A* buf = partials.data() + b * taps * K + taps * c0 * M;
    FilterPartialHot(input, g, in, dy, b, c0, c1, buf);
  });
  // dW = ((0 + buf_0) + buf_1) + ...: batch order, in parallel over filter elements.
  par.ForRange(K, 64, [&](i64 k0, i64 k1) {
    for (i64 tap = 0; tap < taps; ++tap) {
      for (i64 k = k0; k < k1; ++k) {
        const i64 blk = (k / M) / block_c;
        const i64 c0 = blk * block_c, c1 = std::min(C, c0 + block_c);
        const i64 kb = (c1 - c0) * M;
        const i64 pos = taps * c0 * M + tap * kb + (k - c0 * M);
        A s = 0;
        for (i64 b = 0; b < g.batch; ++b)
          s = AddStep(s, partials[static_cast<size_t>(b * taps * K + pos)], Keep(),
                      Rounding<kRound>(typename Types<T>::RoundOp()));
        filter_backprop[tap * K + k] = Storage<T>::Narrow(static_cast<typename Storage<T>::Compute>(s));
      }
    }
  });
}

#define TFOPS_DEPTHWISE_INSTANTIATE(T)                                                                \
  template void Forward<T>(const Geometry&, const T*, const T*, T*, const Parallel&);                \
  template void BackpropInput<T>(const Geometry&, const T*, const T*, T*, const Parallel&);          \
  template void BackpropFilter<T>(const Geometry&, const T*, const T*, T*, const Parallel&);

TFOPS_DEPTHWISE_INSTANTIATE(float)
TFOPS_DEPTHWISE_INSTANTIATE(double)
TFOPS_DEPTHWISE_INSTANTIATE(Half)
TFOPS_DEPTHWISE_INSTANTIATE(BFloat16)

}  // namespace depthwise
}  // namespace tfops
