"""Every rule of DepthwiseConv2dNative and its two backprops, each written once, and the window geometry.

The spec's shape functions (``ort_ops.specs.depthwise``) are built from these checks, and through
``OpSpec.validate`` they guard the NumPy kernels, the standard lowerings and the custom lowering's
handler. Element types are not checked here: the spec's type constraints and kernels do that.
The geometry (``window``, ``window_size``) is pure and shared by the checks, the kernels and the
standard lowering.

Each check works on partial facts: a shape is a tuple of dims (int, or None when unknown) or None
(unknown rank), and what is unknown is not checked. The order and the messages are TF's, which the C++
library (cpp_ops/src/kernels/depthwise.cc) follows: the attributes, the sizes vector, the ranks, the
depths, the output size and, for the backprops, out_backprop's size; then the library's size cap.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from ort_ops.spec import OpError, tf_shape

FORWARD = "DepthwiseConv2dNative"
BACKPROP_INPUT = "DepthwiseConv2dNativeBackpropInput"
BACKPROP_FILTER = "DepthwiseConv2dNativeBackpropFilter"

INT32_MAX = 2**31 - 1

# The library's size cap (docs/semantics.md section 4.5), one for the NumPy kernels, the C++ library
# (cpp_ops/src/kernels/depthwise.h, kMaxOutputElements), these shape functions and the standard lowering:
# no output of more than 2^31 elements (8 GiB of float32, 16 GiB of float64), far beyond any real depthwise
# layer. The backprops' output shapes come from input values (input_sizes, filter_sizes), the forward's from
# the shapes and the padding attributes; a bad value gets this error instead of an allocation failure.
MAX_OUTPUT_ELEMENTS = 1 << 31

# What each op's output shape is computed from, for the size cap's message.
SIZE_SOURCES = {
    FORWARD: "input, filter and attributes",
    BACKPROP_INPUT: "input_sizes",
    BACKPROP_FILTER: "filter_sizes",
}


@dataclasses.dataclass(frozen=True)
class Backprop:
    """How TF names things in a backprop's messages."""

    label: str  # in front of ConvBackpropComputeDimensions' messages
    sizes: str  # the input holding a shape as a vector
    sizes_index: int
    sizes_label: str  # in front of the sizes vector's rank message (shared with Conv2D)
    tensor: str  # the tensor whose shape the sizes vector holds


BACKPROPS = {
    BACKPROP_INPUT: Backprop("DepthwiseConv2DBackpropInput", "input_sizes", 0, "Conv2DBackpropInput", "input"),
    BACKPROP_FILTER: Backprop("DepthwiseConv2DBackpropFilter", "filter_sizes", 1, "Conv2DBackpropFilter", "filter"),
}


@dataclasses.dataclass(frozen=True)
class Window:
    """The spatial part of valid attributes: one stride, (rows, cols) dilations, the padding and,
    for EXPLICIT, ((top, bottom), (left, right))."""

    stride: int
    dilations: Tuple[int, int]
    padding: str
    explicit: Optional[Tuple[Tuple[int, int], Tuple[int, int]]]


def spatial_axes(data_format):
    """(row axis, col axis, channel axis) of a 4-D tensor in ``data_format``."""
    return (2, 3, 1) if data_format == "NCHW" else (1, 2, 3)


def shape_to_nhwc(shape, data_format):
    """A 4-D shape in data_format order as (N, H, W, C); None stays None."""
    if shape is None:
        return None
    return (shape[0], shape[2], shape[3], shape[1]) if data_format == "NCHW" else tuple(shape)


def shape_from_nhwc(shape, data_format):
    return (shape[0], shape[3], shape[1], shape[2]) if data_format == "NCHW" else tuple(shape)


def window(attrs) -> Window:
    """The window of attributes that passed ``check_attrs``."""
    h, w, _ = spatial_axes(attrs["data_format"])
    pads = attrs["explicit_paddings"]
    explicit = ((pads[2 * h], pads[2 * h + 1]), (pads[2 * w], pads[2 * w + 1])) if attrs["padding"] == "EXPLICIT" else None
    dil = attrs["dilations"]
    return Window(attrs["strides"][h], (dil[h], dil[w]), attrs["padding"], explicit)


def check_attrs(op, attrs) -> Window:
    """strides, dilations, padding and explicit_paddings, as TF checks them; returns the window."""
    fmt = attrs["data_format"]
    if fmt not in ("NHWC", "NCHW"):
        raise OpError(op, f"Invalid data format: {fmt}")
    if attrs["padding"] not in ("SAME", "VALID", "EXPLICIT"):
        raise OpError(op, f"padding must be SAME, VALID or EXPLICIT, got {attrs['padding']}")
    h, w, c = spatial_axes(fmt)
    strides = attrs["strides"]
    if len(strides) != 4:
        raise OpError(op, "Sliding window strides field must specify 4 dimensions")
    if strides[0] != 1 or strides[c] != 1:
        raise OpError(op, "Current implementation does not yet support strides in the batch and depth dimensions.")
    if strides[h] != strides[w]:
        raise OpError(op, "Current implementation only supports equal length strides in the row and column dimensions.")
    if strides[h] <= 0:
        raise OpError(op, f"Stride must be > 0, but got {strides[h]}")
    dil = attrs["dilations"]
    if len(dil) != 4:
        raise OpError(op, "Sliding window dilations field must specify 4 dimensions")
    if dil[0] != 1 or dil[c] != 1:
        raise OpError(op, "Current implementation does not support dilations in the batch and depth dimensions.")
    if dil[h] <= 0 or dil[w] <= 0:
        raise OpError(op, f"dilations has a value <= 0: Dilated rates should be larger than 0, got {[dil[h], dil[w]]}")
    pads = attrs["explicit_paddings"]
    if attrs["padding"] == "EXPLICIT":
        if len(pads) != 8:
            raise OpError(op, f"explicit_paddings attribute must contain 8 values, but got: {len(pads)}")
        if any(p < 0 for p in pads):
            raise OpError(op, "All elements of explicit_paddings must be nonnegative")
        if pads[0] or pads[1] or pads[2 * c] or pads[2 * c + 1]:
            raise OpError(
                op,
                "explicit_paddings pads the batch or depth dim: "
                "Nonzero explicit padding in the batch or depth dimensions is not supported",
            )
    elif pads:
        raise OpError(op, "explicit_paddings attribute must be empty if the padding attribute is not EXPLICIT")
    return window(attrs)


def _div_toward_zero(a, b):
    """C++'s ``a / b`` for integers (b > 0)."""
    return -((-a) // b) if a < 0 else a // b


def window_size(n, k, stride, dilation, padding, explicit):
    """TF's windowed output size for one spatial dim: (out, pad_before, pad_after); out < 0 when the
    window does not fit (``output_size`` rejects that). ``explicit``: (before, after) for EXPLICIT."""
    k_eff = (k - 1) * dilation + 1
    # TF divides with C++'s truncation toward zero: a window that overhangs the input by less than one
    # stride gives an empty output, not an error (floor division would say -1).
    if padding == "VALID":
        out = _div_toward_zero(n - k_eff + stride, stride)
        before = 0
    elif padding == "SAME":
        out = (n + stride - 1) // stride
        total = max((out - 1) * stride + k_eff - n, 0)
        before = total // 2
    else:
        before, after = explicit
        out = _div_toward_zero(n + before + after - k_eff + stride, stride)
    after = max((out - 1) * stride + k_eff - n - before, 0) if out > 0 else 0
    return out, before, after


def output_size(op, n, k, stride, dilation, padding, explicit, dim):
    """``window_size``, with TF's error for a negative size (``dim``: "rows" or "cols", named in it)."""
    out, before, after = window_size(n, k, stride, dilation, padding, explicit)
    if out < 0:
        k_eff = (k - 1) * dilation + 1
        raise OpError(
            op,
            f"filter {dim} span {k_eff} (size {k}, dilation {dilation}), more than input {dim} {n} with {padding} "
            f"padding: Computed output size would be negative: {out} [input_size: {n}, effective_filter_size: {k_eff}, "
            f"stride: {stride}]",
        )
    return out, before, after


def _spatial_outputs(op, win: Window, h, w, kh, kw):
    """(out rows, out cols), each None where its input or filter size is unknown; rows are checked
    before cols, both before the caller compares them with anything."""
    explicit = win.explicit or (None, None)
    sizes = []
    for axis, (n, k, dim) in enumerate(((h, kh, "rows"), (w, kw, "cols"))):
        known = n is not None and k is not None
        sizes.append(output_size(op, n, k, win.stride, win.dilations[axis], win.padding, explicit[axis], dim)[0]
                     if known else None)
    return sizes


def check_forward(op, win: Window, data_format, input_shape, filter_shape):
    """DepthwiseConv2dNative's rules on the input and filter shapes; returns the output shape in
    data_format order (None where unknown; None altogether when the input's rank is)."""
    if input_shape is not None and len(input_shape) != 4:
        raise OpError(op, f"input must be 4-dimensional{tf_shape(input_shape)}")
    if filter_shape is not None and len(filter_shape) != 4:
        raise OpError(op, f"filter must be 4-dimensional: {tf_shape(filter_shape)}")
    n, h, w, c = shape_to_nhwc(input_shape, data_format) or (None,) * 4
    kh, kw, depth, m = filter_shape or (None,) * 4
    if c is not None and depth is not None and c != depth:
        raise OpError(op, f"input and filter must have the same depth: {c} vs {depth}")
    for what, v in (("rows", h), ("cols", w)):
        if v is not None and v > INT32_MAX:
            raise OpError(op, f"Input {what} too large")
    if input_shape is None:
        return None
    depth = c if c is not None else depth
    oh, ow = _spatial_outputs(op, win, h, w, kh, kw)
    out_depth = depth * m if depth is not None and m is not None else None
    return shape_from_nhwc((n, oh, ow, out_depth), data_format)


def check_sizes(op, shape, value):
    """A backprop's input_sizes/filter_sizes: a vector of non-negative dims. Returns the dims it holds
    (None where unknown; None altogether when even their number is). Their count is checked with the
    other ranks (``check_backprop``), as TF does."""
    bp = BACKPROPS[op]
    rank = value.ndim if value is not None else None if shape is None else len(shape)
    if rank is not None and rank != 1:
        raise OpError(op, f"{bp.sizes_label}: {bp.sizes} input must be 1-dim, not {rank}")
    if value is None:
        return None if shape is None or shape[0] is None else (None,) * shape[0]
    for i, v in enumerate(value):
        if v < 0:
            raise OpError(op, f"Dimension {i} of {bp.sizes} must be >= 0")
    return tuple(int(v) for v in value)


def check_backprop(op, win: Window, data_format, input_shape, filter_shape, dy_shape) -> None:
    """The rules of TF's ConvBackpropComputeDimensions as the depthwise backprops apply them, with TF's
    label in front of each message. One of the shapes was read from the sizes vector."""
    bp = BACKPROPS[op]
    label = bp.label
    for name, shape in (("input", input_shape), ("filter", filter_shape), ("out_backprop", dy_shape)):
        if shape is not None and len(shape) != 4:
            # TF's message names the tensor; a shape read from input_sizes/filter_sizes names that vector.
            source = f"{bp.sizes} has {len(shape)} values: " if name == bp.tensor else ""
            raise OpError(op, f"{source}{label}: {name} must be 4-dimensional")
    n, h, w, c = shape_to_nhwc(input_shape, data_format) or (None,) * 4
    dn, dh, dw, dc = shape_to_nhwc(dy_shape, data_format) or (None,) * 4
    kh, kw, depth, m = filter_shape or (None,) * 4
    if n is not None and dn is not None and n != dn:
        raise OpError(op, f"{label}: input and out_backprop must have the same batch size")
    for what, v in (("rows", h), ("cols", w), ("depth", c)):
        if v is not None and v > INT32_MAX:
            raise OpError(op, f"{label}: {what} of input too large")
    if c is not None and depth is not None and c != depth:
        raise OpError(op, f"{label}: input and filter must have the same in_depth")
    depth = depth if depth is not None else c
    if depth is not None and m is not None and dc is not None and depth * m != dc:
        raise OpError(
            op,
            f"out_backprop depth {dc} is not in_depth {depth} * depth_multiplier {m}: "
            f"{label}: depth_multiplier * in_depth not equal to out_depth",
        )
    computed = _spatial_outputs(op, win, h, w, kh, kw)  # TF's output-size message carries no label
    for what, actual, want in (("rows", dh, computed[0]), ("cols", dw, computed[1])):
        if actual is not None and want is not None and actual != want:
            raise OpError(
                op, f"{label}: Number of {what} of out_backprop doesn't match computed: actual = {actual}, computed = {want}"
            )


def output_size_message(shape, source: str):
    """The cap's message for an output of ``shape`` computed from ``source``, or None within the cap."""
    elements = 1
    for d in shape:
        elements *= int(d)
    if elements <= MAX_OUTPUT_ELEMENTS:
        return None
    return (f"output of shape {tf_shape(shape)} (from {source}) is too large to allocate: more than 2^31 elements, "
            "this library's cap for one output")


def check_output_cap(op, shape) -> None:
    """The library's size cap on an output shape (data_format order), once all its dims are known."""
    if shape is None or any(d is None for d in shape):
        return
    message = output_size_message(shape, SIZE_SOURCES[op])
    if message:
        raise OpError(op, message)
