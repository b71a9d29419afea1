"""FakeQuantWithMinMax{Args,Vars,VarsPerChannel} and their gradients (float32 only)."""
from ort_ops.checks import fake_quant as rules
from ort_ops.spec import FLOAT, Attr, OpSpec, Param, snake_case

FAMILY = "fake_quant"

NUM_BITS = Attr("num_bits", "int", 8, "bit width of the quantization grid, 2..16")
NARROW_RANGE = Attr("narrow_range", "bool", False, "1: the grid is [1, 2^num_bits - 1] instead of [0, 2^num_bits - 1]")
ARGS_ATTRS = (
    Attr("min", "float", -6.0, "lower end of the range (must be < max)"),
    Attr("max", "float", 6.0, "upper end of the range"),
    NUM_BITS,
    NARROW_RANGE,
)
VARS_ATTRS = (NUM_BITS, NARROW_RANGE)
CHANNEL_AXIS = Attr(
    "axis", "int", -1,
    "the channel dim of `inputs` that min/max index: -1 (TF's only behaviour) is the last dim, else 0..rank-1",
)
PER_CHANNEL_ATTRS = (NUM_BITS, NARROW_RANGE, CHANNEL_AXIS)

X = Param("inputs", FLOAT, "values to quantize")
G = Param("gradients", FLOAT, "gradient flowing into the op's output")
MIN0 = Param("min", FLOAT, "scalar lower end of the range")
MAX0 = Param("max", FLOAT, "scalar upper end of the range")
MIN1 = Param("min", FLOAT, "per-channel lower ends, shape [d] (d = dim `axis` of inputs, the last by default)")
MAX1 = Param("max", FLOAT, "per-channel upper ends, shape [d]")


def _args_shape(shapes, values, attrs):
    op = "FakeQuantWithMinMaxArgs"
    rules.args_range(op, attrs)
    rules.num_bits(op, attrs)
    return [shapes[0]]


def _args_grad_shape(shapes, values, attrs):
    op = "FakeQuantWithMinMaxArgsGradient"
    rules.args_range(op, attrs)
    rules.num_bits(op, attrs)
    return [rules.same_shape_binary(op, shapes[0], shapes[1])]


def _vars_shape(shapes, values, attrs):
    op = "FakeQuantWithMinMaxVars"
    rules.num_bits(op, attrs)
    rules.scalar_range(op, shapes[1], shapes[2])
    return [shapes[0]]


def _vars_grad_shape(shapes, values, attrs):
    op = "FakeQuantWithMinMaxVarsGradient"
    rules.num_bits(op, attrs)
    x = rules.gradient_same_size(op, shapes[0], shapes[1])
    rules.scalar_range(op, shapes[2], shapes[3])
    return [x, (), ()]


def _per_channel_shape(shapes, values, attrs):
    op = "FakeQuantWithMinMaxVarsPerChannel"
    rules.num_bits(op, attrs)
    rules.channel_count(op, shapes[0], shapes[1], shapes[2], attrs["axis"])
    return [shapes[0]]


def _per_channel_grad_shape(shapes, values, attrs):
    op = "FakeQuantWithMinMaxVarsPerChannelGradient"
    rules.num_bits(op, attrs)
    x = rules.gradient_same_size(op, shapes[0], shapes[1])
    d = rules.channel_count(op, x, shapes[2], shapes[3], attrs["axis"])
    return [x, (d,), (d,)]


def _spec(name, doc, inputs, outputs, attrs, shape_fn, deviations=()):
    return OpSpec(
        name=name,
        family=FAMILY,
        doc=doc,
        inputs=inputs,
        outputs=outputs,
        attrs=attrs,
        type_constraints={},
        shape_fn=shape_fn,
        reference=f"op_{snake_case(name)}:run",
        kernels=({},),
        deviations=deviations,
    )


PER_CHANNEL_RANK_FIX = (
    "A scalar `inputs` is rejected with 'input must be at least rank 1'; TF 2.21 aborts the process "
    "(CHECK failure, TF issues #63351/#65728), newer TF sources add this same check."
)
PER_CHANNEL_AXIS = (
    "The `axis` attribute is this project's: TF's op has none and always quantizes along the last dim "
    "(axis = -1, the default). The converters set another value only when the layout optimizer moves "
    "a Transpose through the node; the result is then TF's op on the input transposed so that `axis` "
    "is last, transposed back."
)

SPECS = (
    _spec(
        "FakeQuantWithMinMaxArgs",
        "Fake-quantizes `inputs` to the nudged grid of [min, max] given as attributes.",
        (X,),
        (Param("outputs", FLOAT),),
        ARGS_ATTRS,
        _args_shape,
    ),
    _spec(
        "FakeQuantWithMinMaxArgsGradient",
        "Gradient of FakeQuantWithMinMaxArgs: `gradients` where `inputs` lies in the nudged range (inclusive), else 0.",
        (G, X),
        (Param("backprops", FLOAT),),
        ARGS_ATTRS,
        _args_grad_shape,
    ),
    _spec(
        "FakeQuantWithMinMaxVars",
        "Fake-quantizes `inputs` to the nudged grid of the scalar tensors [min, max].",
        (X, MIN0, MAX0),
        (Param("outputs", FLOAT),),
        VARS_ATTRS,
        _vars_shape,
    ),
    _spec(
        "FakeQuantWithMinMaxVarsGradient",
        "Gradient of FakeQuantWithMinMaxVars with respect to inputs, min and max.",
        (G, X, MIN0, MAX0),
        (
            Param("backprops_wrt_input", FLOAT),
            Param("backprop_wrt_min", FLOAT, "sum of gradients where inputs < nudged min (scalar)", summed=True),
            Param("backprop_wrt_max", FLOAT, "sum of gradients where inputs > nudged max (scalar)", summed=True),
        ),
        VARS_ATTRS,
        _vars_grad_shape,
    ),
    _spec(
        "FakeQuantWithMinMaxVarsPerChannel",
        "Fake-quantizes each channel (dim `axis`, the last by default) of `inputs` to the nudged grid of its own "
        "[min[i], max[i]].",
        (X, MIN1, MAX1),
        (Param("outputs", FLOAT),),
        PER_CHANNEL_ATTRS,
        _per_channel_shape,
        deviations=(PER_CHANNEL_RANK_FIX, PER_CHANNEL_AXIS),
    ),
    _spec(
        "FakeQuantWithMinMaxVarsPerChannelGradient",
        "Gradient of FakeQuantWithMinMaxVarsPerChannel with respect to inputs and the per-channel min and max.",
        (G, X, MIN1, MAX1),
        (
            Param("backprops_wrt_input", FLOAT),
            Param("backprop_wrt_min", FLOAT, "per channel: sum of gradients where inputs < nudged min", summed=True),
            Param("backprop_wrt_max", FLOAT, "per channel: sum of gradients where inputs > nudged max", summed=True),
        ),
        PER_CHANNEL_ATTRS,
        _per_channel_grad_shape,
        deviations=(PER_CHANNEL_RANK_FIX, PER_CHANNEL_AXIS),
    ),
)
