"""A dilated SeparableConv2D under tfmot's quantize_model, batch == channels: its depthwise FakeQuant per node.

Found by tools.graphgen (tfmot, Input(9x9x2) -> SeparableConv2D(2, 3, padding same, dilation 2) -> GAP ->
Dense, batch 2): in the standard lowering ``--verify-nodes`` failed at the depthwise half's activation
quantizer (``quant_depthwise_conv2d/MovingAvgQuantize/FakeQuantWithMinMaxVars``: "156 of 324 differ in bits
away from a rounding tie"), and at the pointwise Conv2D it feeds (312 of 324 outside), while the outputs were
bit for bit TF's end to end and the custom lowering verified per node.

The converted model is right; the per-node check fed and judged those values in the wrong layout. TF writes
the dilated depthwise convolution as SpaceToBatchND -> DepthwiseConv2dNative -> BatchToSpaceND. tf2onnx's
BatchToSpaceND handler works in CNHW (``Transpose [3, 0, 1, 2] -> DepthToSpace -> Slice -> Transpose [1, 2, 3,
0]``); the standard lowering's FakeQuant is element-wise ONNX ops (Clip, Sub, Div, Add, Floor, Mul) that the
layout optimizer (converters.layout) moves any Transpose through, so the closing CNHW -> NHWC Transpose goes
below the quantizer and cancels against the pointwise Conv's NHWC -> NCHW one (one Transpose [1, 0, 2, 3]
remains). The value named after the FakeQuant's output then holds TF's NHWC tensor as CNHW: ``transpose(tf,
[3, 0, 1, 2])``, shape [2, 2, 9, 9]. The per-node verifier's anchor layouts (``_LAYOUTS`` in
converters/node_verification.py) know only NHWC, NCHW ([0, 3, 1, 2]) and [0, 2, 3, 1]; with batch == channels
the CNHW shape equals the NCHW one, so the value was anchored as NCHW, its TF value compared (and fed to the
pointwise Conv's group) with batch and channel swapped. (With batch != channels no known layout matches, the
value is no anchor, and the quantizer is judged inside a larger group: it verified.) The custom lowering's
FakeQuant is one domain node that takes only NCHW -> NHWC Transposes, so its quantizer stays NHWC.

The fix is in converters/node_verification.py: CNHW is among the 4-D anchor layouts, and where it ties with NCHW
the graph decides (``_resolve_by_graph`` follows the layouts of decided values through layout-keeping nodes and
composes them through Transposes, here from the depthwise's output through tf2onnx's BatchToSpaceND Transposes).

Each graph is judged as the campaign judges it: through the CLI, end to end and per node (--verify
--verify-nodes), in both lowerings, for the inference, training-step and saliency signatures.
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

KINDS = ("serving_default", "train_step", "saliency")
LOWERINGS = ("standard", "custom")

# The graph the generator found (one layer: already minimal). Batch 2 == the depthwise's 2 channels is what
# makes the CNHW value look NCHW.
SPEC = GraphSpec(seed=3, index=1, family="tfmot", batch=2, input=(9, 9, 2), head="gap", optimizer=None,
                 train_steps=3,
                 layers=[{"op": "sepconv", "kernel": 3, "padding": "same", "dilation": 2, "filters": 2,
                          "multiplier": 1, "use_bias": True}])

@pytest.fixture(scope="module")
def runs():
    record = judge_graph(SPEC, {"kinds": list(KINDS), "lowerings": list(LOWERINGS), "tf2onnx": False})
    assert "invalid" not in record, record.get("invalid_detail")
    return {(run["kind"], run["lowering"]): run for run in record["runs"]}


@pytest.mark.parametrize("kind,lowering", [(kind, lowering) for kind in KINDS for lowering in LOWERINGS])
def test_dilated_separable_qat_is_verified_end_to_end_and_per_node(runs, kind, lowering):
    run = runs[(kind, lowering)]
    assert run["status"] == "verified", run
