"""The graph generator (tools.graphgen): determinism, validity and reach of its draws, the oracle's classes, and a
short seeded campaign through the CLI in every lowering that must end with zero failures.

The long campaigns (1,000 graphs) are a command of their own (``python -m tools.graphgen``, docs/graphgen.md); this
one is the seeded sample CI can afford.
"""
from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.graphgen import oracle, raw_ops  # noqa: E402
from tools.graphgen.campaign import run_campaign  # noqa: E402
from tools.graphgen.draw import draw_graph  # noqa: E402
from tools.graphgen.minimize import candidates  # noqa: E402
from tools.graphgen.report import summarize  # noqa: E402
from tools.graphgen.spec import FAMILIES, RAW, GraphSpec, InvalidGraph, check  # noqa: E402

pytestmark = pytest.mark.tensorflow

CI_SEED = 44
CI_GRAPHS = 8


def test_draws_are_deterministic_and_valid():
    for i in range(200):
        a, b = draw_graph(3, i), draw_graph(3, i)
        assert a.dumps() == b.dumps()
        check(a)
        assert GraphSpec.from_json(json.loads(a.dumps())).dumps() == a.dumps()
    assert draw_graph(3, 0).dumps() != draw_graph(4, 0).dumps()


def test_draws_reach_every_family_and_raw_attribute_value():
    specs = [draw_graph(0, i) for i in range(1000)]
    assert {s.family for s in specs} == set(FAMILIES)
    seen = collections.defaultdict(set)
    for s in specs:
        if s.family != RAW:
            continue
        for op in s.raw:
            for key, value in op.items():
                if isinstance(value, (bool, int, str)):
                    seen[(op["op"], key)].add(value)
    assert seen[("fq_args", "num_bits")] == set(raw_ops.FAKE_QUANT_BITS)
    assert seen[("fq_vars_pc", "num_bits")] == set(raw_ops.FAKE_QUANT_BITS)
    assert seen[("qdq", "num_bits")] == set(raw_ops.QDQ_BITS)
    assert seen[("qdq", "version")] == set(raw_ops.QDQ_VERSIONS)
    assert seen[("qdq", "round_mode")] == set(raw_ops.ROUND_MODES)
    assert seen[("qdq", "axis")] == {-1, 0, 1, 2, 3}
    for key in ("signed_input", "range_given", "narrow_range"):
        assert seen[("qdq", key)] == {True, False}
    assert seen[("bn", "version")] == set(raw_ops.BN_VERSIONS)
    assert seen[("bn", "data_format")] == set(raw_ops.DATA_FORMATS)
    assert seen[("bn", "is_training")] == {True, False}
    assert seen[("dw", "padding")] == set(raw_ops.PADDINGS)
    assert seen[("dw", "multiplier")] == {1, 2, 3}
    assert seen[("dw", "strides")] == {1, 2} and seen[("dw", "dilations")] == {1}


def test_shape_rules_reject_what_keras_rejects():
    spec = GraphSpec(seed=0, index=0, family="tf_keras", batch=1, input=(2, 2, 1),
                     layers=[{"op": "conv", "kernel": 3, "padding": "valid", "filters": 2, "use_bias": True}])
    with pytest.raises(InvalidGraph):
        check(spec)
    spec.layers[0]["padding"] = "same"
    check(spec)


def test_minimizer_candidates_are_smaller():
    spec = draw_graph(0, 3)
    size = len(spec.dumps())
    found = list(candidates(spec))
    assert found and all(len(c.dumps()) <= size + 8 for c in found)


def test_refusal_reasons_are_masked():
    a = oracle.mask("node 'model/conv2d/Conv2D': 12 bits in build/a/saved_model")
    b = oracle.mask("node 'other/dw': 9 bits in build/b/saved_model")
    assert a == b


def test_static_checks_catch_a_wrong_declared_shape(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    good = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                             opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / "good.onnx"
    onnx.save(good, path)
    assert oracle.static_checks(str(path)) is None
    bad = onnx.ModelProto()
    bad.CopyFrom(good)
    bad.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 4  # ORT gives [2, 3]
    onnx.save(bad, path)
    assert oracle.static_checks(str(path)) is not None
    bad.CopyFrom(good)
    bad.ir_version = 10
    onnx.save(bad, path)
    assert "IR version" in oracle.static_checks(str(path))


def test_seeded_campaign_has_no_failures(tmp_path):
    """A short campaign through the CLI (every lowering and signature, tf2onnx's baseline): zero failures."""
    records = run_campaign(CI_SEED, CI_GRAPHS, 1, tmp_path / "results.jsonl", {"tf2onnx": True}, timeout=600)
    summary = summarize(records)
    print(summary)
    assert len(records) == CI_GRAPHS
    runs = [run for r in records for run in r["runs"]]
    assert sum(1 for r in records if "invalid" not in r) >= CI_GRAPHS // 2, summary
    failed = [(r["name"], run) for r in records for run in r["runs"] if run["status"] == "failed"]
    assert not failed, summary
    assert sum(run["status"] == "verified" for run in runs) >= 6 * (CI_GRAPHS // 2)
