"""QuantizeAndDequantize{V2,V3,V4} and QuantizeAndDequantizeV4Grad (float32 and float64)."""
from ort_ops.checks import quantize_dequantize as rules
from ort_ops.spec import DOUBLE, FLOAT, INT32, Attr, OpSpec, Param, snake_case

FAMILY = "quantize_dequantize"
TYPES = {"T": (FLOAT, DOUBLE)}
KERNELS = ({"T": FLOAT}, {"T": DOUBLE})

SIGNED = Attr("signed_input", "bool", True, "1: the grid is signed, [-2^(b-1), 2^(b-1)-1]; 0: [0, 2^b - 1]")
RANGE_GIVEN_V2 = Attr("range_given", "bool", False, "1: quantize over [input_min, input_max]; 0: over the data's own range")
RANGE_GIVEN_V3 = Attr("range_given", "bool", True, RANGE_GIVEN_V2.doc)
NARROW = Attr("narrow_range", "bool", False, "signed only: drop the most negative grid value")
AXIS = Attr("axis", "int", -1, "-1: one range for the whole tensor; otherwise the channel axis of per-axis ranges")
ROUND_MODE = Attr(
    "round_mode", "string", "HALF_TO_EVEN", "rounding of the scaled value", choices=("HALF_TO_EVEN", "HALF_UP")
)
V2_ATTRS = (SIGNED, Attr("num_bits", "int", 8, "bit width, 1..61 signed / 1..62 unsigned"), RANGE_GIVEN_V2, ROUND_MODE, NARROW, AXIS)
V3_ATTRS = (SIGNED, RANGE_GIVEN_V3, NARROW, AXIS)

INPUT = Param("input", "T", "tensor to quantize and dequantize")
IN_MIN = Param("input_min", "T", "range minimum: a scalar, or a vector of dims[axis] values per axis")
IN_MAX = Param("input_max", "T", "range maximum: a scalar, or a vector of dims[axis] values per axis")
OUTPUT = (Param("output", "T"),)

PER_AXIS_RANGE_FIX = (
    "Per-axis with range_given=1 takes input_min/input_max vectors of dims[axis] values. TF 2.21 first "
    "demands scalars and then vectors, so that documented mode always fails there."
)


def _v2_v4_shape(op):
    def fn(shapes, values, attrs):
        rules.num_bits(op, attrs["num_bits"], attrs["signed_input"], "signed_input_")
        rules.axis_at_least_minus_one(op, attrs["axis"])
        rules.axis_within_rank(op, shapes[0], attrs["axis"])
        if attrs["range_given"]:
            rules.given_range(op, shapes[0], shapes[1:3], values[1:3], attrs["axis"])
        return [shapes[0]]

    return fn


def _v3_shape(shapes, values, attrs):
    op = "QuantizeAndDequantizeV3"
    # The constructor checks nothing: everything depends on the input rank or the num_bits tensor.
    rules.v3_axis(op, shapes[0], attrs["axis"])
    rules.v3_num_bits(op, shapes[3], values[3], attrs["signed_input"])
    if attrs["range_given"]:
        rules.given_range(op, shapes[0], shapes[1:3], values[1:3], attrs["axis"])
    return [shapes[0]]


def _v4_grad_shape(shapes, values, attrs):
    op = "QuantizeAndDequantizeV4Grad"
    rules.axis_at_least_minus_one(op, attrs["axis"])
    rules.grad_axis_within_rank(op, shapes[1], attrs["axis"])
    x = rules.gradient_same_size(op, shapes[0], shapes[1])
    rules.grad_range_shapes(op, x, shapes[2], shapes[3], attrs["axis"])
    return [x, shapes[2], shapes[3]]


def _spec(name, doc, inputs, outputs, attrs, shape_fn, deviations=()):
    return OpSpec(
        name=name,
        family=FAMILY,
        doc=doc,
        inputs=inputs,
        outputs=outputs,
        attrs=attrs,
        type_constraints=TYPES,
        shape_fn=shape_fn,
        reference=f"op_{snake_case(name)}:run",
        kernels=KERNELS,
        deviations=deviations,
    )


SPECS = (
    _spec(
        "QuantizeAndDequantizeV2",
        "Quantizes `input` to a num_bits integer grid and back, per tensor or per axis; straight-through gradient.",
        (INPUT, IN_MIN, IN_MAX),
        OUTPUT,
        V2_ATTRS,
        _v2_v4_shape("QuantizeAndDequantizeV2"),
        deviations=(PER_AXIS_RANGE_FIX,),
    ),
    _spec(
        "QuantizeAndDequantizeV3",
        "As QuantizeAndDequantizeV2 with num_bits as a scalar int32 tensor and HALF_TO_EVEN rounding.",
        (INPUT, IN_MIN, IN_MAX, Param("num_bits", INT32, "scalar bit width")),
        OUTPUT,
        V3_ATTRS,
        _v3_shape,
        deviations=(
            "axis < -1 and non-scalar input_min/input_max with axis=-1 are rejected with an error; TF 2.21 "
            "aborts the process on both (CHECK failures, TF issues #94116 and #99458).",
        ),
    ),
    _spec(
        "QuantizeAndDequantizeV4",
        "Same kernel as QuantizeAndDequantizeV2; its gradient is QuantizeAndDequantizeV4Grad (clipped).",
        (INPUT, IN_MIN, IN_MAX),
        OUTPUT,
        V2_ATTRS,
        _v2_v4_shape("QuantizeAndDequantizeV4"),
        deviations=(PER_AXIS_RANGE_FIX,),
    ),
    _spec(
        "QuantizeAndDequantizeV4Grad",
        "Gradient of QuantizeAndDequantizeV4: `gradients` where input_min <= input <= input_max, else 0.",
        (Param("gradients", "T"), INPUT, IN_MIN, IN_MAX),
        (
            Param("input_backprop", "T"),
            Param("input_min_backprop", "T", "zeros shaped like input_min"),
            Param("input_max_backprop", "T", "zeros shaped like input_max"),
        ),
        (AXIS,),
        _v4_grad_shape,
    ),
)
