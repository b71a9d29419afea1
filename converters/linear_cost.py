"""tf2onnx's graph clean-up and optimizer loops at a cost linear in the graph (issue 12).

Converting a training step took minutes where the inference graph of the same network took seconds:
the cost of tf2onnx's optimizer grew with the graph times something else that grows with it.

* ``Graph.delete_unused_nodes`` runs after every optimizer (and inside some). It walks back from each
  graph output separately, with a fresh visited set per output, so its cost is outputs x nodes. A
  training step has an output per gradient and per updated variable (about 500 for MobileNetV2), and
  this walk was 85% of the conversion time of a synthetic training step of 32 blocks. ``LinearGraph``
  walks once from all outputs with one visited set. It keeps the same nodes; they keep their current relative order
  (tf2onnx's keeps them in the iteration order of a set of objects, which follows memory addresses).

* The transpose optimizer went back to the first node after every Transpose it moved (nodes x moves);
  converters.layout's LayoutOptimizer has a loop without the restarts.

* The identity optimizer hands the whole node list to ``replace_all_inputs`` for every Identity it
  removes (identities x nodes; a training step has one Identity per output). ``LinearOptimizingGraph``
  finds the consumers in the graph's consumer index instead, which is what ``replace_all_inputs`` does
  without ``ops``.

These apply to our conversion only: converters.pipeline gives the graph ``LinearGraph`` as its class
from parsing to ``make_model`` (tf2onnx's rewriters and make_graph clean up too), and
``LinearOptimizingGraph`` while it optimizes.
"""
from __future__ import annotations

import contextlib
import functools


def _reachable_in_order(graph):
    """The nodes of ``graph`` that feed its outputs or are its inputs, in their current order.

    The same set as tf2onnx's extract_sub_graph_nodes(outputs, remove_unused_inputs=False): inputs of a
    node and the outer-scope inputs of its body graphs are followed within this graph only.
    """
    seen = set()
    stack = []

    def visit(tensor):
        node = graph.get_node_by_output_in_current_graph(tensor)
        if node is not None and id(node) not in seen:
            seen.add(id(node))
            stack.append(node)

    for tensor in graph.outputs:
        visit(tensor)
    for node in graph.inputs:  # placeholders stay even when nothing reads them
        if node is not None and id(node) not in seen:
            seen.add(id(node))
            stack.append(node)
    while stack:
        node = stack.pop()
        for tensor in node.input:
            visit(tensor)
        # Only nodes with body graphs have implicit inputs; asking every node costs a lookup each.
        if node.name in graph.contained_graphs:
            for tensor in node.get_implicit_inputs():
                visit(tensor)
    # A node can stand in the list twice (tf2onnx's Gemm rewrite adds one again); the set tf2onnx
    # builds drops the second entry, and so does this.
    kept = []
    for node in graph.get_nodes():
        if id(node) in seen:
            seen.discard(id(node))
            kept.append(node)
    return kept


@functools.lru_cache(maxsize=None)
def _graph_classes():
    from tf2onnx.graph import Graph

    class LinearGraph(Graph):
        """tf2onnx's Graph whose delete_unused_nodes walks the graph once (see the module docstring)."""

        def delete_unused_nodes(self, outputs_name):
            if not outputs_name:
                return  # as tf2onnx: without outputs there is nothing to measure "unused" against
            if list(outputs_name) != list(self.outputs):
                # tf2onnx only ever asks for the graph's own outputs; anything else takes its path.
                return super().delete_unused_nodes(outputs_name)
            kept = _reachable_in_order(self)
            for node in kept:
                bodies = node.get_body_graphs() if node.name in self.contained_graphs else None
                for body in (bodies or {}).values():
                    body.delete_unused_nodes(body.outputs)
            self.reset_nodes(kept)

    class LinearOptimizingGraph(LinearGraph):
        """LinearGraph whose replace_all_inputs uses the consumer index, for the optimizers only."""

        def replace_all_inputs(self, old_input, new_input, ops=None):
            # The identity optimizer passes the whole node list as ``ops`` for every Identity it removes
            # (cost: identities x nodes). Each optimizer starts from the consumer index that reset_nodes
            # rebuilds, and the graph's own edits keep it up to date, so the index finds the same nodes.
            # (Outside the optimizers a handler may edit node.input directly; there ``ops`` is kept.)
            if ops is self.get_nodes():
                ops = None
            return super().replace_all_inputs(old_input, new_input, ops)

    return Graph, LinearGraph, LinearOptimizingGraph


def _all_graphs(graphs):
    found, todo = [], list(graphs)
    while todo:
        g = todo.pop()
        found.append(g)
        for bodies in g.contained_graphs.values():
            todo.extend(bodies.values())
    return found


@contextlib.contextmanager
def linear_graph(*graphs, optimizing=False):
    """Give ``graphs`` and their body graphs LinearGraph's methods (with ``optimizing``, also those of
    LinearOptimizingGraph) for the duration; give each its class back after."""
    classes = _graph_classes()
    target = classes[2] if optimizing else classes[1]
    changed = [(g, type(g)) for g in _all_graphs(graphs) if type(g) in classes]
    for g, _ in changed:
        g.__class__ = target
    try:
        yield
    finally:
        for g, cls in changed:
            g.__class__ = cls
