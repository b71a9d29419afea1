"""DepthwiseConv2dNative and its two backprops (float16, bfloat16, float32, float64)."""
from ort_ops.checks import depthwise as checks
from ort_ops.spec import BFLOAT16, DOUBLE, FLOAT, FLOAT16, INT32, REQUIRED, Attr, OpSpec, Param, snake_case

FAMILY = "depthwise"

TYPES = {"T": (FLOAT16, BFLOAT16, FLOAT, DOUBLE)}
KERNELS = tuple({"T": t} for t in (FLOAT, DOUBLE, FLOAT16, BFLOAT16))

ATTRS = (
    Attr("strides", "ints", REQUIRED, "4 values in data_format order; batch and depth strides must be 1, rows == cols"),
    Attr("padding", "string", REQUIRED, "SAME, VALID or EXPLICIT", choices=("SAME", "VALID", "EXPLICIT")),
    Attr("explicit_paddings", "ints", [], "EXPLICIT only: 8 values, (before, after) per dim in data_format order"),
    Attr("data_format", "string", "NHWC", "layout of input and output", choices=("NHWC", "NCHW")),
    Attr("dilations", "ints", [1, 1, 1, 1], "4 values in data_format order; batch and depth dilations must be 1"),
)


def _forward_shape(shapes, values, attrs):
    op = checks.FORWARD
    window = checks.check_attrs(op, attrs)
    out = checks.check_forward(op, window, attrs["data_format"], shapes[0], shapes[1])
    checks.check_output_cap(op, out)
    return [out]


def _backprop_shape(op):
    """A backprop's output shape is the value of its sizes vector (unknown dims where it is not constant)."""
    which = checks.BACKPROPS[op]

    def fn(shapes, values, attrs):
        window = checks.check_attrs(op, attrs)
        index = which.sizes_index
        sizes = checks.check_sizes(op, shapes[index], values[index])
        tensors = list(shapes)
        tensors[index] = sizes
        checks.check_backprop(op, window, attrs["data_format"], *tensors)
        checks.check_output_cap(op, sizes)
        return [sizes if sizes is not None else (None,) * 4]

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
        _backprop_shape(checks.BACKPROP_INPUT),
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
        _backprop_shape(checks.BACKPROP_FILTER),
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
