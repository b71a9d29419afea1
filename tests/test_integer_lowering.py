"""The integer lowering (converters.integer): every pattern it writes, judged against TF.

A small tfmot QAT network holds each pattern of tfmot's default 8-bit scheme that MobileNetV2 has (a strided
Conv + BN + ReLU, a depthwise Conv + BN + ReLU6 with SAME padding, a ZeroPadding2D before a VALID strided
depthwise, a 1x1 projection + BN, a residual Add, the global mean and the Dense head). Its batch-norm statistics
are random (so the folded factors, negative ones included, are not 1) and a few training steps move its ranges.
"""
import numpy as np
import onnx
import pytest
from integer_models import input_quantizer_integers, run_ort
from onnx import helper, numpy_helper, TensorProto

pytestmark = pytest.mark.tensorflow

SHAPE = (24, 24, 3)


@pytest.fixture(scope="module")
def qat():
    import tensorflow as tf
    import tf_keras
    import tensorflow_model_optimization as tfmot

    tf.keras.utils.set_random_seed(7)
    layers = tf_keras.layers
    x = inputs = tf_keras.Input(SHAPE, name="images")
    x = layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False)(x)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU(6.0)(x)
    skip = x
    x = layers.DepthwiseConv2D(3, padding="same", use_bias=False)(x)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU(6.0)(x)
    x = layers.Conv2D(8, 1, use_bias=False)(x)
    x = layers.BatchNormalization()(x)
    x = layers.Add()([x, skip])
    x = layers.ZeroPadding2D(((0, 1), (0, 1)))(x)
    x = layers.DepthwiseConv2D(3, strides=2, padding="valid", use_bias=False)(x)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU()(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(5)(x)
    model = tf_keras.Model(inputs, x)
    rng = np.random.default_rng(3)
    for layer in model.layers:
        if isinstance(layer, layers.BatchNormalization):
            c = layer.gamma.shape[0]
            layer.set_weights([rng.uniform(-1.5, 1.5, c).astype(np.float32),  # some negative factors
                               rng.normal(0, 0.3, c).astype(np.float32),
                               rng.normal(0, 0.5, c).astype(np.float32),
                               rng.uniform(0.2, 2.0, c).astype(np.float32)])
    qmodel = tfmot.quantization.keras.quantize_model(model)
    qmodel.compile(tf_keras.optimizers.SGD(0.01), tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    images = rng.uniform(0, 1, (64,) + SHAPE).astype(np.float32)
    qmodel.fit(images, rng.integers(0, 5, 64), batch_size=16, epochs=1, verbose=0)
    return qmodel


@pytest.fixture(scope="module")
def converted(qat):
    import converters

    return converters.from_keras(qat, lowering="integer")


def _images(n, seed=0):
    return np.random.default_rng(seed).uniform(0, 1, (n,) + SHAPE).astype(np.float32)


def _initializers(model):
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def _tf_logits(qat, images):
    return qat(images, training=False).numpy()


def test_every_convolution_and_the_dense_run_in_integer(converted):
    from converters.integer import read_summary
    from converters.integer.fusion import optimized_op_counts

    lines, steps = read_summary(converted)
    assert "Conv in integer: 2/2" in lines and "DepthwiseConv2dNative in integer: 2/2" in lines
    assert "MatMul in integer: 1/1" in lines and not any("float island" in line for line in lines)
    counts = optimized_op_counts(converted)
    assert counts["QLinearConv"] == 4 and counts["QGemm"] == 1 and counts["QLinearAdd"] == 1
    assert counts["QLinearGlobalAveragePool"] == 1
    assert not any(counts.get(op) for op in ("Conv", "FusedConv", "Gemm", "MatMul")), counts
    assert set(steps) == {"output_0"} or len(steps) == 1
    assert converted.ir_version <= 9 and not any(i.domain.endswith("tensorflow") for i in converted.opset_import)


def test_weight_integers_are_tfs_and_the_batch_norm_is_in_the_scale(qat, converted):
    """Each convolution's weight: the stored integers are TF's fake-quant integers of the kernel times the sign of
    the batch-norm factor folded after it, and its scale is TF's nudged scale times that factor's magnitude."""
    import tensorflow as tf

    from ort_ops.reference import _fake_quant as fq

    inits = _initializers(converted)
    checked = 0
    layers = list(qat.layers)
    for index, layer in enumerate(layers):
        inner = getattr(layer, "layer", None)
        if inner is None or "conv" not in inner.name:
            continue
        depthwise = "depthwise" in inner.name
        kernel = next(v for v in layer.weights if v.name.endswith("kernel:0") and "_m" not in v.name.split("/")[-1])
        mn = next(v for v in layer.weights if v.name.endswith("kernel_min:0"))
        mx = next(v for v in layer.weights if v.name.endswith("kernel_max:0"))
        tf_fq = tf.quantization.fake_quant_with_min_max_vars_per_channel(kernel, mn, mx, num_bits=8,
                                                                         narrow_range=True).numpy()
        _, _, tf_scale, _, _ = fq.nudge_with_zero_point(mn.numpy(), mx.numpy(), 1, 255)
        tf_q = np.rint(tf_fq / tf_scale)
        assert np.array_equal((tf_q * tf_scale).astype(np.float32), tf_fq)  # TF's values are integers x scale
        bn = next(l for l in layers[index + 1:] if "batch_normalization" in getattr(l, "layer", l).name)
        gamma, _, _, var = (w.numpy() for w in getattr(bn, "layer", bn).weights[:4])
        factor = gamma / np.sqrt(var + getattr(bn, "layer", bn).epsilon)
        # TF's kernel in ONNX's layout: HWIO -> OIHW; a depthwise [kh, kw, C, 1] -> [C, 1, kh, kw].
        tf_q = np.transpose(tf_q, (2, 3, 0, 1) if depthwise else (3, 2, 0, 1))
        if depthwise:
            tf_scale = np.full(tf_q.shape[0], tf_scale.item(), np.float32)
        dq = next(n for n in converted.graph.node if n.op_type == "DequantizeLinear" and f"/{layer.name}/" in n.doc_string)
        stored = inits[dq.input[0]].astype(np.int64) - inits[dq.input[2]].astype(np.int64).reshape(-1, 1, 1, 1)
        sign = np.sign(factor).reshape(-1, 1, 1, 1)
        assert np.array_equal(stored, (tf_q * sign).astype(np.int64)), inner.name
        np.testing.assert_allclose(inits[dq.input[1]], tf_scale * np.abs(factor), rtol=1e-6)
        checked += 1
    assert checked == 4


def test_bias_scale_is_input_scale_times_weight_scale(converted):
    inits = _initializers(converted)
    producers = {o: n for n in converted.graph.node for o in n.output}
    for node in converted.graph.node:
        if node.op_type not in ("Conv", "Gemm"):
            continue
        x_dq, w_dq, b_dq = (producers[i] for i in node.input[:3])
        assert all(n.op_type == "DequantizeLinear" for n in (x_dq, w_dq, b_dq))
        assert inits[b_dq.input[0]].dtype == np.int32 and not inits[b_dq.input[2]].any()
        expected = (np.float32(inits[x_dq.input[1]]) * inits[w_dq.input[1]]).astype(np.float32)
        assert np.array_equal(inits[b_dq.input[1]], expected), node.name


def test_logits_within_steps_of_tf(qat, converted):
    from converters.integer import read_summary
    from converters.integer.steps import judge_steps

    images = _images(64, seed=1)
    step = next(iter(read_summary(converted)[1].values()))
    check = judge_steps("logits", _tf_logits(qat, images), run_ort(converted, {"images": images})[0], step)
    assert check.ok and check.max_steps <= 2 and check.within_one >= 0.99, check
    # ONNX Runtime's integer kernels and the unfused QDQ graph (float convolutions of the same integers) agree:
    # the fusion changes no value beyond the requantization's rounding.
    unfused = judge_steps("logits", run_ort(converted, {"images": images}, optimize=False)[0],
                          run_ort(converted, {"images": images})[0], step)
    assert unfused.max_steps <= 1


def test_graph_input_integers_are_tfs_bit_for_bit_ties_included(qat, converted):
    import tensorflow as tf

    truncated = input_quantizer_integers(converted)
    quantizer = qat.layers[1]  # tfmot's QuantizeLayer
    mn = [v for v in quantizer.weights if v.name.endswith("min:0")][0].numpy()
    mx = [v for v in quantizer.weights if v.name.endswith("max:0")][0].numpy()
    from ort_ops.reference import _fake_quant as fq

    nudged_min, nudged_max, scale, _, zp = fq.nudge_with_zero_point(mn, mx, 0, 255)
    k = np.arange(-3, 259, dtype=np.float32)
    ties = (nudged_min + (k - zp + 0.5) * scale).astype(np.float32)  # exact half-steps (TF rounds them up)
    near = np.concatenate([np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf))])
    values = np.concatenate([ties, near, _images(4).ravel(), [0, -0.0, 1e-30, -1e-30]]).astype(np.float32)
    n = int(np.ceil(values.size / np.prod(SHAPE)))
    padded = np.resize(values, n * int(np.prod(SHAPE))).reshape((n,) + SHAPE)
    ours = run_ort(truncated, {"images": padded})[0]
    tf_values = tf.quantization.fake_quant_with_min_max_vars(padded, mn, mx).numpy()
    tf_integers = np.rint(tf_values / scale + zp).astype(np.int64)
    assert np.array_equal(np.transpose(ours, (0, 2, 3, 1)).astype(np.int64), tf_integers)


def test_clamp_of_integers_equals_clamp_before_quantize():
    """ReLU6 then QuantizeLinear == QuantizeLinear then a Clip of the integers at Q(0), Q(6), on every float32
    near the grid's points and the clamp's bounds (the rewrite that keeps the convolution fused)."""
    scale, zp = np.float32(0.0429), np.uint8(117)
    lo, hi = np.float32(0), np.float32(6)
    q_lo = int(np.clip(np.rint(lo / scale) + zp, 0, 255))
    q_hi = int(np.clip(np.rint(hi / scale) + zp, 0, 255))
    grid = ((np.arange(-140, 160) - 0.5) * scale).astype(np.float32)
    x = np.concatenate([grid, np.nextafter(grid, np.inf), np.nextafter(grid, -np.inf), [lo, hi, -0.0, 1e9, -1e9]])
    x = x.astype(np.float32)
    s, z = numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zp, "z")
    before = helper.make_graph([helper.make_node("Clip", ["x", "lo", "hi"], ["c"]),
                                helper.make_node("QuantizeLinear", ["c", "s", "z"], ["y"])], "before",
                               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                               [helper.make_tensor_value_info("y", TensorProto.UINT8, [None])],
                               [s, z, numpy_helper.from_array(lo, "lo"), numpy_helper.from_array(hi, "hi")])
    after = helper.make_graph([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                               helper.make_node("Clip", ["q", "qlo", "qhi"], ["y"])], "after",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [None])],
                              [s, z, numpy_helper.from_array(np.uint8(q_lo), "qlo"),
                               numpy_helper.from_array(np.uint8(q_hi), "qhi")])
    results = [run_ort(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), {"x": x})[0]
               for g in (before, after)]
    assert np.array_equal(results[0], results[1])


def _mutated(model, pick, change):
    mutated = onnx.ModelProto()
    mutated.CopyFrom(model)
    for init in mutated.graph.initializer:
        if pick(init.name):
            value = numpy_helper.to_array(init)
            init.CopyFrom(numpy_helper.from_array(change(value.copy()), init.name))
            return mutated
    raise AssertionError("nothing to mutate")


def _mutations(model):
    """Each kind of wrong parameter, applied to one layer in the middle of ``model``: (name, pick, change)."""
    names = [i.name for i in model.graph.initializer]
    weights = [n for n in names if n.endswith("/integer/weight")]
    layer = weights[1][: -len("/integer/weight")]
    activations = [n[: -len("/scale")] for n in names if n.endswith("/integer/scale")]
    middle = activations[len(activations) // 2]
    return {
        "activation scale": (lambda n: n == middle + "/scale", lambda v: (v * np.float32(1.25)).astype(v.dtype)),
        "zero point": (lambda n: n == middle + "/zero_point",
                       lambda v: (v.astype(np.int64) + 20).clip(0, 255).astype(v.dtype)),
        "weight": (lambda n: n == weights[1], lambda v: np.where(np.arange(v.size).reshape(v.shape) % 3 == 0,
                                                                  255 - v, v).astype(v.dtype)),
        "bias": (lambda n: n == layer + "/integer/bias", lambda v: (v + np.int32(20000)).astype(v.dtype)),
        "weight scale": (lambda n: n == layer + "/integer/weight_scale",
                         lambda v: (v * np.float32(1.5)).astype(v.dtype)),
    }


@pytest.mark.parametrize("mutation", ["activation scale", "zero point", "weight", "bias", "weight scale"])
def test_a_wrong_parameter_fails_per_tensor_by_far(qat, converted, mutation):
    """Per quantized tensor, on TF's values of the tensors before it: the converted model is within one step
    everywhere, and each wrong parameter puts its layer many steps off."""
    from converters.frontends import keras_concrete_function
    from converters.integer.per_tensor import DEFAULT_TENSOR_BOUND, verify_quantized_tensors

    fn = keras_concrete_function(qat)
    inputs = {"images": _images(8, seed=2)}
    good = verify_quantized_tensors(converted, fn, inputs)
    assert good.ok and len(good.checks) == 8, good.table()  # every quantizer but the regridded mean's
    pick, change = _mutations(converted)[mutation]
    bad = verify_quantized_tensors(_mutated(converted, pick, change), fn, inputs)
    assert not bad.ok and max(c.max_steps for c in bad.checks) >= 3 * DEFAULT_TENSOR_BOUND, (mutation, bad.table())


@pytest.mark.parametrize("mutation", ["zero point", "weight"])
def test_a_gross_error_fails_end_to_end_on_a_trained_network(mutation):
    """End to end (the drift of a deep network allowed for), on the trained 4-bit CNN's held-out digits: a wrong
    zero point or weight fails by far; the converted model passes."""
    import tensorflow as tf

    import converters
    from converters.integer import read_summary
    from converters.integer.steps import DEFAULT_STEP_BOUND, judge_steps
    from models import data
    from pathlib import Path

    path = str(Path(__file__).resolve().parents[1] / "models" / "fourbit_cnn" / "saved_model")
    model = converters.from_saved_model(path, lowering="integer")
    loaded = tf.saved_model.load(path)
    name = model.graph.input[0].name
    images = data.digits(model.graph.input[0].type.tensor_type.shape.dim[1].dim_value).test_images[:64]
    expected = loaded.signatures["serving_default"](**{name: tf.constant(images)})["logits"].numpy()
    step = read_summary(model)[1]["logits"]
    assert judge_steps("logits", expected, run_ort(model, {name: images})[0], step).ok
    pick, change = _mutations(model)[mutation]
    bad = judge_steps("logits", expected, run_ort(_mutated(model, pick, change), {name: images})[0], step)
    assert not bad.ok and bad.max_steps > 2 * DEFAULT_STEP_BOUND, bad


def test_a_training_step_is_refused_with_the_reason(qat):
    import converters

    with pytest.raises(converters.ConversionError, match="gradients"):
        converters.from_keras_train_step(qat, "sparse_categorical_crossentropy", from_logits=True, lowering="integer")


def test_a_float_graph_is_refused_saying_nothing_is_integer():
    import tensorflow as tf

    import converters

    @tf.function(input_signature=[tf.TensorSpec([1, 8, 8, 3], tf.float32)])
    def f(x):
        return tf.nn.relu(tf.nn.conv2d(x, tf.ones([3, 3, 3, 4]), 1, "SAME"))

    with pytest.raises(converters.ConversionError, match="no quantizer"):
        converters.from_function(f, f.input_signature, lowering="integer")


def test_a_batch_norm_outside_a_pattern_is_named():
    """An inference batch norm that follows no convolution has nothing to fold into: the error names it."""
    import tensorflow as tf

    import converters

    c = tf.constant(np.linspace(0.5, 1.5, 4).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([2, 3, 3, 4], tf.float32)])
    def f(x):
        xq = tf.quantization.fake_quant_with_min_max_args(x, -1.0, 1.0)
        y = tf.compat.v1.nn.fused_batch_norm(xq, c, c, mean=c, variance=c, is_training=False)[0]
        return tf.quantization.fake_quant_with_min_max_args(y, -4.0, 4.0)

    with pytest.raises(converters.ConversionError, match="FusedBatchNorm.*not part of a pattern the integer lowering"):
        converters.from_function(f, f.input_signature, lowering="integer")


def test_an_unquantized_matmul_is_a_named_float_island():
    """A Dense whose input no quantizer ends (Keras 3's example head) stays float, with TF's fake-quantized weight,
    and the summary names it."""
    import tensorflow as tf

    import converters
    from converters.integer import read_summary

    w = tf.constant(np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([2, 4], tf.float32)])
    def f(x):
        xq = tf.quantization.fake_quant_with_min_max_args(x, -1.0, 1.0)
        wq = tf.quantization.fake_quant_with_min_max_args(w, -3.0, 3.0, narrow_range=True)
        return tf.matmul(tf.nn.relu(tf.matmul(xq, tf.eye(4))), wq)

    model = converters.from_function(f, f.input_signature, lowering="integer")
    lines = read_summary(model)[0]
    assert any("float island" in line and "MatMul" in line and "not quantized" in line for line in lines), lines
    x = np.random.default_rng(1).uniform(-1, 1, (2, 4)).astype(np.float32)
    np.testing.assert_allclose(run_ort(model, {"x": x})[0], f(tf.constant(x)).numpy(), rtol=1e-5, atol=1e-6)


def test_cli_converts_verifies_and_prints_the_fused_counts(qat, tmp_path):
    import subprocess
    import sys

    saved = tmp_path / "qat"
    qat.save(str(saved), include_optimizer=False)
    out = tmp_path / "m.onnx"
    run = subprocess.run([sys.executable, "-m", "converters", "--saved-model", str(saved), "--lowering", "integer",
                          "--output", str(out), "--verify", "--no-tf-spread"], capture_output=True, text=True,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "QLinearConv 4/4" in run.stdout and "QGemm 1/1" in run.stdout
    assert "judged in quantization steps" in run.stdout and "verification passed" in run.stdout


def test_int8_weights_hold_the_same_integers(qat, converted):
    """``integer_weights="int8"`` (for VNNI x86 and ARM, where ONNX Runtime's u8s8 kernels are exact) stores the same
    integers with zero point 0; run unfused (float convolutions of the dequantized values, no u8s8 kernel) it
    computes what the default uint8 model computes."""
    import converters

    int8 = converters.from_keras(qat, lowering="integer", integer_weights="int8")
    a, b = _initializers(converted), _initializers(int8)
    weights = [n for n in a if n.endswith("/integer/weight")]
    assert len(weights) == 5
    for name in weights:
        assert a[name].dtype == np.uint8 and b[name].dtype == np.int8
        assert np.array_equal(a[name].astype(np.int16) - 128, b[name].astype(np.int16))
        assert not b[name.replace("/weight", "/weight_zero_point")].any()
    images = {"images": _images(16, seed=4)}
    np.testing.assert_array_equal(run_ort(converted, images, optimize=False)[0], run_ort(int8, images, optimize=False)[0])
    with pytest.raises(ValueError, match="integer_weights"):
        converters.from_keras(qat, lowering="integer", integer_weights="int4")
