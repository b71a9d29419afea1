"""Inline the function calls that TF's freezing leaves behind.

TF's freezing (``convert_variables_to_constants_v2``, aggressive inlining) inlines every function call but
those marked for XLA compilation or ``_noinline``. Keras 3 writes some ops that way on purpose: its TensorFlow
backend runs a grouped convolution (``Conv2D(groups=...)``, ConvNeXt's and keras_hub MobileNet's depthwise
convolutions) inside ``tf.function(jit_compile=True)`` because TF once lacked a CPU kernel for it
(keras/src/backend/tensorflow/nn.py ``conv``). Left as a ``StatefulPartitionedCall``, such a call is an op
tf2onnx cannot convert. Its body is ordinary ops, and TF's CPU kernels run the grouped Conv2D and its
gradients, so the marks are dropped and grappler's function inliner runs again: the frozen graph is flat, and
TF (verification) and ONNX see the same ops under the same names.
"""
from __future__ import annotations

from typing import Iterable

from converters.errors import ConversionError

# Attributes that keep grappler from inlining a call (on the call node or on the function it calls).
NO_INLINE_ATTRS = ("_XlaMustCompile", "_XlaCompile", "_XlaScope", "_XlaSeparateCompiledGradients", "_noinline")
CALL_OPS = ("PartitionedCall", "StatefulPartitionedCall")


def calls(graph_def) -> list:
    """The function-call nodes of a graph (not of its functions)."""
    return [n for n in graph_def.node if n.op in CALL_OPS]


def inline_calls(graph_def, fetches: Iterable[str]):
    """``graph_def`` with every (Stateful)PartitionedCall inlined; ``graph_def`` itself when it has none.

    ``fetches`` are the tensors (or nodes) that must survive, as grappler's fetch list."""
    if not calls(graph_def):
        return graph_def
    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2, rewriter_config_pb2
    from tensorflow.python.grappler import tf_optimizer

    graph_def = type(graph_def).FromString(graph_def.SerializeToString())
    functions = {f.signature.name: f for f in graph_def.library.function}
    compiled = [n.name for n in calls(graph_def) if _must_compile(n, functions)]
    for node in graph_def.node:
        _drop(node.attr)
    for function in graph_def.library.function:
        _drop(function.attr)
        for node in function.node_def:
            _drop(node.attr)
        _repair_frozen_reads(function)
    with tf.Graph().as_default():
        meta_graph = tf.compat.v1.train.export_meta_graph(graph_def=graph_def)
    keep = meta_graph_pb2.CollectionDef()
    keep.node_list.value.extend(fetches)
    meta_graph.collection_def["train_op"].CopyFrom(keep)
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.min_graph_nodes = -1  # small graphs too
    rewrite.fail_on_optimizer_errors = True  # a call left uninlined is an error, not a silent skip
    rewrite.optimizers.append("function")  # nothing else: the caller's own grappler pass comes later
    rewrite.function_optimization = rewriter_config_pb2.RewriterConfig.AGGRESSIVE
    try:
        inlined = tf_optimizer.OptimizeGraph(config, meta_graph)
    except (tf.errors.OpError, ValueError) as e:  # ValueError: grappler could not even import the graph
        reason = (e.message if isinstance(e, tf.errors.OpError) else str(e)).splitlines()[0]
        raise ConversionError(
            f"TF could not inline the function call(s) {', '.join(n.name for n in calls(graph_def))}: {reason}. "
            f"Convert a function whose body TF can inline, or report this with the model"
        ) from None
    left = calls(inlined)
    if left:
        raise ConversionError(
            f"{len(left)} function call(s) could not be inlined: "
            + ", ".join(f"{n.op} {n.name!r} (function {n.attr['f'].func.name})" for n in left[:5])
            + ". tf2onnx converts ops, not calls; convert a function whose body TF can inline"
        )
    _mark_for_xla(inlined, compiled)
    return inlined


def _must_compile(call, functions) -> bool:
    function = functions.get(call.attr["f"].func.name)
    marks = [call.attr.get("_XlaMustCompile")] + ([function.attr.get("_XlaMustCompile")] if function else [])
    return any(m is not None and m.b for m in marks)


def _mark_for_xla(graph_def, compiled_calls):
    """Mark the ops inlined from each XLA-compiled call for XLA again, one cluster per call (``_XlaCompile``,
    ``_XlaScope``, as ``tf.xla.experimental.jit_scope`` marks ops), so that TF, running the frozen graph for
    verification, computes them as the user's model does: TF's CPU kernels lack some of them (the grouped
    Conv2DBackpropInput and Conv2DBackpropFilter that differentiate Keras 3's grouped convolution). The
    marks are attributes TF alone reads; the conversion ignores them."""
    from tensorflow.core.framework import attr_value_pb2

    prefixes = [(name + "/", "Func/" + name + "/", name) for name in compiled_calls]
    for node in graph_def.node:
        for body, wiring, scope in prefixes:
            if node.name.startswith(body) or node.name.startswith(wiring):
                node.attr["_XlaCompile"].CopyFrom(attr_value_pb2.AttrValue(b=True))
                node.attr["_XlaScope"].CopyFrom(attr_value_pb2.AttrValue(s=("inlined:" + scope).encode()))
                break


def _repair_frozen_reads(function):
    """Point a function's references to a frozen variable read at the read's new output.

    TF's freezing turns a ``ReadVariableOp`` inside a function into an ``Identity`` of the constant, but a
    function that also returns the read (the forward half of a gradient returns what its backward half
    needs) keeps returning ``read:value:0``, ReadVariableOp's output, which an Identity names
    ``read:output:0``; grappler then rejects the function."""
    identities = {n.name for n in function.node_def if n.op == "Identity"}

    def repaired(ref: str) -> str:
        parts = ref.split(":")
        if len(parts) == 3 and parts[0] in identities and parts[1] != "output":
            return f"{parts[0]}:output:{parts[2]}"
        return ref

    for key, ref in list(function.ret.items()):
        function.ret[key] = repaired(ref)
    for node in function.node_def:
        node.input[:] = [i if i.startswith("^") else repaired(i) for i in node.input]


def _drop(attrs):
    for name in NO_INLINE_ATTRS:
        if name in attrs:
            del attrs[name]
