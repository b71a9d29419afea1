// ORT adapters for QuantizeAndDequantize{V2,V3,V4} and QuantizeAndDequantizeV4Grad (float, double):
// the checks of kernels/quantize_dequantize_checks.cc (TF's order and wording), then the kernels in kernels/quantize_dequantize.h (CPU) or kernels/cuda/quantize_dequantize.h (CUDA EP).
//
// Host inputs on the CUDA EP: the forward ops' input_min/input_max (TF's per-tensor range check reads
// them; given per-axis ranges become kernel launch arguments, see the CUDA header) and V3's num_bits.
// V4Grad reads min/max only per element, so they stay in device memory.
#include <algorithm>
#include <string>

#include "kernels/cuda/quantize_dequantize.h"
#include "kernels/quantize_dequantize.h"
#include "kernels/simd.h"
#include "ort/op_base.h"

namespace tfops {
namespace ort {
namespace {

QdqView ChannelView(const Tensor& x, int64_t axis) { return QdqViewOf(x.shape.data(), x.rank(), axis); }

template <typename T>
void RunForward(KernelContext& ctx, const Tensor& x, const Tensor& mn, const Tensor& mx, int64_t axis,
                const QdqOptions& options) {
  T* y = ctx.Output<T>(0, x.shape);
  if constexpr (kWithCuda) {
    if (ctx.OnCuda()) {  // x and y in device memory, mn and mx in host memory (kHostInputs)
      cuda::QuantizeDequantize<T>(x.Data<T>(), y, ChannelView(x, axis), mn.Data<T>(), mx.Data<T>(), options, ctx.Cuda());
      return;
    }
  }
  QuantizeDequantize<T>(x.Data<T>(), y, ChannelView(x, axis), mn.Data<T>(), mx.Data<T>(), options, ctx.parallel());
}

void SameShapeAs(ShapeInference& ctx, std::size_t input, std::size_t output) {
  ctx.SetOutputLike(output, ctx.Input(input));
}

// V2 and V4 are the same TF kernel class.
template <typename T, const char* kOpName>
class QuantizeAndDequantizeV2V4 {
 public:
  static constexpr const char* kName = kOpName;
  static constexpr bool kHasCudaKernel = true;
  static constexpr unsigned kHostInputs = (1u << 1) | (1u << 2);  // input_min, input_max

  explicit QuantizeAndDequantizeV2V4(const KernelAttributes& attrs) {
    options_.signed_input = attrs.Bool("signed_input");
    options_.num_bits = attrs.Int("num_bits");
    options_.range_given = attrs.Bool("range_given");
    options_.narrow_range = attrs.Bool("narrow_range");
    CheckQdqNumBits(options_.num_bits, options_.signed_input, "signed_input_");
    const std::string round_mode = attrs.Choice("round_mode");
    options_.round_mode = round_mode == "HALF_UP" ? QdqRoundMode::kHalfUp : QdqRoundMode::kHalfToEven;
    axis_ = attrs.Int("axis");
    CheckQdqAxis(axis_);
  }

  void Compute(KernelContext& ctx) const {
    const Tensor x = ctx.Input(0), mn = ctx.Input(1), mx = ctx.Input(2);
    CheckQdqAxisInRank(axis_, static_cast<int64_t>(x.rank()));
    if (options_.range_given) CheckQdqGivenRange<T>(x.shape, mn.shape, mn.Data<T>(), mx.shape, mx.Data<T>(), axis_);
    RunForward<T>(ctx, x, mn, mx, axis_, options_);
  }
  static void InferShapes(ShapeInference& ctx) { SameShapeAs(ctx, 0, 0); }

 private:
  QdqOptions options_;
  int64_t axis_ = -1;
};

template <typename T>
class QuantizeAndDequantizeV3 {
 public:
  static constexpr const char* kName = "QuantizeAndDequantizeV3";
  static constexpr bool kHasCudaKernel = true;
  static constexpr unsigned kHostInputs = (1u << 1) | (1u << 2) | (1u << 3);  // input_min, input_max, num_bits

  explicit QuantizeAndDequantizeV3(const KernelAttributes& attrs) {
    options_.signed_input = attrs.Bool("signed_input");
    options_.range_given = attrs.Bool("range_given");
    options_.narrow_range = attrs.Bool("narrow_range");
    options_.round_mode = QdqRoundMode::kHalfToEven;
    axis_ = attrs.Int("axis");
  }

  // Everything depends on the input rank or the num_bits tensor, so all checks run here, in TF's order.
  void Compute(KernelContext& ctx) const {
    const Tensor x = ctx.Input(0), mn = ctx.Input(1), mx = ctx.Input(2), bits = ctx.Input(3);
    CheckQdqV3Inputs(axis_, static_cast<int64_t>(x.rank()), static_cast<int64_t>(bits.rank()));
    QdqOptions options = options_;
    options.num_bits = bits.Scalar<int32_t>();
    CheckQdqNumBits(options.num_bits, options.signed_input, "`signed_input_`");
    if (options.range_given) CheckQdqGivenRange<T>(x.shape, mn.shape, mn.Data<T>(), mx.shape, mx.Data<T>(), axis_);
    RunForward<T>(ctx, x, mn, mx, axis_, options);
  }
  static void InferShapes(ShapeInference& ctx) { SameShapeAs(ctx, 0, 0); }

 private:
  QdqOptions options_;
  int64_t axis_ = -1;
};

template <typename T>
class QuantizeAndDequantizeV4Grad {
 public:
  static constexpr const char* kName = "QuantizeAndDequantizeV4Grad";
  static constexpr bool kHasCudaKernel = true;  // every input in device memory

  explicit QuantizeAndDequantizeV4Grad(const KernelAttributes& attrs) : axis_(attrs.Int("axis")) { CheckQdqAxis(axis_); }

  void Compute(KernelContext& ctx) const {
    const Tensor g = ctx.Input(0), x = ctx.Input(1), mn = ctx.Input(2), mx = ctx.Input(3);
    CheckQdqV4GradInputs(axis_, g.shape, x.shape, mn.shape, mx.shape);
    T* dx = ctx.Output<T>(0, x.shape);
    T* dmin = ctx.Output<T>(1, mn.shape);
    T* dmax = ctx.Output<T>(2, mx.shape);
    if constexpr (kWithCuda) {
      if (ctx.OnCuda()) {
        const CudaLaunch launch = ctx.Cuda();
        cuda::Zeros(dmin, mn.size, launch);
        cuda::Zeros(dmax, mx.size, launch);
        cuda::QuantizeDequantizeGradient<T>(g.Data<T>(), x.Data<T>(), dx, ChannelView(x, axis_), mn.Data<T>(),
                                            mx.Data<T>(), launch);
        return;
      }
    }
    std::fill(dmin, dmin + mn.size, T(0));
    std::fill(dmax, dmax + mx.size, T(0));
    QuantizeDequantizeGradient<T>(g.Data<T>(), x.Data<T>(), dx, ChannelView(x, axis_), mn.Data<T>(), mx.Data<T>(),
                                  ctx.parallel());
  }
  static void InferShapes(ShapeInference& ctx) {
    SameShapeAs(ctx, 1, 0);
    SameShapeAs(ctx, 2, 1);
    SameShapeAs(ctx, 3, 2);
  }

 private:
  int64_t axis_;
};

constexpr char kV2[] = "QuantizeAndDequantizeV2";
constexpr char kV4[] = "QuantizeAndDequantizeV4";

CustomOp<QuantizeAndDequantizeV2V4<float, kV2>> v2_float({kFloat, kFloat, kFloat}, {kFloat});
CustomOp<QuantizeAndDequantizeV2V4<double, kV2>> v2_double({kDouble, kDouble, kDouble}, {kDouble});
CustomOp<QuantizeAndDequantizeV3<float>> v3_float({kFloat, kFloat, kFloat, kInt32}, {kFloat});
CustomOp<QuantizeAndDequantizeV3<double>> v3_double({kDouble, kDouble, kDouble, kInt32}, {kDouble});
CustomOp<QuantizeAndDequantizeV2V4<float, kV4>> v4_float({kFloat, kFloat, kFloat}, {kFloat});
CustomOp<QuantizeAndDequantizeV2V4<double, kV4>> v4_double({kDouble, kDouble, kDouble}, {kDouble});
CustomOp<QuantizeAndDequantizeV4Grad<float>> v4_grad_float({kFloat, kFloat, kFloat, kFloat}, {kFloat, kFloat, kFloat});
CustomOp<QuantizeAndDequantizeV4Grad<double>> v4_grad_double({kDouble, kDouble, kDouble, kDouble},
                                                             {kDouble, kDouble, kDouble});

const OpRegistrar kRegistered({&v2_float, &v2_double, &v3_float, &v3_double, &v4_float, &v4_double, &v4_grad_float,
                               &v4_grad_double});

}  // namespace
}  // namespace ort
}  // namespace tfops
