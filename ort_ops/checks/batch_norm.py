"""Every rule of FusedBatchNorm{,V2,V3} and FusedBatchNormGrad{,V2,V3}, each written once.

The spec's shape functions (``ort_ops.specs.batch_norm``) are built from these checks, and through
``OpSpec.validate`` they guard the NumPy kernels, the standard lowerings and the custom lowering's
handler. Element types are not checked here: the spec's type constraints and kernels do that.

Each check works on partial facts: a shape is a tuple of dims (int, or None when unknown) or None
(unknown rank), and what is unknown is not checked. The order is TF's, which the C++ library
(cpp_ops/src/kernels/batch_norm.cc) follows with the same messages: the rank of x (and y_backprop),
the statistics' ranks, [gradients: x and y_backprop agree], data_format, then the statistics' sizes.
"""
from __future__ import annotations

from ort_ops.spec import OpError, tf_shape

FORMATS_4D = ("NHWC", "NCHW")  # V1, V2, Grad, GradV2 (op-def attribute choices)
FORMATS_5D = FORMATS_4D + ("NDHWC", "NCDHW")  # V3, GradV3
CHANNELS_FIRST = ("NCHW", "NCDHW")

# The [C] inputs as (input name, what TF's rank message calls it): TF labels some inputs its own way.
FORWARD_STATISTICS = (("scale", "scale"), ("offset", "offset"), ("mean", "estimated_mean"),
                      ("variance", "estimated_variance"))
GRAD_STATISTICS = (("scale", "scale"), ("reserve_space_1", "saved mean"), ("reserve_space_2", "saved variance"))


def channel_axis(rank: int, data_format: str) -> int:
    """The channel dim of a rank-``rank`` x. A 4-D x with "NCDHW" is plain NCHW: TF parses the 3-D
    names to the same internal formats."""
    return 1 if data_format in CHANNELS_FIRST else rank - 1


def reads_statistics(is_training: bool, exponential_avg_factor: float) -> bool:
    """Whether the forward op reads mean/variance: in inference, or when averaging. Otherwise they may
    have any size (even be empty)."""
    return not is_training or exponential_avg_factor != 1.0


def check_rank(op: str, name: str, shape) -> None:
    """x (or y_backprop) is 4-D or 5-D. TF says "input" for x and y_backprop alike; the message leads
    with the input at fault."""
    if shape is not None and len(shape) not in (4, 5):
        raise OpError(op, f"{name} has rank {len(shape)}: input must be 4 or 5-dimensional{tf_shape(shape)}")


def check_vector(op: str, name: str, label: str, shape) -> None:
    """A [C] statistic is 1-D. ``label`` is what TF's message calls the input ``name`` (``saved mean`` for
    reserve_space_1, ``estimated_mean`` for mean); the input's name leads where the two differ."""
    if shape is None or len(shape) == 1:
        return
    tf_message = f"{label} must be 1-dimensional{tf_shape(shape)}"
    raise OpError(op, tf_message if name == label else f"{name} has rank {len(shape)}: {tf_message}")


def check_same_shape(op: str, x, y_backprop) -> None:
    """The gradients' x and y_backprop have one shape (dims unknown on either side are not compared)."""
    if x is None or y_backprop is None:
        return
    if len(x) != len(y_backprop) or any(a is not None and b is not None and a != b for a, b in zip(x, y_backprop)):
        raise OpError(
            op,
            f"x and y_backprop must have same shape, but x has shape {tf_shape(x)} and y_backprop has shape "
            f"{tf_shape(y_backprop)}",
        )


def check_data_format(op: str, data_format: str, formats) -> None:
    """``formats``: the op's choices (the 3-D names only from V3 on)."""
    if data_format not in formats:
        raise OpError(op, f'Invalid data format: data_format "{data_format}" is not one of {", ".join(formats)}')


def channels_of(x, data_format: str):
    """C, the size of x's channel dim; None when unknown."""
    return None if x is None else x[channel_axis(len(x), data_format)]


def check_count(op: str, label: str, shape, channels, prefix: str = "") -> None:
    """A (1-D) statistic has C elements, when both are known."""
    if shape is None or channels is None or shape[0] is None or shape[0] == channels:
        return
    raise OpError(
        op, f"{prefix}{label} must have the same number of elements as the channels of x, got {shape[0]} and {channels}"
    )


def _counts(op, checks, channels):
    """check_count for each (label, shape, prefix); with x's channels unknown, the first known statistic
    stands for them (TF's shape function merges them all). Returns C, None when still unknown."""
    for label, shape, prefix in checks:
        check_count(op, label, shape, channels, prefix)
        if channels is None and shape is not None:
            channels = shape[0]
    return channels


def check_forward(op: str, formats, shapes, attrs) -> object:
    """FusedBatchNorm{,V2,V3}'s rules on (x, scale, offset, mean, variance); returns C (None if unknown)."""
    x, stats = shapes[0], shapes[1:5]
    check_rank(op, "x", x)
    for (name, label), shape in zip(FORWARD_STATISTICS, stats):
        check_vector(op, name, label, shape)  # TF checks every rank before any size
    check_data_format(op, attrs["data_format"], formats)
    checks = [("scale", stats[0], ""), ("offset", stats[1], "")]
    training, factor = attrs["is_training"], attrs["exponential_avg_factor"]
    if reads_statistics(training, factor):
        prefix = "When is_training=false, " if not training else "When exponential_avg_factor != 1, "
        checks += [("mean", stats[2], prefix), ("variance", stats[3], prefix)]
    return _counts(op, checks, channels_of(x, attrs["data_format"]))


def check_grad(op: str, formats, shapes, attrs) -> object:
    """FusedBatchNormGrad{,V2,V3}'s rules on (y_backprop, x, scale, reserve_space_1, reserve_space_2);
    returns C (None if unknown). A V3 reserve_space_3 is not read (any shape, as on TF's CPU)."""
    y_backprop, x, stats = shapes[0], shapes[1], shapes[2:5]
    check_rank(op, "y_backprop", y_backprop)
    check_rank(op, "x", x)
    for (name, label), shape in zip(GRAD_STATISTICS, stats):
        check_vector(op, name, label, shape)
    check_same_shape(op, x, y_backprop)
    check_data_format(op, attrs["data_format"], formats)
    checks = [(name, shape, "") for (name, _), shape in zip(GRAD_STATISTICS, stats)]
    return _counts(op, checks, channels_of(merged_shape(x, y_backprop), attrs["data_format"]))


def merged_shape(a, b):
    """What two shapes known to agree tell together (a dim unknown in one may be known in the other)."""
    if a is None or b is None:
        return a if b is None else b
    return tuple(p if p is not None else q for p, q in zip(a, b))
