// Batch-norm kernels (see batch_norm.h). Work layout:
//  * Column sums run as tasks over groups of up to 64 channels (four 16-channel blocks); inside a
//    group the rows are walked in order with the channels innermost, so every channel's sum is added
//    in exactly the reference order whatever the thread count. Full 16-channel blocks are one
//    16-lane vector each (one zmm register with AVX-512, two ymm with AVX2, four xmm on the
//    baseline; simd.h compiles them once per ISA).
//  * Passes over the data, and which are inherent:
//      training forward: three reads of x. The mean needs every row before the sum of
//      (x - mean)^2 can start (the two-pass variance, docs/semantics.md 3.2), and y needs the
//      variance;
//      training gradient: two reads of dy and x. dx needs S(dy) and S(dy * (x - mean)) over every
//      row; the three sums share one pass;
//      inference gradient: one read of dy and x. dx = dy * k needs no sum, so it is written in the
//      sums' pass (when dx is a float32 [R, C] matrix and there are two groups or more to share
//      the threads).
//    The element-wise passes of the training ops walk whole rows in their own tasks. Writing y or
//    dx from the column groups' tasks instead (to find the group's rows in cache) measured slower:
//    a group's rows are short runs a row apart, and writing such runs costs more than the re-read.
//  * Channels-first x (and 16-bit x) is first converted to a float32 [R, C] matrix for the sums;
//    the element-wise outputs are then computed straight from the caller's buffers in their own
//    layout.
// The vector blocks below pass 64-byte vectors only between always-inlined functions (including
// batch_norm.h's templates), so the ABI note GCC gives for them does not apply; it is raised at the
// header's lines, hence before the include.
#pragma GCC diagnostic ignored "-Wpsabi"

#include "kernels/batch_norm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/simd.h"

namespace tfops {
namespace batch_norm {
namespace {

using i64 = std::int64_t;

// Eigen's vectorized column sum: channels in whole packets of 8 floats, 4 row accumulators once
// there are at least 16 rows (docs/semantics.md section 3.3).
constexpr i64 kPacket = 8;
constexpr i64 kMinRowsForSplit = 16;
// Channels per column-sum task (a shape-only choice): two packets.
constexpr i64 kChannelBlock = 16;

bool ChannelsFirst(const std::string& fmt) { return fmt == "NCHW" || fmt == "NCDHW"; }

// TF says "input" for x and y_backprop alike: the message leads with the input's name.
void CheckRank(const char* name, const std::vector<i64>& s) {
  if (s.size() != 4 && s.size() != 5)
    throw OpError(std::string(name) + " has rank " + std::to_string(s.size()) + ": input must be 4 or 5-dimensional" +
                  ShapeString(s));
}

// A [C] statistic; `label` is what TF's message calls the input `name` ("saved mean" for
// reserve_space_1), and the name leads where the two differ.
void CheckVector(const std::string& name, const std::string& label, const std::vector<i64>& s) {
  if (s.size() == 1) return;
  const std::string tf_message = label + " must be 1-dimensional" + ShapeString(s);
  throw OpError(name == label ? tf_message : name + " has rank " + std::to_string(s.size()) + ": " + tf_message);
}

void CheckCount(const std::string& prefix, const std::string& label, const std::vector<i64>& s, i64 channels) {
  i64 n = 1;
  for (i64 d : s) n *= d;
  if (n != channels)
    throw OpError(prefix + label + " must have the same number of elements as the channels of x, got " +
                  std::to_string(n) + " and " + std::to_string(channels));
}

Layout LayoutOf(const std::vector<i64>& x, const std::string& fmt) {
  const size_t axis = ChannelsFirst(fmt) ? 1 : x.size() - 1;
  Layout l;
  l.outer = 1;
  for (size_t i = 0; i < axis; ++i) l.outer *= x[i];
  l.channels = x[axis];
  l.inner = 1;
  for (size_t i = axis + 1; i < x.size(); ++i) l.inner *= x[i];
  return l;
}

// A float32 [R, C] view of x: x itself when it already is one, else a converted copy.
template <typename T>
const float* RowsOf(const Layout& l, const T* x, std::vector<float>* storage, const Parallel& par) {
  const i64 C = l.channels, P = l.inner;
  if (P == 1 && std::is_same<T, float>::value) return reinterpret_cast<const float*>(x);
  storage->resize(static_cast<size_t>(l.size()));
  float* out = storage->data();
  if (P == 1) {
    par.ForRange(l.size(), 1 << 14, [&](i64 b, i64 e) { WidenBlock(x + b, out + b, e - b); });
  } else {
    // [N, C, P] -> [N*P, C]: one task per block of rows of the result.
    par.ForRange(l.rows(), 256, [&](i64 b, i64 e) {
      for (i64 r = b; r < e; ++r) {
        const i64 n = r / P, p = r % P;
        const T* src = x + n * C * P + p;
        float* dst = out + r * C;
        for (i64 c = 0; c < C; ++c) dst[c] = Storage<T>::Widen(src[c * P]);
      }
    });
  }
  return out;
}

// Column sums of value(r, c) over rows, channels [c0, c1): a plain running sum from 0.
template <typename F>
inline void SequentialSums(i64 rows, i64 c0, i64 c1, float* sums, const F& value) {
  for (i64 c = c0; c < c1; ++c) sums[c] = 0.0f;
  for (i64 r = 0; r < rows; ++r)
    for (i64 c = c0; c < c1; ++c) sums[c] = sums[c] + value(r, c);
}

// Eigen's order for channels [c0, c1) (all below the packet boundary V): four partial sums take
// rows round-robin, ((p0 + p1) + p2) + p3, then the leftover rows in order.
template <typename F>
inline void SplitSums(i64 rows, i64 c0, i64 c1, float* sums, const F& value) {
  float p[4][kChannelBlock];
  const i64 w = c1 - c0;
  for (int k = 0; k < 4; ++k)
    for (i64 c = 0; c < w; ++c) p[k][c] = 0.0f;
  const i64 head = rows / 4 * 4;
  for (i64 r = 0; r < head; r += 4)
    for (int k = 0; k < 4; ++k)
      for (i64 c = 0; c < w; ++c) p[k][c] = p[k][c] + value(r + k, c0 + c);
  for (i64 c = 0; c < w; ++c) sums[c0 + c] = ((p[0][c] + p[1][c]) + p[2][c]) + p[3][c];
  for (i64 r = head; r < rows; ++r)
    for (i64 c = c0; c < c1; ++c) sums[c] = sums[c] + value(r, c);
}

// The training forward's column sum (reference `column_sum`) of value(r, c) for the channels
// [c0, c1) of one block of a tensor with `channels` channels (the scalar form, for partial blocks).
template <typename F>
void BlockColumnSums(i64 rows, i64 channels, i64 c0, i64 c1, float* sums, const F& value) {
  const i64 vector_channels = kPacket * (channels / kPacket);
  const bool split = rows >= kMinRowsForSplit;
  const i64 mid = std::min(c1, vector_channels);  // blocks are packet-aligned: [c0, mid) vector, [mid, c1) not
  if (split && mid > c0) SplitSums(rows, c0, mid, sums, value);
  else if (mid > c0) SequentialSums(rows, c0, mid, sums, value);
  if (c1 > mid) SequentialSums(rows, std::max(c0, mid), c1, sums, value);
}

// ---------------------------------------------------------------------------------------------
// Full 16-channel blocks as vectors. Lane l of a block's vector is channel c0 + l, and each lane
// makes the scalar code's operations in its order, so a vector block and the scalar loops above
// give the same bits (no FMA contraction in the build). A task takes a group of up to kMaxVectors
// adjacent blocks and walks the rows with the whole group innermost: wider groups read longer
// contiguous runs of each row, which the hardware prefetchers follow across 4 KiB pages where a
// one-line-per-row stream loses them.

typedef float Lanes __attribute__((vector_size(64)));
static_assert(sizeof(Lanes) == kChannelBlock * sizeof(float), "a block is one vector");
constexpr int kMaxVectors = 4;

TFOPS_ALWAYS_INLINE Lanes Load(const float* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
TFOPS_ALWAYS_INLINE void Store(float* p, Lanes v) { std::memcpy(p, &v, sizeof v); }
TFOPS_ALWAYS_INLINE Lanes Splat(float v) {
  Lanes r;
  for (i64 l = 0; l < kChannelBlock; ++l) r[l] = v;
  return r;
}

// x, or (x - mean)^2 for the variance.
template <bool kDeviation>
TFOPS_ALWAYS_INLINE Lanes ForwardSummand(const float* p, Lanes mean) {
  if constexpr (kDeviation) return SquaredDeviation(Load(p), mean);
  else return Load(p);
}

// BlockColumnSums' order for kN full blocks at X (all their channels fill whole packets).
template <int kN, bool kDeviation>
TFOPS_ALWAYS_INLINE void GroupColumnSums(const float* X, i64 rows, i64 ld, const Lanes* mean, Lanes* sums) {
  i64 r = 0;
  for (int j = 0; j < kN; ++j) sums[j] = Splat(0.0f);
  if (rows >= kMinRowsForSplit) {
    Lanes p[4][kN];
    for (int k = 0; k < 4; ++k)
      for (int j = 0; j < kN; ++j) p[k][j] = Splat(0.0f);
    const i64 head = rows / 4 * 4;
    for (; r < head; r += 4)
      for (int k = 0; k < 4; ++k)
        for (int j = 0; j < kN; ++j)
          p[k][j] = p[k][j] + ForwardSummand<kDeviation>(X + (r + k) * ld + j * kChannelBlock, mean[j]);
    for (int j = 0; j < kN; ++j) sums[j] = ((p[0][j] + p[1][j]) + p[2][j]) + p[3][j];
  }
  for (; r < rows; ++r)
    for (int j = 0; j < kN; ++j) sums[j] = sums[j] + ForwardSummand<kDeviation>(X + r * ld + j * kChannelBlock, mean[j]);
}

// The training forward's statistics of kN full blocks from channel c0 of X [rows, ld]: batch mean
// and (biased) variance, and k.
template <int kN>
TFOPS_ALWAYS_INLINE void ForwardTrainingGroup(const float* X, i64 rows, i64 ld, i64 c0, const float* scale,
                                              float eps, float inv, float* bm, float* bv, float* k) {
  const float* Xg = X + c0;
  Lanes mean[kN], sums[kN];
  for (int j = 0; j < kN; ++j) mean[j] = Splat(0.0f);
  GroupColumnSums<kN, false>(Xg, rows, ld, mean, sums);
  for (int j = 0; j < kN; ++j) {
    mean[j] = sums[j] * inv;
    Store(bm + c0 + j * kChannelBlock, mean[j]);
  }
  GroupColumnSums<kN, true>(Xg, rows, ld, mean, sums);
  for (int j = 0; j < kN; ++j) Store(bv + c0 + j * kChannelBlock, sums[j] * inv);
  for (i64 c = c0; c < c0 + kN * kChannelBlock; ++c) k[c] = ScaleFactor(bv[c], eps, scale[c]);
}

// The training gradient's sums of kN full blocks, S(dy * ((x - mean) * c0)), S(dy) and
// S(dy * (x - mean)), in one pass, and the per-channel coefficients of dx.
template <int kN>
TFOPS_ALWAYS_INLINE void GradTrainingGroup(const float* DY, const float* X, i64 rows, i64 ld, i64 c0,
                                           const float* scale, const float* mean, const float* c0v, float inv,
                                           float* dscale, float* doffset, float* dym, float* coef1,
                                           float* coef2) {
  const float* Xg = X + c0;
  const float* Gg = DY + c0;
  Lanes m[kN], cz[kN], s[3][kN];
  for (int j = 0; j < kN; ++j) {
    m[j] = Load(mean + c0 + j * kChannelBlock);
    cz[j] = Load(c0v + c0 + j * kChannelBlock);
    s[0][j] = s[1][j] = s[2][j] = Splat(0.0f);
  }
  for (i64 r = 0; r < rows; ++r) {
    for (int j = 0; j < kN; ++j) {
      Lanes v[3];
      const i64 e = r * ld + j * kChannelBlock;
      GradTrainingSummands(Load(Gg + e), Load(Xg + e), m[j], cz[j], v);
      for (int q = 0; q < 3; ++q) s[q][j] = s[q][j] + v[q];
    }
  }
  float s_dxc[kMaxVectors * kChannelBlock];
  for (int j = 0; j < kN; ++j) {
    Store(dscale + c0 + j * kChannelBlock, s[0][j]);
    Store(doffset + c0 + j * kChannelBlock, s[1][j]);
    Store(s_dxc + j * kChannelBlock, s[2][j]);
  }
  for (i64 l = 0; l < kN * kChannelBlock; ++l) {
    const i64 c = c0 + l;
    const GradTrainingCoefficients kc =
        GradTrainingChannel(doffset[c], s_dxc[l], scale[c], c0v[c], inv, static_cast<float>(rows));
    dym[c] = kc.dy_mean;
    coef1[c] = kc.coef1;
    coef2[c] = kc.coef2;
  }
}

// The inference gradient of kN full blocks: S(dy), S(dy * (x - mean)) and, when dx is given,
// dx = dy * k, all in one pass (dx needs no sum).
template <int kN>
TFOPS_ALWAYS_INLINE void GradInferenceGroup(const float* DY, const float* X, i64 rows, i64 ld, i64 c0,
                                            const float* mean, const float* k, float* doffset, float* s2,
                                            float* dx) {
  const float* Xg = X + c0;
  const float* Gg = DY + c0;
  Lanes m[kN], kv[kN], s[2][kN];
  for (int j = 0; j < kN; ++j) {
    m[j] = Load(mean + c0 + j * kChannelBlock);
    kv[j] = Load(k + c0 + j * kChannelBlock);
    s[0][j] = s[1][j] = Splat(0.0f);
  }
  for (i64 r = 0; r < rows; ++r) {
    for (int j = 0; j < kN; ++j) {
      const i64 e = r * ld + j * kChannelBlock;
      const Lanes g = Load(Gg + e);
      Lanes v[2];
      GradInferenceSummands(g, Load(Xg + e), m[j], v);
      s[0][j] = s[0][j] + v[0];
      s[1][j] = s[1][j] + v[1];
      if (dx != nullptr) Store(dx + c0 + e, GradInferenceElement(g, kv[j]));
    }
  }
  for (int j = 0; j < kN; ++j) {
    Store(doffset + c0 + j * kChannelBlock, s[0][j]);
    Store(s2 + c0 + j * kChannelBlock, s[1][j]);
  }
}

// The entry points: n (1 to kMaxVectors) full blocks from c0, one copy per ISA (simd.h).
#define TFOPS_BN_GROUP_SWITCH(FN, ...) \
  switch (n) {                         \
    case 1: FN<1>(__VA_ARGS__); break; \
    case 2: FN<2>(__VA_ARGS__); break; \
    case 3: FN<3>(__VA_ARGS__); break; \
    default: FN<4>(__VA_ARGS__);       \
  }
TFOPS_ALWAYS_INLINE void ForwardTrainingBody(int n, const float* X, i64 rows, i64 ld, i64 c0, const float* scale,
                                             float eps, float inv, float* bm, float* bv, float* k) {
  TFOPS_BN_GROUP_SWITCH(ForwardTrainingGroup, X, rows, ld, c0, scale, eps, inv, bm, bv, k)
}
TFOPS_ISA_VARIANTS(ForwardTrainingBlocks,
                   (int n, const float* X, i64 rows, i64 ld, i64 c0, const float* scale, float eps, float inv,
                    float* bm, float* bv, float* k),
                   (n, X, rows, ld, c0, scale, eps, inv, bm, bv, k), ForwardTrainingBody)
TFOPS_ALWAYS_INLINE void GradTrainingBody(int n, const float* DY, const float* X, i64 rows, i64 ld, i64 c0,
                                          const float* scale, const float* mean, const float* c0v, float inv,
                                          float* dscale, float* doffset, float* dym, float* coef1, float* coef2) {
  TFOPS_BN_GROUP_SWITCH(GradTrainingGroup, DY, X, rows, ld, c0, scale, mean, c0v, inv, dscale, doffset, dym, coef1,
                        coef2)
}
TFOPS_ISA_VARIANTS(GradTrainingBlocks,
                   (int n, const float* DY, const float* X, i64 rows, i64 ld, i64 c0, const float* scale,
                    const float* mean, const float* c0v, float inv, float* dscale, float* doffset, float* dym,
                    float* coef1, float* coef2),
                   (n, DY, X, rows, ld, c0, scale, mean, c0v, inv, dscale, doffset, dym, coef1, coef2),
                   GradTrainingBody)
TFOPS_ALWAYS_INLINE void GradInferenceBody(int n, const float* DY, const float* X, i64 rows, i64 ld, i64 c0,
                                           const float* mean, const float* k, float* doffset, float* s2, float* dx) {
  TFOPS_BN_GROUP_SWITCH(GradInferenceGroup, DY, X, rows, ld, c0, mean, k, doffset, s2, dx)
}
TFOPS_ISA_VARIANTS(GradInferenceBlocks,
                   (int n, const float* DY, const float* X, i64 rows, i64 ld, i64 c0, const float* mean,
                    const float* k, float* doffset, float* s2, float* dx),
                   (n, DY, X, rows, ld, c0, mean, k, doffset, s2, dx), GradInferenceBody)
#undef TFOPS_BN_GROUP_SWITCH

// Channel groups (tasks) of a tensor: kMaxVectors blocks each, from the channel count alone (a
// shape-only choice). Narrower groups (more tasks) measured slower: shorter runs of each row.
struct Groups {
  i64 width, count;
};
Groups GroupsOf(i64 channels) {
  const i64 width = kMaxVectors * kChannelBlock;
  return {width, (channels + width - 1) / width};
}

// Plain running sums (reference `sequential_sum`) of several values at once, in one pass, for the
// channels [c0, c1) of one block (the scalar form, for partial blocks).
template <int kN, typename F>
void BlockRunningSums(i64 rows, i64 c0, i64 c1, float* const sums[kN], const F& values) {
  float acc[kN][kChannelBlock];
  const i64 w = c1 - c0;
  for (int k = 0; k < kN; ++k)
    for (i64 c = 0; c < w; ++c) acc[k][c] = 0.0f;
  for (i64 r = 0; r < rows; ++r) {
    for (i64 c = 0; c < w; ++c) {
      float v[kN];
      values(r, c0 + c, v);
      for (int k = 0; k < kN; ++k) acc[k][c] = acc[k][c] + v[k];
    }
  }
  for (int k = 0; k < kN; ++k)
    for (i64 c = 0; c < w; ++c) sums[k][c0 + c] = acc[k][c];
}

// out = Narrow(fn(c, widen(in...))) over x's own layout; channels-last walks rows, channels-first
// walks (n, c) planes, both with contiguous innermost loops.
template <typename T, typename F>
void ElementwiseUnary(const Layout& l, const T* in, T* out, const F& fn, const Parallel& par) {
  const i64 C = l.channels, P = l.inner;
  if (P == 1) {
    par.ForRange(l.rows(), std::max<i64>(1, 8192 / std::max<i64>(C, 1)), [&](i64 b, i64 e) {
      for (i64 r = b; r < e; ++r)
        for (i64 c = 0; c < C; ++c) out[r * C + c] = Storage<T>::Narrow(fn(c, Storage<T>::Widen(in[r * C + c])));
    });
  } else {
    par.ForRange(l.outer * C, std::max<i64>(1, 8192 / std::max<i64>(P, 1)), [&](i64 b, i64 e) {
      for (i64 q = b; q < e; ++q) {
        const i64 c = q % C;
        for (i64 p = 0; p < P; ++p) out[q * P + p] = Storage<T>::Narrow(fn(c, Storage<T>::Widen(in[q * P + p])));
      }
    });
  }
}

// y = (x - mean[c]) * k[c] + offset[c] for float x, with a copy per vector ISA (the generic loops above
// run only the baseline copy): channels-first planes [q0, q1) of P elements, or channels-last rows
// [q0, q1) of C elements. The same IEEE operations as Normalize, so every copy gives the same bits.
TFOPS_ALWAYS_INLINE void NormalizePlanesBody(const float* x, float* y, i64 q0, i64 q1, i64 C, i64 P, const float* m,
                                             const float* k, const float* off) {
  for (i64 q = q0; q < q1; ++q) {
    const i64 c = q % C;
    const float mc = m[c], kc = k[c], oc = off[c];
    const float* __restrict in = x + q * P;
    float* __restrict out = y + q * P;
    for (i64 p = 0; p < P; ++p) out[p] = Normalize(in[p], mc, kc, oc);
  }
}
TFOPS_ALWAYS_INLINE void NormalizeRowsBody(const float* x, float* y, i64 r0, i64 r1, i64 C, const float* m,
                                           const float* k, const float* off) {
  for (i64 r = r0; r < r1; ++r) {
    const float* __restrict in = x + r * C;
    float* __restrict out = y + r * C;
    for (i64 c = 0; c < C; ++c) out[c] = Normalize(in[c], m[c], k[c], off[c]);
  }
}
TFOPS_ISA_VARIANTS(NormalizePlanes,
                   (const float* x, float* y, i64 q0, i64 q1, i64 C, i64 P, const float* m, const float* k,
                    const float* off),
                   (x, y, q0, q1, C, P, m, k, off), NormalizePlanesBody)
TFOPS_ISA_VARIANTS(NormalizeRows,
                   (const float* x, float* y, i64 r0, i64 r1, i64 C, const float* m, const float* k, const float* off),
                   (x, y, r0, r1, C, m, k, off), NormalizeRowsBody)

// y = Normalize(x, mean[c], k[c], offset[c]) over x's layout.
template <typename T>
void NormalizeAll(const Layout& l, const T* x, T* y, const float* m, const float* k, const float* off,
                  const Parallel& par) {
  const i64 C = l.channels, P = l.inner;
  if constexpr (std::is_same<T, float>::value) {
    if (P == 1)
      par.ForRange(l.rows(), std::max<i64>(1, 8192 / std::max<i64>(C, 1)),
                   [&](i64 b, i64 e) { NormalizeRows(x, y, b, e, C, m, k, off); });
    else
      par.ForRange(l.outer * C, std::max<i64>(1, 8192 / std::max<i64>(P, 1)),
                   [&](i64 b, i64 e) { NormalizePlanes(x, y, b, e, C, P, m, k, off); });
  } else {
    ElementwiseUnary(l, x, y, [&](i64 c, float v) { return Normalize(v, m[c], k[c], off[c]); }, par);
  }
}

template <typename T, typename F>
void ElementwiseBinary(const Layout& l, const T* a, const T* b_in, T* out, const F& fn, const Parallel& par) {
  const i64 C = l.channels, P = l.inner;
  if (P == 1) {
    par.ForRange(l.rows(), std::max<i64>(1, 8192 / std::max<i64>(C, 1)), [&](i64 b, i64 e) {
      for (i64 r = b; r < e; ++r)
        for (i64 c = 0; c < C; ++c)
          out[r * C + c] =
              Storage<T>::Narrow(fn(c, Storage<T>::Widen(a[r * C + c]), Storage<T>::Widen(b_in[r * C + c])));
    });
  } else {
    par.ForRange(l.outer * C, std::max<i64>(1, 8192 / std::max<i64>(P, 1)), [&](i64 b, i64 e) {
      for (i64 q = b; q < e; ++q) {
        const i64 c = q % C;
        for (i64 p = 0; p < P; ++p)
          out[q * P + p] =
              Storage<T>::Narrow(fn(c, Storage<T>::Widen(a[q * P + p]), Storage<T>::Widen(b_in[q * P + p])));
      }
    });
  }
}

}  // namespace

void CheckDataFormat(const std::string& fmt, bool allow_3d_names) {
  if (fmt == "NHWC" || fmt == "NCHW") return;
  if (allow_3d_names && (fmt == "NDHWC" || fmt == "NCDHW")) return;
  throw OpError("Invalid data format: data_format \"" + fmt + "\" is not one of NHWC, NCHW" +
                (allow_3d_names ? ", NDHWC, NCDHW" : ""));
}

void CheckForward(const std::vector<i64>& x, const std::vector<i64>& scale, const std::vector<i64>& offset,
                  const std::vector<i64>& mean, const std::vector<i64>& variance, const std::string& fmt,
                  bool allow_3d_names, bool is_training, float f, Layout* layout) {
  CheckRank("x", x);
  CheckVector("scale", "scale", scale);
  CheckVector("offset", "offset", offset);
  CheckVector("mean", "estimated_mean", mean);
  CheckVector("variance", "estimated_variance", variance);
  CheckDataFormat(fmt, allow_3d_names);
  *layout = LayoutOf(x, fmt);
  const i64 c = layout->channels;
  CheckCount("", "scale", scale, c);
  CheckCount("", "offset", offset, c);
  if (!is_training || f != 1.0f) {  // only then are mean/variance read
    const std::string prefix = !is_training ? "When is_training=false, " : "When exponential_avg_factor != 1, ";
    CheckCount(prefix, "mean", mean, c);
    CheckCount(prefix, "variance", variance, c);
  }
}

void CheckGrad(const std::vector<i64>& dy, const std::vector<i64>& x, const std::vector<i64>& scale,
               const std::vector<i64>& rs1, const std::vector<i64>& rs2, const std::string& fmt,
               bool allow_3d_names, Layout* layout) {
  CheckRank("y_backprop", dy);
  CheckRank("x", x);
  CheckVector("scale", "scale", scale);
  CheckVector("reserve_space_1", "saved mean", rs1);
  CheckVector("reserve_space_2", "saved variance", rs2);
  if (x != dy)
    throw OpError("x and y_backprop must have same shape, but x has shape " + ShapeString(x) + " and y_backprop has shape " +
                  ShapeString(dy));
  CheckDataFormat(fmt, allow_3d_names);
  *layout = LayoutOf(x, fmt);
  const i64 c = layout->channels;
  CheckCount("", "scale", scale, c);
  CheckCount("", "reserve_space_1", rs1, c);
  CheckCount("", "reserve_space_2", rs2, c);
}

template <typename T>
void Forward(const Layout& l, const T* x, const float* scale, const float* offset, const float* mean,
             const float* variance, float eps, float f, bool is_training, T* y, float* batch_mean, float* batch_variance,
             float* rs1, float* rs2, const Parallel& par) {
  const i64 C = l.channels;
  if (l.size() == 0) {  // statistics of nothing: NaN, as TF; the reserve spaces get zeros
    for (i64 c = 0; c < C; ++c) {
      batch_mean[c] = batch_variance[c] = std::numeric_limits<float>::quiet_NaN();
      rs1[c] = rs2[c] = 0.0f;
    }
    return;
  }
  std::vector<float> k(static_cast<size_t>(C)), shift(static_cast<size_t>(C));
  if (!is_training) {
    for (i64 c = 0; c < C; ++c) k[c] = ScaleFactor(variance[c], eps, scale[c]);
    const float* m = mean;
    NormalizeAll(l, x, y, m, k.data(), offset, par);
    for (i64 c = 0; c < C; ++c) {
      batch_mean[c] = rs1[c] = mean[c];
      batch_variance[c] = rs2[c] = variance[c];
    }
    return;
  }
  std::vector<float> storage;
  const float* X = RowsOf(l, x, &storage, par);
  const i64 R = l.rows();
  const float inv = 1.0f / static_cast<float>(R);
  std::vector<float> bm(static_cast<size_t>(C)), bv(static_cast<size_t>(C));
  const Groups groups = GroupsOf(C);
  par.For(static_cast<size_t>(groups.count), [&](size_t t) {
    const i64 g0 = static_cast<i64>(t) * groups.width, g1 = std::min(C, g0 + groups.width);
    const i64 full = (g1 - g0) / kChannelBlock, c0 = g0 + full * kChannelBlock;
    if (full > 0)
      ForwardTrainingBlocks(static_cast<int>(full), X, R, C, g0, scale, eps, inv, bm.data(), bv.data(), k.data());
    if (c0 == g1) return;
    // The partial block at the end: the scalar loops.
    const i64 c1 = g1;
    BlockColumnSums(R, C, c0, c1, bm.data(), [&](i64 r, i64 c) { return X[r * C + c]; });
    for (i64 c = c0; c < c1; ++c) bm[c] = bm[c] * inv;
    BlockColumnSums(R, C, c0, c1, bv.data(), [&](i64 r, i64 c) { return SquaredDeviation(X[r * C + c], bm[c]); });
    for (i64 c = c0; c < c1; ++c) {
      bv[c] = bv[c] * inv;
      k[c] = ScaleFactor(bv[c], eps, scale[c]);
    }
  });
  const float* mu = bm.data();
  NormalizeAll(l, x, y, mu, k.data(), offset, par);
  const float bessel = BesselFactor(R);
  if (f == 1.0f) {
    for (i64 c = 0; c < C; ++c) {
      batch_mean[c] = bm[c];
      batch_variance[c] = bv[c] * bessel;
    }
  } else {
    const float keep = 1.0f - f, f_bessel = f * bessel;
    for (i64 c = 0; c < C; ++c) {
      batch_mean[c] = RunningAverage(keep, mean[c], f, bm[c]);
      batch_variance[c] = RunningAverage(keep, variance[c], f_bessel, bv[c]);
    }
  }
  for (i64 c = 0; c < C; ++c) {
    rs1[c] = bm[c];
    rs2[c] = bv[c];
  }
}

template <typename T>
void Grad(const Layout& l, const T* dy, const T* x, const float* scale, const float* saved_mean,
          const float* saved_var, float eps, bool is_training, T* dx, float* dscale, float* doffset,
          const Parallel& par) {
  const i64 C = l.channels;
  if (l.size() == 0) {
    for (i64 c = 0; c < C; ++c) dscale[c] = doffset[c] = 0.0f;
    return;
  }
  std::vector<float> x_storage, dy_storage;
  const float* X = RowsOf(l, x, &x_storage, par);
  const float* DY = RowsOf(l, dy, &dy_storage, par);
  const i64 R = l.rows();
  std::vector<float> c0v(static_cast<size_t>(C));
  for (i64 c = 0; c < C; ++c) c0v[c] = Rsqrt(saved_var[c] + eps);
  const float* cz = c0v.data();
  const Groups groups = GroupsOf(C);
  if (is_training) {
    // Three arrays (not an array of structs), so that the element-wise loops vectorize over channels.
    std::vector<float> dym(static_cast<size_t>(C)), coef1(static_cast<size_t>(C)), coef2(static_cast<size_t>(C));
    const float inv = 1.0f / static_cast<float>(R);
    par.For(static_cast<size_t>(groups.count), [&](size_t t) {
      const i64 g0 = static_cast<i64>(t) * groups.width, g1 = std::min(C, g0 + groups.width);
      const i64 full = (g1 - g0) / kChannelBlock, c0 = g0 + full * kChannelBlock, c1 = g1;
      if (full > 0)
        GradTrainingBlocks(static_cast<int>(full), DY, X, R, C, g0, scale, saved_mean, cz, inv, dscale, doffset,
                           dym.data(), coef1.data(), coef2.data());
      if (c0 == c1) return;
      float s_dxc[kChannelBlock];
      float* const sums[3] = {dscale, doffset, s_dxc - c0};
      BlockRunningSums<3>(R, c0, c1, sums, [&](i64 r, i64 c, float* v) {
        GradTrainingSummands(DY[r * C + c], X[r * C + c], saved_mean[c], cz[c], v);
      });
      for (i64 c = c0; c < c1; ++c) {
        const GradTrainingCoefficients k = GradTrainingChannel(doffset[c], s_dxc[c - c0], scale[c], c0v[c], inv,
                                                               static_cast<float>(R));
        dym[c] = k.dy_mean;
        coef1[c] = k.coef1;
        coef2[c] = k.coef2;
      }
    });
    ElementwiseBinary(l, dy, x, dx, [&](i64 c, float g, float v) {
      return GradTrainingElement(g, v, saved_mean[c], dym[c], coef1[c], coef2[c]);
    }, par);
  } else {
    // dx joins the sums' pass when it is a float [R, C] matrix like X and DY and there are two
    // groups or more (one group would leave the other threads idle).
    const bool fused = std::is_same<T, float>::value && l.inner == 1 && groups.count >= 2;
    float* dx_rows = fused ? reinterpret_cast<float*>(dx) : nullptr;
    std::vector<float> s2(static_cast<size_t>(C)), k(static_cast<size_t>(C));
    for (i64 c = 0; c < C; ++c) k[c] = c0v[c] * scale[c];
    par.For(static_cast<size_t>(groups.count), [&](size_t t) {
      const i64 g0 = static_cast<i64>(t) * groups.width, g1 = std::min(C, g0 + groups.width);
      const i64 full = (g1 - g0) / kChannelBlock, c0 = g0 + full * kChannelBlock, c1 = g1;
      if (full > 0)
        GradInferenceBlocks(static_cast<int>(full), DY, X, R, C, g0, saved_mean, k.data(), doffset, s2.data(),
                            dx_rows);
      if (c0 == c1) return;
      float* const sums[2] = {doffset, s2.data()};
      BlockRunningSums<2>(R, c0, c1, sums, [&](i64 r, i64 c, float* v) {
        GradInferenceSummands(DY[r * C + c], X[r * C + c], saved_mean[c], v);
      });
      if (dx_rows != nullptr) {
        for (i64 r = 0; r < R; ++r)
          for (i64 c = c0; c < c1; ++c) dx_rows[r * C + c] = GradInferenceElement(DY[r * C + c], k[c]);
      }
    });
    for (i64 c = 0; c < C; ++c) dscale[c] = s2[c] * c0v[c];
    if (!fused) ElementwiseUnary(l, dy, dx, [&](i64 c, float g) { return GradInferenceElement(g, k[c]); }, par);
  }
  // TF's sum over a single row is a copy, so denormals-are-zero does not touch offset_backprop then.
  if (R == 1) {
    for (i64 c = 0; c < C; ++c) doffset[c] = DY[c];
  }
}

#define TFOPS_BATCH_NORM_INSTANTIATE(T)                                                                        \
  template void Forward<T>(const Layout&, const T*, const float*, const float*, const float*, const float*, float, \
                           float, bool, T*, float*, float*, float*, float*, const Parallel&);                    \
  template void Grad<T>(const Layout&, const T*, const T*, const float*, const float*, const float*, float, bool, T*, \
                        float*, float*, const Parallel&);

TFOPS_BATCH_NORM_INSTANTIATE(float)
TFOPS_BATCH_NORM_INSTANTIATE(Half)
TFOPS_BATCH_NORM_INSTANTIATE(BFloat16)

}  // namespace batch_norm
}  // namespace tfops
