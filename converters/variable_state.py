"""Freezing a ConcreteFunction with its variable state said out loud.

tf2onnx freezes a function with TensorFlow's ``convert_variables_to_constants_v2``, which (1) drops every
AssignVariableOp / AssignSubVariableOp / AssignAddVariableOp without a word and (2) drops the control
inputs of the variable reads it turns into constants. (2) is a silent error, not only lost state: tfmot's
quantizers in training mode read their min/max *after* the moving-average assignment, and a frozen read
gets the value from before it, so the converted step fake-quantizes with the wrong range.

``freeze`` here instead:
* finds every variable assignment in the inlined graph and computes the variable's new value as TF's
  assignment would (AssignVariableOp: the value; AssignSub: v - delta; AssignAdd: v + delta, one float
  op each, as TF's kernels compute it);
* wires every read that TF orders after an assignment (a control edge to it) to that new value;
* keeps the values of the assigned variables that are all zeros or hold a -0 out of grappler's sight, and
  adds their update nodes after it: grappler's folding of arithmetic on zero constants ignores the sign of
  zero, and a variable that a step assigns is often zero (a fresh bias, an optimizer slot), where TF never
  folds it (_sign_unsafe);
* then either leaves the updates out with a warning naming each one (``variable_updates="warn"``, the
  default), or adds each new value as an extra graph output named after the variable
  (``variable_updates="outputs"``);
* with ``trainable_inputs=True`` keeps the trainable variables as graph inputs (named after the
  variable) instead of constants; ``add_variable_initializers`` then gives each one its current value as
  a same-name initializer, so a caller may leave it out or feed new weights.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Dict, List

import numpy as np

from converters.errors import ConversionError
from converters.inlining import inline_calls

logger = logging.getLogger(__name__)

VARIABLE_UPDATE_MODES = ("warn", "outputs")
WARN_NAMES = 3  # variables the "left out" warning names
ASSIGN_OPS = ("AssignVariableOp", "AssignSubVariableOp", "AssignAddVariableOp")
# How each assignment computes the new value from the old one (None: the assigned value itself).
_UPDATE_OP = {"AssignVariableOp": None, "AssignSubVariableOp": "Sub", "AssignAddVariableOp": "AddV2"}
_UPDATE_SUFFIX = "/variable_new_value"
_ASSIGNED_SUFFIX = "/variable_assigned_value"
# Model metadata: comma-separated names of the variable-update outputs and of the trainable-variable inputs.
VARIABLE_UPDATES_KEY = "converters.variable_update_outputs"
TRAINABLE_INPUTS_KEY = "converters.trainable_inputs"


@dataclasses.dataclass
class VariableUpdate:
    variable: str  # the variable's name without ":0", also the extra output's name
    assign_op: str  # the TF op type
    assign_node: str
    new_value: str = ""  # tensor name of the new value in the frozen graph

    def describe(self) -> str:
        return f"{self.variable} ({self.assign_op} {self.assign_node})"


@dataclasses.dataclass
class FrozenFunction:
    graph_def: object
    input_names: List[str]
    output_names: List[str]
    renames: Dict[str, str]  # graph tensor name -> user-visible name (extra outputs and inputs)
    updates: List[VariableUpdate]
    trainable_values: Dict[str, np.ndarray]  # input name (after renaming) -> current value


def variable_output_name(variable_name: str) -> str:
    return variable_name.split(":")[0]


def _node_name(tensor: str) -> str:
    return tensor.lstrip("^").split(":")[0]


def _captured_variables(concrete_func, tensor_data) -> Dict[str, object]:
    """Frozen constant node name -> the tf.Variable it holds."""
    by_handle = {id(v.handle): v for v in concrete_func.graph.variables}
    captured = list(concrete_func.captured_inputs)
    out = {}
    for node, data in tensor_data.items():
        if data.index is not None and data.index < len(captured):
            var = by_handle.get(id(captured[data.index]))
            if var is not None:
                out[node] = var
    return out


def _resource_source(nodes: dict, tensor: str) -> str:
    """The node a resource tensor comes from, through the Identity nodes that inlining adds."""
    name = _node_name(tensor)
    seen = set()
    while name in nodes and nodes[name].op == "Identity" and name not in seen:
        seen.add(name)
        name = _node_name(nodes[name].input[0])
    return name


def _assignments_before(inlined_nodes: dict, read: str, assign_nodes: set) -> set:
    """Assignments a node is ordered after through control edges (directly or via other nodes' control inputs)."""
    found, stack, seen = set(), [read], set()
    while stack:
        node = inlined_nodes.get(stack.pop())
        if node is None:
            continue
        for inp in node.input:
            if not inp.startswith("^"):
                continue
            name = inp[1:]
            if name in seen:
                continue
            seen.add(name)
            if name in assign_nodes:
                found.add(name)
            stack.append(name)
    return found


def _unique_names(variables) -> Dict[int, str]:
    names, taken = {}, set()
    for var in variables:
        base = variable_output_name(var.name)
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        names[id(var)] = name
    return names


def freeze(concrete_func, input_names, output_names, variable_updates="warn", trainable_inputs=False,
           keep_quantized_constants=False) -> FrozenFunction:
    """Freeze ``concrete_func`` for conversion (see the module docstring); runs grappler as tf2onnx does.

    ``keep_quantized_constants=True`` (the integer lowering, converters.integer): the constants a quantizer reads
    (a weight and its range) are hidden from grappler, so that the quantizer stays a node of the frozen graph
    instead of folding into a float constant; the integer lowering needs its range to write the weight's integers.
    """
    import tensorflow as tf
    from tensorflow.python.framework import convert_to_constants as c2c
    from tf2onnx import tf_loader

    if variable_updates not in VARIABLE_UPDATE_MODES:
        raise ValueError(f"variable_updates must be one of {VARIABLE_UPDATE_MODES}, got {variable_updates!r}")
    # TF's own freezing, minus its last step (re-importing the graph as a function), which rejects
    # the assignments left pointing at constants.
    try:
        converter_data = c2c._FunctionConverterDataInEager(func=concrete_func, lower_control_flow=False,
                                                           aggressive_inlining=True)
    except tf.errors.UnimplementedError as e:
        if "f8E" not in str(e):
            raise
        # TF 2.21's graph optimizer (grappler's MLIR hook) cannot write float8 tensors back into a GraphDef, so TF
        # itself cannot freeze the function: Keras 3's float8 training steps and saliency maps (float8_e5m2
        # gradients) end here, while their inference graphs freeze and convert (opset 19).
        raise ConversionError(
            "TensorFlow cannot freeze this function: its graph optimizer fails on its float8 tensors ("
            f"{str(e).strip().splitlines()[0]}), a TensorFlow limitation; Keras 3's float8 inference graphs convert "
            "(--opset 19), its float8 training steps and gradients do not") from None
    inlined_nodes = {n.name: n for n in converter_data.graph_def.node}
    graph_def, _ = c2c._replace_variables_by_constants(converter_data=converter_data)
    graph_def = tf_loader.fix_freezing_errors_part2(graph_def)
    nodes = {n.name: n for n in graph_def.node}
    variables = _captured_variables(concrete_func, converter_data.tensor_data)
    names = _unique_names(variables.values())

    updates, by_variable = [], {}
    for node in graph_def.node:
        if node.op not in ASSIGN_OPS:
            continue
        source = _resource_source(nodes, node.input[0])
        var = variables.get(source)
        if var is None:
            raise ConversionError(f"{node.op} (node {node.name!r}) assigns a resource that is not a captured variable")
        if id(var) in by_variable:
            raise ConversionError(
                f"{node.op} (node {node.name!r}): variable {var.name} is assigned more than once in one call, which "
                f"a graph without state cannot express (first assignment: {by_variable[id(var)][1].assign_node})"
            )
        update = VariableUpdate(names[id(var)], node.op, node.name)
        by_variable[id(var)] = (source, update)
        updates.append(update)

    trainable_values = {}
    renames = {}
    inputs = list(input_names)
    if trainable_inputs:
        for source, var in variables.items():
            if not var.trainable:
                continue
            node = nodes[source]
            value = var.numpy()
            node.op = "Placeholder"
            dtype = node.attr["dtype"].type
            node.ClearField("attr")
            node.attr["dtype"].type = dtype
            node.attr["shape"].shape.CopyFrom(tf.TensorShape(value.shape).as_proto())
            inputs.append(f"{source}:0")
            renames[f"{source}:0"] = names[id(var)]
            trainable_values[names[id(var)]] = value

    if trainable_values:
        _fold_variable_shapes(graph_def, nodes, {n[:-2] for n in inputs[len(input_names):]})

    assign_names = {u.assign_node for u in updates}
    # Grappler's folding ignores the sign of zero (see _sign_unsafe): the variables where that can matter are
    # hidden from it, and their updates are added after it; the others are updated in the graph it folds.
    hide = {source for source, _ in by_variable.values() if _sign_unsafe(nodes[source])}
    if keep_quantized_constants:
        hide |= _quantizer_constants(nodes)
    new_value_of, pending = {}, []
    for source, update in by_variable.values():
        assign = nodes[update.assign_node]
        dtype, op = assign.attr["dtype"].type, _UPDATE_OP[assign.op]
        if source not in hide and nodes[source].op == "Const":
            # v holds no -0 and is not all zeros, so grappler's rewrites of v - d and v + d are exact (v - 0 = v,
            # v + 0 = v), and it may fold the update and what reads it (tfmot's ranges, read after their update).
            new_node = _add_node(graph_def, update.assign_node + _UPDATE_SUFFIX, op or "Identity",
                                 [source, assign.input[1]] if op else [assign.input[1]])
            new_node.attr["T"].type = dtype
            update.new_value = new_node.name + ":0"
        else:
            # Added after grappler (_add_update_nodes); until then a placeholder stands in for the new value, and
            # the assigned value (the delta of AssignSub/AssignAdd) is kept as a fetch of its own.
            assigned = _add_node(graph_def, update.assign_node + _ASSIGNED_SUFFIX, "Identity", [assign.input[1]])
            assigned.attr["T"].type = dtype
            stand_in = _add_node(graph_def, update.assign_node + _UPDATE_SUFFIX, "Placeholder", [])
            stand_in.attr["dtype"].type = dtype
            stand_in.attr["shape"].shape.CopyFrom(nodes[source].attr["shape"].shape if nodes[source].op == "Placeholder"
                                                  else nodes[source].attr["value"].tensor.tensor_shape)
            update.new_value = stand_in.name + ":0"
            old_value = type(nodes[source])()
            old_value.CopyFrom(nodes[source])  # before hiding: the variable's frozen constant, or its input
            folded_by_tf = op is not None and _constant_in_tf(inlined_nodes, assign.input[1])
            pending.append((update, op, assigned.name + ":0", old_value, folded_by_tf))
        new_value_of[update.assign_node] = update.new_value

    hidden = _hide_from_grappler(nodes, hide)
    if hidden:
        _fold_variable_shapes(graph_def, nodes, set(hidden))

    # Reads TF orders after an assignment see the new value (tf2onnx's freezing gives the old one).
    for node in graph_def.node:
        original = inlined_nodes.get(node.name)
        if original is None or original.op != "ReadVariableOp":
            continue
        before = _assignments_before(inlined_nodes, node.name, assign_names)
        if not before:
            continue
        source = _resource_source(nodes, node.input[0])
        mine = [a for a in before if _resource_source(nodes, nodes[a].input[0]) == source]
        if mine:
            node.input[0] = new_value_of[mine[0]]

    kept = [n for n in graph_def.node if n.name not in assign_names]
    for n in kept:
        n.input[:] = [i for i in n.input if not (i.startswith("^") and i[1:] in assign_names)]
    del graph_def.node[:]
    graph_def.node.extend(kept)

    outputs = list(output_names)
    if variable_updates == "outputs":
        for update in updates:
            outputs.append(update.new_value)
            renames[update.new_value] = update.variable
    elif updates:
        # One sentence (a deep network's step assigns hundreds of variables); the whole list at debug level.
        shown = ", ".join(u.variable for u in updates[:WARN_NAMES])
        more = f" and {len(updates) - WARN_NAMES} more" if len(updates) > WARN_NAMES else ""
        logger.warning(
            "%d variable update(s) left out of the converted model (%s%s): ONNX has no state; pass "
            "variable_updates='outputs' / --variable-update-outputs to get each new value as an output",
            len(updates), shown, more,
        )
        logger.debug("variable updates left out: %s", "; ".join(u.describe() for u in updates))
    stand_ins = [u.new_value for u, *_ in pending]
    feeds = inputs + stand_ins + [f"{name}:0" for name in hidden]
    fetches = outputs + [assigned for _, _, assigned, *_ in pending if assigned not in outputs]
    # The calls TF's inlining left (Keras 3's XLA-marked grouped convolutions), inlined once the graph is valid
    # again (no assignment of a frozen variable left): converters.inlining.
    graph_def = inline_calls(graph_def, feeds + fetches)
    with tf.Graph().as_default():
        graph_def = tf_loader.tf_optimize(feeds, fetches, graph_def)
    _restore_hidden(graph_def, hidden)
    _add_update_nodes(graph_def, pending)
    return FrozenFunction(graph_def, inputs, outputs, renames, updates, trainable_values)


def _add_node(graph_def, name, op, inputs):
    node = graph_def.node.add()
    node.name, node.op = name, op
    node.input.extend(inputs)
    return node


def _sign_unsafe(node) -> bool:
    """Whether grappler's folding could give a variable's update (or what reads the variable) another sign of
    zero than TF: its frozen constant is all zeros, or holds a -0.

    Grappler simplifies arithmetic with a constant of zeros without regard to the sign of zero (``0 * m -> 0``,
    ``0 - d -> Neg(d)``, ``0 + d -> d``, ``v + 0 -> v``). A variable a step assigns is often exactly zero when
    frozen (a fresh bias, an optimizer's slots), and TF itself never folds it (it is a resource read), so
    TF's ``+0 * 0.9 - (+0) = +0`` became ``Neg(+0) = -0`` in the converted update; and ``v + 0 -> v`` is wrong
    only where v holds a -0 (``-0 + +0 = +0``). Any other constant keeps grappler's folding, which is exact on it.
    """
    import tensorflow as tf

    if node.op != "Const":
        return False
    value = tf.make_ndarray(node.attr["value"].tensor)
    if value.dtype.kind not in "fc":
        return False
    zeros = value == 0
    return bool(zeros.all() or (zeros & np.signbit(value.real if value.dtype.kind == "c" else value)).any())


def _hide_from_grappler(nodes: dict, sources: set) -> Dict[str, object]:
    """Turn the frozen constants of ``sources`` (the sign-unsafe assigned variables, :func:`_sign_unsafe`) into
    placeholders for the time grappler runs; returns the constants, by name, for :func:`_restore_hidden`.
    Hidden, a variable is folded later by tf2onnx and ONNX Runtime, which evaluate the ops as TF does."""
    hidden = {}
    for name in sorted(sources):
        node = nodes[name]
        hidden[name] = type(node)()
        hidden[name].CopyFrom(node)
        value = node.attr["value"].tensor
        dtype = node.attr["dtype"].type
        node.op = "Placeholder"
        node.ClearField("attr")
        node.attr["dtype"].type = dtype
        node.attr["shape"].shape.CopyFrom(value.tensor_shape)
    return hidden


def _quantizer_constants(nodes: dict) -> set:
    """The frozen constants that quantizers read (through Identity nodes): weights and their ranges."""
    from converters.family import QUANTIZATION_OPS

    found = set()
    for node in nodes.values():
        if node.op not in QUANTIZATION_OPS:
            continue
        for tensor in node.input:
            if tensor.startswith("^"):
                continue
            source = _resource_source(nodes, tensor)
            if source in nodes and nodes[source].op == "Const":
                found.add(source)
    return found


def _restore_hidden(graph_def, hidden: Dict[str, object]):
    """The hidden variables' constants back in place of their placeholders (re-added where grappler dropped one)."""
    present = {n.name: n for n in graph_def.node}
    for name, const in hidden.items():
        node = present.get(name) or graph_def.node.add()
        node.CopyFrom(const)


def _add_update_nodes(graph_def, pending):
    """Each variable's new value, computed after grappler as TF's assignment computes it (AssignSub: ``v - d``,
    AssignAdd: ``v + d``, AssignVariableOp: the value), and the placeholder that stood in for the new value
    during grappler becomes its Identity (or the constant result, where both operands are constants). Grappler
    would rewrite ``0 - d`` as ``Neg(d)`` (see :func:`_sign_unsafe`).
    """
    by_name = {n.name: n for n in graph_def.node}
    for update, op, assigned, old_value, folded_by_tf in pending:
        stand_in = by_name[_node_name(update.new_value)]  # a feed of grappler's, so it is still there
        dtype = stand_in.attr["dtype"].type
        value = assigned
        if op is not None:
            old = by_name.get(old_value.name)
            if old is None or old.op != old_value.op or (old.op == "Const" and old.attr["value"] != old_value.attr["value"]):
                # Grappler folded the variable's constant away or into another one: a copy of it, by itself.
                old = graph_def.node.add()
                old.CopyFrom(old_value)
                if old_value.op == "Const":
                    old.name = update.assign_node + "/variable_old_value"
            delta = by_name.get(_node_name(assigned))
            if folded_by_tf and delta is not None and delta.op == "Const" and _all_zeros(delta):
                # TF's own grappler, run on the function when it executes, sees this delta as a constant of
                # zeros and drops it (v - 0 -> v, v + 0 -> v): the variable keeps its bits, a -0 included.
                value = old.name
            elif old.op == "Const" and delta is not None and delta.op == "Const":
                # A constant update is computed here, by TF's own kernel run eagerly: tf2onnx would fold it in a
                # TF session, whose grappler rewrites v + 0 as v (-0 where TF's kernel gives -0 + +0 = +0).
                _make_const(stand_in, _node_name(update.new_value), _eager_update(op, old, delta))
                continue
            else:
                new = _add_node(graph_def, update.assign_node + "/variable_update", op, [old.name, assigned])
                new.attr["T"].type = dtype
                value = new.name
        stand_in.Clear()
        stand_in.name, stand_in.op = _node_name(update.new_value), "Identity"
        stand_in.input.append(value)
        stand_in.attr["T"].type = dtype


def _all_zeros(const_node) -> bool:
    import tensorflow as tf

    return bool(np.all(tf.make_ndarray(const_node.attr["value"].tensor) == 0))


def _constant_in_tf(inlined_nodes: dict, tensor: str) -> bool:
    """Whether ``tensor`` of the function's inlined graph is computed from constants only (no input, variable
    read or stateful op behind it): TF's grappler folds such a tensor when the function runs."""
    from tensorflow.python.framework import op_def_registry

    stack, seen = [_node_name(tensor)], set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        node = inlined_nodes.get(name)
        if node is None:
            return False
        if node.op == "Const":
            continue
        op_def = op_def_registry.get(node.op)
        data_inputs = [i for i in node.input if not i.startswith("^")]
        if op_def is None or op_def.is_stateful or not data_inputs:
            return False
        stack.extend(_node_name(i) for i in data_inputs)
    return True


def _eager_update(op: str, old, delta):
    """``op`` (Sub or AddV2) of two Const nodes' values, computed by TF's CPU kernel, eagerly (no grappler)."""
    import tensorflow as tf

    with tf.device("/cpu:0"):
        return getattr(tf.raw_ops, op)(x=tf.make_ndarray(old.attr["value"].tensor),
                                       y=tf.make_ndarray(delta.attr["value"].tensor)).numpy()


def _make_const(node, name: str, value):
    import tensorflow as tf

    node.Clear()
    node.name, node.op = name, "Const"
    node.attr["dtype"].type = tf.as_dtype(value.dtype).as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))


def _fold_variable_shapes(graph_def, nodes: dict, variable_inputs: set):
    """Shape/ShapeN of a variable that is a placeholder (a trainable-variable input, or an assigned variable
    hidden from grappler) become constants (a fed weight keeps its variable's shape).

    Grappler folds the shapes of constants but not of graph inputs, and gradient ops take their filter
    sizes from such shapes (Conv2DBackpropFilter's filter_sizes = ShapeN(x, kernel)[1]); as constants they
    stay what they were when the weights were constants.
    """
    from tensorflow.core.framework import tensor_pb2, types_pb2

    replace = {}
    for node in list(graph_def.node):
        if node.op not in ("Shape", "ShapeN"):
            continue
        data_inputs = [i for i in node.input if not i.startswith("^")]
        for index, tensor in enumerate(data_inputs):
            source = _resource_source(nodes, tensor)
            if source not in variable_inputs:
                continue
            dims = [d.size for d in nodes[source].attr["shape"].shape.dim]
            out_type = node.attr["out_type"].type or types_pb2.DT_INT32
            const = graph_def.node.add()
            const.name = f"{node.name}/variable_shape_{index}"
            const.op = "Const"
            const.attr["dtype"].type = out_type
            proto = tensor_pb2.TensorProto(dtype=out_type)
            proto.tensor_shape.dim.add().size = len(dims)
            (proto.int64_val if out_type == types_pb2.DT_INT64 else proto.int_val).extend(dims)
            const.attr["value"].tensor.CopyFrom(proto)
            replace[f"{node.name}:{index}"] = const.name + ":0"
            if index == 0:
                replace[node.name] = const.name + ":0"
    if replace:
        for node in graph_def.node:
            node.input[:] = [replace.get(i, i) for i in node.input]


def record_state(model, frozen: FrozenFunction, variable_updates: str):
    """Name the extra outputs and inputs in the model's metadata, for callers and the CLI's --verify."""
    entries = []
    if variable_updates == "outputs" and frozen.updates:
        entries.append((VARIABLE_UPDATES_KEY, ",".join(u.variable for u in frozen.updates)))
    inputs = {i.name for i in model.graph.input}
    trainable = [n for n in frozen.trainable_values if n in inputs]
    if trainable:
        entries.append((TRAINABLE_INPUTS_KEY, ",".join(trainable)))
    for key, value in entries:
        prop = model.metadata_props.add()
        prop.key, prop.value = key, value
    return model


def add_variable_initializers(model, trainable_values: Dict[str, np.ndarray]):
    """Give each trainable-variable input its current value as a same-name initializer (an input with an
    initializer is optional: ONNX Runtime uses the initializer unless the input is fed)."""
    from onnx import numpy_helper

    graph_inputs = {i.name for i in model.graph.input}
    missing = sorted(set(trainable_values) - graph_inputs)
    if missing:
        # grappler prunes variables the outputs do not depend on; say so instead of adding dead initializers.
        logger.warning("trainable variables unused by the outputs are not inputs: %s", ", ".join(missing))
    for name, value in trainable_values.items():
        if name in graph_inputs:
            model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    return model

