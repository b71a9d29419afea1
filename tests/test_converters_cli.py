"""`python -m converters` on a SavedModel and on a GraphDef (as subprocesses), with --verify, and the
failure listing for ops tf2onnx cannot convert."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import tensorflow as tf

import ort_ops
from converters.__main__ import EXIT_CONVERSION_FAILED, main
from ort_ops.schemas import DOMAIN

pytestmark = pytest.mark.tensorflow

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run(
        [sys.executable, "-m", "converters", *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


class _QuantDepthwise(tf.Module):
    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(7)
        self.w = tf.Variable(rng.standard_normal((3, 3, 2, 2)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([1, 6, 6, 2], tf.float32, name="image")])
    def serve(self, image):
        q = tf.quantization.fake_quant_with_min_max_args(image, min=-2.0, max=2.0, num_bits=6)
        return {"quantized": q, "features": tf.nn.depthwise_conv2d(q, self.w, [1, 1, 1, 1], "SAME")}


def test_cli_saved_model_verify(tmp_path):
    module = _QuantDepthwise()
    tf.saved_model.save(module, str(tmp_path / "sm"), signatures={"serving_default": module.serve})
    out = tmp_path / "m.onnx"
    proc = _cli("--saved-model", tmp_path / "sm", "--output", out, "--verify")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verification passed" in proc.stdout
    for name in ("quantized", "features", "bit-exact", "error", "bound"):
        assert name in proc.stdout
    model = onnx.load(str(out))
    assert model.ir_version == ort_ops.lowest_ir_version(model) == 8
    assert sorted(n.op_type for n in model.graph.node if n.domain == DOMAIN) == [
        "DepthwiseConv2dNative", "FakeQuantWithMinMaxArgs",
    ]
    assert [i.name for i in model.graph.input] == ["image"]


def _graph_def(body, signature):
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    concrete = tf.function(body, input_signature=signature).get_concrete_function()
    frozen = convert_variables_to_constants_v2(concrete)
    return frozen.graph.as_graph_def(), [t.name for t in frozen.inputs], [t.name for t in frozen.outputs]


def test_cli_graph_def_verify(tmp_path):
    def body(x):
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(x, tf.ones([3]) * 1.5, tf.zeros([3]) + 0.25, is_training=True)
        return tf.quantization.quantize_and_dequantize_v2(y, -1.0, 1.0, num_bits=4, range_given=True)

    graph_def, inputs, outputs = _graph_def(body, [tf.TensorSpec([2, 3, 3, 3], tf.float32)])
    pb = tmp_path / "g.pb"
    pb.write_bytes(graph_def.SerializeToString())
    out = tmp_path / "g.onnx"
    proc = _cli("--graphdef", pb, "--inputs", ",".join(inputs), "--outputs", ",".join(outputs), "--output", out, "--verify")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verification passed" in proc.stdout and "bit-exact" in proc.stdout
    model = onnx.load(str(out))
    assert {"FusedBatchNormV3", "QuantizeAndDequantizeV4"} <= {n.op_type for n in model.graph.node if n.domain == DOMAIN}


def test_cli_lists_unconverted_ops(tmp_path, capsys):
    def body(x):
        return tf.math.special.bessel_i0e(tf.quantization.fake_quant_with_min_max_args(x))

    graph_def, inputs, outputs = _graph_def(body, [tf.TensorSpec([4], tf.float32)])
    pb = tmp_path / "bad.pb"
    pb.write_bytes(graph_def.SerializeToString())
    out = tmp_path / "bad.onnx"
    rc = main(["--graphdef", str(pb), "--inputs", ",".join(inputs), "--outputs", ",".join(outputs), "--output", str(out)])
    err = capsys.readouterr().err
    assert rc == EXIT_CONVERSION_FAILED
    assert "1 TensorFlow op(s) could not be converted" in err and "BesselI0e" in err
    assert not out.exists()


class _BatchNormStep(tf.Module):
    """A training-mode batch norm: assigns its moving statistics; gamma and beta are trainable."""

    def __init__(self):
        super().__init__()
        import tf_keras

        self.bn = tf_keras.layers.BatchNormalization(momentum=0.5)
        self.bn.build((None, 3, 3, 2))

    @tf.function(input_signature=[tf.TensorSpec([2, 3, 3, 2], tf.float32, name="x")])
    def step(self, x):
        return {"y": self.bn(x, training=True) * 2.0}


def test_cli_state_options(tmp_path):
    module = _BatchNormStep()
    tf.saved_model.save(module, str(tmp_path / "sm"), signatures={"serving_default": module.step})
    plain, stateful = tmp_path / "plain.onnx", tmp_path / "stateful.onnx"
    proc = _cli("--saved-model", tmp_path / "sm", "--output", plain, "--verify")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 variable update(s) left out" in proc.stderr and "moving_mean" in proc.stderr
    warning = next(line for line in proc.stderr.splitlines() if "left out" in line)
    assert len(warning) < 400, warning  # one sentence, whatever the number of variables
    assert [o.name for o in onnx.load(str(plain)).graph.output] == ["y"]

    proc = _cli("--saved-model", tmp_path / "sm", "--output", stateful, "--variable-update-outputs", "--trainable-inputs",
                "--verify")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verification passed" in proc.stdout
    model = onnx.load(str(stateful))
    outputs = [o.name for o in model.graph.output]
    # Named after the variables (a layer built outside a model has no name scope).
    assert outputs[0] == "y" and sorted(outputs[1:]) == ["moving_mean", "moving_variance"]
    assert sorted(i.name for i in model.graph.input) == ["beta", "gamma", "x"]
    assert {"beta", "gamma"} <= {t.name for t in model.graph.initializer}


def test_cli_state_options_need_variables(tmp_path):
    proc = _cli("--graphdef", tmp_path / "g.pb", "--inputs", "x:0", "--outputs", "y:0", "--output", tmp_path / "o.onnx",
                "--trainable-inputs")
    assert proc.returncode == 2 and "--trainable-inputs need a SavedModel or Keras source" in proc.stderr
