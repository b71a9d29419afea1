// ORT adapters of DepthwiseConv2dNative, ...BackpropInput and ...BackpropFilter: read the
// attributes, validate shapes (and the int32 size vectors, read on the host) with the ORT-free
// geometry functions (kernels/depthwise_geometry.cc), allocate the output and call the kernels in
// kernels/depthwise.cc, or on the CUDA execution provider those of kernels/cuda/depthwise.cu (the size
// vectors are host inputs there).
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/depthwise.h"
#include "kernels/depthwise.h"
#include "kernels/device.h"
#include "kernels/half.h"
#include "ort/op_base.h"

namespace tfops {
namespace ort {
namespace {

depthwise::Attrs ReadAttrs(const KernelAttributes& a) {
  depthwise::Attrs out;
  out.strides = a.Ints("strides");
  out.padding = a.Choice("padding");
  out.explicit_paddings = a.Ints("explicit_paddings");
  out.data_format = a.Choice("data_format");
  out.dilations = a.Ints("dilations");
  depthwise::CheckAttrs(out);  // the node is unusable whatever its inputs
  return out;
}

// Attributes at graph-build time (defaults where unreadable: the kernel reports those).
depthwise::Attrs InferAttrs(const ShapeInference& ctx) {
  depthwise::Attrs out;
  out.strides = ctx.Ints("strides");
  out.padding = ctx.String("padding");
  out.explicit_paddings = ctx.Ints("explicit_paddings");
  out.data_format = ctx.String("data_format");
  out.dilations = ctx.Ints("dilations");
  return out;
}

bool AllKnown(const TypeShape& ts) {
  for (std::size_t i = 0; i < ts.rank(); ++i)
    if (!ts.known(i)) return false;
  return true;
}

// The output is rank 4 with the type of input `typed_input`. ORT keeps one shape-inference
// function per op name (whichever type registered first), so the type must come from the input.
void InferRank4(ShapeInference& ctx, std::size_t typed_input, const Shape& dims) {
  ctx.SetOutput(0, ctx.Input(typed_input).type, dims);
}

template <typename T>
class DepthwiseForward {
 public:
  static constexpr const char* kName = "DepthwiseConv2dNative";
  static constexpr bool kHasCudaKernel = true;
  explicit DepthwiseForward(const KernelAttributes& attrs) : attrs_(ReadAttrs(attrs)) {}

  void Compute(KernelContext& ctx) const {
    const Tensor input = ctx.Input(0), filter = ctx.Input(1);
    depthwise::Geometry g;
    depthwise::ForwardGeometry(attrs_, input.shape, filter.shape, &g);
    const Shape out_shape = g.OutputShape();
    depthwise::CheckOutputSize(out_shape, "input, filter and attributes");
    T* out = ctx.Output<T>(0, out_shape);
    if constexpr (kWithCuda) {
      if (ctx.OnCuda()) {
        cuda::DepthwiseForward<T>(g, input.Data<T>(), filter.Data<T>(), out, ctx.Cuda());
        return;
      }
    }
    depthwise::Forward<T>(g, input.Data<T>(), filter.Data<T>(), out, ctx.parallel());
  }

  static void InferShapes(ShapeInference& ctx) {
    const TypeShape input = ctx.Input(0), filter = ctx.Input(1);
    Shape dims(4, -1);
    if (input.rank() == 4 && filter.rank() == 4 && AllKnown(input) && AllKnown(filter)) {
      try {
        depthwise::Geometry g;
        depthwise::ForwardGeometry(InferAttrs(ctx), input.dims, filter.dims, &g);
        dims = g.OutputShape();
      } catch (const OpError&) {
        // Bad attributes or shapes: the kernel reports them at run time, with the node's name.
      }
    }
    InferRank4(ctx, 0, dims);
  }

 private:
  depthwise::Attrs attrs_;
};

template <typename T>
class DepthwiseBackpropInput {
 public:
  static constexpr const char* kName = "DepthwiseConv2dNativeBackpropInput";
  static constexpr bool kHasCudaKernel = true;
  static constexpr unsigned kHostInputs = 1u << 0;  // input_sizes
  explicit DepthwiseBackpropInput(const KernelAttributes& attrs) : attrs_(ReadAttrs(attrs)) {}

  void Compute(KernelContext& ctx) const {
    const Tensor sizes = ctx.Input(0), filter = ctx.Input(1), dy = ctx.Input(2);
    depthwise::Geometry g;
    depthwise::BackpropInputGeometry(attrs_, sizes.shape, sizes.Data<std::int32_t>(), filter.shape, dy.shape, &g);
    const Shape out_shape = g.InputShape();
    depthwise::CheckOutputSize(out_shape, "input_sizes");
    T* out = ctx.Output<T>(0, out_shape);
    if constexpr (kWithCuda) {
      if (ctx.OnCuda()) {
        cuda::DepthwiseBackpropInput<T>(g, filter.Data<T>(), dy.Data<T>(), out, ctx.Cuda());
        return;
      }
    }
    depthwise::BackpropInput<T>(g, filter.Data<T>(), dy.Data<T>(), out, ctx.parallel());
  }

  // The dims are input_sizes' values, unknown at graph-build time.
  static void InferShapes(ShapeInference& ctx) { InferRank4(ctx, 1, Shape(4, -1)); }

 private:
  depthwise::Attrs attrs_;
};

template <typename T>
class DepthwiseBackpropFilter {
 public:
  static constexpr const char* kName = "DepthwiseConv2dNativeBackpropFilter";
  static constexpr bool kHasCudaKernel = true;
  static constexpr unsigned kHostInputs = 1u << 1;  // filter_sizes
  explicit DepthwiseBackpropFilter(const KernelAttributes& attrs) : attrs_(ReadAttrs(attrs)) {}

  void Compute(KernelContext& ctx) const {
    const Tensor input = ctx.Input(0), sizes = ctx.Input(1), dy = ctx.Input(2);
    depthwise::Geometry g;
    depthwise::BackpropFilterGeometry(attrs_, input.shape, sizes.shape, sizes.Data<std::int32_t>(), dy.shape, &g);
    const Shape out_shape = g.FilterShape();
    depthwise::CheckOutputSize(out_shape, "filter_sizes");
    T* out = ctx.Output<T>(0, out_shape);
    if constexpr (kWithCuda) {
      if (ctx.OnCuda()) {
        cuda::DepthwiseBackpropFilter<T>(g, input.Data<T>(), dy.Data<T>(), out, ctx.Cuda());
        return;
      }
    }
    depthwise::BackpropFilter<T>(g, input.Data<T>(), dy.Data<T>(), out, ctx.parallel());
  }

  static void InferShapes(ShapeInference& ctx) { InferRank4(ctx, 0, Shape(4, -1)); }

 private:
  depthwise::Attrs attrs_;
};

template <typename T>
struct DepthwiseOps {
  CustomOp<DepthwiseForward<T>> forward{{ElementType<T>(), ElementType<T>()}, {ElementType<T>()}};
  CustomOp<DepthwiseBackpropInput<T>> backprop_input{{kInt32, ElementType<T>(), ElementType<T>()}, {ElementType<T>()}};
  CustomOp<DepthwiseBackpropFilter<T>> backprop_filter{{ElementType<T>(), kInt32, ElementType<T>()}, {ElementType<T>()}};
};

DepthwiseOps<float> g_float;
DepthwiseOps<double> g_double;
DepthwiseOps<Half> g_half;
DepthwiseOps<BFloat16> g_bfloat16;

const OpRegistrar kRegistered({
    &g_float.forward, &g_float.backprop_input, &g_float.backprop_filter,        //
    &g_double.forward, &g_double.backprop_input, &g_double.backprop_filter,     //
    &g_half.forward, &g_half.backprop_input, &g_half.backprop_filter,           //
    &g_bfloat16.forward, &g_bfloat16.backprop_input, &g_bfloat16.backprop_filter,
});

}  // namespace
}  // namespace ort
}  // namespace tfops
