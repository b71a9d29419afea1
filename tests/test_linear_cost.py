"""converters.linear_cost gives the graph tf2onnx's own clean-up and optimizer loops give (issue 12).

Each graph is converted twice: as the pipeline does it (LinearGraph, the continuing layout loop) and
with tf2onnx's Graph methods and the restarting loop put back. The two models must have the same
nodes by type and, where ONNX Runtime runs them (the standard lowering), the same outputs bit for bit.
Then LinearGraph.delete_unused_nodes against tf2onnx's on a graph with dangling nodes, an unused input,
several outputs and a node listed twice.
"""
from __future__ import annotations

import collections
import contextlib

import numpy as np
import pytest
import tensorflow as tf

import converters
import converters.layout as layout
import converters.pipeline as pipeline
from benchmarks.conversion_time import make_chain
from converters.verification import run_onnx

pytestmark = pytest.mark.tensorflow


@contextlib.contextmanager
def _untouched(*graphs, optimizing=False):
    yield


def _two_ways(monkeypatch, fn, signature, **kw):
    linear = converters.from_function(fn, signature, **kw)
    with monkeypatch.context() as m:
        m.setattr(pipeline, "linear_graph", _untouched)
        m.setattr(layout, "SWEEPS", False)
        original = converters.from_function(fn, signature, **kw)
    return linear, original


def _types(model):
    return collections.Counter(n.op_type for n in model.graph.node)


def _multi_output_dense():
    """Dense layers with Identity outputs, one output read twice: the identity optimizer's cases."""
    w1 = tf.Variable(np.random.default_rng(1).normal(size=(6, 5)).astype(np.float32))
    w2 = tf.Variable(np.random.default_rng(2).normal(size=(5, 4)).astype(np.float32))
    spec = tf.TensorSpec([3, 6], tf.float32, name="x")

    @tf.function(input_signature=[spec])
    def fn(x):
        h = tf.nn.relu(tf.matmul(x, w1) + 1.0)
        y = tf.matmul(h, w2)
        return {"h": tf.identity(h), "y": y, "y_again": tf.identity(tf.identity(y)), "s": tf.reduce_sum(y)}

    fn.keep_alive = (w1, w2)
    return fn, [spec]


CASES = {
    "chain_step_standard": (lambda: make_chain(3, True), dict(lowering="standard", variable_updates="outputs")),
    "chain_step_custom": (lambda: make_chain(3, True), dict(lowering="custom", variable_updates="outputs")),
    "chain_inference_standard": (lambda: make_chain(3, False), dict(lowering="standard")),
    "chain_inference_custom": (lambda: make_chain(3, False), dict(lowering="custom")),
    "dense_identities": (_multi_output_dense, dict(lowering="standard")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_graph_as_tf2onnx_optimizers(monkeypatch, case):
    make, kw = CASES[case]
    fn, signature = make()
    linear, original = _two_ways(monkeypatch, fn, signature, **kw)
    assert _types(linear) == _types(original)
    assert [o.name for o in linear.graph.output] == [o.name for o in original.graph.output]
    if kw["lowering"] == "standard":
        x = np.random.default_rng(0).normal(size=signature[0].shape).astype(np.float32) * 3
        got, want = run_onnx(linear, {"x": x}), run_onnx(original, {"x": x})
        assert sorted(got) == sorted(want)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_delete_unused_nodes_keeps_what_tf2onnx_keeps():
    from tf2onnx.graph import Graph

    from converters.linear_cost import _graph_classes, linear_graph

    def build():
        g = Graph([], opset=17)
        g.add_graph_input("x", 1, [2])
        g.add_graph_input("u", 1, [2])  # read only by a dangling node: kept, as tf2onnx keeps inputs
        x, unused = g.get_node_by_output("x"), g.get_node_by_output("u")
        a = g.make_node("Relu", ["x"], outputs=["a"])
        b = g.make_node("Neg", ["a"], outputs=["b"])
        g.make_node("Abs", ["a"], outputs=["dangling"])  # read by nothing
        g.make_node("Exp", ["u"], outputs=["dangling_from_unused"])
        c = g.make_node("Add", ["a", "b"], outputs=["c"])
        g.get_nodes().append(c)  # listed twice, as tf2onnx's Gemm rewrite can leave a node
        g.outputs = ["b", "c"]
        return g, (x, unused, a, b, c)

    original, _ = build()
    Graph.delete_unused_nodes(original, original.outputs)
    linear, (x, unused, a, b, c) = build()
    with linear_graph(linear):
        assert isinstance(linear, _graph_classes()[1])
        linear.delete_unused_nodes(linear.outputs)
    assert type(linear) is Graph
    # node names come from a global counter; their outputs name them here
    assert sorted(n.output[0] for n in linear.get_nodes()) == sorted(n.output[0] for n in original.get_nodes())
    # the survivors keep their order (inputs, then as built), each once
    assert linear.get_nodes() == [x, unused, a, b, c]
