"""Gradients of the activations: one standard-ONNX handler per op, used by both lowerings.

Each formula is TF's CPU kernel (Eigen functor) evaluated in the same order, so the results are
bit-identical, including TF's flush-to-zero (converters.gradients._common): selections multiply by a
0/1 mask as TF does (a masked -1 gives -0.0, a masked NaN or Inf gives NaN), and ``where``-style
selections between two products are written as one product with a selected factor, which is the
same IEEE operation and avoids ONNX Runtime's signed-zero loss in Where.
"""
from __future__ import annotations

from converters.gradients._common import daz, float_type, flushed_product, mask, mul_no_nan, negative, positive
from converters.gradients.registry import gradient_op
from converters.standard._builder import Lowering

# TF's SELU constants (selu_op / relu_op_functor.h), rounded to the operand type.
SELU_SCALE = 1.0507009873554804934193349852946
SELU_SCALE_ALPHA = 1.7580993408473768599402175208123


def _start(ctx, node, *names):
    """A Lowering over ``node`` with the float type of its inputs; the TF node is taken over."""
    b = Lowering(ctx, node)
    t = float_type(b, 0)
    for i in range(1, len(b.inputs)):
        if float_type(b, i) != t:
            b.fail(f"inputs {names[0]} and {names[i]} differ in element type")
    b.take_over()
    return b, t


@gradient_op("ReluGrad")
def relu_grad(ctx, node, lowering):
    # gradients * (features > 0)
    b, t = _start(ctx, node, "gradients", "features")
    dy, x = b.inputs
    b.emit(0, daz(b, b.op("Mul", dy, mask(b, positive(b, x, t), t)), t))


@gradient_op("Relu6Grad")
def relu6_grad(ctx, node, lowering):
    # gradients * ((features > 0) & (features < 6)); the gradient graph passes Relu6's output.
    b, t = _start(ctx, node, "gradients", "features")
    dy, x = b.inputs
    inside = b.op("And", positive(b, x, t), b.op("Less", x, b.const(6.0, t)))
    b.emit(0, daz(b, b.op("Mul", dy, mask(b, inside, t)), t))


@gradient_op("LeakyReluGrad")
def leaky_relu_grad(ctx, node, lowering):
    # (features > 0) ? gradients : gradients * alpha
    alpha = float(node.get_attr_value("alpha", 0.2))
    b, t = _start(ctx, node, "gradients", "features")
    dy, x = b.inputs
    passes = positive(b, x, t)
    factor = b.op("Where", passes, b.const(1.0, t), b.const(alpha, t))
    b.emit(0, flushed_product(b, dy, factor, t, pass_through=passes))


@gradient_op("EluGrad")
def elu_grad(ctx, node, lowering):
    # (outputs < 0) ? (outputs + 1) * gradients : gradients
    b, t = _start(ctx, node, "gradients", "outputs")
    dy, y = b.inputs
    y = daz(b, y, t)
    scaled = negative(b, y, t)
    factor = b.op("Where", scaled, b.op("Add", y, b.const(1.0, t)), b.const(1.0, t))
    b.emit(0, flushed_product(b, dy, factor, t, pass_through=b.op("Not", scaled)))


@gradient_op("SeluGrad")
def selu_grad(ctx, node, lowering):
    # (outputs < 0) ? gradients * (outputs + scale * alpha) : gradients * scale
    b, t = _start(ctx, node, "gradients", "outputs")
    dy, y = b.inputs
    y = daz(b, y, t)
    shifted = b.op("Add", y, b.const(SELU_SCALE_ALPHA, t))
    factor = b.op("Where", negative(b, y, t), shifted, b.const(SELU_SCALE, t))
    b.emit(0, flushed_product(b, dy, factor, t))


# The next ops follow Eigen's vectorized form (TF's packetOp); TF evaluates the last n % packet-size
# elements of a tensor with the scalar form, which for SigmoidGrad and SqrtGrad rounds differently.


@gradient_op("SigmoidGrad")
def sigmoid_grad(ctx, node, lowering):
    # dy * (y * (1 - y))
    b, t = _start(ctx, node, "y", "dy")
    y, dy = (daz(b, v, t) for v in b.inputs)
    slope = daz(b, b.op("Mul", y, b.op("Sub", b.const(1.0, t), y)), t)
    b.emit(0, daz(b, b.op("Mul", dy, slope), t))


@gradient_op("TanhGrad")
def tanh_grad(ctx, node, lowering):
    # dy * (1 - y * y)
    b, t = _start(ctx, node, "y", "dy")
    y, dy = (daz(b, v, t) for v in b.inputs)
    square = daz(b, b.op("Mul", y, y), t)
    b.emit(0, daz(b, b.op("Mul", dy, b.op("Sub", b.const(1.0, t), square)), t))


@gradient_op("SoftsignGrad")
def softsign_grad(ctx, node, lowering):
    # gradients / (1 + |features|)^2
    b, t = _start(ctx, node, "gradients", "features")
    dy, x = (daz(b, v, t) for v in b.inputs)
    denominator = b.op("Add", b.const(1.0, t), b.op("Abs", x))
    b.emit(0, daz(b, b.op("Div", dy, daz(b, b.op("Mul", denominator, denominator), t)), t))


@gradient_op("SqrtGrad")
def sqrt_grad(ctx, node, lowering):
    # mul_no_nan(0.5 / y, dy)
    b, t = _start(ctx, node, "y", "dy")
    y, dy = b.inputs
    half_over_y = daz(b, b.op("Div", b.const(0.5, t), daz(b, y, t)), t)
    b.emit(0, mul_no_nan(b, half_over_y, dy, t))


@gradient_op("RsqrtGrad")
def rsqrt_grad(ctx, node, lowering):
    # mul_no_nan(-0.5 * (y * y), mul_no_nan(y, dy))
    b, t = _start(ctx, node, "y", "dy")
    y, dy = b.inputs
    y = daz(b, y, t)
    factor = daz(b, b.op("Mul", b.const(-0.5, t), daz(b, b.op("Mul", y, y), t)), t)
    b.emit(0, mul_no_nan(b, factor, mul_no_nan(b, y, dy, t), t))


@gradient_op("ReciprocalGrad", "InvGrad")
def reciprocal_grad(ctx, node, lowering):
    # mul_no_nan(-(y * y), dy)
    b, t = _start(ctx, node, "y", "dy")
    y, dy = b.inputs
    y = daz(b, y, t)
    b.emit(0, mul_no_nan(b, b.op("Neg", daz(b, b.op("Mul", y, y), t)), dy, t))
