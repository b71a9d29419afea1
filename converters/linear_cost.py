"""tf2onnx's graph clean-up and optimizer loops at a cost linear in the graph (issue 12).

Converting a training step took minutes where the inference graph of the same network took seconds:
the cost of tf2onnx's optimizer grew with the graph times something else that grows with it.

* ``Graph.delete_unused_nodes`` runs after every optimizer (and inside some). It walks back from each
  graph output separately, with a fresh visited set per output, so its cost is outputs x nodes. A
  training step has an output per gradient and per updated variable (about 500 for MobileNetV2), and
  this walk was 85% of the conversion time of a synthetic training step of 32 blocks. ``LinearGraph``
  walks once from all outputs with one visited set. It keeps the same nodes; they keep their current relative order
  (tf2onnx's keeps them in the iteration order of a set of objects, which follows memory addresses).

* The transpose optimizer (here converters.layout's LayoutOptimizer) goes back to the first node after
  every Transpose it moves or removes, so its cost is nodes x moves, and the moves grow with the
  number of convolutions. ``linear_layout_optimizer_class`` goes on from the next node instead, and
  scans again only while a pass changed something: the same moves, each tried on the graph as it is,
  until a whole pass finds nothing left to do. The order of the moves differs, so the result is not the
  same by construction; it was the same graph (node types and counts, ORT outputs) on every model
  compared (tests/test_linear_cost.py, the MobileNetV2 inference and training-step conversions).

* The identity optimizer hands the whole node list to ``replace_all_inputs`` for every Identity it
  removes (identities x nodes; a training step has one Identity per output). ``LinearOptimizingGraph``
  finds the consumers in the graph's consumer index instead, which is what ``replace_all_inputs`` does
  without ``ops``.

These apply to our conversion only: converters.pipeline gives the graph ``LinearGraph`` as its class
from parsing to ``make_model`` (tf2onnx's rewriters and make_graph clean up too),
``LinearOptimizingGraph`` while it optimizes, and the layout optimizer is an entry of our list.
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


def linear_layout_optimizer_class(base):
    """``base`` (a TransposeOptimizer subclass) with a node loop that does not restart after each change."""

    class LinearLayoutOptimizer(base):
        def _optimize_at_current_graph_level(self, graph):
            self._g = graph
            self.pre_optimize_action()
            changed = True
            while changed:
                changed = False
                self._force_stop = {}
                # This pass visits the nodes in graph order and then the nodes its moves create, in the
                # order they are created (make_node appends them), as tf2onnx's loop over the live list.
                work = list(graph.get_nodes())
                known = {id(n) for n in work}
                i = 0
                while i < len(work):
                    n = work[i]
                    i += 1
                    # An earlier move may have removed n.
                    if graph.get_node_by_name(n.name) is not n:
                        continue
                    if n.type == "Transpose" and n.get_attr("perm"):
                        if self._handle_nhwc_tranpose(n):
                            changed = True
                            self.graph_been_opt = True
                        elif graph.get_node_by_name(n.name) is n and _is_useless_transpose(n):
                            changed = True
                            self._remove_useless_tranpose(n)
                        _take_new_nodes(graph, work, known)
                if self._force_stop.get("stop") == 1:
                    break
            self.merge_duplicated_transposes()
            self.post_optimize_action()
            return self._g

    LinearLayoutOptimizer.__name__ = base.__name__
    LinearLayoutOptimizer.__qualname__ = base.__qualname__
    return LinearLayoutOptimizer


def _take_new_nodes(graph, work, known):
    """Append to ``work`` the nodes created since ``known`` was filled: make_node appends, so they are
    the tail of the node list after the last known node (cost: the new nodes, not the graph)."""
    nodes = graph.get_nodes()
    j = len(nodes)
    while j > 0 and id(nodes[j - 1]) not in known:
        j -= 1
    for n in nodes[j:]:
        known.add(id(n))
        work.append(n)


def _is_useless_transpose(node):
    # A Transpose whose perm keeps every axis in place (what tf2onnx's loop removes as useless).
    perm = node.get_attr_value("perm")
    return node.type == "Transpose" and bool(perm) and list(perm) == list(range(len(perm)))
