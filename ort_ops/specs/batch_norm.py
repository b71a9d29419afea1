"""FusedBatchNorm{,V2,V3} and FusedBatchNormGrad{,V2,V3}."""
from ort_ops.spec import BFLOAT16, FLOAT, FLOAT16, Attr, OpError, OpSpec, Param, snake_case

FAMILY = "batch_norm"

FORMATS_4D = ("NHWC", "NCHW")
FORMATS_5D = FORMATS_4D + ("NDHWC", "NCDHW")

EPSILON = Attr("epsilon", "float", 0.0001, "added to the variance before the reciprocal square root")
AVG_FACTOR = Attr(
    "exponential_avg_factor", "float", 1.0, "training: weight of this batch in the running mean/variance outputs"
)
IS_TRAINING = Attr("is_training", "bool", True, "1: normalize with batch statistics; 0: with the given population ones")


def _format_attr(choices):
    return Attr("data_format", "string", "NHWC", "layout of x (channels last or channels first)", choices=choices)


def _dims(shape):
    """A shape as TF's TensorShape::DebugString writes it (``[2,3,?]``), so messages read like TF's."""
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def rank_message(name, shape):
    """TF says "input" for x and for y_backprop alike; the message names the input at fault."""
    return f"{name} has rank {len(shape)}: input must be 4 or 5-dimensional{_dims(shape)}"


def vector_message(name, label, shape):
    """TF's rank message for a [C] statistic, which uses its own label (``saved mean`` for
    reserve_space_1, ``estimated_mean`` for mean); the input's name leads where the label differs."""
    tf_message = f"{label} must be 1-dimensional{_dims(shape)}"
    return tf_message if name == label else f"{name} has rank {len(shape)}: {tf_message}"


def data_format_message(data_format, formats):
    return f'Invalid data format: data_format "{data_format}" is not one of {", ".join(formats)}'


def _channels(op, shape, data_format, name="x"):
    if shape is None:
        return None
    if len(shape) not in (4, 5):
        raise OpError(op, rank_message(name, shape))
    return shape[1] if data_format.startswith("NC") else shape[-1]


def _check_stat(op, name, rank_label, size_label, s, c, prefix=""):
    """The [C] statistic ``name``: 1-D, and (unless ``size_label`` is None) C elements when both are
    known. TF names some inputs differently in its rank and size messages, hence two labels."""
    if s is None:
        return
    if len(s) != 1:
        raise OpError(op, vector_message(name, rank_label, s))
    if size_label is not None and c is not None and s[0] is not None and s[0] != c:
        raise OpError(
            op, f"{prefix}{size_label} must have the same number of elements as the channels of x, got {s[0]} and {c}"
        )


def _forward_shape(op, version):
    def fn(shapes, values, attrs):
        x = shapes[0]
        c = _channels(op, x, attrs["data_format"])
        names = ("scale", "offset", "mean", "variance")
        for name, rank_label, s in zip(names, ("scale", "offset", "estimated_mean", "estimated_variance"), shapes[1:5]):
            _check_stat(op, name, rank_label, None, s, c)  # TF checks every rank before any size
        for name, s in zip(("scale", "offset"), shapes[1:3]):
            _check_stat(op, name, name, name, s, c)
            if c is None and s is not None:
                c = s[0]
        # mean/variance are read (and their size checked) only in inference or when averaging.
        training, f = attrs["is_training"], attrs["exponential_avg_factor"]
        reads_stats = not training or f != 1.0
        prefix = "When is_training=false, " if not training else "When exponential_avg_factor != 1, "
        _check_stat(op, "mean", "estimated_mean", "mean" if reads_stats else None, shapes[3], c, prefix)
        _check_stat(op, "variance", "estimated_variance", "variance" if reads_stats else None, shapes[4], c, prefix)
        outs = [x, (c,), (c,), (c,), (c,)]
        if version == 3:
            outs.append(())
        return outs

    return fn


def _grad_shape(op, version):
    def fn(shapes, values, attrs):
        dy, x = shapes[0], shapes[1]
        for name, s in (("y_backprop", dy), ("x", x)):
            if s is not None and len(s) not in (4, 5):
                raise OpError(op, rank_message(name, s))
        if dy is not None and x is not None and (
            len(dy) != len(x) or any(a is not None and b is not None and a != b for a, b in zip(dy, x))
        ):
            raise OpError(
                op, f"x and y_backprop must have same shape, but x has shape {_dims(x)} and y_backprop has shape {_dims(dy)}"
            )
        x = x if x is not None else dy
        c = _channels(op, x, attrs["data_format"])
        names = ("scale", "reserve_space_1", "reserve_space_2")
        for name, rank_label, s in zip(names, ("scale", "saved mean", "saved variance"), shapes[2:5]):
            _check_stat(op, name, rank_label, None, s, c)  # TF checks every rank before any size
        for name, s in zip(names, shapes[2:5]):
            _check_stat(op, name, name, name, s, c)
        if c is None and shapes[2] is not None:
            c = shapes[2][0]
        return [x, (c,), (c,), (0,), (0,)]

    return fn


def _forward(name, version, types, kernels, inputs_type, formats):
    u = inputs_type
    return OpSpec(
        name=name,
        family=FAMILY,
        doc="Batch normalization of a 4-D or 5-D tensor over all dims but the channel dim.",
        inputs=(
            Param("x", "T", "input, 4-D or 5-D (TF's kernels take both, with oneDNN off or on); the channel dim is the "
                  "last one for NHWC" + (" and NDHWC" if version == 3 else "") + ", dim 1 for NCHW"
                  + (" and NCDHW" if version == 3 else "")),
            Param("scale", u, "[C] gamma"),
            Param("offset", u, "[C] beta"),
            Param("mean", u, "[C] population mean; read when is_training=0 or exponential_avg_factor != 1"),
            Param("variance", u, "[C] population variance; read as mean is"),
        ),
        outputs=(
            Param("y", "T"),
            Param("batch_mean", u, "training: the (running) mean; inference: `mean` copied"),
            Param("batch_variance", u, "training: the (running) Bessel-corrected variance; inference: `variance` copied"),
            Param("reserve_space_1", u, "the mean the gradient op needs"),
            Param("reserve_space_2", u, "the biased variance the gradient op needs"),
        )
        + ((Param("reserve_space_3", u, "scalar 0 (unused on CPU; see the deviations for its shape)",
                  placeholder=True),) if version == 3 else ()),
        attrs=(EPSILON, AVG_FACTOR, _format_attr(formats), IS_TRAINING),
        type_constraints=types,
        shape_fn=_forward_shape(name, version),
        reference=f"op_{snake_case(name)}:run",
        kernels=kernels,
        deviations=(
            "reserve_space_1/2 hold the given mean/variance in inference mode and zeros for an empty x; TF's Eigen "
            "kernel leaves them uninitialized there (oneDNN copies the statistics, as here).",
            "rsqrt is the correctly rounded 1/sqrt; TF's AVX path uses the RSQRTPS estimate plus a Newton step for the "
            "channels filling whole 8-float packets, which depends on the CPU vendor, so those channels may differ in "
            "the last bits (the rest match bit for bit).",
        )
        + (("reserve_space_3 is a scalar, the shape TF's Eigen kernel gives; with oneDNN on, TF gives it shape [0]. "
            "Nothing reads it (the gradient op accepts any shape).",) if version == 3 else ()),
    )


def _grad(name, version, types, kernels, stats_type, scale_type, formats):
    u = stats_type
    inputs = (
        Param("y_backprop", "T", "gradient with respect to y"),
        Param("x", "T", "the forward op's input"),
        Param("scale", scale_type, "[C] gamma"),
        Param("reserve_space_1", u, "training: the batch mean; inference: the population mean"),
        Param("reserve_space_2", u, "training: the biased batch variance; inference: the population variance"),
    )
    if version == 3:
        inputs += (Param("reserve_space_3", u, "the forward op's reserve_space_3 (unused on CPU, any shape)"),)
    spare = ("reserve_space_4", "reserve_space_5") if version == 3 else ("reserve_space_3", "reserve_space_4")
    return OpSpec(
        name=name,
        family=FAMILY,
        doc="Gradient of the matching FusedBatchNorm with respect to x, scale and offset; x is 4-D or 5-D.",
        inputs=inputs,
        outputs=(
            Param("x_backprop", "T"),
            Param("scale_backprop", u),
            Param("offset_backprop", u),
            Param(spare[0], u, "empty, shape [0] (unused; see the deviations)", placeholder=True),
            Param(spare[1], u, "empty, shape [0] (unused; see the deviations)", placeholder=True),
        ),
        attrs=(EPSILON, _format_attr(formats), IS_TRAINING),
        type_constraints=types,
        shape_fn=_grad_shape(name, version),
        reference=f"op_{snake_case(name)}:run",
        kernels=kernels,
        deviations=(
            "is_training=0 accepts NCHW/NCDHW (computed as the transposed NHWC problem); TF's Eigen kernel rejects it "
            "while its Python gradient transposes around it, and oneDNN accepts it.",
            "rsqrt is the correctly rounded 1/sqrt; TF's AVX path uses the RSQRTPS estimate plus a Newton step for the "
            "channels filling whole 8-float packets, so those channels may differ in the last bits (the rest match "
            "bit for bit).",
            f"{spare[0]} and {spare[1]} have shape [0], the shape TF's Eigen kernel gives; with oneDNN on, TF gives "
            "them as scalars. Nothing reads them.",
            "For an empty 5-D x, x_backprop has x's shape; TF 2.21's Eigen kernel returns it 4-D (two dims merged).",
        ),
    )


_V1_TYPES = {"T": (FLOAT,)}
_V1_KERNELS = ({"T": FLOAT},)
_MIXED_TYPES = {"T": (FLOAT16, BFLOAT16, FLOAT), "U": (FLOAT,)}
_MIXED_KERNELS = tuple({"T": t, "U": FLOAT} for t in (FLOAT, FLOAT16, BFLOAT16))

SPECS = (
    _forward("FusedBatchNorm", 1, _V1_TYPES, _V1_KERNELS, "T", FORMATS_4D),
    _forward("FusedBatchNormV2", 2, _MIXED_TYPES, _MIXED_KERNELS, "U", FORMATS_4D),
    _forward("FusedBatchNormV3", 3, _MIXED_TYPES, _MIXED_KERNELS, "U", FORMATS_5D),
    _grad("FusedBatchNormGrad", 1, _V1_TYPES, _V1_KERNELS, "T", "T", FORMATS_4D),
    _grad("FusedBatchNormGradV2", 2, _MIXED_TYPES, _MIXED_KERNELS, "U", FLOAT, FORMATS_4D),
    _grad("FusedBatchNormGradV3", 3, _MIXED_TYPES, _MIXED_KERNELS, "U", FLOAT, FORMATS_5D),
)
