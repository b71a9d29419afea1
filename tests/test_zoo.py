"""The zoo's fast subset (benchmarks/zoo.py; the whole zoo and its timings are docs/zoo.md's run).

keras_hub's MobileNetBackbone built from arguments (MobileNetV3-Small's stacks: hard-swish, squeeze-excite and
the depthwise convolutions Keras 3 writes as grouped Conv2D), calibrated on scikit-learn's sample photographs,
converted by the CLI in both lowerings and verified against TF: it passes, prints no traceback, and keeps one
Transpose (the input image's), and writes the same graph in both (names aside); tf2onnx's own conversion of it
is reported as the model ONNX Runtime cannot load that it is.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.tensorflow

ROOT = Path(__file__).resolve().parent.parent


def test_zoo_subset(tmp_path):
    out = tmp_path / "zoo.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "zoo.py"), "--models", "keras_hub.MobileNetBackbone", "--size", "32",
         "--graphs", "inference", "--no-timing", "--work", str(tmp_path), "--json", str(out),
         "--markdown", str(tmp_path / "zoo.md")],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2"), capture_output=True,
        text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["label"]: r for r in json.loads(out.read_text())["rows"]}
    for lowering in ("custom", "standard"):
        row = rows[lowering]
        assert row["verdict"] == "passed" and not row["traceback"], row
        assert row["transposes"] == 1, row
    # Keras 3 float inference: both lowerings write the same graph (names aside), and the table says so.
    assert rows["custom"]["signature"] == rows["standard"]["signature"]
    assert "the standard lowering's graph" in rows_text(tmp_path / "zoo.md", "custom")
    # tf2onnx 1.17 alone leaves Keras 3's grouped convolutions as StatefulPartitionedCall nodes: the zoo reports a
    # model ONNX Runtime cannot load instead of timing it.
    assert rows["tf2onnx"]["verdict"] == ("tf2onnx failed: ValueError: ONNX Runtime cannot load its model: no ONNX op "
                                          "StatefulPartitionedCall (a TF op tf2onnx left as it was)"), rows["tf2onnx"]
    assert "| keras_hub.MobileNetBackbone | 32 | inference | custom |" in (tmp_path / "zoo.md").read_text()


def rows_text(markdown: Path, lowering: str) -> str:
    return next(line for line in markdown.read_text().splitlines() if f"| {lowering} |" in line)


def test_graph_signature_ignores_names_not_computation():
    import onnx
    from onnx import helper

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from zoo import graph_signature

    def model(node_name, value_name, perm):
        node = helper.make_node("Transpose", ["x"], [value_name], name=node_name, perm=perm)
        relu = helper.make_node("Relu", [value_name], ["y"], name=node_name + "_relu")
        graph = helper.make_graph([node, relu], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 3])],
                                  [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 3, 2])])
        return helper.make_model(graph)

    assert graph_signature(model("a", "t", [0, 2, 1])) == graph_signature(model("b", "u", [0, 2, 1]))
    assert graph_signature(model("a", "t", [0, 2, 1])) != graph_signature(model("a", "t", [1, 0, 2]))
