// Batch-norm kernels (see batch_norm.h). Work layout:
//  * Column sums run as tasks over blocks of channels; inside a block the rows are walked in order
//    with the channels innermost (contiguous, vectorized), so every channel's sum is added in
//    exactly the reference order whatever the thread count.
//  * Channels-first x (and 16-bit x) is first converted to a float32 [R, C] matrix for the sums;
//    the element-wise outputs are computed straight from the caller's buffers in their own layout.
#include "kernels/batch_norm.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
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

std::string Dims(const std::vector<i64>& s) {  // TF's "[2,3,4]"
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
  os << "]";
  return os.str();
}

bool ChannelsFirst(const std::string& fmt) { return fmt == "NCHW" || fmt == "NCDHW"; }

// TF says "input" for x and y_backprop alike: the message leads with the input's name.
std::string CheckRank(const char* name, const std::vector<i64>& s) {
  if (s.size() != 4 && s.size() != 5)
    return std::string(name) + " has rank " + std::to_string(s.size()) + ": input must be 4 or 5-dimensional" + Dims(s);
  return "";
}

// A [C] statistic; `label` is what TF's message calls the input `name` ("saved mean" for
// reserve_space_1), and the name leads where the two differ.
std::string CheckVector(const std::string& name, const std::string& label, const std::vector<i64>& s) {
  if (s.size() == 1) return "";
  const std::string tf_message = label + " must be 1-dimensional" + Dims(s);
  return name == label ? tf_message : name + " has rank " + std::to_string(s.size()) + ": " + tf_message;
}

std::string CheckCount(const std::string& prefix, const std::string& label, const std::vector<i64>& s, i64 channels) {
  i64 n = 1;
  for (i64 d : s) n *= d;
  if (n != channels)
    return prefix + label + " must have the same number of elements as the channels of x, got " + std::to_string(n) +
           " and " + std::to_string(channels);
  return "";
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

// The training forward's column sum (reference `column_sum`) of value(r, c), for all channels.
template <typename F>
void ColumnSums(i64 rows, i64 channels, float* sums, const F& value, const Parallel& par) {
  const i64 vector_channels = kPacket * (channels / kPacket);
  const bool split = rows >= kMinRowsForSplit;
  par.ForRange(channels, kChannelBlock, [&](i64 c0, i64 c1) {
    const i64 mid = std::min(c1, vector_channels);  // blocks are packet-aligned: [c0, mid) vector, [mid, c1) not
    if (split && mid > c0) SplitSums(rows, c0, mid, sums, value);
    else if (mid > c0) SequentialSums(rows, c0, mid, sums, value);
    if (c1 > mid) SequentialSums(rows, std::max(c0, mid), c1, sums, value);
  });
}

// Plain running sums (reference `sequential_sum`) of several values at once, in one pass.
template <int kN, typename F>
void RunningSums(i64 rows, i64 channels, float* const sums[kN], const F& values, const Parallel& par) {
  par.ForRange(channels, kChannelBlock, [&](i64 c0, i64 c1) {
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
  });
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

std::string CheckDataFormat(const std::string& fmt, bool allow_3d_names) {
  if (fmt == "NHWC" || fmt == "NCHW") return "";
  if (allow_3d_names && (fmt == "NDHWC" || fmt == "NCDHW")) return "";
  return "Invalid data format: data_format \"" + fmt + "\" is not one of NHWC, NCHW" +
         (allow_3d_names ? ", NDHWC, NCDHW" : "");
}

std::string CheckForward(const std::vector<i64>& x, const std::vector<i64>& scale, const std::vector<i64>& offset,
                         const std::vector<i64>& mean, const std::vector<i64>& variance, const std::string& fmt,
                         bool allow_3d_names, bool is_training, float f, Layout* layout) {
  std::string err;
  if (!(err = CheckRank("x", x)).empty()) return err;
  if (!(err = CheckVector("scale", "scale", scale)).empty()) return err;
  if (!(err = CheckVector("offset", "offset", offset)).empty()) return err;
  if (!(err = CheckVector("mean", "estimated_mean", mean)).empty()) return err;
  if (!(err = CheckVector("variance", "estimated_variance", variance)).empty()) return err;
  if (!(err = CheckDataFormat(fmt, allow_3d_names)).empty()) return err;
  *layout = LayoutOf(x, fmt);
  const i64 c = layout->channels;
  if (!(err = CheckCount("", "scale", scale, c)).empty()) return err;
  if (!(err = CheckCount("", "offset", offset, c)).empty()) return err;
  if (!is_training || f != 1.0f) {  // only then are mean/variance read
    const std::string prefix = !is_training ? "When is_training=false, " : "When exponential_avg_factor != 1, ";
    if (!(err = CheckCount(prefix, "mean", mean, c)).empty()) return err;
    if (!(err = CheckCount(prefix, "variance", variance, c)).empty()) return err;
  }
  return "";
}

std::string CheckGrad(const std::vector<i64>& dy, const std::vector<i64>& x, const std::vector<i64>& scale,
                      const std::vector<i64>& rs1, const std::vector<i64>& rs2, const std::string& fmt,
                      bool allow_3d_names, Layout* layout) {
  std::string err;
  if (!(err = CheckRank("y_backprop", dy)).empty()) return err;
  if (!(err = CheckRank("x", x)).empty()) return err;
  if (!(err = CheckVector("scale", "scale", scale)).empty()) return err;
  if (!(err = CheckVector("reserve_space_1", "saved mean", rs1)).empty()) return err;
  if (!(err = CheckVector("reserve_space_2", "saved variance", rs2)).empty()) return err;
  if (x != dy)
    return "x and y_backprop must have same shape, but x has shape " + Dims(x) + " and y_backprop has shape " + Dims(dy);
  if (!(err = CheckDataFormat(fmt, allow_3d_names)).empty()) return err;
  *layout = LayoutOf(x, fmt);
  const i64 c = layout->channels;
  if (!(err = CheckCount("", "scale", scale, c)).empty()) return err;
  if (!(err = CheckCount("", "reserve_space_1", rs1, c)).empty()) return err;
  if (!(err = CheckCount("", "reserve_space_2", rs2, c)).empty()) return err;
  return "";
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
    ElementwiseUnary(l, x, y, [&](i64 c, float v) { return Normalize(v, m[c], k[c], offset[c]); }, par);
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
  ColumnSums(R, C, bm.data(), [&](i64 r, i64 c) { return X[r * C + c]; }, par);
  for (i64 c = 0; c < C; ++c) bm[c] = bm[c] * inv;
  const float* mu = bm.data();
  ColumnSums(R, C, bv.data(), [&](i64 r, i64 c) { return SquaredDeviation(X[r * C + c], mu[c]); }, par);
  for (i64 c = 0; c < C; ++c) {
    bv[c] = bv[c] * inv;
    k[c] = ScaleFactor(bv[c], eps, scale[c]);
  }
  ElementwiseUnary(l, x, y, [&](i64 c, float v) { return Normalize(v, mu[c], k[c], offset[c]); }, par);
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
  std::vector<float> c0(static_cast<size_t>(C));
  for (i64 c = 0; c < C; ++c) c0[c] = Rsqrt(saved_var[c] + eps);
  const float* cz = c0.data();
  if (is_training) {
    std::vector<float> s_dxc(static_cast<size_t>(C));
    float* const sums[3] = {dscale, doffset, s_dxc.data()};
    RunningSums<3>(R, C, sums, [&](i64 r, i64 c, float* v) {
      GradTrainingSummands(DY[r * C + c], X[r * C + c], saved_mean[c], cz[c], v);
    }, par);
    // Three arrays (not an array of structs), so that the loop below vectorizes over channels.
    std::vector<float> dym(static_cast<size_t>(C)), coef1(static_cast<size_t>(C)), coef2(static_cast<size_t>(C));
    const float inv = 1.0f / static_cast<float>(R);
    for (i64 c = 0; c < C; ++c) {
      const GradTrainingCoefficients k = GradTrainingChannel(doffset[c], s_dxc[c], scale[c], c0[c], inv,
                                                             static_cast<float>(R));
      dym[c] = k.dy_mean;
      coef1[c] = k.coef1;
      coef2[c] = k.coef2;
    }
    ElementwiseBinary(l, dy, x, dx, [&](i64 c, float g, float v) {
      return GradTrainingElement(g, v, saved_mean[c], dym[c], coef1[c], coef2[c]);
    }, par);
  } else {
    std::vector<float> s2(static_cast<size_t>(C));
    float* const sums[2] = {doffset, s2.data()};
    RunningSums<2>(R, C, sums, [&](i64 r, i64 c, float* v) {
      GradInferenceSummands(DY[r * C + c], X[r * C + c], saved_mean[c], v);
    }, par);
    std::vector<float> k(static_cast<size_t>(C));
    for (i64 c = 0; c < C; ++c) {
      k[c] = c0[c] * scale[c];
      dscale[c] = s2[c] * c0[c];
    }
    ElementwiseUnary(l, dy, dx, [&](i64 c, float g) { return GradInferenceElement(g, k[c]); }, par);
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
