// Seeded random cases of every op, type and layout: the families of tests/test_cuda_kernels.py (their shapes,
// ranges and special values), drawn by a generator of our own so that the cases are the same on every machine
// and compiler, plus what only a direct run can afford: large cases whose grids pass one launch's reach
// (over 65,535 block rows or channels, over 2^24 elements and, for one op, 2^26), and the timing cases.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "check.h"
#include "kernels/depthwise.h"
#include "kernels/half.h"

namespace gpu_check {
namespace {

constexpr uint64_t kSeed = 20261123;

class Rng {
 public:
  explicit Rng(const std::string& key) {
    uint64_t h = 1469598103934665603ull ^ kSeed;  // FNV-1a over the key, mixed with the seed
    for (unsigned char ch : key) h = (h ^ ch) * 1099511628211ull;
    state_ = h;
  }
  uint64_t Next() {  // splitmix64
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  double Uniform(double a, double b) { return a + (b - a) * Uniform(); }
  int64_t Int(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(Next() % static_cast<uint64_t>(hi - lo)); }
  bool Chance(double p) { return Uniform() < p; }
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u = 0;
    while (u <= 1e-300) u = Uniform();
    const double v = Uniform(), r = std::sqrt(-2.0 * std::log(u)), a = 6.283185307179586 * v;
    spare_ = r * std::sin(a);
    has_spare_ = true;
    return r * std::cos(a);
  }
  template <typename T>
  const T& Pick(const std::vector<T>& v) {
    return v[static_cast<std::size_t>(Int(0, static_cast<int64_t>(v.size())))];
  }

 private:
  uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0;
};

void Store(Tensor& t, int64_t i, double v) {
  switch (t.dtype) {
    case DType::kF32:
      t.as<float>()[i] = static_cast<float>(v);
      break;
    case DType::kF64:
      t.as<double>()[i] = v;
      break;
    case DType::kF16:
      t.as<uint16_t>()[i] = tfops::FloatToHalf(static_cast<float>(v));
      break;
    case DType::kBF16:
      t.as<uint16_t>()[i] = tfops::FloatToBFloat16(static_cast<float>(v));
      break;
    case DType::kI32:
      t.as<int32_t>()[i] = static_cast<int32_t>(v);
      break;
    case DType::kBool:
      t.as<uint8_t>()[i] = v != 0;
      break;
  }
}

void StoreBits(Tensor& t, int64_t i, uint64_t bits) {
  switch (SizeOf(t.dtype)) {
    case 8:
      t.as<uint64_t>()[i] = bits;
      break;
    case 4:
      t.as<uint32_t>()[i] = static_cast<uint32_t>(bits);
      break;
    default:
      t.as<uint16_t>()[i] = static_cast<uint16_t>(bits);
  }
}

// A tensor of `shape` whose element i is f(i), converted to `dtype` (float -> 16-bit types round once).
template <typename F>
Tensor Fill(DType dtype, std::vector<int64_t> shape, F&& f) {
  Tensor t = Tensor::Make(dtype, std::move(shape));
  for (int64_t i = 0; i < t.count(); ++i) Store(t, i, f(i));
  return t;
}

Tensor Normal(Rng& r, DType t, std::vector<int64_t> shape, double scale = 1, double shift = 0) {
  return Fill(t, std::move(shape), [&](int64_t) {
    const double v = r.Normal() * scale + shift;
    return t == DType::kF64 ? v : static_cast<double>(static_cast<float>(v));
  });
}

Tensor Uniform(Rng& r, DType t, std::vector<int64_t> shape, double lo, double hi) {
  return Fill(t, std::move(shape), [&](int64_t) { return r.Uniform(lo, hi); });
}

Tensor Scalar(DType t, double v) { return Fill(t, {}, [&](int64_t) { return v; }); }

Tensor Ints32(const std::vector<int64_t>& values) {
  return Fill(DType::kI32, {static_cast<int64_t>(values.size())}, [&](int64_t i) { return double(values[i]); });
}

// Values over [lo, hi] widened by a quarter on both sides; a third of them on grid points or halfway between
// two (the rounding ties), for a grid of `levels` steps (test_cuda_kernels.py grid_values).
Tensor GridValues(Rng& r, DType t, std::vector<int64_t> shape, double lo, double hi, int64_t levels) {
  if (hi < lo) std::swap(lo, hi);
  const double width = hi > lo ? hi - lo : 1.0;
  const double step = width / static_cast<double>(std::max<int64_t>(levels, 1));
  return Fill(t, std::move(shape), [&](int64_t) {
    double x = r.Uniform(lo - width / 4, hi + width / 4);
    const double k = static_cast<double>(r.Int(0, std::max<int64_t>(levels, 1) + 1));
    const double pick = r.Uniform();
    if (pick < 0.2) x = lo + k * step;
    else if (pick < 0.35) x = lo + (k + 0.5) * step;
    return x;
  });
}

// NaN bit patterns of both signs with random payloads, quiet or signaling (quiet bit clear, payload nonzero).
uint64_t NanBits(Rng& r, DType t, bool signaling) {
  if (t == DType::kF64) {
    const uint64_t quiet = 1ull << 51;
    const uint64_t payload = 1 + r.Next() % (quiet - 1);
    return (0x7ffull << 52) | payload | (signaling ? 0 : quiet) | ((r.Next() & 1) << 63);
  }
  if (t == DType::kF32) {
    const uint64_t quiet = 1ull << 22;
    const uint64_t payload = 1 + r.Next() % (quiet - 1);
    return (0xffull << 23) | payload | (signaling ? 0 : quiet) | ((r.Next() & 1) << 31);
  }
  const bool half = t == DType::kF16;
  const uint64_t quiet = half ? 1u << 9 : 1u << 6;
  const uint64_t payload = 1 + r.Next() % (quiet - 1);
  return (half ? 0x7c00u : 0x7f80u) | payload | (signaling ? 0 : quiet) | ((r.Next() & 1) << 15);
}

uint64_t BitsOf(DType t, double v) {
  Tensor s = Scalar(t, v);
  return s.BitsAt(0);
}

// Values whose bits a kernel can get wrong: signed zeros, infinities, subnormals, extremes, the range's ends and
// their neighbours, NaNs with payloads (test_cuda_kernels.py specials). As bit patterns of `t` (float32/64).
std::vector<uint64_t> Specials(Rng& r, DType t, double lo = -1, double hi = 1, bool signaling = false) {
  std::vector<uint64_t> bits;
  if (t == DType::kF32) {
    const float l = static_cast<float>(lo), h = static_cast<float>(hi);
    for (float v : {0.0f, -0.0f, INFINITY, -INFINITY, 3.4028235e38f, -3.4028235e38f, 1.17549435e-38f,
                    -1.17549435e-38f, 1e-45f, -1e-45f, 7e-45f, l, h, std::nextafter(l, -INFINITY),
                    std::nextafter(l, INFINITY), std::nextafter(h, -INFINITY), std::nextafter(h, INFINITY)}) {
      uint32_t u;
      std::memcpy(&u, &v, 4);
      bits.push_back(u);
    }
  } else {
    for (double v : {0.0, -0.0, double(INFINITY), -double(INFINITY), 1.7976931348623157e308, -1.7976931348623157e308,
                     2.2250738585072014e-308, -2.2250738585072014e-308, 4.9e-324, -4.9e-324, 3.5e-323, lo, hi,
                     std::nextafter(lo, -INFINITY), std::nextafter(lo, INFINITY), std::nextafter(hi, -INFINITY),
                     std::nextafter(hi, INFINITY)}) {
      uint64_t u;
      std::memcpy(&u, &v, 8);
      bits.push_back(u);
    }
  }
  for (int i = 0; i < 8; ++i) bits.push_back(NanBits(r, t, false));
  if (signaling)
    for (int i = 0; i < 4; ++i) bits.push_back(NanBits(r, t, true));
  return bits;
}

// About `fraction` of the elements (at least one) replaced by draws from `pool` (bit patterns of t's dtype).
void Sprinkle(Rng& r, Tensor& t, const std::vector<uint64_t>& pool, double fraction) {
  const int64_t n = t.count();
  if (n == 0 || pool.empty()) return;
  const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(n) * fraction));
  for (int64_t j = 0; j < k; ++j) StoreBits(t, r.Int(0, n), r.Pick(pool));
}

AttrValue I(int64_t v) {
  AttrValue a;
  a.kind = 'i';
  a.i = v;
  return a;
}
AttrValue F(double v) {
  AttrValue a;
  a.kind = 'f';
  a.f = v;
  return a;
}
AttrValue S(const std::string& v) {
  AttrValue a;
  a.kind = 's';
  a.s = v;
  return a;
}
AttrValue L(std::vector<int64_t> v) {
  AttrValue a;
  a.kind = 'l';
  a.l = std::move(v);
  return a;
}

using Attrs = std::map<std::string, AttrValue>;

struct Sink {
  std::string op;
  std::vector<Case>* out;
  void Add(const std::string& source, const std::string& note, Attrs attrs, std::vector<Tensor> inputs) {
    Case c;
    c.op = op;
    c.source = source;
    c.index = static_cast<int>(out->size());
    c.note = note;
    c.attrs = std::move(attrs);
    c.inputs = std::move(inputs);
    out->push_back(std::move(c));
  }
};

std::string Range(double lo, double hi, int bits, bool narrow) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "[%g, %g] %d bits%s", lo, hi, bits, narrow ? " narrow" : "");
  return buf;
}

// ------------------------------------------------------------------------------------------------ FakeQuant

const int64_t kBeyondOneGrid = (int64_t{1} << 24) + 4099;  // past GridFor's 65,536 blocks of 256 (not x4)
const int64_t kBeyondVectorGrid = (int64_t{1} << 26) + 1027;  // past them with float4 accesses too

void FakeQuantCases(const std::string& op, bool large, Sink& sink) {
  Rng r(op);
  const bool grad = op.size() > 8 && op.compare(op.size() - 8, 8, "Gradient") == 0;
  const bool per_channel = op.find("PerChannel") != std::string::npos;
  const bool by_attr = op.rfind("FakeQuantWithMinMaxArgs", 0) == 0;
  auto make = [&](const std::string& source, const std::string& note, std::vector<int64_t> shape, double lo, double hi,
                  int bits, bool narrow, bool signaling = false, bool payload_grads = true, int64_t axis = -1) {
    const int64_t levels = (bits > 1 && bits < 20) ? (int64_t{1} << bits) - 1 - (narrow ? 1 : 0) : 255;
    Tensor x = GridValues(r, DType::kF32, shape, lo, hi, levels);
    Sprinkle(r, x, Specials(r, DType::kF32, lo, hi, signaling), 0.05);
    std::vector<Tensor> inputs;
    if (grad) {
      Tensor g = Normal(r, DType::kF32, shape);
      if (payload_grads) Sprinkle(r, g, Specials(r, DType::kF32, -1, 1, signaling), 0.01);
      inputs.push_back(std::move(g));
    }
    inputs.push_back(std::move(x));
    Attrs attrs = {{"num_bits", I(bits)}, {"narrow_range", I(narrow)}};
    if (by_attr) {
      attrs["min"] = F(lo);
      attrs["max"] = F(hi);
    } else if (per_channel) {
      const int64_t d = shape.empty() ? 1 : shape[axis == -1 ? shape.size() - 1 : axis];
      if (axis != -1) attrs["axis"] = I(axis);
      Tensor los = Fill(DType::kF32, {d}, [&](int64_t) { return lo + r.Uniform(-1, 1) * 0.5 * (hi - lo + 1); });
      Tensor his = Fill(DType::kF32, {d}, [&](int64_t i) {
        return los.At(i) + r.Uniform(0.05, 2.0) * (std::fabs(hi - lo) + 0.1);
      });
      if (d > 3) {  // an empty range, and a zero one
        his.as<float>()[1] = los.as<float>()[1];
        los.as<float>()[2] = his.as<float>()[2] = 0.0f;
      }
      inputs.push_back(std::move(los));
      inputs.push_back(std::move(his));
    } else {
      inputs.push_back(Scalar(DType::kF32, lo));
      inputs.push_back(Scalar(DType::kF32, hi));
    }
    sink.Add(source, note + ShapeText(shape) + " " + Range(lo, hi, bits, narrow), attrs, std::move(inputs));
  };
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {7}, {3, 5}, {2, 5, 6, 3}, {4, 3, 33}, {2, 0, 3}};
  struct R {
    double lo, hi;
    int bits;
    bool narrow;
  };
  const std::vector<R> ranges = {{-6, 6, 8, false},   {-1, 3, 2, false},  {0.25, 4, 8, true},
                                 {-10, -0.5, 16, false}, {-0.3, 0.7, 5, true}, {-2.5, 2.5, 4, true}};
  const std::vector<R> bad = {{0, 0, 8, false}, {1, -1, 8, false}, {-2, 2, 1, false}, {-2, 2, 17, false}};
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const R& g = ranges[i % ranges.size()];
    make("random", "shape ", shapes[i], g.lo, g.hi, g.bits, g.narrow);
  }
  for (const R& g : ranges) make("random", "", {5, 3, 17}, g.lo, g.hi, g.bits, g.narrow);
  for (const R& g : bad) make("random", "odd range ", {4, 6}, g.lo, g.hi, g.bits, g.narrow);
  make("random", "signaling NaN payloads ", {6, 40}, -6, 6, 8, false, true);
  make("random", "large ", {1031, 1029}, -3, 5, 8, false, false, false);
  if (grad) {
    make("random", "large ", {3, 1000003}, -3, 5, 8, false, false, false);
    make("random", "large, NaN payloads in the gradients ", {1031, 1029}, -3, 5, 8, false);
  }
  if (per_channel) {  // the domain's axis before the last dim, forward and gradient
    make("random", "axis 1 ", {2, 6, 5, 7}, -3, 5, 8, false, false, true, 1);
    make("random", "axis 0 ", {3, 40, 33}, -3, 5, 8, false, false, true, 0);
    make("random", "axis 1 ", {2, 16, 300, 9}, -3, 5, 8, false, false, true, 1);
  }
  if (!large) return;
  if (per_channel) {
    make("large", "70001 channels ", {2, 70001}, -3, 5, 8, false, false, false);
    make("large", "70001 channels, axis 1 ", {2, 70001, 3}, -3, 5, 8, false, false, false, 1);
    make("large", "2^24+ elements ", {kBeyondOneGrid / 13, 13}, -3, 5, 8, false, false, false);
  } else {
    make("large", "2^24+ elements ", {kBeyondOneGrid}, -3, 5, 8, false, false, false);
    if (op == "FakeQuantWithMinMaxArgs" || op == "FakeQuantWithMinMaxVarsGradient")
      make("large", "2^26+ elements ", {kBeyondVectorGrid}, -3, 5, 8, false, false, false);
  }
}

// ------------------------------------------------------------------------------------ QuantizeAndDequantize

void QdqNanOrderCase(const std::string& op, Rng& r, bool long_views, Sink& sink, int k) {
  const DType t = r.Chance(0.5) ? DType::kF32 : DType::kF64;
  const std::vector<std::vector<int64_t>> small = {{5}, {13}, {37}, {3, 13}, {2, 2, 5}, {4, 1, 9}, {5, 3}, {1, 2, 17}, {300, 3}};
  const std::vector<std::vector<int64_t>> longs = {{1, 2, 11500}, {2, 1, 6000}, {3000, 1, 5}, {6000, 2}};
  const std::vector<int64_t> shape = r.Pick(long_views ? longs : small);
  const int64_t axis = r.Int(-1, static_cast<int64_t>(shape.size()));
  const std::vector<double> pool = {NAN, -NAN, 0.0, -0.0, INFINITY, -INFINITY, 1.0, -1.0, 0.5, 2.0, 1e-40};
  const bool all_pool = r.Chance(0.5);
  Tensor x = Fill(t, shape, [&](int64_t) {
    if (all_pool || r.Chance(0.1)) return r.Pick(pool);
    return r.Normal();
  });
  const bool signed_input = r.Chance(0.5);
  const int64_t bits = r.Pick(std::vector<int64_t>{1, 2, 8});
  Attrs attrs = {{"signed_input", I(signed_input)}, {"narrow_range", I(r.Chance(0.3))}, {"axis", I(axis)}};
  const int64_t depth = axis == -1 ? 1 : shape[axis];
  const bool v3 = op == "QuantizeAndDequantizeV3";
  const bool given = v3 && r.Chance(0.5);
  Tensor mins, maxs;
  if (given && axis != -1) {
    mins = Fill(t, {depth}, [&](int64_t) { return r.Pick(std::vector<double>{NAN, -NAN, -1.0, 0.0}); });
    maxs = Fill(t, {depth}, [&](int64_t) { return r.Pick(std::vector<double>{NAN, -NAN, 1.0, 0.0}); });
  } else if (given) {
    mins = Scalar(t, 0);
    maxs = Scalar(t, r.Chance(0.5) ? 0.0 : 1.0);
  } else {
    mins = axis != -1 ? Fill(t, {depth}, [](int64_t) { return 0.0; }) : Scalar(t, 0);
    maxs = mins;
  }
  attrs["range_given"] = I(given);
  std::vector<Tensor> inputs = {std::move(x), std::move(mins), std::move(maxs)};
  if (v3) {
    inputs.push_back(Scalar(DType::kI32, static_cast<double>(bits)));
  } else {
    attrs["num_bits"] = I(bits);
    attrs["round_mode"] = S(r.Chance(0.5) ? "HALF_TO_EVEN" : "HALF_UP");
  }
  sink.Add("random", "NaN/zero order " + std::to_string(k) + ": " + Name(t) + " " + ShapeText(shape) + " axis " +
                         std::to_string(axis),
           attrs, std::move(inputs));
}

void QdqCases(const std::string& op, bool large, Sink& sink) {
  Rng r(op);
  const bool grad = op == "QuantizeAndDequantizeV4Grad";
  const bool v3 = op == "QuantizeAndDequantizeV3";
  if (!grad)
    for (int k = 0; k < 14; ++k) QdqNanOrderCase(op, r, k >= 11, sink, k);
  struct View {
    std::vector<int64_t> shape;
    int64_t axis;
  };
  std::vector<View> views = {{{}, -1}, {{0}, -1}, {{7}, -1}, {{4, 9}, 1}, {{3, 5, 8}, 0}, {{2, 3, 4, 6}, 3},
                             {{1000, 1001}, -1}, {{517, 3, 129}, 2}};
  auto make = [&](const std::string& source, DType t, const View& v, int k) {
    const bool given = (k % 2) || grad;
    const bool signed_input = k % 3 != 0;
    const int64_t bits = r.Pick(std::vector<int64_t>{1, 2, 4, 8, 16, t == DType::kF64 ? 40 : 23});
    const int64_t depth = v.axis == -1 ? 1 : v.shape[v.axis];
    std::vector<double> lo(depth), hi(depth);
    double lo_min = 0, hi_max = 0;
    for (int64_t c = 0; c < depth; ++c) {
      lo[c] = signed_input ? -r.Uniform(0.1, 4.0) : 0.0;
      hi[c] = r.Uniform(0.1, 4.0);
      lo_min = c ? std::min(lo_min, lo[c]) : lo[c];
      hi_max = c ? std::max(hi_max, hi[c]) : hi[c];
    }
    Tensor x = GridValues(r, t, v.shape, lo_min, hi_max, (int64_t{1} << std::min<int64_t>(bits, 12)) - 1);
    Sprinkle(r, x, Specials(r, t, lo_min, hi_max), 0.03);
    Tensor rmin = v.axis != -1 ? Fill(t, {depth}, [&](int64_t c) { return lo[c]; }) : Scalar(t, lo[0]);
    Tensor rmax = v.axis != -1 ? Fill(t, {depth}, [&](int64_t c) { return hi[c]; }) : Scalar(t, hi[0]);
    const std::string note = std::string(Name(t)) + " " + ShapeText(v.shape) + " axis " + std::to_string(v.axis) + ", " +
                             (given ? "given" : "data") + " range, " + std::to_string(bits) + " bits";
    if (grad) {
      Tensor g = Normal(r, t, v.shape);
      Sprinkle(r, g, Specials(r, t), 0.02);
      sink.Add(source, note, {{"axis", I(v.axis)}}, {std::move(g), std::move(x), std::move(rmin), std::move(rmax)});
      return;
    }
    Attrs attrs = {{"signed_input", I(signed_input)}, {"range_given", I(given)}, {"narrow_range", I(k % 4 == 1)},
                   {"axis", I(v.axis)}};
    if (v3) {
      sink.Add(source, note, attrs, {std::move(x), std::move(rmin), std::move(rmax), Scalar(DType::kI32, double(bits))});
    } else {
      attrs["num_bits"] = I(bits);
      attrs["round_mode"] = S(k % 2 ? "HALF_UP" : "HALF_TO_EVEN");
      sink.Add(source, note, attrs, {std::move(x), std::move(rmin), std::move(rmax)});
    }
  };
  for (DType t : {DType::kF32, DType::kF64})
    for (std::size_t k = 0; k < views.size(); ++k) make("random", t, views[k], static_cast<int>(k));
  // rejected: an inverted given range (per tensor), and for V4Grad shapes that do not match
  Tensor x = Normal(r, DType::kF32, {3, 4});
  if (grad) {
    sink.Add("random", "inverted range", {}, {x, x, Scalar(DType::kF32, 1), Scalar(DType::kF32, -1)});
    Tensor g2 = Normal(r, DType::kF32, {2, 4});
    sink.Add("random", "gradient of another shape", {}, {g2, x, Scalar(DType::kF32, -1), Scalar(DType::kF32, 1)});
    sink.Add("random", "axis past the rank", {{"axis", I(2)}},
             {x, x, Fill(DType::kF32, {4}, [](int64_t) { return 0.0; }), Fill(DType::kF32, {4}, [](int64_t) { return 1.0; })});
  } else if (v3) {
    sink.Add("random", "inverted given range", {{"range_given", I(1)}},
             {x, Scalar(DType::kF32, 1), Scalar(DType::kF32, -1), Scalar(DType::kI32, 8)});
  } else {
    sink.Add("random", "inverted given range", {{"range_given", I(1)}}, {x, Scalar(DType::kF32, 1), Scalar(DType::kF32, -1)});
  }
  if (!large) return;
  for (DType t : {DType::kF32, DType::kF64}) {
    make("large", t, {{2, 70001, 3}, 1}, 0);  // 70,001 channels: more than a grid's 65,535 block rows
    make("large", t, {{2, 70001, 3}, 1}, 1);
    make("large", t, {{kBeyondOneGrid}, -1}, 2);
    make("large", t, {{kBeyondOneGrid / 7, 7}, 1}, 3);
  }
}

// ----------------------------------------------------------------------------------------------- batch norm

std::vector<int64_t> ChannelsFirst(const std::vector<int64_t>& last) {  // N, spatial..., C -> N, C, spatial...
  std::vector<int64_t> s = {last[0], last.back()};
  s.insert(s.end(), last.begin() + 1, last.end() - 1);
  return s;
}

bool FirstFormat(const std::string& f) { return f == "NCHW" || f == "NCDHW"; }

// The batch mean and biased variance of x per channel, in float64, as float32 (what the forward op gives the
// gradient).
void BatchStats(const Tensor& x, const std::string& fmt, Tensor* mean, Tensor* var) {
  const std::size_t axis = FirstFormat(fmt) ? 1 : x.shape.size() - 1;
  const int64_t c = x.shape[axis];
  int64_t inner = 1;
  for (std::size_t d = axis + 1; d < x.shape.size(); ++d) inner *= x.shape[d];
  std::vector<double> s(c, 0), s2(c, 0);
  const int64_t n = x.count(), rows = c ? n / c : 0;
  for (int64_t i = 0; i < n; ++i) s[(i / inner) % c] += x.At(i);
  for (double& v : s) v /= static_cast<double>(rows);
  for (int64_t i = 0; i < n; ++i) {
    const double d = x.At(i) - s[(i / inner) % c];
    s2[(i / inner) % c] += d * d;
  }
  *mean = Fill(DType::kF32, {c}, [&](int64_t k) { return rows ? s[k] : NAN; });
  *var = Fill(DType::kF32, {c}, [&](int64_t k) { return rows ? s2[k] / static_cast<double>(rows) : NAN; });
}

void BatchNormCase(const std::string& op, Rng& r, Sink& sink, const std::string& source, DType t,
                   const std::string& fmt, std::vector<int64_t> last_shape, bool training, int k) {
  const bool grad = op.find("Grad") != std::string::npos;
  const std::vector<int64_t> shape = FirstFormat(fmt) ? ChannelsFirst(last_shape) : last_shape;
  const int64_t c = last_shape.back();
  Tensor x = Normal(r, DType::kF32, shape, 1.5, 0.3);
  if (k % 5 == 0 && x.count()) x.as<float>()[r.Int(0, x.count())] = std::vector<float>{NAN, INFINITY, -INFINITY}[k % 3];
  Tensor xt = Fill(t, shape, [&](int64_t i) { return x.At(i); });
  Tensor scale = Uniform(r, DType::kF32, {c}, 0.5, 1.5), offset = Normal(r, DType::kF32, {c});
  Tensor mean = Normal(r, DType::kF32, {c}, 0.3), var = Uniform(r, DType::kF32, {c}, 0.5, 2.0);
  const double eps = static_cast<float>(r.Pick(std::vector<double>{1e-4, 1e-3, 0.01}));
  std::string note = std::string(Name(t)) + " " + fmt + " " + ShapeText(shape) + (training ? " training" : " inference");
  Attrs attrs = {{"epsilon", F(eps)}, {"data_format", S(fmt)}, {"is_training", I(training)}};
  if (!grad) {
    const double factor = k % 3 ? 1.0 : 0.3;
    attrs["exponential_avg_factor"] = F(factor);
    sink.Add(source, note + ", avg factor " + std::to_string(factor).substr(0, 3), attrs,
             {std::move(xt), std::move(scale), std::move(offset), std::move(mean), std::move(var)});
    return;
  }
  if (training) BatchStats(xt, fmt, &mean, &var);  // the gradient gets the forward's batch statistics
  Tensor dy = Normal(r, t, shape);
  std::vector<Tensor> inputs = {std::move(dy), std::move(xt), std::move(scale), std::move(mean), std::move(var)};
  if (op == "FusedBatchNormGradV3") inputs.push_back(Scalar(DType::kF32, 0));
  sink.Add(source, note, attrs, std::move(inputs));
}

void BatchNormCases(const std::string& op, bool large, Sink& sink) {
  Rng r(op);
  const bool grad = op.find("Grad") != std::string::npos;
  const std::vector<std::vector<int64_t>> shapes4 = {{2, 5, 7, 6}, {1, 1, 1, 3}, {3, 4, 4, 17}, {0, 2, 2, 3}, {8, 32, 32, 16}, {2, 3, 3, 300}};
  const std::vector<std::vector<int64_t>> shapes5 = {{2, 3, 4, 5, 6}, {1, 2, 3, 4, 9}};
  int k = 0;
  for (const std::vector<DType>& types : InputTypeCombinations(op)) {
    const DType t = types[0];
    for (const std::string& fmt : LayoutChoices(op)) {
      const bool five = fmt == "NDHWC" || fmt == "NCDHW";
      std::vector<std::vector<int64_t>> shapes = five ? shapes5 : shapes4;
      if (t != DType::kF32) shapes.resize(std::min<std::size_t>(shapes.size(), 3));
      for (const auto& s : shapes)
        for (bool training : {true, false}) BatchNormCase(op, r, sink, "random", t, fmt, s, training, ++k);
    }
  }
  Tensor x = Normal(r, DType::kF32, {2, 3, 3, 4});
  Tensor c4 = Fill(DType::kF32, {4}, [](int64_t) { return 1.0; }), c3 = Fill(DType::kF32, {3}, [](int64_t) { return 1.0; });
  std::vector<Tensor> bad = grad ? std::vector<Tensor>{x, x, c3, c4, c4} : std::vector<Tensor>{x, c3, c4, c4, c4};
  if (op == "FusedBatchNormGradV3") bad.push_back(c4);
  sink.Add("random", "scale of 3 channels for 4", {}, bad);
  if (!large) return;
  const std::vector<std::string> formats = LayoutChoices(op);
  for (bool training : {true, false}) {
    BatchNormCase(op, r, sink, "large", DType::kF32, "NCHW", {1, 1, 3, 70001}, training, ++k);  // 70,001 planes
    BatchNormCase(op, r, sink, "large", DType::kF32, "NHWC", {3, 1, 1, 70001}, training, ++k);
    BatchNormCase(op, r, sink, "large", DType::kF32, "NHWC", {64, 56, 56, 32}, training, ++k);  // 200,704 rows
  }
  if (op != "FusedBatchNorm" && op != "FusedBatchNormGrad")
    BatchNormCase(op, r, sink, "large", DType::kF16, "NCHW", {16, 56, 56, 32}, true, ++k);
}

// ------------------------------------------------------------------------------------------------ depthwise

struct DwConfig {
  int64_t n, h, w, c, kh, kw, m, stride, dil_h, dil_w;
  std::string padding;
  std::vector<int64_t> explicit_pads;  // top, bottom, left, right
};

void DepthwiseCase(const std::string& op, Rng& r, Sink& sink, const std::string& source, DType t,
                   const std::string& fmt, const DwConfig& d, bool specials) {
  const bool nchw = fmt == "NCHW";
  auto attr4 = [&](int64_t a, int64_t b) { return nchw ? std::vector<int64_t>{1, 1, a, b} : std::vector<int64_t>{1, a, b, 1}; };
  std::vector<int64_t> pads;
  if (!d.explicit_pads.empty()) {
    const auto& e = d.explicit_pads;
    pads = nchw ? std::vector<int64_t>{0, 0, 0, 0, e[0], e[1], e[2], e[3]} : std::vector<int64_t>{0, 0, e[0], e[1], e[2], e[3], 0, 0};
  }
  Attrs attrs = {{"strides", L(attr4(d.stride, d.stride))}, {"padding", S(d.padding)}, {"explicit_paddings", L(pads)},
                 {"data_format", S(fmt)}, {"dilations", L(attr4(d.dil_h, d.dil_w))}};
  const std::vector<int64_t> xshape = nchw ? std::vector<int64_t>{d.n, d.c, d.h, d.w} : std::vector<int64_t>{d.n, d.h, d.w, d.c};
  const std::vector<int64_t> fshape = {d.kh, d.kw, d.c, d.m};
  Tensor x = Normal(r, DType::kF64, xshape);
  if (specials) {
    std::vector<uint64_t> pool;
    for (double v : {double(NAN), double(INFINITY), -double(INFINITY), 0.0, -0.0}) pool.push_back(BitsOf(DType::kF64, v));
    Sprinkle(r, x, pool, 0.02);
  }
  Tensor xt = Fill(t, xshape, [&](int64_t i) { return x.At(i); });
  Tensor filt = Normal(r, t, fshape);
  tfops::depthwise::Attrs a;
  a.strides = attrs["strides"].l;
  a.padding = d.padding;
  a.explicit_paddings = pads;
  a.data_format = fmt;
  a.dilations = attrs["dilations"].l;
  tfops::depthwise::Geometry g;
  tfops::depthwise::ForwardGeometry(a, xshape, fshape, &g);
  Tensor dy = Normal(r, t, g.OutputShape());
  char buf[160];
  std::snprintf(buf, sizeof buf, " filter %lldx%lldx%lldx%lld stride %lld dil (%lld,%lld) %s", (long long)d.kh,
                (long long)d.kw, (long long)d.c, (long long)d.m, (long long)d.stride, (long long)d.dil_h,
                (long long)d.dil_w, d.padding.c_str());
  const std::string note = std::string(Name(t)) + " " + fmt + " x" + ShapeText(xshape) + buf;
  if (op == "DepthwiseConv2dNative") {
    sink.Add(source, note, attrs, {std::move(xt), std::move(filt)});
  } else if (op == "DepthwiseConv2dNativeBackpropInput") {
    sink.Add(source, note, attrs, {Ints32(xshape), std::move(filt), std::move(dy)});
  } else {
    sink.Add(source, note, attrs, {std::move(xt), Ints32(fshape), std::move(dy)});
  }
}

void DepthwiseCases(const std::string& op, bool large, Sink& sink) {
  Rng r(op);
  const std::vector<DwConfig> configs = {
      {2, 9, 8, 3, 3, 3, 1, 1, 1, 1, "SAME", {}},        {1, 11, 10, 4, 3, 3, 2, 2, 1, 1, "SAME", {}},
      {2, 8, 9, 5, 5, 3, 3, 1, 2, 1, "VALID", {}},       {1, 7, 7, 2, 3, 2, 1, 3, 1, 2, "EXPLICIT", {2, 1, 0, 3}},
      {3, 6, 5, 8, 1, 1, 1, 1, 1, 1, "VALID", {}},       {0, 5, 5, 3, 3, 3, 1, 1, 1, 1, "SAME", {}},
      {1, 2, 2, 3, 3, 3, 1, 1, 1, 1, "VALID", {}},       {2, 13, 11, 37, 3, 3, 1, 1, 1, 1, "SAME", {}},
      {1, 9, 17, 48, 3, 3, 1, 2, 1, 1, "SAME", {}},
  };
  const DwConfig large_config = {4, 28, 28, 32, 3, 3, 1, 1, 1, 1, "SAME", {}};
  for (DType t : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16})
    for (const std::string fmt : {"NHWC", "NCHW"}) {
      for (std::size_t j = 0; j < configs.size(); ++j) DepthwiseCase(op, r, sink, "random", t, fmt, configs[j], j == 1);
      if (t == DType::kF32 || t == DType::kF16) DepthwiseCase(op, r, sink, "random", t, fmt, large_config, false);
    }
  // rejected: a filter for 2 channels on an input of 3
  Tensor x = Normal(r, DType::kF32, {1, 5, 5, 3}), filt = Normal(r, DType::kF32, {3, 3, 2, 1});
  Tensor dy = Normal(r, DType::kF32, {1, 5, 5, 3});
  Attrs same = {{"strides", L({1, 1, 1, 1})}, {"padding", S("SAME")}};
  if (op == "DepthwiseConv2dNative") sink.Add("random", "filter depth 2 for 3 channels", same, {x, filt});
  else if (op == "DepthwiseConv2dNativeBackpropInput")
    sink.Add("random", "filter depth 2 for 3 channels", same, {Ints32({1, 5, 5, 3}), filt, dy});
  else sink.Add("random", "filter depth 2 for 3 channels", same, {x, Ints32({3, 3, 2, 1}), dy});
  if (!large) return;
  const DwConfig tall = {1, 70000, 2, 32, 3, 3, 1, 1, 1, 1, "SAME", {}};  // 70,000 output rows: past 65,535
  for (DType t : {DType::kF32, DType::kF16}) DepthwiseCase(op, r, sink, "large", t, "NHWC", tall, false);
  DepthwiseCase(op, r, sink, "large", DType::kF32, "NCHW", tall, false);
  DepthwiseCase(op, r, sink, "large", DType::kF32, "NHWC", {8, 56, 56, 144, 3, 3, 2, 2, 1, 1, "SAME", {}}, false);
}

// -------------------------------------------------------------------------------------------------- fused

void FusedCases(const std::string& op, bool large, Sink& sink) {
  Rng r(op);
  struct Q {
    const char* quantizer;
    double lo, hi;
    int bits;
    bool narrow;
  };
  const std::vector<Q> ranges = {{"FakeQuantWithMinMaxVars", 0, 6, 8, false}, {"FakeQuantWithMinMaxArgs", -6, 6, 8, false},
                                 {"FakeQuantWithMinMaxVars", -1, 3, 4, true}, {"FakeQuantWithMinMaxArgs", -0.5, 2.5, 16, false},
                                 {"FakeQuantWithMinMaxVars", -2.5, 2.5, 5, true}};
  const std::vector<std::pair<double, double>> clips = {{0, 6}, {-INFINITY, INFINITY}, {-1, 2}};
  enum Values { kGrid, kNormalSpecials, kNanGrid };
  auto make = [&](const std::string& source, const std::string& what, std::vector<int64_t> last, const std::string& fmt,
                  const Q& q, std::pair<double, double> clip, bool nan_stats, Values values) {
    const std::vector<int64_t> shape = FirstFormat(fmt) ? ChannelsFirst(last) : last;
    const int64_t c = last.back();
    Tensor x;
    if (values == kGrid) {
      x = GridValues(r, DType::kF32, shape, q.lo - 2, q.hi + 2, (int64_t{1} << q.bits) - 1 - (q.narrow ? 1 : 0));
      Sprinkle(r, x, Specials(r, DType::kF32, q.lo, q.hi, true), 0.05);
    } else if (values == kNormalSpecials) {
      x = Normal(r, DType::kF32, shape);
      Sprinkle(r, x, Specials(r, DType::kF32), 0.1);
    } else {
      x = GridValues(r, DType::kF32, shape, -3, 8, 255);
      Sprinkle(r, x, Specials(r, DType::kF32, -3, 8, true), 0.1);
    }
    Tensor scale = Uniform(r, DType::kF32, {c}, 0.5, 1.5), offset = Normal(r, DType::kF32, {c});
    Tensor mean = Normal(r, DType::kF32, {c}, 0.3), var = Uniform(r, DType::kF32, {c}, 0.5, 2.0);
    if (nan_stats && c > 2) {  // a NaN k (negative variance; a NaN scale) and a NaN offset meet NaN inputs
      var.as<float>()[0] = -1.0f;
      StoreBits(scale, 1, NanBits(r, DType::kF32, false));
      StoreBits(offset, 2, NanBits(r, DType::kF32, false));
    }
    Attrs attrs = {{"epsilon", F(static_cast<float>(0.001))}, {"data_format", S(fmt)}, {"clip_min", F(clip.first)},
                   {"clip_max", F(clip.second)}, {"fake_quant", S(q.quantizer)}, {"num_bits", I(q.bits)},
                   {"narrow_range", I(q.narrow)}};
    char buf[96];
    std::snprintf(buf, sizeof buf, " clip [%g, %g]", clip.first, clip.second);
    sink.Add(source, what + ": " + fmt + " " + ShapeText(shape) + " " + q.quantizer + " " + Range(q.lo, q.hi, q.bits, q.narrow) + buf,
             attrs, {std::move(x), std::move(scale), std::move(offset), std::move(mean), std::move(var),
                     Scalar(DType::kF32, q.lo), Scalar(DType::kF32, q.hi)});
  };
  const std::vector<std::pair<std::vector<int64_t>, std::string>> shapes = {
      {{2, 5, 7, 6}, "NHWC"},  {{1, 1, 1, 3}, "NHWC"},     {{3, 4, 4, 17}, "NHWC"}, {{0, 2, 2, 3}, "NHWC"},
      {{8, 32, 32, 16}, "NHWC"}, {{2, 3, 3, 300}, "NHWC"}, {{2, 5, 7, 6}, "NCHW"},  {{2, 7, 9, 19}, "NCHW"},
      {{2, 8, 8, 4}, "NCHW"},  {{1, 100, 100, 3}, "NCHW"}, {{4, 28, 28, 32}, "NCHW"}, {{2, 3, 4, 5, 6}, "NDHWC"},
      {{1, 2, 3, 4, 9}, "NCDHW"}};
  for (std::size_t i = 0; i < shapes.size(); ++i)
    for (std::size_t j = 0; j < 2; ++j)
      make("random", "layout", shapes[i].first, shapes[i].second, ranges[(2 * i + j) % ranges.size()],
           clips[(i + j) % clips.size()], false, kGrid);
  for (const std::string fmt : {"NHWC", "NCHW"}) {
    make("random", "zero range (Vars: zeros)", {2, 5, 7, 6}, fmt, {"FakeQuantWithMinMaxVars", 0, 0, 8, false}, {0, 6}, false,
         kNormalSpecials);
    make("random", "NaN grid (infinite min)", {2, 5, 7, 6}, fmt, {"FakeQuantWithMinMaxVars", -INFINITY, 6, 8, false},
         {-INFINITY, INFINITY}, false, kNanGrid);
    for (const char* quantizer : {"FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxArgs"})
      make("random", "NaN statistics", {3, 4, 5, 8}, fmt, {quantizer, -1, 5, 8, false}, {0, 6}, true, kGrid);
  }
  // rejected: statistics for 3 channels of 4, an Args range with min >= max, clip bounds out of order
  Tensor x = Normal(r, DType::kF32, {2, 3, 3, 4});
  Tensor c3 = Fill(DType::kF32, {3}, [](int64_t) { return 1.0; }), c4 = Fill(DType::kF32, {4}, [](int64_t) { return 1.0; });
  Tensor lo = Scalar(DType::kF32, -1), hi = Scalar(DType::kF32, 1);
  Attrs base = {{"data_format", S("NHWC")}, {"fake_quant", S("FakeQuantWithMinMaxVars")}};
  sink.Add("random", "scale of 3 channels for 4", base, {x, c3, c4, c4, c4, lo, hi});
  Attrs args = base;
  args["fake_quant"] = S("FakeQuantWithMinMaxArgs");
  sink.Add("random", "Args range min >= max", args, {x, c4, c4, c4, c4, hi, lo});
  Attrs clip = base;
  clip["clip_min"] = F(6.0);
  clip["clip_max"] = F(0.0);
  sink.Add("random", "clip_min > clip_max", clip, {x, c4, c4, c4, c4, lo, hi});
  if (!large) return;
  make("large", "70001 planes", {1, 1, 3, 70001}, "NCHW", ranges[0], clips[0], false, kGrid);
  make("large", "70001 channels", {3, 1, 1, 70001}, "NHWC", ranges[1], clips[1], false, kGrid);
  make("large", "2^24+ elements", {4, 1025, 1025, 4}, "NHWC", ranges[2], clips[0], false, kGrid);
  make("large", "2^24+ elements", {4, 1025, 1025, 4}, "NCHW", ranges[3], clips[2], false, kGrid);
}

}  // namespace

std::vector<Case> RandomCases(const std::string& op, bool large) {
  std::vector<Case> cases;
  Sink sink{op, &cases};
  if (op.rfind("FakeQuant", 0) == 0) FakeQuantCases(op, large, sink);
  else if (op.rfind("QuantizeAndDequantize", 0) == 0) QdqCases(op, large, sink);
  else if (op == "FusedBatchNormClipFakeQuant") FusedCases(op, large, sink);
  else if (op.rfind("FusedBatchNorm", 0) == 0) BatchNormCases(op, large, sink);
  else if (op.rfind("DepthwiseConv2dNative", 0) == 0) DepthwiseCases(op, large, sink);
  else throw std::runtime_error("RandomCases: unknown op " + op);
  return cases;
}

// One case per type combination of `op` on NHWC 16x56x56x128 (benchmarks/bench_ops.py's main shape and cases):
// what the timings run.
std::vector<Case> TimingCases(const std::string& op) {
  std::vector<Case> cases;
  Sink sink{op, &cases};
  Rng r("timing/" + op);
  const std::vector<int64_t> shape = {16, 56, 56, 128};
  const int64_t c = 128;
  for (const std::vector<DType>& types : InputTypeCombinations(op)) {
    const DType t = op.rfind("DepthwiseConv2dNativeBackpropInput", 0) == 0 ? types[1] : types[0];
    const std::string tn = Name(t);
    if (op.rfind("FakeQuant", 0) == 0) {
      const bool grad = op.find("Gradient") != std::string::npos;
      Tensor x = Normal(r, DType::kF32, shape, 3.0);
      std::vector<Tensor> in;
      if (grad) in.push_back(Normal(r, DType::kF32, shape));
      in.push_back(std::move(x));
      Attrs attrs;
      if (op.find("PerChannel") != std::string::npos) {
        in.push_back(Fill(DType::kF32, {c}, [&](int64_t k) { return -6.0 + 5.0 * double(k) / double(c - 1); }));
        in.push_back(Fill(DType::kF32, {c}, [&](int64_t k) { return 1.0 + 5.0 * double(k) / double(c - 1); }));
        attrs["narrow_range"] = I(1);
      } else if (op.rfind("FakeQuantWithMinMaxArgs", 0) == 0) {
        attrs = {{"min", F(-6)}, {"max", F(6)}};
      } else {
        in.push_back(Scalar(DType::kF32, -6));
        in.push_back(Scalar(DType::kF32, 6));
      }
      sink.Add("timing", "16x56x56x128 8 bits", attrs, std::move(in));
    } else if (op.rfind("QuantizeAndDequantize", 0) == 0) {
      Tensor x = Normal(r, t, shape, 3.0);
      if (op == "QuantizeAndDequantizeV4Grad") {
        sink.Add("timing", "16x56x56x128 " + tn + " per tensor", {}, {Normal(r, t, shape), std::move(x), Scalar(t, -6), Scalar(t, 6)});
      } else if (op == "QuantizeAndDequantizeV3") {
        sink.Add("timing", "16x56x56x128 " + tn + " given range, 8 bits", {}, {std::move(x), Scalar(t, -6), Scalar(t, 6), Scalar(DType::kI32, 8)});
      } else if (op == "QuantizeAndDequantizeV2") {
        sink.Add("timing", "16x56x56x128 " + tn + " data range, half-to-even", {{"range_given", I(0)}},
                 {std::move(x), Scalar(t, -6), Scalar(t, 6)});
      } else {
        Tensor z = Fill(t, {c}, [](int64_t) { return 0.0; });
        sink.Add("timing", "16x56x56x128 " + tn + " per axis 3, data range, half-up",
                 {{"range_given", I(0)}, {"axis", I(3)}, {"round_mode", S("HALF_UP")}}, {std::move(x), z, z});
      }
    } else if (op == "FusedBatchNormClipFakeQuant") {
      Tensor x = Normal(r, DType::kF32, shape, 3.0);
      Tensor mean, var;
      BatchStats(x, "NHWC", &mean, &var);
      sink.Add("timing", "16x56x56x128 inference, ReLU6, 8 bits", {{"epsilon", F(0.001f)}, {"clip_min", F(0)}, {"clip_max", F(6)}},
               {std::move(x), Uniform(r, DType::kF32, {c}, 0.5, 1.5), Normal(r, DType::kF32, {c}), mean, var,
                Scalar(DType::kF32, -6), Scalar(DType::kF32, 6)});
    } else if (op.rfind("FusedBatchNorm", 0) == 0) {
      const bool grad = op.find("Grad") != std::string::npos;
      const bool training = op.back() != '2';  // as bench_ops.py: V2 inference, the others training
      Tensor x = Fill(t, shape, [&](int64_t) { return static_cast<double>(static_cast<float>(r.Normal() * 3.0)); });
      Tensor mean, var;
      BatchStats(x, "NHWC", &mean, &var);
      Attrs attrs = {{"is_training", I(training)}, {"epsilon", F(0.001f)}};
      std::vector<Tensor> in;
      if (grad) in.push_back(Normal(r, t, shape));
      in.push_back(std::move(x));
      in.push_back(Uniform(r, DType::kF32, {c}, 0.5, 1.5));
      if (!grad) in.push_back(Normal(r, DType::kF32, {c}));
      in.push_back(mean);
      in.push_back(var);
      if (op == "FusedBatchNormGradV3") in.push_back(Scalar(DType::kF32, 0));
      sink.Add("timing", "16x56x56x128 " + tn + (training ? " training" : " inference"), attrs, std::move(in));
    } else {
      DepthwiseCase(op, r, sink, "timing", t, "NHWC", {16, 56, 56, 128, 3, 3, 1, 1, 1, 1, "SAME", {}}, false);
      if (t == DType::kF32) {
        DepthwiseCase(op, r, sink, "timing", t, "NHWC", {16, 56, 56, 128, 3, 3, 2, 2, 1, 1, "SAME", {}}, false);
        DepthwiseCase(op, r, sink, "timing", t, "NCHW", {16, 56, 56, 128, 3, 3, 1, 1, 1, 1, "SAME", {}}, false);
      }
    }
  }
  return cases;
}

}  // namespace gpu_check
