// One Prepare per op: what the op's ORT adapter (cpp_ops/src/ort/<family>_ops.cc) does before it dispatches,
// in the same order (attribute reads and checks of its constructor, then those of its Compute, which runs in
// TF's denormal mode), and the two calls it dispatches to: the CPU kernel and the CUDA launcher, with the
// host-side values (the adapter's kHostInputs) read from the case. Keep it in step with the adapters.
#include <algorithm>
#include <type_traits>
#include <stdexcept>
#include <string>

#include "check.h"
#include "kernels/batch_norm.h"
#include "kernels/depthwise.h"
#include "kernels/fake_quant.h"
#include "kernels/fused.h"
#include "kernels/half.h"
#include "kernels/op_error.h"
#include "kernels/quantize_dequantize.h"
#include "kernels/simd.h"
#if GPU_CHECK_WITH_CUDA
#include "kernels/cuda/batch_norm.h"
#include "kernels/cuda/depthwise.h"
#include "kernels/cuda/fake_quant.h"
#include "kernels/cuda/fused.h"
#include "kernels/cuda/quantize_dequantize.h"
#endif

namespace gpu_check {
namespace {

using tfops::Parallel;
using tfops::CudaLaunch;

template <typename T>
const T* In(const Pointers& in, std::size_t i) {
  return static_cast<const T*>(in[i]);
}
template <typename T>
T* Out(const MutablePointers& out, std::size_t i) {
  return static_cast<T*>(out[i]);
}

// The CUDA half of a Prepared, only in a build with CUDA (a CPU-only build references no launcher).
#if GPU_CHECK_WITH_CUDA
#define SET_GPU(p, ...) \
  (p).gpu = [=](const Pointers& in, const MutablePointers& out, const CudaLaunch& launch) { __VA_ARGS__; }
#else
#define SET_GPU(p, ...) (void)0
#endif
#define SET_CPU(p, ...) \
  (p).cpu = [=](const Pointers& in, const MutablePointers& out, const Parallel& par) { __VA_ARGS__; }

template <typename T>
constexpr DType DTypeOf();
template <>
constexpr DType DTypeOf<float>() { return DType::kF32; }
template <>
constexpr DType DTypeOf<double>() { return DType::kF64; }
template <>
constexpr DType DTypeOf<tfops::Half>() { return DType::kF16; }
template <>
constexpr DType DTypeOf<tfops::BFloat16>() { return DType::kBF16; }

Prepared Outputs(std::vector<Tensor> outputs, std::size_t inputs, std::vector<std::size_t> host = {}) {
  Prepared p;
  p.outputs = std::move(outputs);
  p.host_input.assign(inputs, false);
  for (std::size_t i : host) p.host_input[i] = true;
  return p;
}

// ---------------------------------------------------------------------------------------------- FakeQuant

tfops::FakeQuantBits ReadBits(const Case& c) {
  const int64_t num_bits = c.Int("num_bits");
  tfops::CheckFakeQuantNumBits(num_bits);
  return tfops::FakeQuantBitsOf(num_bits, c.Bool("narrow_range"));
}

tfops::FakeQuantGrid ArgsGrid(const Case& c) {
  const tfops::FakeQuantBits bits = ReadBits(c);
  const float min = c.Float("min");
  return tfops::CheckArgsRange(min, c.Float("max"), bits);
}

Prepared FakeQuantArgs(const Case& c) {
  const tfops::FakeQuantGrid grid = ArgsGrid(c);
  tfops::ScopedFlushDenormals flush;
  const Tensor& x = c.inputs[0];
  const int64_t n = x.count();
  Prepared p = Outputs({Tensor::Make(DType::kF32, x.shape)}, 1);
  SET_CPU(p, tfops::FakeQuantForward(In<float>(in, 0), Out<float>(out, 0), n, grid, false, par));
  SET_GPU(p, tfops::cuda::FakeQuantForward(In<float>(in, 0), Out<float>(out, 0), n, grid, false, launch));
  return p;
}

Prepared FakeQuantArgsGradient(const Case& c) {
  const tfops::FakeQuantGrid grid = ArgsGrid(c);
  tfops::ScopedFlushDenormals flush;
  const Tensor &g = c.inputs[0], &x = c.inputs[1];
  tfops::CheckArgsGradientShapes(g.shape, x.shape);
  const int64_t n = x.count();
  Prepared p = Outputs({Tensor::Make(DType::kF32, x.shape)}, 2);
  SET_CPU(p, tfops::FakeQuantGradientInput(In<float>(in, 0), In<float>(in, 1), Out<float>(out, 0), n, grid, par));
  SET_GPU(p, tfops::cuda::FakeQuantGradientInput(In<float>(in, 0), In<float>(in, 1), Out<float>(out, 0), n, grid,
                                                  launch));
  return p;
}

Prepared FakeQuantVars(const Case& c) {
  const tfops::FakeQuantBits bits = ReadBits(c);
  tfops::ScopedFlushDenormals flush;
  const Tensor &x = c.inputs[0], &min = c.inputs[1], &max = c.inputs[2];
  tfops::CheckScalarRange(min.shape, "min");
  tfops::CheckScalarRange(max.shape, "max");
  const float lo = min.as<float>()[0], hi = max.as<float>()[0];
  const int64_t n = x.count();
  const int qmin = bits.quant_min, qmax = bits.quant_max;
  Prepared p = Outputs({Tensor::Make(DType::kF32, x.shape)}, 3, {1, 2});
  SET_CPU(p, tfops::FakeQuantVarsForward(In<float>(in, 0), Out<float>(out, 0), n, lo, hi, qmin, qmax, par));
  SET_GPU(p, tfops::cuda::FakeQuantVarsForward(In<float>(in, 0), Out<float>(out, 0), n, lo, hi, qmin, qmax, launch));
  return p;
}

Prepared FakeQuantVarsGradient(const Case& c) {
  const tfops::FakeQuantBits bits = ReadBits(c);
  tfops::ScopedFlushDenormals flush;
  const Tensor &g = c.inputs[0], &x = c.inputs[1], &min = c.inputs[2], &max = c.inputs[3];
  tfops::CheckGradientSameSize(g.shape, x.shape);
  tfops::CheckScalarRange(min.shape, "min");
  tfops::CheckScalarRange(max.shape, "max");
  const float lo = min.as<float>()[0], hi = max.as<float>()[0];
  const int64_t n = x.count();
  const int qmin = bits.quant_min, qmax = bits.quant_max;
  Prepared p = Outputs({Tensor::Make(DType::kF32, x.shape), Tensor::Make(DType::kF32, {}),
                        Tensor::Make(DType::kF32, {})},
                       4, {2, 3});
  SET_CPU(p, tfops::FakeQuantVarsGradient(In<float>(in, 0), In<float>(in, 1), n, lo, hi, qmin, qmax,
                                          Out<float>(out, 0), Out<float>(out, 1), Out<float>(out, 2), par));
  SET_GPU(p, tfops::cuda::FakeQuantVarsGradient(In<float>(in, 0), In<float>(in, 1), n, lo, hi, qmin, qmax,
                                                Out<float>(out, 0), Out<float>(out, 1), Out<float>(out, 2), launch));
  return p;
}

Prepared FakeQuantPerChannel(const Case& c) {
  const tfops::FakeQuantBits bits = ReadBits(c);
  const int64_t axis = c.Int("axis");
  tfops::ScopedFlushDenormals flush;
  const Tensor &x = c.inputs[0], &min = c.inputs[1], &max = c.inputs[2];
  const tfops::FakeQuantChannels v = tfops::CheckChannelRanges(x.shape, min.shape, max.shape, axis);
  const int qmin = bits.quant_min, qmax = bits.quant_max;
  Prepared p = Outputs({Tensor::Make(DType::kF32, x.shape)}, 3);
  SET_CPU(p, tfops::FakeQuantPerChannelForward(In<float>(in, 0), Out<float>(out, 0), v.outer, v.depth, v.inner,
                                               In<float>(in, 1), In<float>(in, 2), qmin, qmax, par));
  SET_GPU(p, tfops::cuda::FakeQuantPerChannelForward(In<float>(in, 0), Out<float>(out, 0), v.outer, v.depth, v.inner,
                                                     In<float>(in, 1), In<float>(in, 2), qmin, qmax, launch));
  return p;
}

Prepared FakeQuantPerChannelGradient(const Case& c) {
  const tfops::FakeQuantBits bits = ReadBits(c);
  const int64_t axis = c.Int("axis");
  tfops::ScopedFlushDenormals flush;
  const Tensor &g = c.inputs[0], &x = c.inputs[1], &min = c.inputs[2], &max = c.inputs[3];
  tfops::CheckGradientSameSize(g.shape, x.shape);
  const tfops::FakeQuantChannels v = tfops::CheckChannelRanges(x.shape, min.shape, max.shape, axis);
  const int qmin = bits.quant_min, qmax = bits.quant_max;
  Prepared p = Outputs({Tensor::Make(DType::kF32, x.shape), Tensor::Make(DType::kF32, {v.depth}),
                        Tensor::Make(DType::kF32, {v.depth})},
                       4);
  SET_CPU(p, tfops::FakeQuantPerChannelGradient(In<float>(in, 0), In<float>(in, 1), v.outer, v.depth, v.inner,
                                                In<float>(in, 2), In<float>(in, 3), qmin, qmax, Out<float>(out, 0),
                                                Out<float>(out, 1), Out<float>(out, 2), par));
  SET_GPU(p, tfops::cuda::FakeQuantPerChannelGradient(In<float>(in, 0), In<float>(in, 1), v.outer, v.depth, v.inner,
                                                      In<float>(in, 2), In<float>(in, 3), qmin, qmax,
                                                      Out<float>(out, 0), Out<float>(out, 1), Out<float>(out, 2),
                                                      launch));
  return p;
}

// ---------------------------------------------------------------------------------- QuantizeAndDequantize

tfops::QdqView ChannelView(const Tensor& x, int64_t axis) { return tfops::QdqViewOf(x.shape.data(), x.shape.size(), axis); }

template <typename T>
Prepared QdqForward(const Case& c, int64_t axis, const tfops::QdqOptions& options, std::vector<std::size_t> host) {
  const Tensor &x = c.inputs[0], &mn = c.inputs[1], &mx = c.inputs[2];
  const tfops::QdqView view = ChannelView(x, axis);
  const T* given_min = mn.as<T>();  // host memory on either path
  const T* given_max = mx.as<T>();
  Prepared p = Outputs({Tensor::Make(DTypeOf<T>(), x.shape)}, c.inputs.size(), host);
  SET_CPU(p, tfops::QuantizeDequantize<T>(In<T>(in, 0), Out<T>(out, 0), view, given_min, given_max, options, par));
  SET_GPU(p, tfops::cuda::QuantizeDequantize<T>(In<T>(in, 0), Out<T>(out, 0), view, given_min, given_max, options,
                                                launch));
  return p;
}

template <typename T>
Prepared QdqV2V4(const Case& c) {
  tfops::QdqOptions o;
  o.signed_input = c.Bool("signed_input");
  o.num_bits = c.Int("num_bits");
  o.range_given = c.Bool("range_given");
  o.narrow_range = c.Bool("narrow_range");
  tfops::CheckQdqNumBits(o.num_bits, o.signed_input, "signed_input_");
  o.round_mode = c.String("round_mode") == "HALF_UP" ? tfops::QdqRoundMode::kHalfUp : tfops::QdqRoundMode::kHalfToEven;
  const int64_t axis = c.Int("axis");
  tfops::CheckQdqAxis(axis);
  tfops::ScopedFlushDenormals flush;
  const Tensor &x = c.inputs[0], &mn = c.inputs[1], &mx = c.inputs[2];
  tfops::CheckQdqAxisInRank(axis, static_cast<int64_t>(x.shape.size()));
  if (o.range_given) tfops::CheckQdqGivenRange<T>(x.shape, mn.shape, mn.as<T>(), mx.shape, mx.as<T>(), axis);
  return QdqForward<T>(c, axis, o, {1, 2});
}

template <typename T>
Prepared QdqV3(const Case& c) {
  tfops::QdqOptions o;
  o.signed_input = c.Bool("signed_input");
  o.range_given = c.Bool("range_given");
  o.narrow_range = c.Bool("narrow_range");
  o.round_mode = tfops::QdqRoundMode::kHalfToEven;
  const int64_t axis = c.Int("axis");
  tfops::ScopedFlushDenormals flush;
  const Tensor &x = c.inputs[0], &mn = c.inputs[1], &mx = c.inputs[2], &bits = c.inputs[3];
  tfops::CheckQdqV3Inputs(axis, static_cast<int64_t>(x.shape.size()), static_cast<int64_t>(bits.shape.size()));
  o.num_bits = bits.as<int32_t>()[0];
  tfops::CheckQdqNumBits(o.num_bits, o.signed_input, "`signed_input_`");
  if (o.range_given) tfops::CheckQdqGivenRange<T>(x.shape, mn.shape, mn.as<T>(), mx.shape, mx.as<T>(), axis);
  return QdqForward<T>(c, axis, o, {1, 2, 3});
}

template <typename T>
Prepared QdqV4Grad(const Case& c) {
  const int64_t axis = c.Int("axis");
  tfops::CheckQdqAxis(axis);
  tfops::ScopedFlushDenormals flush;
  const Tensor &g = c.inputs[0], &x = c.inputs[1], &mn = c.inputs[2], &mx = c.inputs[3];
  tfops::CheckQdqV4GradInputs(axis, g.shape, x.shape, mn.shape, mx.shape);
  const tfops::QdqView view = ChannelView(x, axis);
  const int64_t n_min = mn.count(), n_max = mx.count();
  Prepared p = Outputs({Tensor::Make(DTypeOf<T>(), x.shape), Tensor::Make(DTypeOf<T>(), mn.shape),
                        Tensor::Make(DTypeOf<T>(), mx.shape)},
                       4);
  SET_CPU(p, std::fill(Out<T>(out, 1), Out<T>(out, 1) + n_min, T(0)); std::fill(Out<T>(out, 2), Out<T>(out, 2) + n_max, T(0));
          tfops::QuantizeDequantizeGradient<T>(In<T>(in, 0), In<T>(in, 1), Out<T>(out, 0), view, In<T>(in, 2),
                                               In<T>(in, 3), par));
  SET_GPU(p, tfops::cuda::Zeros(Out<T>(out, 1), n_min, launch); tfops::cuda::Zeros(Out<T>(out, 2), n_max, launch);
          tfops::cuda::QuantizeDequantizeGradient<T>(In<T>(in, 0), In<T>(in, 1), Out<T>(out, 0), view, In<T>(in, 2),
                                                     In<T>(in, 3), launch));
  return p;
}

// --------------------------------------------------------------------------------------------- batch norm

template <typename T>
Prepared BatchNormForward(const Case& c, int version) {
  const float epsilon = c.Float("epsilon"), factor = c.Float("exponential_avg_factor");
  const std::string format = c.String("data_format");
  const bool training = c.Bool("is_training");
  tfops::ScopedFlushDenormals flush;
  const Tensor &x = c.inputs[0], &scale = c.inputs[1], &offset = c.inputs[2], &mean = c.inputs[3],
               &variance = c.inputs[4];
  tfops::batch_norm::Layout l;
  tfops::batch_norm::CheckForward(x.shape, scale.shape, offset.shape, mean.shape, variance.shape, format, version == 3,
                                  training, factor, &l);
  std::vector<Tensor> outs = {Tensor::Make(DTypeOf<T>(), x.shape)};
  for (int k = 0; k < 4; ++k) outs.push_back(Tensor::Make(DType::kF32, {l.channels}));
  const bool v3 = version == 3;
  if (v3) outs.push_back(Tensor::Make(DType::kF32, {}));
  Prepared p = Outputs(std::move(outs), 5);
  SET_CPU(p, if (v3) *Out<float>(out, 5) = 0.0f;
          tfops::batch_norm::Forward<T>(l, In<T>(in, 0), In<float>(in, 1), In<float>(in, 2), In<float>(in, 3),
                                        In<float>(in, 4), epsilon, factor, training, Out<T>(out, 0), Out<float>(out, 1),
                                        Out<float>(out, 2), Out<float>(out, 3), Out<float>(out, 4), par));
  SET_GPU(p, tfops::cuda::BatchNormForward<T>(l, In<T>(in, 0), In<float>(in, 1), In<float>(in, 2), In<float>(in, 3),
                                              In<float>(in, 4), epsilon, factor, training, Out<T>(out, 0),
                                              Out<float>(out, 1), Out<float>(out, 2), Out<float>(out, 3),
                                              Out<float>(out, 4), v3 ? Out<float>(out, 5) : nullptr, launch));
  return p;
}

template <typename T>
Prepared BatchNormGrad(const Case& c, int version) {
  const float epsilon = c.Float("epsilon");
  const std::string format = c.String("data_format");
  const bool training = c.Bool("is_training");
  tfops::ScopedFlushDenormals flush;
  const Tensor &dy = c.inputs[0], &x = c.inputs[1], &scale = c.inputs[2], &rs1 = c.inputs[3], &rs2 = c.inputs[4];
  tfops::batch_norm::Layout l;
  tfops::batch_norm::CheckGrad(dy.shape, x.shape, scale.shape, rs1.shape, rs2.shape, format, version == 3, &l);
  Prepared p = Outputs({Tensor::Make(DTypeOf<T>(), x.shape), Tensor::Make(DType::kF32, {l.channels}),
                        Tensor::Make(DType::kF32, {l.channels}), Tensor::Make(DType::kF32, {0}),
                        Tensor::Make(DType::kF32, {0})},
                       c.inputs.size());
  SET_CPU(p, tfops::batch_norm::Grad<T>(l, In<T>(in, 0), In<T>(in, 1), In<float>(in, 2), In<float>(in, 3),
                                        In<float>(in, 4), epsilon, training, Out<T>(out, 0), Out<float>(out, 1),
                                        Out<float>(out, 2), par));
  SET_GPU(p, tfops::cuda::BatchNormGrad<T>(l, In<T>(in, 0), In<T>(in, 1), In<float>(in, 2), In<float>(in, 3),
                                           In<float>(in, 4), epsilon, training, Out<T>(out, 0), Out<float>(out, 1),
                                           Out<float>(out, 2), launch));
  return p;
}

// ---------------------------------------------------------------------------------------------- depthwise

tfops::depthwise::Attrs DepthwiseAttrs(const Case& c) {
  tfops::depthwise::Attrs a;
  a.strides = c.Ints("strides");
  a.padding = c.String("padding");
  a.explicit_paddings = c.Ints("explicit_paddings");
  a.data_format = c.String("data_format");
  a.dilations = c.Ints("dilations");
  tfops::depthwise::CheckAttrs(a);
  return a;
}

template <typename T>
Prepared DepthwiseForward(const Case& c) {
  const tfops::depthwise::Attrs attrs = DepthwiseAttrs(c);
  tfops::ScopedFlushDenormals flush;
  const Tensor &input = c.inputs[0], &filter = c.inputs[1];
  tfops::depthwise::Geometry g;
  tfops::depthwise::ForwardGeometry(attrs, input.shape, filter.shape, &g);
  const std::vector<int64_t> shape = g.OutputShape();
  tfops::depthwise::CheckOutputSize(shape, "input, filter and attributes");
  Prepared p = Outputs({Tensor::Make(DTypeOf<T>(), shape)}, 2);
  SET_CPU(p, tfops::depthwise::Forward<T>(g, In<T>(in, 0), In<T>(in, 1), Out<T>(out, 0), par));
  SET_GPU(p, tfops::cuda::DepthwiseForward<T>(g, In<T>(in, 0), In<T>(in, 1), Out<T>(out, 0), launch));
  return p;
}

template <typename T>
Prepared DepthwiseBackpropInput(const Case& c) {
  const tfops::depthwise::Attrs attrs = DepthwiseAttrs(c);
  tfops::ScopedFlushDenormals flush;
  const Tensor &sizes = c.inputs[0], &filter = c.inputs[1], &dy = c.inputs[2];
  tfops::depthwise::Geometry g;
  tfops::depthwise::BackpropInputGeometry(attrs, sizes.shape, sizes.as<int32_t>(), filter.shape, dy.shape, &g);
  const std::vector<int64_t> shape = g.InputShape();
  tfops::depthwise::CheckOutputSize(shape, "input_sizes");
  Prepared p = Outputs({Tensor::Make(DTypeOf<T>(), shape)}, 3, {0});
  SET_CPU(p, tfops::depthwise::BackpropInput<T>(g, In<T>(in, 1), In<T>(in, 2), Out<T>(out, 0), par));
  SET_GPU(p, tfops::cuda::DepthwiseBackpropInput<T>(g, In<T>(in, 1), In<T>(in, 2), Out<T>(out, 0), launch));
  return p;
}

template <typename T>
Prepared DepthwiseBackpropFilter(const Case& c) {
  const tfops::depthwise::Attrs attrs = DepthwiseAttrs(c);
  tfops::ScopedFlushDenormals flush;
  const Tensor &input = c.inputs[0], &sizes = c.inputs[1], &dy = c.inputs[2];
  tfops::depthwise::Geometry g;
  tfops::depthwise::BackpropFilterGeometry(attrs, input.shape, sizes.shape, sizes.as<int32_t>(), dy.shape, &g);
  const std::vector<int64_t> shape = g.FilterShape();
  tfops::depthwise::CheckOutputSize(shape, "filter_sizes");
  Prepared p = Outputs({Tensor::Make(DTypeOf<T>(), shape)}, 3, {1});
  SET_CPU(p, tfops::depthwise::BackpropFilter<T>(g, In<T>(in, 0), In<T>(in, 2), Out<T>(out, 0), par));
  SET_GPU(p, tfops::cuda::DepthwiseBackpropFilter<T>(g, In<T>(in, 0), In<T>(in, 2), Out<T>(out, 0), launch));
  return p;
}

// ------------------------------------------------------------------------------------------------- fused

Prepared FusedBatchNormClipFakeQuant(const Case& c) {
  const float epsilon = c.Float("epsilon");
  const std::string format = c.String("data_format");
  const float clip_min = c.Float("clip_min"), clip_max = c.Float("clip_max");
  const bool args = c.String("fake_quant") == "FakeQuantWithMinMaxArgs";
  tfops::fused::CheckClipBounds(clip_min, clip_max);
  const int64_t num_bits = c.Int("num_bits");
  tfops::CheckFakeQuantNumBits(num_bits);
  const tfops::FakeQuantBits bits = tfops::FakeQuantBitsOf(num_bits, c.Bool("narrow_range"));
  tfops::ScopedFlushDenormals flush;
  const Tensor &x = c.inputs[0], &scale = c.inputs[1], &offset = c.inputs[2], &mean = c.inputs[3],
               &variance = c.inputs[4], &min = c.inputs[5], &max = c.inputs[6];
  tfops::batch_norm::Layout l;
  tfops::batch_norm::CheckForward(x.shape, scale.shape, offset.shape, mean.shape, variance.shape, format, true, false,
                                  1.0f, &l);
  tfops::CheckScalarRange(min.shape, "min");
  tfops::CheckScalarRange(max.shape, "max");
  const tfops::fused::FakeQuantStep step =
      tfops::fused::MakeFakeQuantStep(args, min.as<float>()[0], max.as<float>()[0], bits);
  Prepared p = Outputs({Tensor::Make(DType::kF32, x.shape)}, 7, {5, 6});
  SET_CPU(p, tfops::fused::BatchNormClipFakeQuantForward(l, In<float>(in, 0), In<float>(in, 1), In<float>(in, 2),
                                                         In<float>(in, 3), In<float>(in, 4), epsilon, clip_min,
                                                         clip_max, step, Out<float>(out, 0), par));
  SET_GPU(p, tfops::cuda::BatchNormClipFakeQuantForward(l, In<float>(in, 0), In<float>(in, 1), In<float>(in, 2),
                                                        In<float>(in, 3), In<float>(in, 4), epsilon, clip_min,
                                                        clip_max, step, Out<float>(out, 0), launch));
  return p;
}

// ------------------------------------------------------------------------------------------------ dispatch

template <template <typename> class F, typename... Args>
Prepared ByFloatType(DType t, Args&&... args) {
  switch (t) {
    case DType::kF32:
      return F<float>::Run(std::forward<Args>(args)...);
    case DType::kF64:
      return F<double>::Run(std::forward<Args>(args)...);
    case DType::kF16:
      return F<tfops::Half>::Run(std::forward<Args>(args)...);
    case DType::kBF16:
      return F<tfops::BFloat16>::Run(std::forward<Args>(args)...);
    default:
      throw std::runtime_error("no kernel type for dtype");
  }
}

// The op table's type lists: a combination outside them never reaches a kernel (ORT finds none); Prepare checks.
template <typename T>
struct QdqV2V4Op {
  static Prepared Run(const Case& c) {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) return QdqV2V4<T>(c);
    throw std::logic_error("QDQ: float or double only");
  }
};
template <typename T>
struct QdqV3Op {
  static Prepared Run(const Case& c) {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) return QdqV3<T>(c);
    throw std::logic_error("QDQ: float or double only");
  }
};
template <typename T>
struct QdqV4GradOp {
  static Prepared Run(const Case& c) {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) return QdqV4Grad<T>(c);
    throw std::logic_error("QDQ: float or double only");
  }
};
template <typename T>
struct BatchNormForwardOp {
  static Prepared Run(const Case& c, int version) {
    if constexpr (!std::is_same_v<T, double>) return BatchNormForward<T>(c, version);
    throw std::logic_error("batch norm: no double kernel");
  }
};
template <typename T>
struct BatchNormGradOp {
  static Prepared Run(const Case& c, int version) {
    if constexpr (!std::is_same_v<T, double>) return BatchNormGrad<T>(c, version);
    throw std::logic_error("batch norm: no double kernel");
  }
};
template <typename T>
struct DepthwiseForwardOp {
  static Prepared Run(const Case& c) { return DepthwiseForward<T>(c); }
};
template <typename T>
struct DepthwiseBackpropInputOp {
  static Prepared Run(const Case& c) { return DepthwiseBackpropInput<T>(c); }
};
template <typename T>
struct DepthwiseBackpropFilterOp {
  static Prepared Run(const Case& c) { return DepthwiseBackpropFilter<T>(c); }
};

}  // namespace

tfops::depthwise::Geometry DepthwiseGeometryOf(const Case& c) {
  const tfops::depthwise::Attrs attrs = DepthwiseAttrs(c);
  tfops::depthwise::Geometry g;
  if (c.op == "DepthwiseConv2dNative") {
    tfops::depthwise::ForwardGeometry(attrs, c.inputs[0].shape, c.inputs[1].shape, &g);
  } else if (c.op == "DepthwiseConv2dNativeBackpropInput") {
    tfops::depthwise::BackpropInputGeometry(attrs, c.inputs[0].shape, c.inputs[0].as<int32_t>(), c.inputs[1].shape,
                                            c.inputs[2].shape, &g);
  } else {
    tfops::depthwise::BackpropFilterGeometry(attrs, c.inputs[0].shape, c.inputs[1].shape, c.inputs[1].as<int32_t>(),
                                             c.inputs[2].shape, &g);
  }
  return g;
}

Prepared Prepare(const Case& c) {
  // ORT's own check before any kernel: a registered type combination with the op's input count.
  bool registered = false;
  for (const std::vector<DType>& types : InputTypeCombinations(c.op)) {
    if (types.size() != c.inputs.size()) continue;
    bool same = true;
    for (std::size_t i = 0; i < types.size(); ++i) same = same && types[i] == c.inputs[i].dtype;
    registered = registered || same;
  }
  if (!registered) throw std::runtime_error(c.op + ": the case's input types are not a registered combination");
  const std::string& op = c.op;
  const DType t = c.KeyType();
  if (op == "FakeQuantWithMinMaxArgs") return FakeQuantArgs(c);
  if (op == "FakeQuantWithMinMaxArgsGradient") return FakeQuantArgsGradient(c);
  if (op == "FakeQuantWithMinMaxVars") return FakeQuantVars(c);
  if (op == "FakeQuantWithMinMaxVarsGradient") return FakeQuantVarsGradient(c);
  if (op == "FakeQuantWithMinMaxVarsPerChannel") return FakeQuantPerChannel(c);
  if (op == "FakeQuantWithMinMaxVarsPerChannelGradient") return FakeQuantPerChannelGradient(c);
  if (op == "QuantizeAndDequantizeV2" || op == "QuantizeAndDequantizeV4") return ByFloatType<QdqV2V4Op>(t, c);
  if (op == "QuantizeAndDequantizeV3") return ByFloatType<QdqV3Op>(t, c);
  if (op == "QuantizeAndDequantizeV4Grad") return ByFloatType<QdqV4GradOp>(t, c);
  if (op == "FusedBatchNorm") return ByFloatType<BatchNormForwardOp>(t, c, 1);
  if (op == "FusedBatchNormV2") return ByFloatType<BatchNormForwardOp>(t, c, 2);
  if (op == "FusedBatchNormV3") return ByFloatType<BatchNormForwardOp>(t, c, 3);
  if (op == "FusedBatchNormGrad") return ByFloatType<BatchNormGradOp>(t, c, 1);
  if (op == "FusedBatchNormGradV2") return ByFloatType<BatchNormGradOp>(t, c, 2);
  if (op == "FusedBatchNormGradV3") return ByFloatType<BatchNormGradOp>(t, c, 3);
  if (op == "DepthwiseConv2dNative") return ByFloatType<DepthwiseForwardOp>(t, c);
  if (op == "DepthwiseConv2dNativeBackpropInput") return ByFloatType<DepthwiseBackpropInputOp>(t, c);
  if (op == "DepthwiseConv2dNativeBackpropFilter") return ByFloatType<DepthwiseBackpropFilterOp>(t, c);
  if (op == "FusedBatchNormClipFakeQuant") return FusedBatchNormClipFakeQuant(c);
  throw std::runtime_error("Prepare: no driver for op " + op);
}

std::vector<Tensor> RunCpu(const Case& c, const Prepared& p, const Parallel& par) {
  std::vector<Tensor> outs = p.outputs;
  Pointers in;
  for (const Tensor& t : c.inputs) in.push_back(t.data());
  MutablePointers out;
  for (Tensor& t : outs) {
    t.FillBytes(0xFF);  // a NaN pattern: an element the kernel leaves unwritten shows
    out.push_back(t.data());
  }
  tfops::ScopedFlushDenormals flush;  // the adapter's Compute runs in TF's mode
  p.cpu(in, out, par);
  return outs;
}

}  // namespace gpu_check
