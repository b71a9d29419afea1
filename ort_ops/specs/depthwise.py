"""DepthwiseConv2dNative and its two backprops (float16, bfloat16, float32, float64)."""
from ort_ops.spec import BFLOAT16, DOUBLE, FLOAT, FLOAT16, INT32, REQUIRED, Attr, OpError, OpSpec, Param, snake_case

FAMILY = "depthwise"

# The library's size cap (docs/semantics.md section 4.5), one for the NumPy kernels, the C++ library
# (cpp_ops/src/kernels/depthwise.h, kMaxOutputElements), these shape functions and the standard lowering:
# no output of more than 2^31 elements (8 GiB of float32, 16 GiB of float64), far beyond any real depthwise
# layer. The backprops' output shapes come from input values (input_sizes, filter_sizes), the forward's from
# the shapes and the padding attributes; a bad value gets this error instead of an allocation failure.
MAX_OUTPUT_ELEMENTS = 1 << 31


def output_size_message(shape, source: str):
    """The cap's message for an output of ``shape`` computed from ``source``, or None within the cap."""
    elements = 1
    for d in shape:
        elements *= int(d)
    if elements <= MAX_OUTPUT_ELEMENTS:
        return None
    dims = "[" + ",".join(str(int(d)) for d in shape) + "]"
    return f"output of shape {dims} (from {source}) is too large to allocate: more than 2^31 elements, this library's cap for one output"
TYPES = {"T": (FLOAT16, BFLOAT16, FLOAT, DOUBLE)}
KERNELS = tuple({"T": t} for t in (FLOAT, DOUBLE, FLOAT16, BFLOAT16))

ATTRS = (
    Attr("strides", "ints", REQUIRED, "4 values in data_format order; batch and depth strides must be 1, rows == cols"),
    Attr("padding", "string", REQUIRED, "SAME, VALID or EXPLICIT", choices=("SAME", "VALID", "EXPLICIT")),
    Attr("explicit_paddings", "ints", [], "EXPLICIT only: 8 values, (before, after) per dim in data_format order"),
    Attr("data_format", "string", "NHWC", "layout of input and output", choices=("NHWC", "NCHW")),
    Attr("dilations", "ints", [1, 1, 1, 1], "4 values in data_format order; batch and depth dilations must be 1"),
)


def spatial_axes(data_format):
    """(row axis, col axis, channel axis) of a 4-D tensor in ``data_format``."""
    return (2, 3, 1) if data_format == "NCHW" else (1, 2, 3)


def check_attrs(op, attrs):
    """Validate strides/dilations/paddings; return (stride, (dil_h, dil_w), explicit pads or None)."""
    fmt = attrs["data_format"]
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
        explicit = ((pads[2 * h], pads[2 * h + 1]), (pads[2 * w], pads[2 * w + 1]))
    else:
        if pads:
            raise OpError(op, "explicit_paddings attribute must be empty if the padding attribute is not EXPLICIT")
        explicit = None
    return strides[h], (dil[h], dil[w]), explicit


def _div_toward_zero(a, b):
    """C++'s ``a / b`` for integers (b > 0)."""
    return -((-a) // b) if a < 0 else a // b


def output_size(op, n, k, stride, dilation, padding, explicit, dim):
    """TF's windowed output size: returns (out, pad_before, pad_after) for one spatial dim (``dim``:
    "rows" or "cols", named in the error)."""
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
    if out < 0:
        raise OpError(
            op,
            f"filter {dim} span {k_eff} (size {k}, dilation {dilation}), more than input {dim} {n} with {padding} "
            f"padding: Computed output size would be negative: {out} [input_size: {n}, effective_filter_size: {k_eff}, "
            f"stride: {stride}]",
        )
    after = max((out - 1) * stride + k_eff - n - before, 0) if out > 0 else 0
    return out, before, after


def _shape_str(shape):
    """A shape as TF prints it: [4,4,2] (unknown dims as ?)."""
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def _nhwc(shape, fmt):
    if shape is None:
        return None
    return (shape[0], shape[2], shape[3], shape[1]) if fmt == "NCHW" else tuple(shape)


def _from_nhwc(shape, fmt):
    return (shape[0], shape[3], shape[1], shape[2]) if fmt == "NCHW" else tuple(shape)


def _forward_dims(op, attrs, inp, filt):
    """Output shape (in data_format) from input and filter shapes with unknown dims as None."""
    stride, (dh, dw), explicit = check_attrs(op, attrs)
    fmt = attrs["data_format"]
    if inp is not None and len(inp) != 4:
        raise OpError(op, f"input must be 4-dimensional{_shape_str(inp)}")
    if filt is not None and len(filt) != 4:
        raise OpError(op, f"filter must be 4-dimensional: {_shape_str(filt)}")
    if inp is None:
        return None
    n, h, w, c = _nhwc(inp, fmt)
    if filt is not None and c is not None and filt[2] is not None and c != filt[2]:
        raise OpError(op, f"input and filter must have the same depth: {c} vs {filt[2]}")
    dims = [n, None, None, None]
    if filt is not None:
        kh, kw, _, m = filt
        if c is not None and m is not None:
            dims[3] = c * m
        explicit = explicit or (None, None)
        if h is not None and kh is not None:
            dims[1] = output_size(op, h, kh, stride, dh, attrs["padding"], explicit[0], "rows")[0]
        if w is not None and kw is not None:
            dims[2] = output_size(op, w, kw, stride, dw, attrs["padding"], explicit[1], "cols")[0]
    return _from_nhwc(dims, fmt)


def _forward_shape(shapes, values, attrs):
    return [_forward_dims("DepthwiseConv2dNative", attrs, shapes[0], shapes[1])]


def _sizes_shape(op, label, index):
    """Output shape of a backprop: the constant input_sizes/filter_sizes, checked as the kernel checks them."""
    name = "input_sizes" if "Input" in op else "filter_sizes"
    depthwise_label = "DepthwiseConv2DBackpropInput" if "Input" in op else "DepthwiseConv2DBackpropFilter"

    def fn(shapes, values, attrs):
        check_attrs(op, attrs)
        sizes = values[index]
        if sizes is None:
            known = shapes[index]
            if known is not None and (len(known) != 1 or known[0] not in (None, 4)):
                raise OpError(op, f"{name} must be a vector of 4 dims, got shape {_shape_str(known)}")
            return [(None,) * 4]
        if sizes.ndim != 1:
            raise OpError(op, f"{label}: {name} input must be 1-dim, not {sizes.ndim}")
        for i, v in enumerate(sizes):
            if v < 0:
                raise OpError(op, f"Dimension {i} of {name} must be >= 0")
        if sizes.size != 4:
            what = "input" if "Input" in op else "filter"
            raise OpError(op, f"{name} has {sizes.size} values: {depthwise_label}: {what} must be 4-dimensional")
        message = output_size_message(sizes, name)
        if message:
            raise OpError(op, message)
        return [tuple(int(v) for v in sizes)]

    return fn


def _spec(name, doc, inputs, shape_fn, deviations):
    return OpSpec(
        name=name,
        family=FAMILY,
        doc=doc,
        inputs=inputs,
        outputs=(Param("output", "T"),),
        attrs=ATTRS,
        type_constraints=TYPES,
        shape_fn=shape_fn,
        reference=f"op_{snake_case(name)}:run",
        kernels=KERNELS,
        deviations=deviations,
    )


DILATIONS = (
    "dilations > 1 compute the true dilated convolution (as TF's default oneDNN build does); TF's Eigen kernel "
    "rejects them in the forward op and silently ignores them in the backprops."
)
NCHW = "NCHW is supported (as in oneDNN builds); TF's Eigen CPU kernel rejects it."
PADDING_TAPS = (
    "Padding taps contribute exact zeros (a non-finite filter tap over padding does not produce NaN); TF's Eigen "
    "kernel multiplies padding in, oneDNN skips it as here."
)
EMPTY_FILTER = (
    "An empty filter (kh or kw = 0) with a non-empty output gives zeros (the empty sum, as TF's Eigen kernel); "
    "TF's oneDNN kernel rejects it."
)
DILATED_EMPTY = (
    "With dilations and an output size of 0 the output is empty; TF's oneDNN kernel returns the input tensor "
    "instead (observed in 2.21)."
)
NCHW_EXPLICIT = (
    "NCHW backprops with EXPLICIT padding are computed; TF's oneDNN build falls back to the NHWC-only Eigen "
    "kernel there and rejects them."
)
ORDER = (
    "Sums follow TF's Eigen kernels' order of operations (float32/float64/float16/bfloat16 bit-exact with oneDNN "
    "off); oneDNN sums in other orders, within the bounds of docs/semantics.md section 4.6."
)

SPECS = (
    _spec(
        "DepthwiseConv2dNative",
        "Depthwise 2-D convolution: each input channel c is convolved with filter[:, :, c, m] for m < M, giving "
        "output channel c*M + m.",
        (Param("input", "T", "[N,H,W,C] or [N,C,H,W]"), Param("filter", "T", "[kh,kw,C,M]")),
        _forward_shape,
        (DILATIONS, NCHW, PADDING_TAPS, EMPTY_FILTER, DILATED_EMPTY, ORDER),
    ),
    _spec(
        "DepthwiseConv2dNativeBackpropInput",
        "Gradient of DepthwiseConv2dNative with respect to its input.",
        (
            Param("input_sizes", INT32, "the 4 dims of the forward input, in data_format order"),
            Param("filter", "T", "[kh,kw,C,M]"),
            Param("out_backprop", "T", "gradient with respect to the forward output"),
        ),
        _sizes_shape("DepthwiseConv2dNativeBackpropInput", "Conv2DBackpropInput", 0),
        (
            DILATIONS,
            NCHW,
            NCHW_EXPLICIT,
            PADDING_TAPS,
            ORDER,
            "An empty out_backprop (channel multiplier 0) gives a zero input gradient; TF 2.21's Eigen kernel returns "
            "uninitialized memory.",
        ),
    ),
    _spec(
        "DepthwiseConv2dNativeBackpropFilter",
        "Gradient of DepthwiseConv2dNative with respect to its filter.",
        (
            Param("input", "T", "the forward input"),
            Param("filter_sizes", INT32, "the 4 dims of the filter, [kh,kw,C,M]"),
            Param("out_backprop", "T", "gradient with respect to the forward output"),
        ),
        _sizes_shape("DepthwiseConv2dNativeBackpropFilter", "Conv2DBackpropFilter", 1),
        (
            DILATIONS,
            NCHW,
            NCHW_EXPLICIT,
            PADDING_TAPS,
            ORDER,
            "An empty out_backprop gives a zero filter gradient; TF 2.21 returns uninitialized memory (PR #126484).",
        ),
    ),
)
