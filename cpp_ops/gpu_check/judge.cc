// The suite's comparison rules, in C++ (the Python originals name the rule each function follows):
//  - bits: tests/comparison.py bits_mismatch (+0 and -0 differ; NaNs in the same places, with the same sign and
//    payload unless the rule says positions only);
//  - summed outputs against TF: comparison.py sum_mismatch (within 1e-6 * sum of |gradients|);
//  - batch norm: test_batch_norm.py assert_close (16 float32 ulps, or one ulp of float16/bfloat16, of
//    max(1, max |expected|); NaN and infinities in the same places). Stricter than the kit's rule for the
//    gradients' scale/offset outputs (rules.batch_norm_output_bound also allows 2*(n+1)*u*sum|terms| for
//    those sums); against the CPU kernels a miss still passes when the GPU is no further from the float64
//    math than twice the CPU kernels' own error (Judge below).
//  - depthwise: test_depthwise.py assert_close with its per-element bound, from the op computed in float64 on the
//    inputs and on their absolute values;
//  - which rule for which op and output: tests/cuda_support.py outputs_mismatch (CUDA against the CPU kernels) and
//    golden_mismatch (against TF's goldens).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "check.h"
#include "kernels/depthwise.h"
#include "kernels/op_error.h"

namespace gpu_check {

tfops::depthwise::Geometry DepthwiseGeometryOf(const Case& c);  // ops.cc

namespace {

bool NanAt(const Tensor& t, int64_t i) {
  const uint64_t b = t.BitsAt(i);
  switch (t.dtype) {
    case DType::kF32:
      return (b & 0x7fffffffu) > 0x7f800000u;
    case DType::kF64:
      return (b & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    case DType::kF16:
      return (b & 0x7fffu) > 0x7c00u;
    case DType::kBF16:
      return (b & 0x7fffu) > 0x7f80u;
    default:
      return false;
  }
}

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%#llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string SameKind(const Tensor& want, const Tensor& got) {
  if (want.dtype != got.dtype || want.shape != got.shape) {
    return std::string("dtype/shape ") + Name(got.dtype) + ShapeText(got.shape) + " != " + Name(want.dtype) +
           ShapeText(want.shape);
  }
  return "";
}

std::string NanPositions(const Tensor& want, const Tensor& got) {
  int64_t differ = 0, first = -1;
  for (int64_t i = 0; i < want.count(); ++i) {
    if (NanAt(want, i) != NanAt(got, i)) {
      if (first < 0) first = i;
      ++differ;
    }
  }
  if (!differ) return "";
  return "NaN positions differ (" + std::to_string(differ) + "), first at " + std::to_string(first) + ": " +
         Num(got.At(first)) + " != " + Num(want.At(first));
}

// comparison.py sum_mismatch
std::string SumMismatch(const Tensor& want, const Tensor& got, const Tensor& gradients) {
  std::string why = SameKind(want, got);
  if (!why.empty()) return why;
  for (int64_t i = 0; i < want.count(); ++i) {
    if (NanAt(want, i) != NanAt(got, i)) return "NaN positions differ";
  }
  double tol = 0;
  for (int64_t i = 0; i < gradients.count(); ++i) {
    const double g = std::fabs(gradients.At(i));
    if (std::isfinite(g)) tol += g;
  }
  tol *= 1e-6;
  for (int64_t i = 0; i < want.count(); ++i) {
    const double w = want.At(i), a = got.At(i);
    if (std::isnan(w) || w == a || std::fabs(w - a) <= tol) continue;
    return "sums differ at " + std::to_string(i) + ": " + Num(a) + " != " + Num(w) + " (tolerance " + Num(tol) + ")";
  }
  return "";
}

// ------------------------------------------------------------------------------------------- batch norm

double UlpOf(DType t) {
  switch (t) {
    case DType::kF16:
      return std::ldexp(1.0, -10);
    case DType::kBF16:
      return std::ldexp(1.0, -7);
    default:
      return 16 * std::ldexp(1.0, -23);
  }
}

// test_batch_norm.py assert_close; `bound_out` (if given) receives the bound, `err_out` the error.
std::string BatchNormClose(const Tensor& want, const Tensor& got, double* err_out = nullptr, double* bound_out = nullptr) {
  std::string why = SameKind(want, got);
  if (!why.empty()) return why;
  int64_t inf_w = 0, inf_g = 0;
  double size = 1, err = 0;
  for (int64_t i = 0; i < want.count(); ++i) {
    const double w = want.At(i), g = got.At(i);
    if (std::isnan(w) != std::isnan(g)) return "NaN positions differ";
    if (std::isinf(w)) {
      ++inf_w;
      if (g != w) return "infinities differ";
    }
    if (std::isinf(g)) ++inf_g;
    if (std::isfinite(w)) size = std::max(size, std::fabs(w));
  }
  if (inf_w != inf_g) return "infinities differ";
  for (int64_t i = 0; i < want.count(); ++i) {
    const double w = want.At(i);
    if (std::isfinite(w)) err = std::max(err, std::fabs(got.At(i) - w));
  }
  const double bound = UlpOf(want.dtype) * size;
  if (err_out) *err_out = err;
  if (bound_out) *bound_out = bound;
  if (err <= bound) return "";
  return "max abs error " + Num(err) + " > " + Num(UlpOf(want.dtype)) + " * " + Num(size);
}

struct BnView {
  int64_t channels = 0, inner = 1, count = 0;
  int64_t Channel(int64_t i) const { return (i / inner) % channels; }
};

BnView BnViewOf(const Tensor& x, const std::string& format) {
  BnView v;
  v.count = x.count();
  const bool first = format == "NCHW" || format == "NCDHW";
  const std::size_t axis = first ? 1 : x.shape.size() - 1;
  v.channels = x.shape[axis];
  for (std::size_t d = axis + 1; d < x.shape.size(); ++d) v.inner *= x.shape[d];
  return v;
}

std::vector<double> Doubles(const Tensor& t) {
  std::vector<double> v(static_cast<std::size_t>(t.count()));
  for (int64_t i = 0; i < t.count(); ++i) v[i] = t.At(i);
  return v;
}

// The batch-norm ops in float64 (ort_ops/reference/_batch_norm.py's formulas, without rounding or flushing).
std::vector<std::vector<double>> BatchNorm64(const Case& c) {
  const bool grad = c.op.find("Grad") != std::string::npos;
  const std::string format = c.String("data_format");
  const double eps = c.Float("epsilon");
  const bool training = c.Bool("is_training");
  const Tensor& x = c.inputs[grad ? 1 : 0];
  const BnView v = BnViewOf(x, format);
  const int64_t C = v.channels, R = C ? v.count / C : 0;
  const std::vector<double> xs = Doubles(x);
  std::vector<std::vector<double>> out;
  if (!grad) {
    const std::vector<double> scale = Doubles(c.inputs[1]), offset = Doubles(c.inputs[2]);
    const std::vector<double> mean_in = Doubles(c.inputs[3]), var_in = Doubles(c.inputs[4]);
    std::vector<double> mean(C, 0), var(C, 0), y(xs.size());
    if (training) {
      for (int64_t i = 0; i < v.count; ++i) mean[v.Channel(i)] += xs[i];
      for (double& m : mean) m /= static_cast<double>(R);
      for (int64_t i = 0; i < v.count; ++i) var[v.Channel(i)] += (xs[i] - mean[v.Channel(i)]) * (xs[i] - mean[v.Channel(i)]);
      for (double& s : var) s /= static_cast<double>(R);
    } else {
      mean = mean_in;
      var = var_in;
    }
    for (int64_t i = 0; i < v.count; ++i) {
      const int64_t ch = v.Channel(i);
      y[i] = (xs[i] - mean[ch]) * (scale[ch] / std::sqrt(var[ch] + eps)) + offset[ch];
    }
    out.push_back(y);
    if (!training) {
      out.insert(out.end(), {mean_in, var_in, mean_in, var_in});
    } else {
      const double f = c.Float("exponential_avg_factor");
      const double bessel = static_cast<double>(R) / static_cast<double>(std::max<int64_t>(R - 1, 1));
      std::vector<double> run_mean(C), run_var(C);
      for (int64_t ch = 0; ch < C; ++ch) {
        run_mean[ch] = f == 1.0 ? mean[ch] : (1 - f) * mean_in[ch] + f * mean[ch];
        run_var[ch] = f == 1.0 ? var[ch] * bessel : (1 - f) * var_in[ch] + f * bessel * var[ch];
      }
      out.insert(out.end(), {run_mean, run_var, mean, var});
    }
    if (c.op == "FusedBatchNormV3") out.push_back({0.0});
    return out;
  }
  const std::vector<double> dy = Doubles(c.inputs[0]), scale = Doubles(c.inputs[2]);
  const std::vector<double> mean = Doubles(c.inputs[3]), var = Doubles(c.inputs[4]);
  std::vector<double> c0(C), sum_dy(C, 0), sum_dyxc(C, 0), dx(xs.size());
  for (int64_t ch = 0; ch < C; ++ch) c0[ch] = 1 / std::sqrt(var[ch] + eps);
  for (int64_t i = 0; i < v.count; ++i) {
    const int64_t ch = v.Channel(i);
    sum_dy[ch] += dy[i];
    sum_dyxc[ch] += dy[i] * (xs[i] - mean[ch]);
  }
  std::vector<double> dscale(C);
  for (int64_t ch = 0; ch < C; ++ch) dscale[ch] = sum_dyxc[ch] * c0[ch];
  for (int64_t i = 0; i < v.count; ++i) {
    const int64_t ch = v.Channel(i);
    const double xc = xs[i] - mean[ch];
    if (training) {
      const double dy_mean = sum_dy[ch] / static_cast<double>(R), m = sum_dyxc[ch] / static_cast<double>(R);
      dx[i] = scale[ch] * c0[ch] * ((dy[i] - dy_mean) - xc * (c0[ch] * c0[ch] * m));
    } else {
      dx[i] = dy[i] * (c0[ch] * scale[ch]);
    }
  }
  out.insert(out.end(), {dx, dscale, sum_dy, {}, {}});
  return out;
}

// The largest |t - exact| over the elements where exact is finite (NaN when t is not finite there).
double ErrorFrom(const Tensor& t, const std::vector<double>& exact) {
  double err = 0;
  for (int64_t i = 0; i < t.count() && i < static_cast<int64_t>(exact.size()); ++i) {
    if (!std::isfinite(exact[i])) continue;
    const double e = std::fabs(t.At(i) - exact[i]);
    if (!(e <= err)) err = e;  // NaN stays
  }
  return err;
}

// ---------------------------------------------------------------------------------------------- depthwise

struct DwIndex {
  const tfops::depthwise::Geometry& g;
  int64_t In(int64_t b, int64_t y, int64_t x, int64_t c) const {
    return g.nchw ? ((b * g.in_depth + c) * g.in_rows + y) * g.in_cols + x
                  : ((b * g.in_rows + y) * g.in_cols + x) * g.in_depth + c;
  }
  int64_t Out(int64_t b, int64_t y, int64_t x, int64_t c) const {
    return g.nchw ? ((b * g.out_depth + c) * g.out_rows + y) * g.out_cols + x
                  : ((b * g.out_rows + y) * g.out_cols + x) * g.out_depth + c;
  }
  int64_t Filter(int64_t i, int64_t j, int64_t c, int64_t m) const {
    return ((i * g.filter_cols + j) * g.in_depth + c) * g.depth_multiplier + m;
  }
};

// Visits every (input element, filter element, output element) product of the op's geometry; padding taps
// are skipped (the library's semantics, docs/semantics.md section 4).
template <typename F>
void ForEachTap(const tfops::depthwise::Geometry& g, F&& f) {
  const DwIndex ix{g};
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t oy = 0; oy < g.out_rows; ++oy)
      for (int64_t ox = 0; ox < g.out_cols; ++ox)
        for (int64_t i = 0; i < g.filter_rows; ++i) {
          const int64_t iy = oy * g.stride - g.pad_top + i * g.dilation_rows;
          if (iy < 0 || iy >= g.in_rows) continue;
          for (int64_t j = 0; j < g.filter_cols; ++j) {
            const int64_t jx = ox * g.stride - g.pad_left + j * g.dilation_cols;
            if (jx < 0 || jx >= g.in_cols) continue;
            for (int64_t ch = 0; ch < g.in_depth; ++ch)
              for (int64_t m = 0; m < g.depth_multiplier; ++m)
                f(ix.In(b, iy, jx, ch), ix.Filter(i, j, ch, m), ix.Out(b, oy, ox, ch * g.depth_multiplier + m));
          }
        }
}

// The op in float64 on the case's float inputs, or on their absolute values.
std::vector<double> Depthwise64(const Case& c, const tfops::depthwise::Geometry& g, bool absolute) {
  auto load = [&](const Tensor& t) {
    std::vector<double> v = Doubles(t);
    if (absolute)
      for (double& e : v) e = std::fabs(e);
    return v;
  };
  if (c.op == "DepthwiseConv2dNative") {
    const std::vector<double> in = load(c.inputs[0]), f = load(c.inputs[1]);
    std::vector<double> out(static_cast<std::size_t>(g.OutputSize()), 0.0);
    ForEachTap(g, [&](int64_t a, int64_t w, int64_t o) { out[o] += in[a] * f[w]; });
    return out;
  }
  if (c.op == "DepthwiseConv2dNativeBackpropInput") {
    const std::vector<double> f = load(c.inputs[1]), dy = load(c.inputs[2]);
    std::vector<double> out(static_cast<std::size_t>(g.InputSize()), 0.0);
    ForEachTap(g, [&](int64_t a, int64_t w, int64_t o) { out[a] += dy[o] * f[w]; });
    return out;
  }
  const std::vector<double> in = load(c.inputs[0]), dy = load(c.inputs[2]);
  std::vector<double> out(static_cast<std::size_t>(g.FilterSize()), 0.0);
  ForEachTap(g, [&](int64_t a, int64_t w, int64_t o) { out[w] += in[a] * dy[o]; });
  return out;
}

int64_t SummedTerms(const Case& c, const tfops::depthwise::Geometry& g) {
  if (c.op == "DepthwiseConv2dNative") return g.filter_rows * g.filter_cols;
  if (c.op == "DepthwiseConv2dNativeBackpropInput") return g.filter_rows * g.filter_cols * g.depth_multiplier;
  return g.batch * g.out_rows * g.out_cols;
}

// test_depthwise.py assert_close against `want`, `ours` being the library's CPU result (for 16-bit types the
// bound holds the CPU kernel's own rounding error, |cpu - exact|).
std::string DepthwiseClose(const Case& c, const Tensor& want, const Tensor& got, const Tensor& cpu) {
  std::string why = SameKind(want, got);
  if (!why.empty()) return why;
  const int64_t n = want.count();
  for (int64_t i = 0; i < n; ++i) {
    const double w = want.At(i), g = got.At(i);
    if (std::isnan(w) != std::isnan(g)) return "NaN positions differ";
    if (std::isinf(w) != std::isinf(g) || (std::isinf(w) && w != g)) return "inf differ";
  }
  const tfops::depthwise::Geometry geo = DepthwiseGeometryOf(c);
  const int64_t terms = SummedTerms(c, geo);
  const bool low = want.dtype == DType::kF16 || want.dtype == DType::kBF16;
  const double u = want.dtype == DType::kF32   ? std::ldexp(1.0, -24)
                   : want.dtype == DType::kF64 ? std::ldexp(1.0, -53)
                   : want.dtype == DType::kF16 ? std::ldexp(1.0, -11)
                                               : std::ldexp(1.0, -8);
  const double tiny = want.dtype == DType::kF64 ? std::ldexp(1.0, -1022)
                      : want.dtype == DType::kF16 ? std::ldexp(1.0, -14)
                                                  : std::ldexp(1.0, -126);
  const std::vector<double> total = Depthwise64(c, geo, true);
  std::vector<double> exact;
  if (low) exact = Depthwise64(c, geo, false);
  for (int64_t i = 0; i < n; ++i) {
    const double w = want.At(i);
    if (!std::isfinite(w)) continue;
    double bound;
    if (!low) {
      bound = 2.0 * static_cast<double>(terms + 1) * u * total[i] + static_cast<double>(terms) * tiny;
    } else {
      const double ours = std::fabs(cpu.At(i) - exact[i]);
      const double accumulation = u * std::fabs(exact[i]) + 2.0 * static_cast<double>(terms + 1) * std::ldexp(1.0, -24) * total[i];
      const double stepwise = 5.0 * std::sqrt(static_cast<double>(terms)) * u * total[i];
      bound = ours + std::max(accumulation, stepwise) + static_cast<double>(terms) * tiny;
    }
    const double err = std::fabs(got.At(i) - w);
    if (!(err <= bound)) {
      return "error " + Num(err) + " over the bound " + Num(bound) + " at " + std::to_string(i) +
             " (n=" + std::to_string(terms) + ")";
    }
  }
  return "";
}

bool IsBatchNorm(const std::string& op) {
  return op.rfind("FusedBatchNorm", 0) == 0 && op != "FusedBatchNormClipFakeQuant";
}
bool IsDepthwise(const std::string& op) { return op.rfind("DepthwiseConv2dNative", 0) == 0; }

}  // namespace

bool BitExactFamily(const std::string& op) {
  return op.rfind("FakeQuant", 0) == 0 || op.rfind("QuantizeAndDequantize", 0) == 0 ||
         op == "FusedBatchNormClipFakeQuant";
}

std::string KeyPhrase(const std::string& message) {
  std::size_t cut = message.size();
  for (std::size_t i = 0; i < message.size(); ++i) {
    const bool digit = message[i] >= '0' && message[i] <= '9';
    const bool sign = (message[i] == '-' || message[i] == '+') && i + 1 < message.size() && message[i + 1] >= '0' &&
                      message[i + 1] <= '9';
    if (digit || sign) {
      cut = i;
      break;
    }
  }
  std::string s = message.substr(0, cut);
  const char* strip = " :,";
  const std::size_t a = s.find_first_not_of(strip);
  if (a == std::string::npos) return "";
  const std::size_t b = s.find_last_not_of(strip);
  return s.substr(a, b - a + 1);
}

std::string BitsMismatch(const Tensor& want, const Tensor& got, bool nan_payloads) {
  std::string why = SameKind(want, got);
  if (!why.empty()) return why;
  why = NanPositions(want, got);
  if (!why.empty()) return why;
  int64_t differ = 0, first = -1;
  for (int64_t i = 0; i < want.count(); ++i) {
    if (want.BitsAt(i) == got.BitsAt(i)) continue;
    if (!nan_payloads && NanAt(want, i)) continue;
    if (first < 0) first = i;
    ++differ;
  }
  if (!differ) return "";
  return std::to_string(differ) + " of " + std::to_string(want.count()) + " values differ, first at " +
         std::to_string(first) + ": " + Num(got.At(first)) + " (bits " + Hex(got.BitsAt(first)) + ") != " +
         Num(want.At(first)) + " (bits " + Hex(want.BitsAt(first)) + ")";
}

std::vector<std::string> Judge(const Case& c, const std::vector<Tensor>& want, const std::vector<Tensor>& got,
                               Against against, const std::vector<Tensor>* cpu, int* float64_passes) {
  std::vector<std::string> problems;
  if (want.size() != got.size()) {
    problems.push_back(std::to_string(got.size()) + " outputs, expected " + std::to_string(want.size()));
    return problems;
  }
  const std::string& op = c.op;
  const bool summed_grad = op == "FakeQuantWithMinMaxVarsGradient" || op == "FakeQuantWithMinMaxVarsPerChannelGradient";
  std::vector<std::vector<double>> bn64;  // computed on demand
  for (std::size_t k = 0; k < want.size(); ++k) {
    std::string why;
    if (against == Against::kGolden && want[k].dtype == DType::kBool) continue;  // TF leaves it undefined
    if (BitExactFamily(op)) {
      if (against == Against::kGolden && summed_grad && k > 0) {
        why = SumMismatch(want[k], got[k], c.inputs[0]);
      } else {
        why = BitsMismatch(want[k], got[k], true);
      }
    } else if (IsDepthwise(op)) {
      if (against == Against::kCpu && op != "DepthwiseConv2dNativeBackpropFilter") {
        why = BitsMismatch(want[k], got[k], false);
      } else {
        const Tensor& cpu_out = cpu ? (*cpu)[k] : (against == Against::kCpu ? want[k] : got[k]);
        why = DepthwiseClose(c, want[k], got[k], cpu_out);
      }
    } else if (IsBatchNorm(op)) {
      why = BatchNormClose(want[k], got[k]);
      if (!why.empty() && against == Against::kCpu && why.rfind("max abs error", 0) == 0) {
        // Outside the suite's tolerance of the CPU result: no further from the float64 math than twice the CPU
        // kernel's own error (or than the tolerance) also passes.
        if (bn64.empty()) bn64 = BatchNorm64(c);
        double err_cpu_tol = 0, bound = 0;
        BatchNormClose(want[k], want[k], &err_cpu_tol, &bound);
        const double err_gpu = ErrorFrom(got[k], bn64[k]), err_cpu = ErrorFrom(want[k], bn64[k]);
        if (err_gpu <= std::max(2 * err_cpu, bound)) {
          why.clear();
          if (float64_passes) ++*float64_passes;
        } else {
          why += "; from float64: " + Num(err_gpu) + ", the CPU kernels' " + Num(err_cpu);
        }
      }
    } else {
      throw std::runtime_error("Judge: no rule for op " + op);
    }
    if (!why.empty()) problems.push_back("output " + std::to_string(k) + ": " + why);
  }
  return problems;
}

}  // namespace gpu_check
