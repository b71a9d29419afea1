"""The integer lowering of QuantizeAndDequantizeV2/V3/V4 quantizers (converters.integer.grid), judged against TF.

The network is quantized the way TensorRT-oriented QAT tools quantize: symmetric int8 grids (narrow range), the
weights per output channel over their own range (``range_given=False`` on a constant: TF 2.21's V2/V4 reject a
given per-axis range, ort_ops.specs.quantize_dequantize), one weight per axis with a given range through V3, and
the activations per tensor over a calibrated range, rounding half to even (V2, V3) and half up (V4). One output
channel of a weight is all zeros (a pruned filter, whose range is [0, 0]).
"""
import numpy as np
import onnx
import pytest
from integer_models import input_quantizer_integers, run_ort
from onnx import numpy_helper

pytestmark = pytest.mark.tensorflow

SHAPE = (16, 16, 3)


def _network():
    import tensorflow as tf

    rng = np.random.default_rng(0)
    pointwise = rng.normal(0, 0.3, (1, 1, 8, 8)).astype(np.float32)
    pointwise[..., 5] = 0  # a pruned filter: range [0, 0]

    class Network(tf.Module):
        def __init__(self):
            self.k1 = tf.Variable(rng.normal(0, 0.3, (3, 3, 3, 8)).astype(np.float32))
            self.b1 = tf.Variable(rng.normal(0, 0.1, 8).astype(np.float32))
            self.dw = tf.Variable(rng.normal(0, 0.3, (3, 3, 8, 1)).astype(np.float32))
            self.k2 = tf.Variable(pointwise)
            self.w = tf.Variable(rng.normal(0, 0.3, (8, 5)).astype(np.float32))
            self.bw = tf.Variable(rng.normal(0, 0.1, 5).astype(np.float32))
            self.ranges = [tf.Variable(v, dtype=tf.float32) for v in (1.0, 3.0, 2.5, 2.0, 1.5, 1.2)]

        @staticmethod
        def weight(k, axis):
            zeros = tf.zeros([k.shape[axis]])
            return tf.quantization.quantize_and_dequantize_v2(k, zeros, zeros, range_given=False, narrow_range=True,
                                                              axis=axis)

        def activation(self, x, i, version=2):
            a = self.ranges[i]
            if version == 3:
                return tf.raw_ops.QuantizeAndDequantizeV3(input=x, input_min=-a, input_max=a, num_bits=8,
                                                          range_given=True, narrow_range=True)
            if version == 4:
                return tf.raw_ops.QuantizeAndDequantizeV4(input=x, input_min=-a, input_max=a, range_given=True,
                                                          round_mode="HALF_UP")
            return tf.quantization.quantize_and_dequantize_v2(x, -a, a, range_given=True, narrow_range=True)

        @tf.function(input_signature=[tf.TensorSpec((None,) + SHAPE, tf.float32, name="images")])
        def __call__(self, x):
            x = self.activation(x, 0)
            x = tf.nn.relu(tf.nn.conv2d(x, self.weight(self.k1, 3), 1, "SAME") + self.b1)
            x = self.activation(x, 1, version=3)
            x = tf.nn.relu6(tf.nn.depthwise_conv2d(x, self.weight(self.dw, 2), [1, 1, 1, 1], "SAME"))
            x = self.activation(x, 2, version=4)
            x = self.activation(tf.nn.conv2d(x, self.weight(self.k2, 3), 1, "VALID"), 3)
            x = self.activation(tf.reduce_mean(x, axis=[1, 2]), 4)
            amax = tf.reduce_max(tf.abs(self.w), axis=0)
            w = tf.raw_ops.QuantizeAndDequantizeV3(input=self.w, input_min=-amax, input_max=amax, num_bits=8,
                                                   range_given=True, narrow_range=True, axis=1)
            return self.activation(tf.matmul(x, w) + self.bw, 5)

    return Network()


@pytest.fixture(scope="module")
def network():
    return _network()


@pytest.fixture(scope="module")
def converted(network):
    import converters

    return converters.from_function(network.__call__, network.__call__.input_signature, lowering="integer")


def _images(n, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (n,) + SHAPE).astype(np.float32)


def test_every_convolution_and_the_matmul_run_in_integer(converted):
    from converters.integer import read_summary
    from converters.integer.fusion import optimized_op_counts

    lines, steps = read_summary(converted)
    assert "Conv in integer: 2/2" in lines and "DepthwiseConv2dNative in integer: 1/1" in lines
    assert "MatMul in integer: 1/1" in lines and not any("float island" in line for line in lines), lines
    assert any(line.startswith("quantizers: 6 activation") and "4 weight" in line for line in lines), lines
    counts = optimized_op_counts(converted)
    assert counts["QLinearConv"] == 3 and counts["QGemm"] == 1 and counts["QLinearGlobalAveragePool"] == 1, counts
    assert not any(counts.get(op) for op in ("Conv", "FusedConv", "Gemm", "MatMul")), counts
    # The symmetric int8 grid [-127, 127] as uint8 k = q + 128, its step TF's inverse scale a / 127.
    assert list(steps.values()) == [pytest.approx(np.float32(1.2) / np.float32(127), rel=1e-7)]


def test_weight_integers_times_scale_are_tfs_quantized_weights(network, converted):
    """Each stored weight, dequantized, is TF's QuantizeAndDequantize output of the kernel to the bit, the pruned
    filter's integers zeros (with a valid scale)."""
    import tensorflow as tf

    inits = {i.name: numpy_helper.to_array(i) for i in converted.graph.initializer}
    names = sorted(n for n in inits if n.endswith("/integer/weight"))
    assert len(names) == 4
    dequantized = {}
    for name in names:
        q = inits[name].astype(np.int64) - inits[name + "_zero_point"].reshape((-1,) + (1,) * (inits[name].ndim - 1))
        scale = inits[name + "_scale"].reshape((-1,) + (1,) * (inits[name].ndim - 1))
        assert np.abs(q).max() <= 127  # narrow range
        dequantized[name] = (q.astype(np.float32) * scale).astype(np.float32)
    zeros = lambda n: tf.zeros([n])  # noqa: E731
    expected = {
        "k1": np.transpose(tf.quantization.quantize_and_dequantize_v2(
            network.k1, zeros(8), zeros(8), narrow_range=True, axis=3).numpy(), (3, 2, 0, 1)),
        "dw": np.transpose(tf.quantization.quantize_and_dequantize_v2(
            network.dw, zeros(8), zeros(8), narrow_range=True, axis=2).numpy(), (2, 3, 0, 1)).reshape(8, 1, 3, 3),
        "k2": np.transpose(tf.quantization.quantize_and_dequantize_v2(
            network.k2, zeros(8), zeros(8), narrow_range=True, axis=3).numpy(), (3, 2, 0, 1)),
    }
    amax = tf.reduce_max(tf.abs(network.w), axis=0)
    expected["w"] = tf.raw_ops.QuantizeAndDequantizeV3(input=network.w, input_min=-amax, input_max=amax, num_bits=8,
                                                       range_given=True, narrow_range=True, axis=1).numpy().T
    matched = set()
    for key, value in expected.items():
        hits = [n for n, d in dequantized.items() if d.shape == value.shape and np.array_equal(d, value)]
        assert hits, key
        matched.update(hits)
    assert matched == set(names)
    pruned = next(d for d in dequantized.values() if d.shape == (8, 8, 1, 1) and not d[5].any())
    assert pruned[:5].any()


def test_outputs_and_every_quantized_tensor_on_tfs_grid(network, converted):
    from converters.integer import read_summary
    from converters.integer.per_tensor import verify_quantized_tensors
    from converters.integer.steps import judge_steps

    images = _images(32, seed=1)
    step = next(iter(read_summary(converted)[1].values()))
    check = judge_steps("logits", network(images).numpy(), run_ort(converted, {"images": images})[0], step)
    assert check.ok and check.max_steps <= 1 and check.within_one == 1.0, check
    report = verify_quantized_tensors(converted, network.__call__, {"images": images})
    assert report.ok and len(report.checks) >= 5, report.table()


@pytest.mark.parametrize("mutation", ["activation scale", "weight"])
def test_a_wrong_parameter_fails_per_tensor(network, converted, mutation):
    from converters.integer.per_tensor import verify_quantized_tensors

    mutated = onnx.ModelProto()
    mutated.CopyFrom(converted)
    suffix = "/integer/scale" if mutation == "activation scale" else "/integer/weight"
    targets = sorted((i for i in mutated.graph.initializer if i.name.endswith(suffix)), key=lambda i: i.name)
    target = targets[len(targets) // 2]
    value = numpy_helper.to_array(target)
    changed = (value * np.float32(1.25)).astype(value.dtype) if mutation == "activation scale" else \
        np.where(np.arange(value.size).reshape(value.shape) % 3 == 0, 255 - value, value).astype(value.dtype)
    target.CopyFrom(numpy_helper.from_array(changed, target.name))
    report = verify_quantized_tensors(mutated, network.__call__, {"images": _images(8, seed=2)})
    assert not report.ok and max(c.max_steps for c in report.checks) >= 3, report.table()


@pytest.mark.parametrize("round_mode,signed", [("HALF_TO_EVEN", True), ("HALF_UP", True), ("HALF_TO_EVEN", False)])
def test_graph_input_integers_are_tfs_bit_for_bit_ties_included(round_mode, signed):
    """The input quantizer in TF's own arithmetic (clamp, times the scale, rint or floor(v + 0.5)): every exact
    half-step, its float32 neighbours and the clamp bounds land on TF's integer, on the signed narrow grid
    [-127, 127] (stored + 128) and the unsigned [0, 255] (zero point 0)."""
    import tensorflow as tf

    import converters

    a = np.float32(2.5)
    lo = -a if signed else np.float32(0)
    quantize = dict(input_min=lo, input_max=a, range_given=True, round_mode=round_mode, narrow_range=signed,
                    signed_input=signed)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def f(x):
        xq = tf.raw_ops.QuantizeAndDequantizeV4(input=x, **quantize)
        w = tf.quantization.quantize_and_dequantize_v2(tf.eye(4) * 0.5, tf.zeros([4]), tf.zeros([4]), axis=1)
        return tf.quantization.quantize_and_dequantize_v2(tf.matmul(xq, w), -a, a, range_given=True)

    model = converters.from_function(f, f.input_signature, lowering="integer")
    top = 127 if signed else 255
    step = a / np.float32(top)
    k = np.arange(-top - 3, top + 4, dtype=np.float32)
    ties = ((k + np.float32(0.5)) * step).astype(np.float32)
    values = np.concatenate([ties, np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf)),
                             k * step, [a, -a, 1e9, -1e9, 0, -0.0, 1e-30]]).astype(np.float32)
    x = np.resize(values, (values.size + 3) // 4 * 4).reshape(-1, 4)
    ours = run_ort(input_quantizer_integers(model), {"x": x})[0].astype(np.int64) - (128 if signed else 0)
    tf_values = tf.raw_ops.QuantizeAndDequantizeV4(input=x, **quantize).numpy()
    assert np.array_equal(ours, np.rint(tf_values / step).astype(np.int64))
    assert ours.min() == (-127 if signed else 0) and ours.max() == top


def test_a_range_computed_at_run_time_is_refused():
    import tensorflow as tf

    import converters

    @tf.function(input_signature=[tf.TensorSpec([2, 4], tf.float32)])
    def f(x):
        return tf.quantization.quantize_and_dequantize_v2(x, -1.0, 1.0, range_given=False)

    with pytest.raises(converters.ConversionError, match="QuantizeAndDequantizeV4.*range_given is false"):
        converters.from_function(f, f.input_signature, lowering="integer")


@pytest.mark.parametrize("op", ["QuantizeAndDequantizeV4", "FakeQuantWithMinMaxVars"])
def test_more_than_eight_bits_is_refused_naming_the_node(op):
    import tensorflow as tf

    import converters

    @tf.function(input_signature=[tf.TensorSpec([2, 4], tf.float32)])
    def f(x):
        if op == "FakeQuantWithMinMaxVars":
            return tf.quantization.fake_quant_with_min_max_vars(x, -1.0, 1.0, num_bits=12)
        return tf.quantization.quantize_and_dequantize_v2(x, -1.0, 1.0, num_bits=12, range_given=True)

    with pytest.raises(converters.ConversionError, match=f"{op}.*12-bit quantizer"):
        converters.from_function(f, f.input_signature, lowering="integer")


def test_cli_converts_a_saved_model_and_verifies_it_in_steps(network, tmp_path):
    """From a SavedModel (the quantizers inside its StatefulPartitionedCall), as a user runs it."""
    import subprocess
    import sys
    from pathlib import Path

    import tensorflow as tf

    saved = tmp_path / "qdq_network"
    tf.saved_model.save(network, str(saved), signatures=network.__call__)
    out = tmp_path / "m.onnx"
    run = subprocess.run([sys.executable, "-m", "converters", "--saved-model", str(saved), "--lowering", "integer",
                          "--output", str(out), "--verify", "--no-tf-spread"], capture_output=True, text=True,
                         cwd=str(Path(__file__).resolve().parents[1]))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "QLinearConv 3/3" in run.stdout and "QGemm 1/1" in run.stdout, run.stdout
    assert "per-tensor verification passed" in run.stdout and "Traceback" not in run.stderr
