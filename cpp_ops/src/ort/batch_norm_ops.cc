// ORT adapters of FusedBatchNorm{,V2,V3} and FusedBatchNormGrad{,V2,V3}: read the attributes,
// validate the shapes with the ORT-free checks, allocate the outputs and call kernels/batch_norm.cc,
// or on the CUDA execution provider kernels/cuda/batch_norm.cu (every input and output in device
// memory there: no host inputs). Statistics (scale, offset, mean, variance, reserve spaces) are
// float32 in every version; x/y are T = float (V1) or float/float16/bfloat16 (V2, V3).
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/batch_norm.h"
#include "kernels/cuda/batch_norm.h"
#include "kernels/device.h"
#include "kernels/half.h"
#include "ort/op_base.h"

namespace tfops {
namespace ort {
namespace {

constexpr const char* kForwardNames[] = {"", "FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"};
constexpr const char* kGradNames[] = {"", "FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3"};

// Outputs shaped like a [C] statistics vector, or x's shape, at graph-build time.
void SetVector(ShapeInference& ctx, std::size_t index, const TypeShape& x, const std::string& fmt) {
  Shape dims = {-1};
  if (x.rank() == 4 || x.rank() == 5) {
    const std::size_t axis = (fmt == "NCHW" || fmt == "NCDHW") ? 1 : x.rank() - 1;
    dims[0] = x.dims[axis];
  }
  ctx.SetOutput(index, kFloat, dims);
}

template <typename T, int kVersion>
class BatchNormForward {
 public:
  static constexpr const char* kName = kForwardNames[kVersion];
  static constexpr bool kHasCudaKernel = true;
  explicit BatchNormForward(const KernelAttributes& a)
      : epsilon_(a.Float("epsilon")),
        factor_(a.Float("exponential_avg_factor")),
        data_format_(a.String("data_format")),  // checked with the inputs, in TF's order (CheckForward)
        is_training_(a.Bool("is_training")) {}

  void Compute(KernelContext& ctx) const {
    const Tensor x = ctx.Input(0), scale = ctx.Input(1), offset = ctx.Input(2), mean = ctx.Input(3),
                 variance = ctx.Input(4);
    batch_norm::Layout l;
    batch_norm::CheckForward(x.shape, scale.shape, offset.shape, mean.shape, variance.shape, data_format_, kVersion == 3,
                             is_training_, factor_, &l);
    T* y = ctx.Output<T>(0, x.shape);
    const Shape stats = {l.channels};
    float* batch_mean = ctx.Output<float>(1, stats);
    float* batch_variance = ctx.Output<float>(2, stats);
    float* rs1 = ctx.Output<float>(3, stats);
    float* rs2 = ctx.Output<float>(4, stats);
    // reserve_space_3: a scalar 0, as on TF's CPU (the CUDA kernels write it on the device).
    float* rs3 = kVersion == 3 ? ctx.Output<float>(5, Shape{}) : nullptr;
    if constexpr (kWithCuda) {
      if (ctx.OnCuda()) {
        cuda::BatchNormForward<T>(l, x.Data<T>(), scale.Data<float>(), offset.Data<float>(), mean.Data<float>(),
                                  variance.Data<float>(), epsilon_, factor_, is_training_, y, batch_mean,
                                  batch_variance, rs1, rs2, rs3, ctx.Cuda());
        return;
      }
    }
    if (rs3 != nullptr) *rs3 = 0.0f;
    batch_norm::Forward<T>(l, x.Data<T>(), scale.Data<float>(), offset.Data<float>(), mean.Data<float>(),
                           variance.Data<float>(), epsilon_, factor_, is_training_, y, batch_mean, batch_variance, rs1,
                           rs2, ctx.parallel());
  }

  static void InferShapes(ShapeInference& ctx) {
    const TypeShape x = ctx.Input(0);
    ctx.SetOutputLike(0, x);
    const std::string fmt = ctx.String("data_format");
    for (std::size_t i = 1; i <= 4; ++i) SetVector(ctx, i, x, fmt);
    if (kVersion == 3) ctx.SetOutput(5, kFloat, Shape{});
  }

 private:
  float epsilon_, factor_;
  std::string data_format_;
  bool is_training_;
};

template <typename T, int kVersion>
class BatchNormGrad {
 public:
  static constexpr const char* kName = kGradNames[kVersion];
  static constexpr bool kHasCudaKernel = true;
  explicit BatchNormGrad(const KernelAttributes& a)
      : epsilon_(a.Float("epsilon")),
        data_format_(a.String("data_format")),  // checked with the inputs, in TF's order (CheckGrad)
        is_training_(a.Bool("is_training")) {}

  void Compute(KernelContext& ctx) const {
    const Tensor dy = ctx.Input(0), x = ctx.Input(1), scale = ctx.Input(2), rs1 = ctx.Input(3), rs2 = ctx.Input(4);
    // V3's reserve_space_3 (input 5) is ignored, whatever its shape, as on TF's CPU.
    batch_norm::Layout l;
    batch_norm::CheckGrad(dy.shape, x.shape, scale.shape, rs1.shape, rs2.shape, data_format_, kVersion == 3, &l);
    T* dx = ctx.Output<T>(0, x.shape);
    const Shape stats = {l.channels};
    float* dscale = ctx.Output<float>(1, stats);
    float* doffset = ctx.Output<float>(2, stats);
    ctx.Output<float>(3, Shape{0});  // TF's Eigen kernel returns shape-[0] placeholders
    ctx.Output<float>(4, Shape{0});
    if constexpr (kWithCuda) {
      if (ctx.OnCuda()) {
        cuda::BatchNormGrad<T>(l, dy.Data<T>(), x.Data<T>(), scale.Data<float>(), rs1.Data<float>(),
                               rs2.Data<float>(), epsilon_, is_training_, dx, dscale, doffset, ctx.Cuda());
        return;
      }
    }
    batch_norm::Grad<T>(l, dy.Data<T>(), x.Data<T>(), scale.Data<float>(), rs1.Data<float>(), rs2.Data<float>(),
                        epsilon_, is_training_, dx, dscale, doffset, ctx.parallel());
  }

  static void InferShapes(ShapeInference& ctx) {
    const TypeShape x = ctx.Input(1);
    ctx.SetOutputLike(0, x);
    const std::string fmt = ctx.String("data_format");
    SetVector(ctx, 1, x, fmt);
    SetVector(ctx, 2, x, fmt);
    ctx.SetOutput(3, kFloat, Shape{0});
    ctx.SetOutput(4, kFloat, Shape{0});
  }

 private:
  float epsilon_;
  std::string data_format_;
  bool is_training_;
};

template <typename T, int kVersion>
struct BatchNormOps {
  static constexpr ONNXTensorElementDataType t = ElementType<T>();
  CustomOp<BatchNormForward<T, kVersion>> forward{
      {t, kFloat, kFloat, kFloat, kFloat},
      kVersion == 3 ? std::vector<ONNXTensorElementDataType>{t, kFloat, kFloat, kFloat, kFloat, kFloat}
                    : std::vector<ONNXTensorElementDataType>{t, kFloat, kFloat, kFloat, kFloat}};
  CustomOp<BatchNormGrad<T, kVersion>> grad{
      kVersion == 3 ? std::vector<ONNXTensorElementDataType>{t, t, kFloat, kFloat, kFloat, kFloat}
                    : std::vector<ONNXTensorElementDataType>{t, t, kFloat, kFloat, kFloat},
      {t, kFloat, kFloat, kFloat, kFloat}};
};

BatchNormOps<float, 1> g_v1;
BatchNormOps<float, 2> g_v2_float;
BatchNormOps<Half, 2> g_v2_half;
BatchNormOps<BFloat16, 2> g_v2_bfloat16;
BatchNormOps<float, 3> g_v3_float;
BatchNormOps<Half, 3> g_v3_half;
BatchNormOps<BFloat16, 3> g_v3_bfloat16;

const OpRegistrar kRegistered({
    &g_v1.forward, &g_v1.grad,                                                          //
    &g_v2_float.forward, &g_v2_float.grad, &g_v2_half.forward, &g_v2_half.grad,          //
    &g_v2_bfloat16.forward, &g_v2_bfloat16.grad,                                         //
    &g_v3_float.forward, &g_v3_float.grad, &g_v3_half.forward, &g_v3_half.grad,          //
    &g_v3_bfloat16.forward, &g_v3_bfloat16.grad,
});

}  // namespace
}  // namespace ort
}  // namespace tfops
