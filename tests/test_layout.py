"""Layout and fusions of converted graphs (converters.layout, converters.fusions, issue 12).

A small tfmot quantization-aware network with MobileNetV2's pieces (convolution, batch norm, ReLU6,
ZeroPadding2D before a stride-2 depthwise convolution, per-tensor activation quantizers) is converted
in both lowerings. The domain's nodes must take the layout of the ONNX convolutions around them (no
Transpose next to them, batch norm and depthwise in NCHW), the zero Pad must be folded into the
depthwise node, the standard lowering must compute batch norm's factor at conversion time, and every
output stays what it was: quantization outputs bit-identical to TF. Then the cases the layout must
leave alone (a data range, a filter with an infinity), the gradient graphs, and the batch-norm
folding option.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import converters
from converters.exact_outputs import EXACT_OUTPUTS_KEY
from converters.verification import run_onnx
from ort_ops.schemas import DOMAIN

pytestmark = pytest.mark.tensorflow

SHAPE = (20, 20, 3)


def _neighbours(model):
    producers = {o: n for n in model.graph.node for o in n.output}
    consumers = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    return producers, consumers


def transposes_next_to_domain(model):
    """Transposes next to a domain node, except those on the graph's NHWC inputs and outputs (which
    a network of NCHW convolutions needs somewhere, and tf2onnx's own graphs have as well)."""
    producers, consumers = _neighbours(model)
    boundary = {i.name for i in model.graph.input} | {o.name for o in model.graph.output}
    found = []
    for n in model.graph.node:
        if n.op_type != "Transpose" or n.input[0] in boundary or n.output[0] in boundary:
            continue
        before = producers.get(n.input[0])
        after = consumers.get(n.output[0], [])
        if (before is not None and before.domain == DOMAIN) or any(c.domain == DOMAIN for c in after):
            found.append(n.name)
    return found


def attr(node, name):
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return None


@pytest.fixture(scope="module")
def qat_net():
    import tensorflow_model_optimization as tfmot
    import tf_keras

    layers = tf_keras.layers
    tf_keras.utils.set_random_seed(11)
    inputs = layers.Input(SHAPE)
    x = layers.Conv2D(8, 3, padding="same", use_bias=False)(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU(6.0)(x)
    x = layers.ZeroPadding2D(((0, 1), (0, 1)))(x)
    x = layers.DepthwiseConv2D(3, strides=2, padding="valid", use_bias=False)(x)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU(6.0)(x)
    x = layers.Conv2D(6, 1, use_bias=False)(x)
    x = layers.BatchNormalization()(x)
    x = layers.GlobalAveragePooling2D()(x)
    model = tfmot.quantization.keras.quantize_model(tf_keras.Model(inputs, x))
    # Statistics and ranges away from their initial values, as after training.
    rng = np.random.default_rng(5)
    for v in model.variables:
        name = v.name
        if "moving_mean" in name:
            v.assign(rng.normal(0, 0.2, v.shape).astype(np.float32))
        elif "moving_variance" in name:
            v.assign(rng.uniform(0.5, 2.0, v.shape).astype(np.float32))
        elif "gamma" in name:
            v.assign(rng.uniform(0.5, 1.5, v.shape).astype(np.float32))
        elif "beta" in name:
            v.assign(rng.normal(0, 0.3, v.shape).astype(np.float32))
    images = rng.uniform(0, 1, (4,) + SHAPE).astype(np.float32)
    model(images, training=True)  # sets the activation ranges from data
    return model, images


@pytest.fixture(scope="module")
def converted(qat_net):
    model, _ = qat_net
    return {
        "custom": converters.from_keras(model),
        "standard": converters.from_keras(model, lowering="standard"),
        "folded": converters.from_keras(model, fold_batch_norm=True),
    }


def test_custom_lowering_leaves_no_transpose_next_to_the_domain(converted):
    model = converted["custom"]
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Transpose") <= 1, ops  # the NHWC graph input into the first convolution
    assert not transposes_next_to_domain(model)
    domain = [n for n in model.graph.node if n.domain == DOMAIN]
    # Every batch norm here is the inference one before a ReLU6 quantizer: fused (converters/fusions.py).
    assert {n.op_type for n in domain} == {"FakeQuantWithMinMaxVars", "FusedBatchNormClipFakeQuant", "DepthwiseConv2dNative"}
    for n in domain:
        if n.op_type != "FakeQuantWithMinMaxVars":
            assert attr(n, "data_format") == b"NCHW", n.name


def test_zero_pad_is_folded_into_the_depthwise_node(converted):
    model = converted["custom"]
    assert "Pad" not in [n.op_type for n in model.graph.node]
    (dw,) = [n for n in model.graph.node if n.op_type == "DepthwiseConv2dNative"]
    assert attr(dw, "padding") == b"EXPLICIT"
    assert list(attr(dw, "explicit_paddings")) == [0, 0, 0, 0, 0, 1, 0, 1]  # NCHW pairs: bottom and right
    assert list(attr(dw, "strides")) == [1, 1, 2, 2]


def test_standard_lowering_folds_constant_batch_norm_factors(converted):
    ops = [n.op_type for n in converted["standard"].graph.node]
    assert ops.count("Transpose") <= 1, ops
    assert "Sqrt" not in ops and "Pad" in ops  # the factor is a constant; the standard depthwise keeps its Pad


@pytest.mark.parametrize("lowering", ["custom", "standard"])
def test_outputs_unchanged(qat_net, converted, lowering):
    model, images = qat_net
    report = converters.verify_keras(model, converted[lowering], inputs=[images], print_table=False)
    assert report.ok, report.table()
    # The quantized activations are bit-identical, so the float tail is too (same Conv, BN and mean).
    assert all(c.n_differing == 0 for c in report.outputs), report.table()


def test_fold_batch_norm_option(qat_net, converted):
    model, images = qat_net
    folded = converted["folded"]
    ops = [n.op_type for n in folded.graph.node]
    assert not any(op.startswith("FusedBatchNorm") for op in ops)
    assert any(op.startswith("FusedBatchNorm") for op in (n.op_type for n in converted["custom"].graph.node))
    assert {p.key: p.value for p in folded.metadata_props}[EXACT_OUTPUTS_KEY] == ""
    expected = model(images, training=False).numpy()
    got = run_onnx(folded, {folded.graph.input[0].name: images})[folded.graph.output[0].name]
    # Folding rounds differently; it must stay the same network (close, not exact).
    assert np.abs(got - expected).max() <= 0.02 * np.abs(expected).max() + 1e-6


def test_per_axis_given_range_moves_its_axis_and_data_ranges_keep_their_layout():
    w1 = tf.constant(np.random.default_rng(1).normal(size=(3, 3, 4, 5)).astype(np.float32))
    w2 = tf.constant(np.random.default_rng(2).normal(size=(1, 1, 5, 3)).astype(np.float32))
    lo = tf.constant(np.linspace(-2, -1, 5).astype(np.float32))
    hi = tf.constant(np.linspace(1, 3, 5).astype(np.float32))

    def body(x):
        y = tf.nn.conv2d(x, w1, 1, "SAME")
        given = tf.raw_ops.QuantizeAndDequantizeV3(input=y, input_min=lo, input_max=hi, num_bits=6, range_given=True, axis=3)
        data = tf.raw_ops.QuantizeAndDequantizeV4(input=y, input_min=-1.0, input_max=1.0, range_given=False, num_bits=5)
        return tf.nn.conv2d(given, w2, 1, "SAME"), tf.nn.conv2d(data, w2, 1, "SAME")

    signature = [tf.TensorSpec((2, 6, 6, 4), tf.float32)]
    fn = tf.function(body, input_signature=signature)
    model = converters.from_function(fn, signature)
    qdq = {attr(n, "range_given"): n for n in model.graph.node if n.op_type.startswith("QuantizeAndDequantize")}
    assert attr(qdq[1], "axis") == 1  # NHWC axis 3 is NCHW axis 1
    producers, consumers = _neighbours(model)
    assert producers[qdq[0].input[0]].op_type == "Transpose"  # a data range keeps TF's element order
    assert producers[qdq[1].input[0]].op_type == "Conv"
    assert [c.op_type for c in consumers[qdq[1].output[0]]] == ["Conv"]
    x = np.random.default_rng(3).normal(size=(2, 6, 6, 4)).astype(np.float32)
    report = converters.verify(model, fn, inputs=[x], print_table=False)
    assert report.ok, report.table()


def test_pad_stays_before_a_filter_with_an_infinity():
    w0 = tf.constant(np.random.default_rng(1).normal(size=(1, 1, 3, 4)).astype(np.float32))
    f = np.random.default_rng(2).normal(size=(3, 3, 4, 1)).astype(np.float32)
    f[1, 1, 2, 0] = np.inf  # w * 0 = NaN: the padded zeros are not the same as skipped taps
    f = tf.constant(f)

    def body(x):
        y = tf.nn.conv2d(x, w0, 1, "SAME")
        y = tf.pad(y, [[0, 0], [1, 1], [0, 2], [0, 0]])
        return tf.nn.depthwise_conv2d(y, f, [1, 2, 2, 1], "VALID")

    signature = [tf.TensorSpec((1, 7, 7, 3), tf.float32)]
    fn = tf.function(body, input_signature=signature)
    model = converters.from_function(fn, signature)
    assert "Pad" in [n.op_type for n in model.graph.node]
    x = np.random.default_rng(3).normal(size=(1, 7, 7, 3)).astype(np.float32)
    report = converters.verify(model, fn, inputs=[x], print_table=False)
    assert report.ok, report.table()


def test_depthwise_gradients_take_the_convolutions_layout():
    """A saliency-style graph: the depthwise input gradient and filter gradient between convolutions."""
    w0 = tf.constant(np.random.default_rng(1).normal(size=(3, 3, 3, 4)).astype(np.float32))
    f = tf.Variable(np.random.default_rng(2).normal(size=(3, 3, 4, 2)).astype(np.float32))
    w1 = tf.constant(np.random.default_rng(3).normal(size=(1, 1, 8, 2)).astype(np.float32))

    def body(x):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = tf.nn.conv2d(x, w0, 1, "SAME")
            z = tf.nn.depthwise_conv2d(y, f, [1, 1, 1, 1], "SAME")
            loss = tf.reduce_sum(tf.nn.conv2d(z, w1, 1, "SAME") ** 2)
        return tape.gradient(loss, x), tape.gradient(loss, f)

    signature = [tf.TensorSpec((2, 9, 9, 3), tf.float32)]
    fn = tf.function(body, input_signature=signature)
    model = converters.from_function(fn, signature)
    grads = [n for n in model.graph.node if n.op_type.startswith("DepthwiseConv2dNativeBackprop")]
    assert {n.op_type for n in grads} == {"DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter"}
    assert all(attr(n, "data_format") == b"NCHW" for n in grads)
    assert not transposes_next_to_domain(model)
    x = np.random.default_rng(4).normal(size=(2, 9, 9, 3)).astype(np.float32)
    report = converters.verify(model, fn, inputs=[x], print_table=False)
    assert report.ok, report.table()


def test_saliency_gradients_take_the_convolutions_layout():
    """Only dx is read: the fake-quant and inference batch-norm gradients act element-wise and take the layout."""
    rng = np.random.default_rng(6)
    w0 = tf.constant(rng.normal(size=(3, 3, 3, 4)).astype(np.float32))
    w1 = tf.constant(rng.normal(size=(1, 1, 4, 2)).astype(np.float32))
    scale, offset = tf.constant(rng.uniform(0.5, 1.5, 4).astype(np.float32)), tf.constant(rng.normal(size=4).astype(np.float32))
    mean, var = tf.constant(rng.normal(0, 0.2, 4).astype(np.float32)), tf.constant(rng.uniform(0.5, 2, 4).astype(np.float32))

    def body(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.nn.conv2d(x, w0, 1, "SAME")
            y = tf.raw_ops.FusedBatchNormV3(x=y, scale=scale, offset=offset, mean=mean, variance=var, is_training=False)[0]
            y = tf.quantization.fake_quant_with_min_max_vars(tf.nn.relu6(y), tf.constant(-0.5), tf.constant(5.5))
            score = tf.reduce_sum(tf.nn.conv2d(y, w1, 1, "SAME") ** 2)
        return tape.gradient(score, x)

    signature = [tf.TensorSpec((2, 8, 8, 3), tf.float32)]
    fn = tf.function(body, input_signature=signature)
    model = converters.from_function(fn, signature)
    grads = {n.op_type: n for n in model.graph.node if n.domain == DOMAIN and "Grad" in n.op_type}
    assert set(grads) == {"FusedBatchNormGradV3", "FakeQuantWithMinMaxVarsGradient"}
    assert attr(grads["FusedBatchNormGradV3"], "data_format") == b"NCHW"
    assert not transposes_next_to_domain(model)
    x = rng.normal(size=(2, 8, 8, 3)).astype(np.float32)
    report = converters.verify(model, fn, inputs=[x], print_table=False)
    assert report.ok, report.table()


def test_per_channel_fake_quant_takes_the_layout_with_its_axis_moved():
    """TF's per-channel FakeQuant quantizes the last dim; in NCHW the node gets axis 1 and no Transpose stays
    next to it: on the NHWC graph input before a convolution (the input's Transpose moves above it), and
    between a convolution and a depthwise convolution."""
    w = tf.constant(np.random.default_rng(2).normal(size=(1, 1, 4, 5)).astype(np.float32))
    dw = tf.constant(np.random.default_rng(1).normal(size=(3, 3, 5, 1)).astype(np.float32))
    w2 = tf.constant(np.random.default_rng(4).normal(size=(1, 1, 5, 3)).astype(np.float32))
    lo4, hi4 = tf.constant(np.linspace(-2, -1, 4).astype(np.float32)), tf.constant(np.linspace(1, 3, 4).astype(np.float32))
    lo5, hi5 = tf.constant(np.linspace(-3, -1, 5).astype(np.float32)), tf.constant(np.linspace(1, 2, 5).astype(np.float32))

    def body(x):
        q = tf.quantization.fake_quant_with_min_max_vars_per_channel(x, lo4, hi4, num_bits=6)
        y = tf.nn.conv2d(q, w, 1, "SAME")
        y = tf.quantization.fake_quant_with_min_max_vars_per_channel(y, lo5, hi5)
        y = tf.nn.depthwise_conv2d(y, dw, [1, 1, 1, 1], "SAME")
        return tf.nn.conv2d(y, w2, 1, "SAME")

    signature = [tf.TensorSpec((2, 6, 6, 4), tf.float32)]
    fn = tf.function(body, input_signature=signature)
    model = converters.from_function(fn, signature)
    fq = [n for n in model.graph.node if n.op_type == "FakeQuantWithMinMaxVarsPerChannel"]
    assert len(fq) == 2 and [attr(n, "axis") for n in fq] == [1, 1]  # NHWC's last dim is NCHW axis 1
    assert transposes_next_to_domain(model) == []
    producers, consumers = _neighbours(model)
    assert [c.op_type for c in consumers[fq[0].output[0]]] == ["Conv"]
    assert producers[fq[1].input[0]].op_type == "Conv"
    assert [c.op_type for c in consumers[fq[1].output[0]]] == ["DepthwiseConv2dNative"]
    x = np.random.default_rng(3).normal(size=(2, 6, 6, 4)).astype(np.float32) * 3
    report = converters.verify(model, fn, inputs=[x], print_table=False)
    assert report.ok, report.table()


@pytest.mark.parametrize("case", ["float", "inf_tap", "subnormal_tap", "quantized", "gradient", "variable_filter"])
def test_custom_depthwise_choice(case):
    """The custom lowering writes a float inference graph's depthwise convolution as ONNX Runtime's grouped Conv
    (converters.pipeline.standard_conv_for_depthwise) and keeps the domain's node where that node computes what
    a Conv cannot (a non-finite or subnormal tap), or where its TF-ordered sums matter (a quantizer or a family
    gradient in the graph); every case still verifies against TF."""
    rng = np.random.default_rng(4)
    f = rng.normal(size=(3, 3, 4, 2)).astype(np.float32)
    if case == "inf_tap":
        f[0, 0, 1, 0] = np.inf
    if case == "subnormal_tap":
        f[1, 1, 2, 1] = np.float32(1e-40)
    filt = tf.Variable(f) if case == "variable_filter" else tf.constant(f)
    signature = [tf.TensorSpec((2, 9, 9, 4), tf.float32)]

    def body(x):
        if case == "gradient":
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = tf.nn.depthwise_conv2d(x, filt, [1, 1, 1, 1], "SAME")
                loss = tf.reduce_sum(y * y)
            return y, tape.gradient(loss, x)
        # VALID: no padding taps, where the domain's kernel skips what TF's Eigen kernel multiplies in
        # (docs/semantics.md 4.6), which an infinite tap would show.
        y = tf.nn.depthwise_conv2d(x, filt, [1, 2, 2, 1], "VALID" if case == "inf_tap" else "SAME")
        if case == "quantized":
            y = tf.quantization.fake_quant_with_min_max_args(y, -3.0, 3.0)
        return y

    fn = tf.function(body, input_signature=signature)
    model = converters.from_function(fn, signature, lowering="custom")
    domain = [n for n in model.graph.node if n.domain == DOMAIN and n.op_type == "DepthwiseConv2dNative"]
    grouped = [n for n in model.graph.node if n.op_type == "Conv"]
    if case in ("float", "variable_filter"):  # a variable is frozen: a constant filter, an inference graph
        assert not domain and len(grouped) == 1
    else:
        assert len(domain) == 1 and not grouped
    x = np.random.default_rng(5).normal(size=(2, 9, 9, 4)).astype(np.float32)
    report = converters.verify(model, fn, inputs=[x], print_table=False)
    assert report.ok, report.table()
