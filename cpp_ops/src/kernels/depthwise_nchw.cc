// DepthwiseConv2dNative forward over float NCHW tensors, without the NHWC copies of the general path
// (depthwise.cc). The converters give the op NCHW when its neighbours are ONNX convolutions
// (converters/layout.py), so this is the inference path of a converted network.
//
// Same bits as the NHWC kernel. There each output element starts at 0 and adds w * x for the taps
// inside the input, in (filter row, filter column) order, one rounding per operation (no FMA
// contraction). Here each task copies one input plane into a zero-padded buffer and adds every tap,
// the padding's included, in the same order: a padding tap adds w * 0 = +-0, which leaves any sum
// unchanged (the sum is never -0: it starts at +0, and +0 + -0 is +0), as long as w is finite. A filter
// holding an infinity or a NaN (w * 0 = NaN) goes to the general path instead.
//
// Layout of the padded buffer: for stride S each padded row is stored as S phase rows, phase p
// holding columns p, p + S, p + 2S, ..., so the input column j * S + o of output column j is element
// j + o / S of phase o % S: the inner loop reads contiguous vectors for any stride.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/depthwise.h"
#include "kernels/simd.h"

// Vectors of the GCC extension live only inside this file's cloned loops, never across an ABI boundary.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace tfops {
namespace depthwise {
namespace {

using i64 = std::int64_t;

constexpr i64 kLanes = 8;       // FillPlane's vectors: one AVX2 register of floats
constexpr i64 kMaxLanes = 16;   // slack for vectors up to 16 lanes

// W floats in one vector of the GCC extension.
template <int W>
struct Lanes {
  typedef float Vec __attribute__((vector_size(W * sizeof(float))));
};

using Vec = Lanes<kLanes>::Vec;

template <int W>  // always inline: each ISA copy gets its own
TFOPS_ALWAYS_INLINE typename Lanes<W>::Vec LoadW(const float* p) {
  typename Lanes<W>::Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The first n (<= W) lanes of v to p: an inlined lane loop, where a memcpy of a run-time size is a library
// call per row (measurably slower on MobileNetV2's 7-, 14- and 28-column planes).
template <int W>
TFOPS_ALWAYS_INLINE void StoreN(float* p, const typename Lanes<W>::Vec& v, i64 n) {
  if (n == W) {
    std::memcpy(p, &v, sizeof v);
    return;
  }
  for (i64 l = 0; l < n; ++l) p[l] = v[l];
}

struct PaddedPlane {
  i64 rows = 0;       // padded rows
  i64 phase_len = 0;  // elements per phase row, with kMaxLanes of slack for the last vector
  i64 stride = 1;
  std::vector<float> data;

  // Offset of column `col` of padded row `row`.
  i64 Offset(i64 row, i64 col) const { return (row * stride + col % stride) * phase_len + col / stride; }
};

// The geometry of the padded plane (the same for every plane of a call).
void PadShape(const Geometry& g, PaddedPlane* p) {
  const i64 S = g.stride;
  const i64 need_rows = (g.out_rows - 1) * S + (g.filter_rows - 1) * g.dilation_rows + 1;
  const i64 need_cols = (g.out_cols - 1) * S + (g.filter_cols - 1) * g.dilation_cols + 1;
  const i64 cols = std::max(need_cols, g.pad_left + g.in_cols);
  p->rows = std::max(need_rows, g.pad_top + g.in_rows);
  p->stride = S;
  p->phase_len = (cols + S - 1) / S + kMaxLanes;  // slack: the last vector of a row may read past it
  p->data.assign(static_cast<size_t>(p->rows * S * p->phase_len), 0.0f);
}

// Copies plane `src` (in_rows x in_cols) into the buffer, deinterleaved into phases. Only the input's
// own positions are written, always the same ones, so the padding stays zero from PadShape for every
// plane a task copies.
TFOPS_ALWAYS_INLINE void FillPlaneBody(const Geometry& g, const float* src, PaddedPlane* p) {
  const i64 S = p->stride;
  for (i64 r = 0; r < g.in_rows; ++r) {
    const float* in = src + r * g.in_cols;
    float* row = p->data.data() + (r + g.pad_top) * S * p->phase_len;
    if (S == 1) {
      std::memcpy(row + g.pad_left, in, static_cast<size_t>(g.in_cols) * sizeof(float));
      continue;
    }
    i64 c0 = 0;
    if (S == 2) {  // the common stride: split 16 columns into their 8 even and 8 odd ones per step
      typedef int Mask __attribute__((vector_size(kLanes * sizeof(int))));
      const Mask even = {0, 2, 4, 6, 8, 10, 12, 14}, odd = {1, 3, 5, 7, 9, 11, 13, 15};
      float* to_even = row + (g.pad_left % 2) * p->phase_len + g.pad_left / 2;       // column c even
      float* to_odd = row + ((g.pad_left + 1) % 2) * p->phase_len + (g.pad_left + 1) / 2;  // column c odd
      for (; c0 + 2 * kLanes <= g.in_cols; c0 += 2 * kLanes) {
        const Vec lo = LoadW<kLanes>(in + c0), hi = LoadW<kLanes>(in + c0 + kLanes);
        const Vec e = __builtin_shuffle(lo, hi, even), o = __builtin_shuffle(lo, hi, odd);
        std::memcpy(to_even + c0 / 2, &e, sizeof e);
        std::memcpy(to_odd + c0 / 2, &o, sizeof o);
      }
    }
    // The columns left: padded column pc = c + pad_left goes to phase pc % S, element pc / S, both
    // stepped along (a division per element made MobileNetV2's 14x14 stride-2 planes twice as slow).
    i64 phase = (c0 + g.pad_left) % S, index = (c0 + g.pad_left) / S;
    for (i64 c = c0; c < g.in_cols; ++c) {
      row[phase * p->phase_len + index] = in[c];
      if (++phase == S) phase = 0, ++index;
    }
  }
}

// Output plane (out_rows x out_cols) from the padded input plane: taps[t] and offsets[t] are the filter
// value and the buffer offset (for output position (0, 0)) of tap t, in (filter row, filter column)
// order. Vectors of W lanes, the ISA copy's register width; four independent sums per tap in each
// step: 4W columns of one row, then, for the columns left over, one vector in each of four rows.
template <int W>
TFOPS_ALWAYS_INLINE void PlaneOutputBody(const Geometry& g, const PaddedPlane& p, const float* taps,
                                         const i64* offsets, i64 n_taps, float* out) {
  using V = typename Lanes<W>::Vec;
  const i64 row_step = g.stride * p.stride * p.phase_len;  // output row i reads from padded row i * stride
  const i64 cols = g.out_cols, full = cols / (4 * W) * (4 * W);
  const float* data = p.data.data();
  for (i64 i = 0; i < g.out_rows; ++i) {
    const float* base = data + i * row_step;
    for (i64 j = 0; j < full; j += 4 * W) {
      V a0 = {}, a1 = {}, a2 = {}, a3 = {};
      for (i64 t = 0; t < n_taps; ++t) {
        const float w = taps[t];
        const float* x = base + offsets[t] + j;
        a0 = a0 + w * LoadW<W>(x);
        a1 = a1 + w * LoadW<W>(x + W);
        a2 = a2 + w * LoadW<W>(x + 2 * W);
        a3 = a3 + w * LoadW<W>(x + 3 * W);
      }
      float* o = out + i * cols + j;
      std::memcpy(o, &a0, sizeof a0);
      std::memcpy(o + W, &a1, sizeof a1);
      std::memcpy(o + 2 * W, &a2, sizeof a2);
      std::memcpy(o + 3 * W, &a3, sizeof a3);
    }
  }
  for (i64 j = full; j < cols; j += W) {
    const i64 n = std::min<i64>(W, cols - j);
    i64 i = 0;
    for (; i + 4 <= g.out_rows; i += 4) {
      V a0 = {}, a1 = {}, a2 = {}, a3 = {};
      const float* base = data + i * row_step + j;
      for (i64 t = 0; t < n_taps; ++t) {
        const float w = taps[t];
        const float* x = base + offsets[t];
        a0 = a0 + w * LoadW<W>(x);
        a1 = a1 + w * LoadW<W>(x + row_step);
        a2 = a2 + w * LoadW<W>(x + 2 * row_step);
        a3 = a3 + w * LoadW<W>(x + 3 * row_step);
      }
      StoreN<W>(out + i * cols + j, a0, n);
      StoreN<W>(out + (i + 1) * cols + j, a1, n);
      StoreN<W>(out + (i + 2) * cols + j, a2, n);
      StoreN<W>(out + (i + 3) * cols + j, a3, n);
    }
    for (; i < g.out_rows; ++i) {
      V a = {};
      const float* base = data + i * row_step + j;
      for (i64 t = 0; t < n_taps; ++t) a = a + taps[t] * LoadW<W>(base + offsets[t]);
      StoreN<W>(out + i * cols + j, a, n);
    }
  }
}

// A copy of each loop per vector ISA (simd.h). FillPlane's vectors are 8 lanes in every copy. PlaneOutput's
// are 8 lanes for AVX2 and AVX-512 (16 were slower on the AVX-512 EPYC measured: 2.9 against 2.5 ms, 2.2
// against 1.5 ms on MobileNetV2's shapes at batch 8) and 4 for SSE2 (8 were expanded piecewise there, 3x
// slower). The width changes no result: each element's sum is the same sequence of operations in any lane.
TFOPS_ISA_VARIANTS(FillPlane, (const Geometry& g, const float* src, PaddedPlane* p), (g, src, p), FillPlaneBody)
#define TFOPS_PLANE_PARAMS \
  (const Geometry& g, const PaddedPlane& p, const float* taps, const i64* offsets, i64 n_taps, float* out)
#define TFOPS_PLANE_ARGS (g, p, taps, offsets, n_taps, out)
#if defined(TFOPS_ISA_DISPATCH)
TFOPS_TARGET_AVX512 void PlaneOutputAvx512 TFOPS_PLANE_PARAMS { PlaneOutputBody<8> TFOPS_PLANE_ARGS; }
TFOPS_TARGET_AVX2 void PlaneOutputAvx2 TFOPS_PLANE_PARAMS { PlaneOutputBody<8> TFOPS_PLANE_ARGS; }
void PlaneOutputSse2 TFOPS_PLANE_PARAMS { PlaneOutputBody<4> TFOPS_PLANE_ARGS; }
void PlaneOutput TFOPS_PLANE_PARAMS {
  switch (ActiveIsa()) {
    case Isa::kAvx512:
      return PlaneOutputAvx512 TFOPS_PLANE_ARGS;
    case Isa::kAvx2:
      return PlaneOutputAvx2 TFOPS_PLANE_ARGS;
    default:
      return PlaneOutputSse2 TFOPS_PLANE_ARGS;
  }
}
#else
void PlaneOutput TFOPS_PLANE_PARAMS { PlaneOutputBody<4> TFOPS_PLANE_ARGS; }
#endif
#undef TFOPS_PLANE_PARAMS
#undef TFOPS_PLANE_ARGS

bool AllFinite(const float* v, i64 n) {
  for (i64 i = 0; i < n; ++i)
    if (!std::isfinite(v[i])) return false;
  return true;
}

}  // namespace

bool ForwardNchw(const Geometry& g, const float* input, const float* filter, float* output, const Parallel& par) {
  if (!g.nchw || !AllFinite(filter, g.FilterSize())) return false;
  const i64 C = g.in_depth, M = g.depth_multiplier;
  const i64 in_plane = g.in_rows * g.in_cols, out_plane = g.out_rows * g.out_cols;
  const i64 work = std::max<i64>(out_plane * M * g.filter_rows * g.filter_cols, 1);
  const i64 grain = std::max<i64>(1, (i64{1} << 16) / work);
  par.ForRange(g.batch * C, grain, [&](i64 begin, i64 end) {
    PaddedPlane padded;
    PadShape(g, &padded);
    const i64 n_taps = g.filter_rows * g.filter_cols;
    std::vector<i64> offsets(static_cast<size_t>(n_taps));
    std::vector<float> taps(static_cast<size_t>(n_taps));
    for (i64 r = 0; r < g.filter_rows; ++r)
      for (i64 s = 0; s < g.filter_cols; ++s)
        offsets[r * g.filter_cols + s] = padded.Offset(r * g.dilation_rows, s * g.dilation_cols);
    for (i64 q = begin; q < end; ++q) {  // q = b * C + c
      FillPlane(g, input + q * in_plane, &padded);
      const i64 c = q % C;
      for (i64 m = 0; m < M; ++m) {
        const i64 k = c * M + m;
        for (i64 t = 0; t < n_taps; ++t) taps[t] = filter[t * g.out_depth + k];
        PlaneOutput(g, padded, taps.data(), offsets.data(), n_taps, output + ((q / C) * g.out_depth + k) * out_plane);
      }
    }
  });
  return true;
}

}  // namespace depthwise
}  // namespace tfops
