// ORT adapters for FakeQuantWithMinMax{Args,Vars,VarsPerChannel}(+Gradient): the attribute and input
// checks of kernels/fake_quant_checks.cc (TF's messages, docs/semantics.md section 1.5), then the
// kernels in kernels/fake_quant.h (CPU EP) or kernels/cuda/fake_quant.h (CUDA EP). On the CUDA EP the
// scalar min/max of the Vars ops are host inputs (nudged on the host); the per-channel min/max vectors
// stay on the device.
#include <string>

#include "kernels/cuda/fake_quant.h"
#include "kernels/device.h"
#include "kernels/fake_quant.h"
#include "kernels/simd.h"
#include "ort/op_base.h"

namespace tfops {
namespace ort {
namespace {

// num_bits and narrow_range, shared by all six ops (checked in that order, as TF reads them).
FakeQuantBits ReadBits(const KernelAttributes& attrs) {
  const int64_t num_bits = attrs.Int("num_bits");
  CheckFakeQuantNumBits(num_bits);
  return FakeQuantBitsOf(num_bits, attrs.Bool("narrow_range"));
}

// Args ops: min and max are attributes.
FakeQuantGrid ArgsGrid(const KernelAttributes& attrs) {
  const FakeQuantBits bits = ReadBits(attrs);
  const float min = attrs.Float("min");
  return CheckArgsRange(min, attrs.Float("max"), bits);
}

// Output 0 takes the shape of input `index`; the other outputs as given.
void SameShapeAs(ShapeInference& ctx, std::size_t input, std::size_t output) {
  TypeShape ts = ctx.Input(input);
  ts.type = kFloat;
  ctx.SetOutputLike(output, ts);
}

class FakeQuantWithMinMaxArgs {
 public:
  static constexpr const char* kName = "FakeQuantWithMinMaxArgs";
  static constexpr bool kHasCudaKernel = true;
  explicit FakeQuantWithMinMaxArgs(const KernelAttributes& attrs) : grid_(ArgsGrid(attrs)) {}

  void Compute(KernelContext& ctx) const {
    const Tensor x = ctx.Input(0);
    float* y = ctx.Output<float>(0, x.shape);
    if constexpr (kWithCuda) {
      if (ctx.OnCuda()) {
        cuda::FakeQuantForward(x.Data<float>(), y, x.size, grid_, /*use_division=*/false, ctx.Cuda());
        return;
      }
    }
    FakeQuantForward(x.Data<float>(), y, x.size, grid_, /*use_division=*/false, ctx.parallel());
  }
  static void InferShapes(ShapeInference& ctx) { SameShapeAs(ctx, 0, 0); }

 private:
  FakeQuantGrid grid_;
};

class FakeQuantWithMinMaxArgsGradient {
 public:
  static constexpr const char* kName = "FakeQuantWithMinMaxArgsGradient";
  static constexpr bool kHasCudaKernel = true;
  explicit FakeQuantWithMinMaxArgsGradient(const KernelAttributes& attrs)
      : grid_(ArgsGrid(attrs)) {}

  void Compute(KernelContext& ctx) const {
    const Tensor g = ctx.Input(0);
    const Tensor x = ctx.Input(1);
    CheckArgsGradientShapes(g.shape, x.shape);
    float* dx = ctx.Output<float>(0, x.shape);
    if constexpr (kWithCuda) {
      if (ctx.OnCuda()) {
        cuda::FakeQuantGradientInput(g.Data<float>(), x.Data<float>(), dx, x.size, grid_, ctx.Cuda());
        return;
      }
    }
    FakeQuantGradientInput(g.Data<float>(), x.Data<float>(), dx, x.size, grid_, ctx.parallel());
  }
  static void InferShapes(ShapeInference& ctx) { SameShapeAs(ctx, 1, 0); }

 private:
  FakeQuantGrid grid_;
};

class FakeQuantWithMinMaxVars {
 public:
  static constexpr const char* kName = "FakeQuantWithMinMaxVars";
  static constexpr bool kHasCudaKernel = true;
  static constexpr unsigned kHostInputs = (1u << 1) | (1u << 2);  // min, max
  explicit FakeQuantWithMinMaxVars(const KernelAttributes& attrs) : bits_(ReadBits(attrs)) {}

  void Compute(KernelContext& ctx) const {
    const Tensor x = ctx.Input(0), min = ctx.Input(1), max = ctx.Input(2);
    CheckScalarRange(min.shape, "min");
    CheckScalarRange(max.shape, "max");
    float* y = ctx.Output<float>(0, x.shape);
    const float lo = min.Scalar<float>(), hi = max.Scalar<float>();  // host memory on either EP
    if constexpr (kWithCuda) {
      if (ctx.OnCuda()) {
        cuda::FakeQuantVarsForward(x.Data<float>(), y, x.size, lo, hi, bits_.quant_min, bits_.quant_max, ctx.Cuda());
        return;
      }
    }
    FakeQuantVarsForward(x.Data<float>(), y, x.size, lo, hi, bits_.quant_min, bits_.quant_max, ctx.parallel());
  }
  static void InferShapes(ShapeInference& ctx) { SameShapeAs(ctx, 0, 0); }

 private:
  FakeQuantBits bits_;
};

class FakeQuantWithMinMaxVarsGradient {
 public:
  static constexpr const char* kName = "FakeQuantWithMinMaxVarsGradient";
  static constexpr bool kHasCudaKernel = true;
  static constexpr unsigned kHostInputs = (1u << 2) | (1u << 3);  // min, max
  explicit FakeQuantWithMinMaxVarsGradient(const KernelAttributes& attrs) : bits_(ReadBits(attrs)) {}

  void Compute(KernelContext& ctx) const {
    const Tensor g = ctx.Input(0), x = ctx.Input(1), min = ctx.Input(2), max = ctx.Input(3);
    CheckGradientSameSize(g.shape, x.shape);
    CheckScalarRange(min.shape, "min");
    CheckScalarRange(max.shape, "max");
    float* dx = ctx.Output<float>(0, x.shape);
    float* dmin = ctx.Output<float>(1, {});
    float* dmax = ctx.Output<float>(2, {});
    if constexpr (kWithCuda) {
      if (ctx.OnCuda()) {
        cuda::FakeQuantVarsGradient(g.Data<float>(), x.Data<float>(), x.size, min.Scalar<float>(), max.Scalar<float>(),
                                    bits_.quant_min, bits_.quant_max, dx, dmin, dmax, ctx.Cuda());
        return;
      }
    }
    FakeQuantVarsGradient(g.Data<float>(), x.Data<float>(), x.size, min.Scalar<float>(), max.Scalar<float>(),
                          bits_.quant_min, bits_.quant_max, dx, dmin, dmax, ctx.parallel());
  }
  static void InferShapes(ShapeInference& ctx) {
    SameShapeAs(ctx, 1, 0);
    ctx.SetOutput(1, kFloat, {});
    ctx.SetOutput(2, kFloat, {});
  }

 private:
  FakeQuantBits bits_;
};

class FakeQuantWithMinMaxVarsPerChannel {
 public:
  static constexpr const char* kName = "FakeQuantWithMinMaxVarsPerChannel";
  static constexpr bool kHasCudaKernel = true;  // min and max stay on the device
  explicit FakeQuantWithMinMaxVarsPerChannel(const KernelAttributes& attrs)
      : bits_(ReadBits(attrs)), axis_(attrs.Int("axis")) {}

  void Compute(KernelContext& ctx) const {
    const Tensor x = ctx.Input(0), min = ctx.Input(1), max = ctx.Input(2);
    const FakeQuantChannels view = CheckChannelRanges(x.shape, min.shape, max.shape, axis_);
    float* y = ctx.Output<float>(0, x.shape);
    if constexpr (kWithCuda) {
      if (ctx.OnCuda()) {
        cuda::FakeQuantPerChannelForward(x.Data<float>(), y, view.outer, view.depth, view.inner, min.Data<float>(),
                                         max.Data<float>(), bits_.quant_min, bits_.quant_max, ctx.Cuda());
        return;
      }
    }
    FakeQuantPerChannelForward(x.Data<float>(), y, view.outer, view.depth, view.inner, min.Data<float>(),
                               max.Data<float>(), bits_.quant_min, bits_.quant_max, ctx.parallel());
  }
  static void InferShapes(ShapeInference& ctx) { SameShapeAs(ctx, 0, 0); }

 private:
  FakeQuantBits bits_;
  int64_t axis_;  // -1 (TF's op): the last dim
};

class FakeQuantWithMinMaxVarsPerChannelGradient {
 public:
  static constexpr const char* kName = "FakeQuantWithMinMaxVarsPerChannelGradient";
  static constexpr bool kHasCudaKernel = true;  // min and max stay on the device
  explicit FakeQuantWithMinMaxVarsPerChannelGradient(const KernelAttributes& attrs)
      : bits_(ReadBits(attrs)), axis_(attrs.Int("axis")) {}

  void Compute(KernelContext& ctx) const {
    const Tensor g = ctx.Input(0), x = ctx.Input(1), min = ctx.Input(2), max = ctx.Input(3);
    CheckGradientSameSize(g.shape, x.shape);
    const FakeQuantChannels view = CheckChannelRanges(x.shape, min.shape, max.shape, axis_);
    float* dx = ctx.Output<float>(0, x.shape);
    float* dmin = ctx.Output<float>(1, {view.depth});
    float* dmax = ctx.Output<float>(2, {view.depth});
    if constexpr (kWithCuda) {
      if (ctx.OnCuda()) {
        cuda::FakeQuantPerChannelGradient(g.Data<float>(), x.Data<float>(), view.outer, view.depth, view.inner,
                                          min.Data<float>(), max.Data<float>(), bits_.quant_min, bits_.quant_max, dx,
                                          dmin, dmax, ctx.Cuda());
        return;
      }
    }
    FakeQuantPerChannelGradient(g.Data<float>(), x.Data<float>(), view.outer, view.depth, view.inner,
                                min.Data<float>(), max.Data<float>(), bits_.quant_min, bits_.quant_max, dx, dmin,
                                dmax, ctx.parallel());
  }
  static void InferShapes(ShapeInference& ctx) {
    SameShapeAs(ctx, 1, 0);
    // [depth]: dim `axis` (the last for -1) of `inputs` when its rank is known and the axis valid, else the
    // length of `min`.
    const TypeShape x = ctx.Input(1);
    const int64_t axis = ctx.Int("axis");
    const int64_t rank = static_cast<int64_t>(x.rank());
    TypeShape channels;
    channels.type = kFloat;
    if (rank >= 1 && axis >= -1 && axis < rank) {
      const std::size_t dim = static_cast<std::size_t>(axis == -1 ? rank - 1 : axis);
      channels.dims = {x.dims[dim]};
      channels.symbols = {x.symbols[dim]};
    } else {
      const TypeShape min = ctx.Input(2);
      channels.dims = {min.rank() == 1 ? min.dims[0] : -1};
      channels.symbols = {min.rank() == 1 ? min.symbols[0] : ""};
    }
    ctx.SetOutput(1, channels);
    ctx.SetOutput(2, channels);
  }

 private:
  FakeQuantBits bits_;
  int64_t axis_;  // -1 (TF's op): the last dim
};

// Every FakeQuant op takes and returns float32 only.
CustomOp<FakeQuantWithMinMaxArgs> args_op({kFloat}, {kFloat});
CustomOp<FakeQuantWithMinMaxArgsGradient> args_gradient_op({kFloat, kFloat}, {kFloat});
CustomOp<FakeQuantWithMinMaxVars> vars_op({kFloat, kFloat, kFloat}, {kFloat});
CustomOp<FakeQuantWithMinMaxVarsGradient> vars_gradient_op({kFloat, kFloat, kFloat, kFloat},
                                                           {kFloat, kFloat, kFloat});
CustomOp<FakeQuantWithMinMaxVarsPerChannel> per_channel_op({kFloat, kFloat, kFloat}, {kFloat});
CustomOp<FakeQuantWithMinMaxVarsPerChannelGradient> per_channel_gradient_op({kFloat, kFloat, kFloat, kFloat},
                                                                            {kFloat, kFloat, kFloat});

const OpRegistrar kRegistered({&args_op, &args_gradient_op, &vars_op, &vars_gradient_op, &per_channel_op,
                               &per_channel_gradient_op});

}  // namespace
}  // namespace ort
}  // namespace tfops
