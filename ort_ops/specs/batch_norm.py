"""FusedBatchNorm{,V2,V3} and FusedBatchNormGrad{,V2,V3}."""
from ort_ops.checks import batch_norm as checks
from ort_ops.checks.batch_norm import FORMATS_4D, FORMATS_5D
from ort_ops.spec import BFLOAT16, FLOAT, FLOAT16, Attr, OpSpec, Param, snake_case

FAMILY = "batch_norm"

EPSILON = Attr("epsilon", "float", 0.0001, "added to the variance before the reciprocal square root")
AVG_FACTOR = Attr(
    "exponential_avg_factor", "float", 1.0, "training: weight of this batch in the running mean/variance outputs"
)
IS_TRAINING = Attr("is_training", "bool", True, "1: normalize with batch statistics; 0: with the given population ones")


def _format_attr(choices):
    return Attr("data_format", "string", "NHWC", "layout of x (channels last or channels first)", choices=choices)


def _forward_shape(op, version, formats):
    def fn(shapes, values, attrs):
        c = checks.check_forward(op, formats, shapes, attrs)
        outs = [shapes[0], (c,), (c,), (c,), (c,)]
        if version == 3:
            outs.append(())  # reserve_space_3: a scalar on TF's CPU
        return outs

    return fn


def _grad_shape(op, formats):
    def fn(shapes, values, attrs):
        c = checks.check_grad(op, formats, shapes, attrs)
        return [checks.merged_shape(shapes[1], shapes[0]), (c,), (c,), (0,), (0,)]

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
        shape_fn=_forward_shape(name, version, formats),
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
        shape_fn=_grad_shape(name, formats),
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
