"""Graphs the generator (tools.graphgen) found failing, minimized, each judged again as the campaign judged it:
through the CLI (``--verify --verify-nodes``; the integer lowering's per-tensor check), the run must be verified.

Each entry names the bug it caught; the specs are tools.graphgen.spec.GraphSpec as JSON (replay one with
``python -m tools.graphgen --replay '<spec>' --kinds K --lowerings L``).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.graphgen.spec import GraphSpec  # noqa: E402
from tools.graphgen.worker import judge_graph  # noqa: E402

pytestmark = pytest.mark.tensorflow


def _spec(family, shape, layers, batch=2, head="flatten", optimizer=None, seed=44, index=0, train_steps=2):
    # (seed and index also seed the builder's own choices, e.g. whether a Keras 3 fake-quant head is quantized)
    return GraphSpec(seed=seed, index=index, family=family, batch=batch, input=shape, layers=layers, head=head,
                     optimizer=optimizer, train_steps=train_steps)


BILINEAR = {"op": "upsample", "factor": 2, "interpolation": "bilinear"}

CASES = {
    # The per-node check judged a forward ResizeBilinear (a sum of 4 pixels) within rtol·|tf| instead of against
    # the size of what it summed: near-cancelling pixels failed at a few ulps (verify_magnitude: Resize linear).
    "per-node ResizeBilinear judged as a sum": (
        _spec("keras3", (6, 6, 2), [BILINEAR], batch=4), "train_step", "custom"),
    # An integer model in which no activation is quantized (a Keras 3 fake-quant kernel on the head, nothing
    # else): the per-tensor check had nothing to judge and called that a failure.
    "per-tensor check with no quantized activation": (
        _spec("keras3_fq", (8, 6, 4), [{"op": "bn", "momentum": 0.99, "epsilon": 1e-3, "center": True,
                                        "scale": True}], seed=1, index=17), "serving_default", "integer"),
    # A saliency map through UpSampling2D then ZeroPadding2D: the resize gradient's input had no static shape
    # (converters/gradients/resizing.py takes H and W from the forward resize).
    "resize gradient after zero padding": (
        _spec("tf_keras", (3, 3, 3), [BILINEAR, {"op": "zeropad", "pad": [[1, 0], [2, 1]]}], head="gap"),
        "saliency", "standard"),
    # tf2onnx writes a dilated convolution's SpaceToBatchND / BatchToSpaceND in CNHW; with batch == channels the
    # per-node check took a CNHW value for NCHW (and a channels-first mean for TF's [N, C] reshaped): the layouts
    # now follow from the graph (node_verification._resolve_by_graph through Transposes).
    "dilated grouped convolution, batch == channels": (
        _spec("tf_keras", (6, 4, 2), [{"op": "conv", "kernel": 1, "padding": "valid", "dilation": 2, "groups": 2,
                                       "filters": 4, "use_bias": True}], batch=4, head="gap", seed=2, index=97, train_steps=3),
        "train_step", "custom"),
    # The same graph-derived layouts must not travel through constants two nodes share (a Slice's axes): with
    # them, a CNHW guess reached the saliency map's BatchToSpaceND, which is NCHW.
    "concatenation before a dilated convolution, batch == channels": (
        _spec("tfmot", (1, 2, 1), [
            {"op": "concat", "branches": [
                [{"op": "conv", "kernel": 1, "padding": "same", "filters": 1, "use_bias": True}],
                [{"op": "conv", "kernel": 3, "padding": "same", "filters": 1, "multiplier": 1, "use_bias": False}]]},
            {"op": "conv", "kernel": 3, "padding": "same", "dilation": 2, "filters": 1, "use_bias": True}],
            batch=3, head="gap", seed=1, index=11, train_steps=4), "saliency", "custom"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_minimized_graph_is_verified(name):
    spec, kind, lowering = CASES[name]
    record = judge_graph(spec, {"kinds": [kind], "lowerings": [lowering], "tf2onnx": False})
    assert "invalid" not in record, record.get("invalid_detail")
    (run,) = record["runs"]
    assert run["status"] == "verified", run


def test_a_wrong_bilinear_resize_still_fails():
    """The sum bound of a linear Resize (its magnitude: the same Resize of |x|) still fails a resize that is wrong
    by a part in a thousand, or zero."""
    import numpy as np
    import onnx
    import tensorflow as tf
    from onnx import helper

    import converters

    signature = [tf.TensorSpec((2, 5, 4, 3), tf.float32)]

    def upsample(x):
        return tf.image.resize(x, (10, 8), method="bilinear") * 1.0

    fn = tf.function(upsample, input_signature=signature)
    model = converters.from_function(fn, signature, lowering="standard")
    assert converters.verify(model, fn, spread=False).ok
    for factor in (1.001, 0.0):
        wrong = onnx.ModelProto()
        wrong.CopyFrom(model)
        (resize,) = [n for n in wrong.graph.node if n.op_type == "Resize"]
        scaled = resize.output[0] + "_wrong"
        for node in wrong.graph.node:
            node.input[:] = [scaled if i == resize.output[0] else i for i in node.input]
        for out in wrong.graph.output:
            if out.name == resize.output[0]:
                out.name = scaled
        wrong.graph.initializer.append(onnx.numpy_helper.from_array(np.float32(factor), "wrong_factor"))
        index = list(wrong.graph.node).index(resize)
        wrong.graph.node.insert(index + 1, helper.make_node("Mul", [resize.output[0], "wrong_factor"], [scaled]))
        assert not converters.verify(wrong, fn, spread=False).ok, factor


def test_keras3_float8_training_step_is_refused_with_tf_s_reason():
    """Keras 3's float8 training step: TF itself cannot freeze it (float8_e5m2 gradients); the CLI says so in one
    line (it used to report an unexpected error), while the same model's inference graph converts at opset 19."""
    spec = GraphSpec(seed=2, index=29, family="keras3_quantize", batch=1, input=(8, 8, 3), head="gap",
                     quantize_mode="float8", train_steps=2,
                     layers=[{"op": "dwconv", "kernel": 1, "multiplier": 1, "padding": "same", "use_bias": True}])
    record = judge_graph(spec, {"kinds": ["serving_default", "saliency"], "lowerings": ["standard"], "tf2onnx": False})
    runs = {run["kind"]: run for run in record["runs"]}
    assert runs["serving_default"]["status"] == "verified", runs
    assert runs["saliency"]["status"] == "refused", runs
    assert "TensorFlow cannot freeze this function" in runs["saliency"]["detail"]
