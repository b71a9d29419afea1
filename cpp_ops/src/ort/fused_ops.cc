// ORT adapter of the fused ops (ort_ops/specs/fused.py): FusedBatchNormClipFakeQuant. It runs the checks
// of the ops it fuses (batch norm's CheckForward in inference mode, FakeQuant's num_bits and scalar
// range, Args' range rule) and kernels/fused.h, or on the CUDA execution provider kernels/cuda/fused.h.
// min and max are host inputs there (the grid is nudged on the host, as for FakeQuantWithMinMaxVars).
#include <string>

#include "kernels/batch_norm.h"
#include "kernels/cuda/fused.h"
#include "kernels/device.h"
#include "kernels/fake_quant.h"
#include "kernels/fused.h"
#include "ort/op_base.h"

namespace tfops {
namespace ort {
namespace {

class FusedBatchNormClipFakeQuant {
 public:
  static constexpr const char* kName = "FusedBatchNormClipFakeQuant";
  static constexpr bool kHasCudaKernel = true;
  static constexpr unsigned kHostInputs = (1u << 5) | (1u << 6);  // min, max
  explicit FusedBatchNormClipFakeQuant(const KernelAttributes& a)
      : epsilon_(a.Float("epsilon")),
        data_format_(a.Choice("data_format")),
        clip_min_(a.Float("clip_min")),
        clip_max_(a.Float("clip_max")),
        args_(a.Choice("fake_quant") == "FakeQuantWithMinMaxArgs") {
    fused::CheckClipBounds(clip_min_, clip_max_);
    const int64_t num_bits = a.Int("num_bits");
    CheckFakeQuantNumBits(num_bits);
    bits_ = FakeQuantBitsOf(num_bits, a.Bool("narrow_range"));
  }

  void Compute(KernelContext& ctx) const {
    const Tensor x = ctx.Input(0), scale = ctx.Input(1), offset = ctx.Input(2), mean = ctx.Input(3),
                 variance = ctx.Input(4), min = ctx.Input(5), max = ctx.Input(6);
    batch_norm::Layout l;
    batch_norm::CheckForward(x.shape, scale.shape, offset.shape, mean.shape, variance.shape, data_format_,
                             /*allow_3d_names=*/true, /*is_training=*/false, /*exponential_avg_factor=*/1.0f, &l);
    CheckScalarRange(min.shape, "min");
    CheckScalarRange(max.shape, "max");
    // Host memory on either EP; this thread is in TF's denormal mode (op_base.h).
    const fused::FakeQuantStep step = fused::MakeFakeQuantStep(args_, min.Scalar<float>(), max.Scalar<float>(), bits_);
    float* y = ctx.Output<float>(0, x.shape);
    if constexpr (kWithCuda) {
      if (ctx.OnCuda()) {
        cuda::BatchNormClipFakeQuantForward(l, x.Data<float>(), scale.Data<float>(), offset.Data<float>(),
                                            mean.Data<float>(), variance.Data<float>(), epsilon_, clip_min_,
                                            clip_max_, step, y, ctx.Cuda());
        return;
      }
    }
    fused::BatchNormClipFakeQuantForward(l, x.Data<float>(), scale.Data<float>(), offset.Data<float>(),
                                         mean.Data<float>(), variance.Data<float>(), epsilon_, clip_min_, clip_max_,
                                         step, y, ctx.parallel());
  }

  static void InferShapes(ShapeInference& ctx) {
    TypeShape x = ctx.Input(0);
    x.type = kFloat;
    ctx.SetOutputLike(0, x);
  }

 private:
  float epsilon_;
  std::string data_format_;
  float clip_min_, clip_max_;
  bool args_;
  FakeQuantBits bits_;
};

CustomOp<FusedBatchNormClipFakeQuant> g_batch_norm_clip_fake_quant({kFloat, kFloat, kFloat, kFloat, kFloat, kFloat, kFloat},
                                                                   {kFloat});

const OpRegistrar kRegistered({&g_batch_norm_clip_fake_quant});

}  // namespace
}  // namespace ort
}  // namespace tfops
