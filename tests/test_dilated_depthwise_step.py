"""A dilated DepthwiseConv2D in a training step: SpaceToBatchND / BatchToSpaceND behind a multi-output node.

Found by tools.graphgen (tfmot, Input(1x1x2) -> DepthwiseConv2D(kernel 1, dilation 2, valid, multiplier 2, bias)
-> Flatten -> Dense(4), Adam step): the custom lowering wrote a Transpose with three inputs, which ONNX Runtime
refuses. TF runs the dilated depthwise convolution as SpaceToBatchND -> DepthwiseConv2dNative -> BatchToSpaceND;
the step's gradient applies SpaceToBatchND to the dx of tfmot's FakeQuantWithMinMaxVarsGradient (3 outputs, one
domain node in the custom lowering), and tf2onnx's SpaceToBatchND handler wrote its leading Transpose over every
output of that node (``make_node("Transpose", node.inputs[0].output)``). A training-mode FusedBatchNormV3 (6
outputs) before a dilated depthwise convolution of a float model did the same in the forward pass.
converters.space_to_batch reads such an input through an Identity, which tf2onnx's optimizer removes again.

Each graph is judged as the campaign judges it: through the CLI, end to end and per node (--verify
--verify-nodes), with the variable updates as outputs.
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


def _dwconv(kernel=1, multiplier=2, padding="valid"):
    return {"op": "dwconv", "kernel": kernel, "dilation": 2, "multiplier": multiplier, "padding": padding,
            "use_bias": True}


def _spec(family, shape, layers, seed=2, train_steps=5):
    return GraphSpec(seed=seed, index=0, family=family, batch=1, input=shape, layers=layers, head="flatten",
                     optimizer="adam", train_steps=train_steps)


BN = {"op": "bn", "momentum": 0.9, "epsilon": 1e-3, "center": True, "scale": True}

CASES = {
    # The graph the generator found, minimized.
    "tfmot multiplier 2, custom": (_spec("tfmot", (1, 1, 2), [_dwconv()]), "custom"),
    "tfmot multiplier 2, standard": (_spec("tfmot", (1, 1, 2), [_dwconv()]), "standard"),
    "tfmot multiplier 1, custom": (_spec("tfmot", (1, 1, 2), [_dwconv(multiplier=1)], train_steps=2), "custom"),
    # The forward pass: a training-mode batch norm's y (output 0 of 6) into the SpaceToBatchND; SAME, kernel 3.
    "tf_keras batch norm then dilated depthwise, custom": (
        _spec("tf_keras", (5, 5, 2), [BN, _dwconv(kernel=3, padding="same")], train_steps=2), "custom"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_dilated_depthwise_training_step_is_verified(name):
    spec, lowering = CASES[name]
    record = judge_graph(spec, {"kinds": ["train_step"], "lowerings": [lowering], "tf2onnx": False})
    assert "invalid" not in record, record.get("invalid_detail")
    (run,) = record["runs"]
    assert run["status"] == "verified", run


@pytest.mark.parametrize("lowering", ["custom", "standard"])
def test_space_batch_ops_read_the_right_output_of_a_split(lowering):
    """The same tf2onnx handlers read the producer's first output in the 3-D case and all of them in the 4-D
    case: SpaceToBatchND and BatchToSpaceND on the second output of a Split, judged end to end and per node."""
    import tensorflow as tf

    import converters

    signature = [tf.TensorSpec((2, 4, 6, 4), tf.float32), tf.TensorSpec((2, 4, 6), tf.float32)]

    def fn(x4, x3):
        _, b4 = tf.split(x4 * 2.0, 2, axis=0)
        _, b3 = tf.split(x3 * 2.0, 2, axis=0)
        s4 = tf.space_to_batch_nd(b4, [2, 2], [[0, 0], [1, 1]])
        s3 = tf.space_to_batch_nd(b3, [2, 2], [[1, 1], [0, 0]])
        _, c4 = tf.split(s4 - 1.0, 2, axis=-1)  # 4 x 2 x 4 x 4 -> the second 4 x 2 x 4 x 2
        back4 = tf.batch_to_space(c4 + 0.5, [2, 2], [[0, 0], [1, 1]])
        return {"s4": s4, "s3": s3, "back4": back4}

    function = tf.function(fn, input_signature=signature)
    model = converters.from_function(function, signature, lowering=lowering)
    assert converters.verify(model, function, spread=False).ok
    assert converters.verify_nodes(model, function).ok
