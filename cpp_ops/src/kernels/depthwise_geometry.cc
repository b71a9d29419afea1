// Depthwise geometry and validation (see depthwise.h): the attribute checks, TF's windowed output
// sizes, the backprops' size vectors and the library's output-size cap, in TF's order and wording.
// Every problem is thrown as OpError (kernels/op_error.h). Kept apart from the kernels (depthwise.cc,
// depthwise_nchw.cc): these follow TF's shape rules and messages, the kernels its arithmetic, and the
// CUDA kernels share this file but not those.
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "kernels/depthwise.h"
#include "kernels/op_error.h"

namespace tfops {
namespace depthwise {
namespace {

using i64 = std::int64_t;

struct Axes {
  int h, w, c;
};
Axes AxesOf(const std::string& fmt) { return fmt == "NCHW" ? Axes{2, 3, 1} : Axes{1, 2, 3}; }

// Parsed attributes.
struct Window {
  i64 stride = 1, dil_h = 1, dil_w = 1;
  bool explicit_pad = false;
  i64 pad_h[2] = {0, 0}, pad_w[2] = {0, 0};
};

// Values larger than this in strides/dilations/paddings cannot describe a tensor that fits in
// memory; rejecting them keeps every index computation below far from int64 overflow.
constexpr i64 kMaxWindowValue = std::numeric_limits<std::int32_t>::max();

void ParseWindow(const Attrs& a, Window* w) {
  if (a.data_format != "NHWC" && a.data_format != "NCHW") throw OpError("Invalid data format: " + a.data_format);
  if (a.padding != "SAME" && a.padding != "VALID" && a.padding != "EXPLICIT")
    throw OpError("padding must be SAME, VALID or EXPLICIT, got " + a.padding);
  const Axes ax = AxesOf(a.data_format);
  const auto& s = a.strides;
  if (s.size() != 4) throw OpError("Sliding window strides field must specify 4 dimensions");
  if (s[0] != 1 || s[ax.c] != 1)
    throw OpError("Current implementation does not yet support strides in the batch and depth dimensions.");
  if (s[ax.h] != s[ax.w])
    throw OpError("Current implementation only supports equal length strides in the row and column dimensions.");
  if (s[ax.h] <= 0) throw OpError("Stride must be > 0, but got " + std::to_string(s[ax.h]));
  if (s[ax.h] > kMaxWindowValue) throw OpError("Stride is too large: " + std::to_string(s[ax.h]));
  const auto& d = a.dilations;
  if (d.size() != 4) throw OpError("Sliding window dilations field must specify 4 dimensions");
  if (d[0] != 1 || d[ax.c] != 1)
    throw OpError("Current implementation does not support dilations in the batch and depth dimensions.");
  if (d[ax.h] <= 0 || d[ax.w] <= 0)
    throw OpError("dilations has a value <= 0: Dilated rates should be larger than 0, got [" +
                  std::to_string(d[ax.h]) + ", " + std::to_string(d[ax.w]) + "]");
  if (d[ax.h] > kMaxWindowValue || d[ax.w] > kMaxWindowValue) throw OpError("Dilation rates are too large");
  w->stride = s[ax.h];
  w->dil_h = d[ax.h];
  w->dil_w = d[ax.w];
  const auto& p = a.explicit_paddings;
  if (a.padding == "EXPLICIT") {
    if (p.size() != 8)
      throw OpError("explicit_paddings attribute must contain 8 values, but got: " + std::to_string(p.size()));
    for (i64 v : p)
      if (v < 0) throw OpError("All elements of explicit_paddings must be nonnegative");
    if (p[0] || p[1] || p[2 * ax.c] || p[2 * ax.c + 1])
      throw OpError("explicit_paddings pads the batch or depth dim: "
                    "Nonzero explicit padding in the batch or depth dimensions is not supported");
    for (i64 v : p)
      if (v > kMaxWindowValue) throw OpError("explicit_paddings values are too large");
    w->explicit_pad = true;
    w->pad_h[0] = p[2 * ax.h];
    w->pad_h[1] = p[2 * ax.h + 1];
    w->pad_w[0] = p[2 * ax.w];
    w->pad_w[1] = p[2 * ax.w + 1];
  } else if (!p.empty()) {
    throw OpError("explicit_paddings attribute must be empty if the padding attribute is not EXPLICIT");
  }
}

// TF's windowed output size for one spatial dim (with a true dilation). All operands are far
// below 2^40 here (tensor dims and window values <= 2^31), so int64 arithmetic is exact. `dim`
// ("rows" or "cols") is named in the error.
void OutputSize(const char* dim, i64 n, i64 k, i64 stride, i64 dilation, const std::string& padding,
                const i64 explicit_pad[2], i64* out, i64* before) {
  const i64 k_eff = (k - 1) * dilation + 1;
  i64 o;
  i64 b = 0;
  // Truncating division, as TF's: a window that overhangs the input by less than one stride gives an
  // empty output, not an error (docs/semantics.md section 4).
  if (padding == "VALID") {
    o = (n - k_eff + stride) / stride;
  } else if (padding == "SAME") {
    o = (n + stride - 1) / stride;
    const i64 total = std::max<i64>((o - 1) * stride + k_eff - n, 0);
    b = total / 2;
  } else {
    b = explicit_pad[0];
    o = (n + explicit_pad[0] + explicit_pad[1] - k_eff + stride) / stride;
  }
  if (o < 0) {
    throw OpError(std::string("filter ") + dim + " span " + std::to_string(k_eff) + " (size " + std::to_string(k) +
                  ", dilation " + std::to_string(dilation) + "), more than input " + dim + " " + std::to_string(n) +
                  " with " + padding + " padding: " +
                  "Computed output size would be negative: " + std::to_string(o) +
                  " [input_size: " + std::to_string(n) +
                  ", effective_filter_size: " + std::to_string(k_eff) + ", stride: " + std::to_string(stride) + "]");
  }
  *out = o;
  *before = b;
}

// Fills g's spatial and channel fields from NHWC input dims and the filter shape.
void FinishGeometry(const Attrs& a, const Window& w, i64 n, i64 h, i64 wd, i64 c, i64 kh, i64 kw, i64 m,
                    Geometry* g) {
  g->batch = n;
  g->in_rows = h;
  g->in_cols = wd;
  g->in_depth = c;
  g->filter_rows = kh;
  g->filter_cols = kw;
  g->depth_multiplier = m;
  g->out_depth = c * m;
  g->stride = w.stride;
  g->dilation_rows = w.dil_h;
  g->dilation_cols = w.dil_w;
  g->nchw = a.data_format == "NCHW";
  OutputSize("rows", h, kh, w.stride, w.dil_h, a.padding, w.pad_h, &g->out_rows, &g->pad_top);
  OutputSize("cols", wd, kw, w.stride, w.dil_w, a.padding, w.pad_w, &g->out_cols, &g->pad_left);
  // Sizes built from input_sizes/filter_sizes are not bounded by any tensor here: callers check the
  // tensor they allocate with CheckOutputSize (which cannot overflow) before running a kernel.
}

std::vector<i64> ToNhwc(const std::vector<i64>& s, bool nchw) {
  return nchw ? std::vector<i64>{s[0], s[2], s[3], s[1]} : s;
}

// Reads a 1-D int32 sizes tensor into dims, as TF's TensorShapeUtils::MakeShape does.
void ReadSizes(const char* label, const char* what, const std::vector<i64>& sizes_shape,
               const std::int32_t* sizes, std::vector<i64>* dims) {
  if (sizes_shape.size() != 1)
    throw OpError(std::string(label) + ": " + what + " input must be 1-dim, not " + std::to_string(sizes_shape.size()));
  dims->clear();
  for (i64 i = 0; i < sizes_shape[0]; ++i) {
    if (sizes[i] < 0) throw OpError("Dimension " + std::to_string(i) + " of " + what + " must be >= 0");
    dims->push_back(sizes[i]);
  }
}

// The checks TF's ConvBackpropComputeDimensions makes, with its label. `sizes_name` is the sizes
// vector ("input_sizes" or "filter_sizes") one of the shapes was read from: a wrong count there
// names that vector before TF's message (which names the tensor).
void BackpropDims(const std::string& label, const std::string& sizes_name, const Attrs& a, const Window& w,
                  const std::vector<i64>& input, const std::vector<i64>& filter,
                  const std::vector<i64>& out_backprop, Geometry* g) {
  const auto source = [&](const char* tensor, const std::vector<i64>& s) {
    return sizes_name == std::string(tensor) + "_sizes" ? sizes_name + " has " + std::to_string(s.size()) + " values: "
                                                        : std::string();
  };
  if (input.size() != 4) throw OpError(source("input", input) + label + "input must be 4-dimensional");
  if (filter.size() != 4) throw OpError(source("filter", filter) + label + "filter must be 4-dimensional");
  if (out_backprop.size() != 4) throw OpError(label + "out_backprop must be 4-dimensional");
  const bool nchw = a.data_format == "NCHW";
  const std::vector<i64> in = ToNhwc(input, nchw), dy = ToNhwc(out_backprop, nchw);
  if (in[0] != dy[0]) throw OpError(label + "input and out_backprop must have the same batch size");
  constexpr i64 kInt32Max = std::numeric_limits<std::int32_t>::max();
  if (in[1] > kInt32Max) throw OpError(label + "rows of input too large");
  if (in[2] > kInt32Max) throw OpError(label + "cols of input too large");
  if (in[3] > kInt32Max) throw OpError(label + "depth of input too large");
  if (in[3] != filter[2]) throw OpError(label + "input and filter must have the same in_depth");
  if (filter[2] * filter[3] != dy[3])
    throw OpError("out_backprop depth " + std::to_string(dy[3]) + " is not in_depth " + std::to_string(filter[2]) +
                  " * depth_multiplier " + std::to_string(filter[3]) + ": " + label +
                  "depth_multiplier * in_depth not equal to out_depth");
  // TF's output-size message carries no label.
  FinishGeometry(a, w, in[0], in[1], in[2], in[3], filter[0], filter[1], filter[3], g);
  if (g->out_rows != dy[1])
    throw OpError(label + "Number of rows of out_backprop doesn't match computed: actual = " + std::to_string(dy[1]) +
                  ", computed = " + std::to_string(g->out_rows));
  if (g->out_cols != dy[2])
    throw OpError(label + "Number of cols of out_backprop doesn't match computed: actual = " + std::to_string(dy[2]) +
                  ", computed = " + std::to_string(g->out_cols));
}

}  // namespace

std::vector<i64> Geometry::InputShape() const {
  return nchw ? std::vector<i64>{batch, in_depth, in_rows, in_cols}
              : std::vector<i64>{batch, in_rows, in_cols, in_depth};
}
std::vector<i64> Geometry::OutputShape() const {
  return nchw ? std::vector<i64>{batch, out_depth, out_rows, out_cols}
              : std::vector<i64>{batch, out_rows, out_cols, out_depth};
}

void CheckOutputSize(const std::vector<i64>& shape, const char* source) {
  i64 elements = 1;
  for (i64 d : shape) {
    if (d == 0) return;
  }
  for (i64 d : shape) {
    if (d < 0 || elements > kMaxOutputElements / d) {
      throw OpError("output of shape " + ShapeString(shape) + " (from " + source +
                    ") is too large to allocate: more than 2^31 elements, this library's cap for one output");
    }
    elements *= d;
  }
}

void CheckAttrs(const Attrs& attrs) {
  Window w;
  ParseWindow(attrs, &w);
}

void ForwardGeometry(const Attrs& a, const std::vector<i64>& input_shape, const std::vector<i64>& filter_shape,
                     Geometry* g) {
  Window w;
  ParseWindow(a, &w);
  if (input_shape.size() != 4) throw OpError("input must be 4-dimensional" + ShapeString(input_shape));
  if (filter_shape.size() != 4) throw OpError("filter must be 4-dimensional: " + ShapeString(filter_shape));
  const std::vector<i64> in = ToNhwc(input_shape, a.data_format == "NCHW");
  if (in[3] != filter_shape[2])
    throw OpError("input and filter must have the same depth: " + std::to_string(in[3]) + " vs " +
                  std::to_string(filter_shape[2]));
  if (in[1] > std::numeric_limits<std::int32_t>::max()) throw OpError("Input rows too large");
  if (in[2] > std::numeric_limits<std::int32_t>::max()) throw OpError("Input cols too large");
  FinishGeometry(a, w, in[0], in[1], in[2], in[3], filter_shape[0], filter_shape[1], filter_shape[3], g);
}

void BackpropInputGeometry(const Attrs& a, const std::vector<i64>& input_sizes_shape,
                           const std::int32_t* input_sizes, const std::vector<i64>& filter_shape,
                           const std::vector<i64>& out_backprop_shape, Geometry* g) {
  Window w;
  ParseWindow(a, &w);
  std::vector<i64> input;
  ReadSizes("Conv2DBackpropInput", "input_sizes", input_sizes_shape, input_sizes, &input);
  BackpropDims("DepthwiseConv2DBackpropInput: ", "input_sizes", a, w, input, filter_shape, out_backprop_shape, g);
}

void BackpropFilterGeometry(const Attrs& a, const std::vector<i64>& input_shape,
                            const std::vector<i64>& filter_sizes_shape, const std::int32_t* filter_sizes,
                            const std::vector<i64>& out_backprop_shape, Geometry* g) {
  Window w;
  ParseWindow(a, &w);
  std::vector<i64> filter;
  ReadSizes("Conv2DBackpropFilter", "filter_sizes", filter_sizes_shape, filter_sizes, &filter);
  BackpropDims("DepthwiseConv2DBackpropFilter: ", "filter_sizes", a, w, input_shape, filter, out_backprop_shape,
               g);
}
}  // namespace depthwise
}  // namespace tfops
