"""The verifier tells the truth, both ways (converters.verification, converters.verify_magnitude).

The training step of ``Conv2D(use_bias=True) -> BatchNormalization -> ReLU -> Dense`` returns the gradient of
the convolution's bias, which vanishes in exact arithmetic (the batch norm removes any per-channel constant):
TF and ONNX Runtime both return rounding noise there. It must pass, judged as a sum against the magnitude of
what was summed, in both lowerings, through the API and the CLI. Models that are wrong in the ways a
conversion goes wrong (a dropped epsilon, a flipped sign, a gradient scaled by 1.01, two outputs swapped) must
fail. TF's other kernel set (oneDNN) runs in a child process for TF's own spread; its numbers may be zero on a
CPU without AVX-512, so only their presence is asserted.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import tensorflow as tf
import tf_keras

import converters
from converters.verification import judge_output, run_onnx
from converters.verify_magnitude import companion
from ort_ops.schemas import DOMAIN

pytestmark = pytest.mark.tensorflow

ROOT = Path(__file__).resolve().parent.parent
BATCH, SHAPE, CLASSES = 4, (6, 6, 3), 4  # CLASSES >= 4: the CLI's random labels are in [0, 4)
EPSILON = 0.01  # large enough that dropping it moves every non-vanishing gradient by ~1e-2 relative
BIAS, GAMMA, BETA, KERNEL = "grad:conv/bias", "grad:bn/gamma", "grad:bn/beta", "grad:conv/kernel"


def _net(seed=1):
    tf_keras.backend.clear_session()
    tf_keras.utils.set_random_seed(seed)
    layers = tf_keras.layers
    inputs = tf_keras.Input(SHAPE)
    x = layers.Conv2D(4, 3, padding="same", use_bias=True, name="conv")(inputs)
    x = layers.BatchNormalization(epsilon=EPSILON, name="bn")(x)
    x = layers.ReLU()(x)
    x = layers.GlobalAveragePooling2D()(x)
    return tf_keras.Model(inputs, layers.Dense(CLASSES, name="dense")(x))


class Step(tf.Module):
    """loss and the gradient of every trainable variable (keyed by the variable's name), training=True."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    @tf.function(input_signature=[tf.TensorSpec((BATCH,) + SHAPE, tf.float32, name="images"),
                                  tf.TensorSpec((BATCH,), tf.int32, name="labels")])
    def __call__(self, images, labels):
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            logits = self.model(images, training=True)
            loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits)
        grads = tape.gradient(loss, variables)
        out = {"loss": loss}
        out.update({"grad:" + v.name.split(":")[0]: g for v, g in zip(variables, grads)})
        return out


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    return {"images": rng.standard_normal((BATCH,) + SHAPE).astype(np.float32),
            "labels": rng.integers(0, CLASSES, BATCH).astype(np.int32)}


@pytest.fixture(scope="module")
def step():
    return Step(_net())


@pytest.fixture(scope="module")
def converted(step):
    concrete = step.__call__.get_concrete_function()
    return {lowering: converters.from_concrete_function(concrete, lowering=lowering)
            for lowering in converters.LOWERINGS}


def _verify(model, step, **kw):
    return converters.verify(model, step.__call__.get_concrete_function(), inputs=_batch(), print_table=False, **kw)


def _checks(report):
    return {c.name: c for c in report.outputs}


# ---------------------------------------------------------------- the right model passes


@pytest.mark.parametrize("lowering", converters.LOWERINGS)
def test_training_step_passes_with_the_bias_gradient_judged_as_a_sum(step, converted, lowering):
    model = converted[lowering]
    report = _verify(model, step)
    assert report.ok, report.table()
    checks = _checks(report)
    assert sorted(checks) == sorted(["loss", BIAS, KERNEL, GAMMA, BETA, "grad:dense/kernel", "grad:dense/bias"])
    bias = checks[BIAS]
    assert bias.kind == "sum" and bias.verdict == "ok", report.table()
    # Every gradient and the loss are sums: none is judged against its own value alone.
    assert {c.kind for c in report.outputs} == {"sum"}, report.table()
    assert "Eigen" in report.tf_reference and "this process" in report.tf_reference


def test_the_vanishing_bias_gradient_is_rounding_noise_on_both_sides(step, converted):
    """What the old judge got wrong: against its own largest value, the noise fails; against the magnitude of
    the terms summed, it passes."""
    model = converted["custom"]
    batch = {k: tf.constant(v) for k, v in _batch().items()}
    tf_out = {k: v.numpy() for k, v in step.__call__.get_concrete_function()(**batch).items()}
    ort_out = run_onnx(model, _batch(), log_severity_level=3)
    comp = companion(model, [BIAS])
    magnitude = run_onnx(comp.model, _batch(), log_severity_level=3)[comp.outputs[BIAS]]
    noise = np.abs(tf_out[BIAS]).max()
    assert noise < 1e-6 * magnitude.min(), (noise, magnitude)  # zero in exact arithmetic
    assert judge_output(BIAS, tf_out[BIAS], ort_out[BIAS], magnitude=magnitude).ok
    if not np.array_equal(tf_out[BIAS], ort_out[BIAS]):
        # rtol*|tf| alone: one noise is not within a few ulps of the other
        assert not judge_output(BIAS, tf_out[BIAS], ort_out[BIAS]).ok


def test_judge_output_sum_rule_unit():
    tf_noise = np.array([5e-8, -3e-8, 0.0], np.float32)
    ort_noise = np.array([-2e-8, 4e-8, 1e-8], np.float32)
    magnitude = np.array([5.6, 15.0, 7.0])
    assert judge_output("b", tf_noise, ort_noise, magnitude=magnitude).ok
    assert not judge_output("b", tf_noise, ort_noise).ok
    # A real difference is not noise, however large the magnitude: 1e-3 of what was summed is far outside.
    assert not judge_output("b", tf_noise, ort_noise + np.float32(1e-3) * magnitude.astype(np.float32),
                            magnitude=magnitude).ok
    # Integers and quantized outputs stay bit for bit.
    one_ulp_off = np.array([1.0, np.nextafter(np.float32(2), np.float32(3))], np.float32)
    check = judge_output("q", np.array([1.0, 2.0], np.float32), one_ulp_off, exact=True, magnitude=np.array([1e9, 1e9]))
    assert not check.ok and check.kind == "bits" and check.n_differing == 1


# ---------------------------------------------------------------- wrong models fail


def _copy(model):
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _scale_output(model, name, factor):
    """``name`` times ``factor``: the producing node writes ``name/unscaled`` instead."""
    wrong = _copy(model)
    pre = name + "/unscaled"
    for node in wrong.graph.node:
        node.output[:] = [pre if o == name else o for o in node.output]
        node.input[:] = [pre if i == name else i for i in node.input]
    wrong.graph.initializer.append(onnx.numpy_helper.from_array(np.float32(factor), name + "/factor"))
    wrong.graph.node.append(onnx.helper.make_node("Mul", [pre, name + "/factor"], [name]))
    return wrong


def _swap_outputs(model, a, b):
    wrong = _copy(model)
    names = {a: b, b: a}
    for node in wrong.graph.node:
        node.output[:] = [names.get(o, o) for o in node.output]
        node.input[:] = [names.get(i, i) for i in node.input]
    return wrong


def _drop_epsilon(model):
    """The batch norm's epsilon set to 0: the domain nodes' attribute (custom lowering), or the constant the
    standard lowering adds to the variance."""
    wrong = _copy(model)
    changed = 0
    for node in wrong.graph.node:
        if node.domain == DOMAIN and node.op_type.startswith("FusedBatchNorm"):
            for attr in node.attribute:
                if attr.name == "epsilon":
                    attr.f = 0.0
                    changed += 1
    for init in wrong.graph.initializer:
        value = onnx.numpy_helper.to_array(init)
        if value.dtype == np.float32 and value.size == 1 and np.isclose(value.item(), EPSILON, rtol=1e-6):
            init.CopyFrom(onnx.numpy_helper.from_array(np.zeros_like(value), init.name))
            changed += 1
    assert changed, "no epsilon found"
    return wrong


def _failed(report):
    return {c.name for c in report.outputs if not c.ok}


@pytest.mark.parametrize("lowering", converters.LOWERINGS)
def test_dropped_epsilon_fails(step, converted, lowering):
    report = _verify(_drop_epsilon(converted[lowering]), step)
    assert not report.ok, report.table()
    # Every gradient behind the batch norm moves, except the bias gradient, which stays zero (noise).
    assert {KERNEL, GAMMA, "grad:dense/kernel", "loss"} <= _failed(report), report.table()


def test_flipped_sign_fails(step, converted):
    report = _verify(_scale_output(converted["custom"], KERNEL, -1.0), step)
    assert _failed(report) == {KERNEL}, report.table()
    assert _checks(report)[KERNEL].verdict.startswith("FAIL")


@pytest.mark.parametrize("output", [GAMMA, KERNEL, "grad:dense/kernel", "loss"])
def test_gradient_scaled_by_1_01_fails(step, converted, output):
    report = _verify(_scale_output(converted["custom"], output, 1.01), step)
    assert _failed(report) == {output}, report.table()


def test_swapped_outputs_fail(step, converted):
    report = _verify(_swap_outputs(converted["custom"], GAMMA, BETA), step)
    assert _failed(report) == {GAMMA, BETA}, report.table()


def test_a_swapped_noise_output_fails_too(step, converted):
    """The vanishing bias gradient swapped with the dense bias gradient (same shape): both fail."""
    report = _verify(_swap_outputs(converted["standard"], BIAS, "grad:dense/bias"), step)
    assert _failed(report) == {BIAS, "grad:dense/bias"}, report.table()


# ---------------------------------------------------------------- report, spread, CLI


def test_json_report_and_spread_child(step, converted, tmp_path):
    path = tmp_path / "report.json"
    report = _verify(converted["custom"], step, json_path=path)
    data = json.loads(path.read_text())
    assert data == json.loads(report.to_json())
    names = [o.name for o in converted["custom"].graph.output]
    assert [entry["name"] for entry in data["outputs"]] == names
    for entry in data["outputs"]:
        assert entry["verdict"] == "ok" and entry["ok"] is True
        assert entry["judged_as"] == "sum" and entry["bound"] > 0
        assert entry["tf_spread"] is not None and entry["tf_spread"] >= 0  # oneDNN ran (may equal Eigen here)
        assert entry["identical"] <= entry["elements"]
    assert data["ok"] is True and "child process" in data["tf_spread"]

    quiet = _verify(converted["custom"], step, spread=False)
    assert all(c.spread is None for c in quiet.outputs) and "not measured" in quiet.tf_spread


def test_within_tf_spread_is_said_for_inexact_outputs_only():
    eigen = np.array([1.0, 2.0], np.float32)
    onednn = np.array([1.0, 2.001], np.float32)
    ort = np.array([1.0, 2.0005], np.float32)
    check = judge_output("y", eigen, ort, other_tf=onednn)
    assert check.ok and check.within_spread and check.verdict == "ok: within TF's own spread"
    check = judge_output("y", eigen, ort, exact=True, other_tf=onednn)
    assert not check.ok and not check.within_spread
    check = judge_output("y", eigen, np.array([1.0, 2.0015], np.float32), other_tf=onednn)
    assert check.ok and check.verdict == "ok: within twice TF's own spread"
    check = judge_output("y", eigen, np.array([1.0, 2.003], np.float32), other_tf=onednn)
    assert not check.ok and check.verdict.startswith("FAIL")  # further from TF than twice TF's own spread


def test_onednn_process_runs_the_eigen_reference_in_a_child(tmp_path):
    """A process that imported TF with oneDNN on: the report says so and judges against Eigen from a child."""
    script = tmp_path / "onednn_parent.py"
    script.write_text(
        "import numpy as np, tensorflow as tf, converters\n"
        "from converters.verify_tf_child import onednn_enabled\n"
        "assert onednn_enabled()\n"
        "w = tf.constant(np.random.default_rng(0).standard_normal((3, 3, 2, 4)).astype(np.float32))\n"
        "sig = [tf.TensorSpec([2, 5, 5, 2], tf.float32)]\n"
        "body = lambda x: tf.reduce_sum(tf.nn.conv2d(x, w, 1, 'SAME') - 1.0, axis=[1, 2])\n"
        "fn = tf.function(body, input_signature=sig)\n"
        "model = converters.from_function(fn, sig)\n"
        "report = converters.verify(model, fn, print_table=False)\n"
        "print(report.tf_reference); print(report.tf_spread); print('OK' if report.ok else report.table())\n"
    )
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert "Eigen kernels, in a child process" in lines[-3] and "oneDNN" in lines[-3]
    assert "oneDNN kernels, in this process" in lines[-2]
    assert lines[-1] == "OK"


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_ENABLE_ONEDNN_OPTS", None)  # the CLI pins Eigen for --verify itself
    return subprocess.run([sys.executable, "-m", "converters", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_cli_training_step_from_saved_model(step, tmp_path, monkeypatch):
    tf.saved_model.save(step, str(tmp_path / "sm"), signatures={"serving_default": step.__call__})
    report_path = tmp_path / "report.json"
    proc = _cli("--saved-model", tmp_path / "sm", "--output", tmp_path / "step.onnx", "--variable-update-outputs",
                "--trainable-inputs", "--verify", "--verify-json", report_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "verification passed" in proc.stdout
    assert "TF reference: Eigen kernels (TF_ENABLE_ONEDNN_OPTS=0), in this process" in proc.stdout
    assert "appears in graph inputs" not in proc.stderr  # ORT's per-initializer warnings are off for --verify
    assert "left out of the converted model" not in proc.stderr
    assert "Traceback" not in proc.stderr
    data = json.loads(report_path.read_text())
    verdicts = {o["name"]: (o["judged_as"], o["verdict"]) for o in data["outputs"]}
    assert verdicts[BIAS] == ("sum", "ok")
    assert "moving_mean" not in " ".join(verdicts)  # the variable-update outputs are left out of --verify

    proc = _cli("--saved-model", tmp_path / "sm", "--output", tmp_path / "step.onnx", "--verify",
                "--verify-sum-rtol", "1e-12", "--no-tf-spread")
    assert proc.returncode == 3, proc.stdout + proc.stderr[-3000:]
    assert "verification FAILED" in proc.stdout and "TF spread: not measured" in proc.stdout

    # The API with a path relative to the working directory: the oneDNN child loads the same SavedModel.
    monkeypatch.chdir(tmp_path)
    report = converters.verify_saved_model("sm", onnx.load("step.onnx"), inputs=_batch(), print_table=False)
    assert report.ok and "child process" in report.tf_spread, report.table()
    assert all(c.spread is not None for c in report.outputs)


def test_cli_verify_options_need_verify(tmp_path):
    proc = _cli("--saved-model", tmp_path, "--output", tmp_path / "o.onnx", "--verify-json", tmp_path / "r.json")
    assert proc.returncode == 2 and "--verify-json apply to --verify" in proc.stderr
