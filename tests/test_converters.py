"""End to end: TF graphs holding the family -> converters -> ONNX Runtime, compared to TensorFlow.

Each of the 19 ops is converted in isolation (a tf.function holding just the op) in both lowerings and
run in ONNX Runtime (custom lowering: with the custom-op library). Outputs of the quantization ops
must be bit-identical to TF (NaN, +-inf, ties and bounds are in the inputs); batch-norm and depthwise
outputs must agree within converters.verify's float32 tolerance, rtol 1e-5 plus an absolute floor of
1e-5 * max|TF output| (TF's default oneDNN kernels sum in another order, a few ulps per output; the
floor covers gradient sums whose terms cancel). Then graphs from real code: GradientTape gradients,
a tf_keras model with fused batch norm, and the failure listing for an op tf2onnx cannot convert.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import tensorflow as tf

import converters
import ort_ops
from converters.errors import UnconvertedOpsError
from ort_ops.schemas import DOMAIN

pytestmark = pytest.mark.tensorflow

LOWERINGS = ("custom", "standard")
rng = np.random.default_rng(1234)


def _f32(a):
    return np.asarray(a, dtype=np.float32)


def _quant_inputs(shape, lo, hi):
    """Values on the grid, on half-grid ties, at and just beyond the bounds, and the specials."""
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, lo, hi, lo - 1e-3, hi + 1e-3]
    n = int(np.prod(shape))
    grid = np.linspace(lo - 0.5, hi + 0.5, n - len(special))
    grid[::3] = np.round(grid[::3] * 4) / 8  # many exact binary fractions: ties for small grids
    return _f32(np.concatenate([special, grid])).reshape(shape)


def _normal(*shape, scale=1.0):
    return _f32(rng.standard_normal(shape) * scale)


# op -> (function over graph inputs, list of inputs, output indices to compare)
def _cases():
    x = _quant_inputs((4, 12), -1.5, 2.0)
    g = _normal(4, 12)
    mn, mx = _f32(-1.0), _f32(1.5)
    mn3, mx3 = _f32([-1.0, -0.5, 0.0]), _f32([1.0, 0.7, 2.0])
    xc = _quant_inputs((16, 3), -1.0, 2.0)
    gc = _normal(16, 3)
    qx = _quant_inputs((3, 4, 5), -2.0, 2.0)
    qg = _normal(3, 4, 5)
    bx = _normal(2, 3, 3, 4)
    scale, offset = _normal(4) + 1.0, _normal(4)
    mean, var = _normal(4, scale=0.1), _f32(rng.uniform(0.5, 2.0, 4))
    dy = _normal(2, 3, 3, 4)
    dx_in = _normal(1, 5, 5, 2)
    dw = _normal(3, 3, 2, 2)
    raw = tf.raw_ops
    fq_args = dict(min=-1.5, max=2.0, num_bits=5, narrow_range=True)
    return {
        "FakeQuantWithMinMaxArgs": (lambda a: raw.FakeQuantWithMinMaxArgs(inputs=a, **fq_args), [x]),
        "FakeQuantWithMinMaxArgsGradient": (
            lambda a, b: raw.FakeQuantWithMinMaxArgsGradient(gradients=a, inputs=b, **fq_args),
            [g, x],
        ),
        "FakeQuantWithMinMaxVars": (
            lambda a, lo, hi: raw.FakeQuantWithMinMaxVars(inputs=a, min=lo, max=hi, num_bits=8),
            [x, mn, mx],
        ),
        "FakeQuantWithMinMaxVarsGradient": (
            lambda a, b, lo, hi: raw.FakeQuantWithMinMaxVarsGradient(gradients=a, inputs=b, min=lo, max=hi, num_bits=6),
            [g, x, mn, mx],
        ),
        "FakeQuantWithMinMaxVarsPerChannel": (
            lambda a, lo, hi: raw.FakeQuantWithMinMaxVarsPerChannel(inputs=a, min=lo, max=hi, num_bits=4, narrow_range=True),
            [xc, mn3, mx3],
        ),
        "FakeQuantWithMinMaxVarsPerChannelGradient": (
            lambda a, b, lo, hi: raw.FakeQuantWithMinMaxVarsPerChannelGradient(
                gradients=a, inputs=b, min=lo, max=hi, num_bits=4
            ),
            [gc, xc, mn3, mx3],
        ),
        "QuantizeAndDequantizeV2": (
            lambda a, lo, hi: raw.QuantizeAndDequantizeV2(
                input=a, input_min=lo, input_max=hi, num_bits=4, range_given=True, round_mode="HALF_UP"
            ),
            [qx, _f32(-1.5), _f32(1.25)],
        ),
        "QuantizeAndDequantizeV3": (
            lambda a, lo, hi: raw.QuantizeAndDequantizeV3(input=a, input_min=lo, input_max=hi, num_bits=tf.constant(5)),
            [qx, _f32(-2.0), _f32(1.0)],
        ),
        "QuantizeAndDequantizeV4": (
            lambda a, lo, hi: raw.QuantizeAndDequantizeV4(
                input=a, input_min=lo, input_max=hi, num_bits=3, range_given=False, narrow_range=True, axis=1
            ),
            # range_given=False: the data gives the range, so no NaN/inf here (they would make it all NaN)
            [_normal(3, 4, 5), _f32([0, 0, 0, 0]), _f32([0, 0, 0, 0])],
        ),
        "QuantizeAndDequantizeV4Grad": (
            lambda a, b, lo, hi: raw.QuantizeAndDequantizeV4Grad(gradients=a, input=b, input_min=lo, input_max=hi, axis=1),
            [qg, qx, _f32([-1, -0.5, 0, -2]), _f32([1, 0.5, 2, 0])],
        ),
        "FusedBatchNorm": (
            lambda a, s, o, m, v: raw.FusedBatchNorm(x=a, scale=s, offset=o, mean=m, variance=v, epsilon=1e-3)[:3],
            [bx, scale, offset, mean, var],
        ),
        "FusedBatchNormV2": (
            lambda a, s, o, m, v: raw.FusedBatchNormV2(
                x=a, scale=s, offset=o, mean=m, variance=v, is_training=False
            )[:3],
            [bx, scale, offset, mean, var],
        ),
        "FusedBatchNormV3": (
            lambda a, s, o, m, v: raw.FusedBatchNormV3(
                x=a, scale=s, offset=o, mean=m, variance=v, is_training=True, exponential_avg_factor=0.25
            )[:3],
            [bx, scale, offset, mean, var],
        ),
        # The project's own op: the converter fuses TF's chain (4 channels: TF's batch norm is correctly rounded).
        "FusedBatchNormClipFakeQuant": (
            lambda a, s, o, m, v: raw.FakeQuantWithMinMaxVars(
                inputs=tf.nn.relu6(raw.FusedBatchNormV3(x=a, scale=s, offset=o, mean=m, variance=v, is_training=False)[0]),
                min=-0.5, max=5.75, num_bits=6,
            ),
            [bx * 4, scale, offset, mean, var],
        ),
        "FusedBatchNormGrad": (
            lambda d, a, s, m, v: raw.FusedBatchNormGrad(
                y_backprop=d, x=a, scale=s, reserve_space_1=m, reserve_space_2=v, epsilon=1e-3
            )[:3],
            [dy, bx, scale, mean, var],
        ),
        "FusedBatchNormGradV2": (
            lambda d, a, s, m, v: raw.FusedBatchNormGradV2(
                y_backprop=d, x=a, scale=s, reserve_space_1=m, reserve_space_2=v, is_training=False
            )[:3],
            [dy, bx, scale, mean, var],
        ),
        "FusedBatchNormGradV3": (
            lambda d, a, s, m, v: raw.FusedBatchNormGradV3(
                y_backprop=d, x=a, scale=s, reserve_space_1=m, reserve_space_2=v,
                reserve_space_3=tf.zeros([0]), is_training=True,
            )[:3],
            [dy, bx, scale, mean, var],
        ),
        "DepthwiseConv2dNative": (
            lambda a, w: raw.DepthwiseConv2dNative(input=a, filter=w, strides=[1, 2, 2, 1], padding="SAME"),
            [dx_in, dw],
        ),
        "DepthwiseConv2dNativeBackpropInput": (
            lambda w, d: raw.DepthwiseConv2dNativeBackpropInput(
                input_sizes=tf.constant([1, 5, 5, 2]), filter=w, out_backprop=d, strides=[1, 2, 2, 1], padding="SAME"
            ),
            [dw, _normal(1, 3, 3, 4)],
        ),
        "DepthwiseConv2dNativeBackpropFilter": (
            lambda a, d: raw.DepthwiseConv2dNativeBackpropFilter(
                input=a, filter_sizes=tf.constant([3, 3, 2, 2]), out_backprop=d, strides=[1, 1, 1, 1],
                padding="EXPLICIT", explicit_paddings=[0, 0, 1, 0, 0, 1, 0, 0],
            ),
            [dx_in, _normal(1, 4, 4, 4)],
        ),
    }


CASES = _cases()


def test_every_op_of_the_domain_has_a_case():
    assert sorted(CASES) == sorted(ort_ops.OP_NAMES)


def _convert(body, inputs, lowering):
    signature = [tf.TensorSpec(np.shape(v), tf.as_dtype(np.asarray(v).dtype)) for v in inputs]
    fn = tf.function(body, input_signature=signature)
    return fn, converters.from_function(fn, signature, lowering=lowering)


def _domain_nodes(model):
    return [n for n in model.graph.node if n.domain == DOMAIN]


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("op", sorted(CASES))
def test_single_op_matches_tf(op, lowering):
    body, inputs = CASES[op]
    fn, model = _convert(body, inputs, lowering)
    assert model.ir_version == ort_ops.lowest_ir_version(model) == 8  # opset 17: every onnxruntime from 1.17 reads it
    imports = {i.domain: i.version for i in model.opset_import}
    assert imports[""] == 17
    if lowering == "custom":
        assert [n.op_type for n in _domain_nodes(model)] == [op]
        assert imports[DOMAIN] == 1
    else:
        assert not _domain_nodes(model) and DOMAIN not in imports
    report = converters.verify(model, fn, inputs=inputs, print_table=False)
    quantization = op.startswith(("FakeQuant", "QuantizeAndDequantize"))
    # Element-wise quantization outputs are held bit-exact; the spec's summed outputs (the min/max
    # gradients of the Vars ops) to the float tolerance (their summation order is not fixed by TF).
    # The fused batch norm + clip + quantizer is not exact by construction (its cone holds a batch norm, whose
    # rsqrt TF estimates on whole AVX packets, docs/semantics.md 3.5): judged as a float, and this case's 4
    # channels (a packet's scalar tail) must still give TF's bits.
    summed = ort_ops.get_spec(op).summed_outputs()
    expected_exact = [quantization and i not in summed for i in range(len(report.outputs))]
    assert [c.exact for c in report.outputs] == expected_exact, report.table()
    assert report.ok, report.table()
    if ort_ops.get_spec(op).family == "fused":
        assert all(c.n_differing == 0 for c in report.outputs), report.table()


def test_custom_node_carries_tf_attributes_by_tf_name():
    body, inputs = CASES["QuantizeAndDequantizeV2"]
    _, model = _convert(body, inputs, "custom")
    (node,) = _domain_nodes(model)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs == {
        "signed_input": 1, "num_bits": 4, "range_given": 1, "round_mode": b"HALF_UP", "narrow_range": 0, "axis": -1,
    }
    types = {a.name: a.type for a in node.attribute}
    assert types["round_mode"] == onnx.AttributeProto.STRING and types["range_given"] == onnx.AttributeProto.INT
    assert "T" not in attrs


def test_tf2onnx_rewriters_do_not_touch_family_ops():
    """tf2onnx would turn QDQ into QuantizeLinear/DequantizeLinear (8-bit only) and fold the dilated
    depthwise pattern into one conv; both must stay TF's ops, with TF's semantics."""

    def body(x, w):
        q = tf.quantization.quantize_and_dequantize_v2(x, -1.0, 1.0, num_bits=3, range_given=True)
        return q, tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME", dilations=[2, 2])

    inputs = [_quant_inputs((1, 6, 6, 2), -1.0, 1.0), _normal(3, 3, 2, 1)]
    inputs[0][np.isnan(inputs[0]) | np.isinf(inputs[0])] = 0.5  # keep the convolution finite
    fn, model = _convert(body, inputs, "custom")
    types = [n.op_type for n in model.graph.node]
    assert "QuantizeLinear" not in types and "Conv" not in types
    assert sorted(n.op_type for n in _domain_nodes(model)) == ["DepthwiseConv2dNative", "QuantizeAndDequantizeV4"]
    report = converters.verify(model, fn, inputs=inputs, print_table=False)
    assert report.ok, report.table()


def _tape_fake_quant():
    lo, hi = tf.Variable(-0.8), tf.Variable(1.2)

    def body(x, g):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.quantization.fake_quant_with_min_max_vars(x, lo, hi, num_bits=6)
            yc = tf.quantization.fake_quant_with_min_max_vars_per_channel(x, [-1.0, -0.5, 0.0], [1.0, 0.5, 1.5])
            loss = tf.reduce_sum((y + yc) * g)
        dx, dlo, dhi = tape.gradient(loss, [x, lo, hi])
        return y, dx, dlo, dhi

    x = _quant_inputs((8, 3), -1.0, 1.5)
    return body, [x, _normal(8, 3)], {"FakeQuantWithMinMaxVarsGradient", "FakeQuantWithMinMaxVarsPerChannelGradient"}


def _tape_batch_norm(training):
    scale, offset = tf.Variable(_normal(3) + 1.0), tf.Variable(_normal(3))
    mean, var = tf.constant(_normal(3, scale=0.1)), tf.constant(_f32([0.5, 1.0, 2.0]))

    def body(x, g):
        with tf.GradientTape() as tape:
            tape.watch(x)
            if training:
                y, _, _ = tf.compat.v1.nn.fused_batch_norm(x, scale, offset, is_training=True)
            else:
                y, _, _ = tf.compat.v1.nn.fused_batch_norm(x, scale, offset, mean, var, is_training=False)
            loss = tf.reduce_sum(y * g)
        return (y,) + tuple(tape.gradient(loss, [x, scale, offset]))

    return body, [_normal(2, 4, 4, 3), _normal(2, 4, 4, 3)], {"FusedBatchNormV3", "FusedBatchNormGradV3"}


def _tape_depthwise():
    w = tf.Variable(_normal(3, 3, 2, 2))

    def body(x, g):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.nn.depthwise_conv2d(x, w, [1, 2, 2, 1], "SAME")
            loss = tf.reduce_sum(y * g)
        return (y,) + tuple(tape.gradient(loss, [x, w]))

    return body, [_normal(2, 5, 5, 2), _normal(2, 3, 3, 4)], {
        "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter",
    }


@pytest.mark.parametrize("case", ["fake_quant", "batch_norm_training", "batch_norm_inference", "depthwise"])
def test_gradient_tape_graphs(case):
    body, inputs, expected_ops = {
        "fake_quant": _tape_fake_quant,
        "batch_norm_training": lambda: _tape_batch_norm(True),
        "batch_norm_inference": lambda: _tape_batch_norm(False),
        "depthwise": _tape_depthwise,
    }[case]()
    fn, model = _convert(body, inputs, "custom")
    assert expected_ops <= {n.op_type for n in _domain_nodes(model)}
    report = converters.verify(model, fn, inputs=inputs, print_table=False)
    assert report.ok, report.table()


def test_depthwise_backprop_input_sizes_from_a_shape_op():
    """With a dynamic batch, input_sizes of the input gradient is computed by a Shape op at run time."""
    w = tf.Variable(_normal(3, 3, 2, 1))
    signature = [tf.TensorSpec([None, 5, 5, 2], tf.float32)]

    @tf.function(input_signature=signature)
    def fn(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "VALID") ** 2)
        return tape.gradient(loss, x)

    model = converters.from_function(fn, signature)
    (node,) = [n for n in _domain_nodes(model) if n.op_type == "DepthwiseConv2dNativeBackpropInput"]
    producers = {o: n.op_type for n in model.graph.node for o in n.output}
    initializers = {t.name for t in model.graph.initializer}
    assert node.input[0] not in initializers and producers[node.input[0]] in ("Cast", "Shape")
    report = converters.verify(model, fn, inputs=[_normal(3, 5, 5, 2)], print_table=False)
    assert report.ok, report.table()


def test_keras_model_with_fused_batch_norm():
    import tf_keras

    tf_keras.utils.set_random_seed(3)
    model = tf_keras.Sequential(
        [
            tf_keras.layers.Input((6, 6, 3)),
            tf_keras.layers.DepthwiseConv2D(3, depth_multiplier=2, padding="same"),
            tf_keras.layers.BatchNormalization(),
            tf_keras.layers.ReLU(),
        ]
    )
    bn = model.layers[1]
    bn.moving_mean.assign(_normal(6, scale=0.1))
    bn.moving_variance.assign(_f32(rng.uniform(0.5, 2.0, 6)))
    # A float inference graph: the depthwise convolution is ONNX Runtime's grouped Conv (pipeline.
    # standard_conv_for_depthwise) and the batch norm is folded into it (fold_batch_norm's default there), or,
    # with fold_batch_norm=False, the domain's batch-norm node.
    for fold, domain_ops in ((None, set()), (False, {"FusedBatchNormV3"})):
        onnx_model = converters.from_keras(model, fold_batch_norm=fold)
        assert {n.op_type for n in _domain_nodes(onnx_model)} == domain_ops
        assert any(n.op_type == "Conv" and any(a.name == "group" and a.i == 3 for a in n.attribute)
                   for n in onnx_model.graph.node)
        report = converters.verify_keras(model, onnx_model, seed=5, print_table=False)
        assert report.ok, report.table()


def test_unconverted_ops_are_listed():
    signature = [tf.TensorSpec([4], tf.float32)]

    @tf.function(input_signature=signature)
    def fn(x):
        y = tf.quantization.fake_quant_with_min_max_args(x)
        return tf.math.special.bessel_i0e(y) + tf.math.special.bessel_i1e(x)

    with pytest.raises(UnconvertedOpsError) as info:
        converters.from_function(fn, signature)
    types = sorted(op for op, _ in info.value.ops)
    assert types == ["BesselI0e", "BesselI1e"]
    assert all(name for _, name in info.value.ops)
    assert "BesselI0e" in str(info.value)


def test_random_op_is_listed_with_why_and_what_to_do():
    """A training-mode Dropout's random op cannot be converted: the error says why and what to do. (Keras 3's
    Dropout seeds it from a SeedGenerator variable that the step assigns, so the seed is computed, as here.)"""
    signature = [tf.TensorSpec([4, 8], tf.float32), tf.TensorSpec([2], tf.int64)]

    @tf.function(input_signature=signature)
    def fn(x, seed):
        return tf.nn.experimental.stateless_dropout(x, rate=0.5, seed=seed)

    with pytest.raises(UnconvertedOpsError) as info:
        converters.from_function(fn, signature)
    assert any("Random" in op for op, _ in info.value.ops)
    assert "rate at 0" in str(info.value) and "random numbers cannot be reproduced" in str(info.value)


def test_verify_flags_a_wrong_output():
    """verify must fail a model whose output differs from TF in one element."""
    body, inputs = CASES["FakeQuantWithMinMaxArgs"]
    fn, model = _convert(body, inputs, "custom")
    # Append "+ tiny" to the output: a model that is wrong by one ulp-sized step somewhere.
    out = model.graph.output[0].name
    for node in model.graph.node:
        for i, o in enumerate(node.output):
            if o == out:
                node.output[i] = out + "_pre"
    bump = np.zeros(inputs[0].shape, np.float32)
    bump[0, -1] = 1e-6
    model.graph.initializer.append(onnx.numpy_helper.from_array(bump, "bump"))
    model.graph.node.append(onnx.helper.make_node("Add", [out + "_pre", "bump"], [out]))
    report = converters.verify(model, fn, inputs=inputs, print_table=False)
    (check,) = report.outputs
    assert check.exact and not report.ok and check.n_differing == 1


def test_lowering_error_is_raised_not_logged():
    """tf2onnx only logs a failing handler; the converter must raise the lowering's error instead."""
    signature = [tf.TensorSpec([3, 4], tf.float32), tf.TensorSpec([], tf.int32)]

    @tf.function(input_signature=signature)
    def fn(x, bits):  # num_bits known only at run time: the standard lowering cannot check its range
        return tf.raw_ops.QuantizeAndDequantizeV3(input=x, input_min=-1.0, input_max=1.0, num_bits=bits)

    with pytest.raises(converters.LoweringError) as info:
        converters.from_function(fn, signature, lowering="standard")
    assert info.value.op == "QuantizeAndDequantizeV3"
    model = converters.from_function(fn, signature, lowering="custom")
    report = converters.verify(model, fn, inputs=[_quant_inputs((3, 4), -1.0, 1.0), np.int32(4)], print_table=False)
    assert report.ok, report.table()
