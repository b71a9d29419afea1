"""FakeQuantWithMinMax{Args,Vars,VarsPerChannel} and their gradients (float32 only)."""
from ort_ops.spec import FLOAT, Attr, OpError, OpSpec, Param, snake_case
from ort_ops.specs._shapes import merge_shapes, require_rank, same_as

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

X = Param("inputs", FLOAT, "values to quantize")
G = Param("gradients", FLOAT, "gradient flowing into the op's output")
MIN0 = Param("min", FLOAT, "scalar lower end of the range")
MAX0 = Param("max", FLOAT, "scalar upper end of the range")
MIN1 = Param("min", FLOAT, "per-channel lower ends, shape [d] (d = last dim of inputs)")
MAX1 = Param("max", FLOAT, "per-channel upper ends, shape [d]")


def _grad_input_shape(op, shapes):
    return merge_shapes(op, "gradient and input must be the same size", shapes[0], shapes[1])


def _scalar_ranges(op, shapes, first):
    require_rank(op, "min", shapes[first], 0)
    require_rank(op, "max", shapes[first + 1], 0)


def _channel_count(op, x, mn, mx):
    if x is not None and len(x) < 1:
        raise OpError(op, "input must be at least rank 1")
    d = None if x is None else x[-1]
    for name, s in (("min", mn), ("max", mx)):
        if s is None:
            continue
        if len(s) != 1:
            raise OpError(op, f"`{name}` must be rank 1 but is rank {len(s)}")
        if d is not None and s[0] is not None and s[0] != d:
            raise OpError(op, f"{name} has incorrect size, expected {d} was {s[0]}")
        d = d if d is not None else s[0]
    return d


def _vars_shape(shapes, values, attrs):
    _scalar_ranges("FakeQuantWithMinMaxVars", shapes, 1)
    return [shapes[0]]


def _vars_grad_shape(shapes, values, attrs):
    op = "FakeQuantWithMinMaxVarsGradient"
    x = _grad_input_shape(op, shapes)
    _scalar_ranges(op, shapes, 2)
    return [x, (), ()]


def _per_channel_shape(shapes, values, attrs):
    _channel_count("FakeQuantWithMinMaxVarsPerChannel", shapes[0], shapes[1], shapes[2])
    return [shapes[0]]


def _per_channel_grad_shape(shapes, values, attrs):
    op = "FakeQuantWithMinMaxVarsPerChannelGradient"
    x = _grad_input_shape(op, shapes)
    d = _channel_count(op, x, shapes[2], shapes[3])
    return [x, (d,), (d,)]


def _args_grad_shape(shapes, values, attrs):
    return [_grad_input_shape("FakeQuantWithMinMaxArgsGradient", shapes)]


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

SPECS = (
    _spec(
        "FakeQuantWithMinMaxArgs",
        "Fake-quantizes `inputs` to the nudged grid of [min, max] given as attributes.",
        (X,),
        (Param("outputs", FLOAT),),
        ARGS_ATTRS,
        same_as(0),
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
        "Fake-quantizes each channel (last dim) of `inputs` to the nudged grid of its own [min[i], max[i]].",
        (X, MIN1, MAX1),
        (Param("outputs", FLOAT),),
        VARS_ATTRS,
        _per_channel_shape,
        deviations=(PER_CHANNEL_RANK_FIX,),
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
        VARS_ATTRS,
        _per_channel_grad_shape,
        deviations=(PER_CHANNEL_RANK_FIX,),
    ),
)
