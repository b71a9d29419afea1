"""Per-node verification: every converted op judged on TensorFlow's own input values.

End-to-end verification (converters.verification) judges a model's outputs, where the differences of every
node upstream have accumulated; in a deep training step one ReLU6 mask flip (from a last-bit difference in a
convolution's sum) moves every earlier gradient, and the verdict then depends on the seed. Here each node is
judged alone:

1. TensorFlow runs the frozen function once (frozen as the converter froze it, so the names agree) and every
   tensor that the ONNX graph also holds is fetched: tf2onnx names a converted op's outputs after the TF
   tensors, and the converter names the graph's inputs and outputs after the function's.
2. Each such ONNX value is an *anchor*. Its layout is found from its shape (tf2onnx's layout optimizer keeps a
   tensor's name where it moves a Transpose across the op, so an anchor may hold TF's NHWC tensor as NCHW;
   a graph output keeps TF's layout; where two layouts give the same shape, the graph's neighbours decide, else
   the one closer to ONNX Runtime's own end-to-end value is taken).
   A value whose shape or type matches no layout of its TF tensor is not an anchor.
3. The ONNX nodes are grouped: nodes that exchange a value which is not an anchor belong to one group (a TF
   op that became several ONNX nodes is one group; so is a fusion of several TF ops). One model holds every
   group, each group's inputs fed with TF's values of its anchors, so ONNX Runtime runs every node in one
   session, once.
4. Each anchor a group computes is judged against TF's value by the verifier's rules (converters.verification):
   bit for bit where the value is integer or boolean, or where every TF op between the group's inputs and it
   is exact by construction (converters.exact_outputs: a quantizer, a quantized gradient's mask, data movement;
   so a quantized gradient *is* held to TF's bits here); otherwise ``rtol*|tf|``, plus
   ``max(sum_rtol, 2(n+1)u)*Σ|terms|`` for a sum of n terms per element, its terms' magnitude computed by
   converters.verify_magnitude on the group's own inputs. A forward
   quantizer whose input its group computes (a folded batch norm, a dropped ReLU6) is held to bits except for
   one grid step where TF's input lies at a rounding tie (judge_quantizer).

Where tf2onnx moved a name off the value it names (a handler's inserted nodes, the layout optimizer's moved
Transposes, renamed inputs and outputs), _follow_inserted, follow_layout_ops, _domain_inputs and _lost_names put
it back; docs/verification.md walks through each step and states the limits.

Errors do not accumulate from node to node, so the verdict depends neither on chaos downstream nor on TF's
spread (which is not measured here). The report counts, per TF op type, the values checked, those held bit for
bit, those within their bound, and the worst error against its bound (both of one element); it names the
first failing value in the ONNX graph's order, with its TF op, its group's ONNX nodes and where their inputs
came from.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections import defaultdict
from typing import Dict, List, Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from converters.exact_outputs import through_identities

logger = logging.getLogger(__name__)

TF_PREFIX = "tf_value::"  # graph inputs of the per-node model: TF's value of an anchor
# The layouts (TF -> ONNX permutations) a converted graph holds a TF tensor in: TF's, channels first, channels last
# (from channels first), and, rank 4, tf2onnx's SpaceToBatchND / BatchToSpaceND (CNHW: (3, 0, 1, 2)), which the
# layout optimizer can carry past elementwise ops (a FakeQuant written in standard ops after a dilated depthwise).
_LAYOUTS = {3: [(0, 2, 1)], 4: [(0, 3, 1, 2), (0, 2, 3, 1), (3, 0, 1, 2)], 5: [(0, 4, 1, 2, 3), (0, 2, 3, 4, 1)]}


@dataclasses.dataclass
class Anchor:
    """An ONNX value that holds a TF tensor: ``onnx value == transpose(tf value, perm)`` (reshaped where the
    shapes differ only in unit dimensions)."""

    name: str  # the ONNX value
    tf_name: str  # the TF tensor
    perm: Optional[tuple] = None
    shape: Optional[tuple] = None  # reshape to this after the transpose

    def to_onnx_layout(self, value: np.ndarray) -> np.ndarray:
        if self.perm is not None:
            value = np.ascontiguousarray(np.transpose(value, self.perm))
        if self.shape is not None:
            value = value.reshape(self.shape)
        return value


@dataclasses.dataclass
class NodeCheck:
    """One anchor computed by ONNX Runtime from TF's values of its group's inputs, judged against TF's."""

    value: str  # the ONNX value
    tf_tensor: str
    tf_op: str  # the TF op's name
    tf_type: str
    group: int
    onnx_nodes: List[str]  # "name (OpType)" of the group's nodes that compute the value
    sources: List[str]  # where the group's inputs came from
    layout: str
    check: object  # converters.verification.OutputCheck

    @property
    def ok(self) -> bool:
        return self.check.ok

    def to_dict(self) -> dict:
        return {"value": self.value, "tf_tensor": self.tf_tensor, "tf_op": self.tf_op, "tf_type": self.tf_type,
                "group": self.group, "onnx_nodes": self.onnx_nodes, "inputs_from": self.sources,
                "layout": self.layout, **self.check.to_dict()}


@dataclasses.dataclass
class NodeReport:
    checks: List[NodeCheck]
    nodes: int  # ONNX nodes in the model
    groups: int
    unanchored: int  # ONNX values with a TF name that could not be matched with their TF tensor
    notes: List[str] = dataclasses.field(default_factory=list)
    seconds: Dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> List[NodeCheck]:
        return [c for c in self.checks if not c.ok]

    def check_of(self, value: str) -> Optional[NodeCheck]:
        """The check of one ONNX value (None: not an anchor the model computes)."""
        return next((c for c in self.checks if c.value == value), None)

    @property
    def first_failure(self) -> Optional[NodeCheck]:
        failed = self.failures
        return failed[0] if failed else None

    def by_type(self) -> Dict[str, dict]:
        rows: Dict[str, dict] = {}
        for c in self.checks:
            row = rows.setdefault(c.tf_type, {"checked": 0, "bit_exact": 0, "within_bound": 0, "failed": 0,
                                              "worst_ratio": 0.0, "worst_error": 0.0, "worst_bound": 0.0,
                                              "worst_value": ""})
            row["checked"] += 1
            k = c.check
            if not k.ok:
                row["failed"] += 1
            elif k.exact and k.n_differing == 0:
                row["bit_exact"] += 1
            else:
                row["within_bound"] += 1
            if k.exact:
                ratio = 0.0 if k.ok else np.inf
                error, bound = k.max_abs_err, 0.0
            else:
                error = k.max_abs_err if k.error is None else k.error
                bound = k.bound
                ratio = error / bound if bound > 0 else (0.0 if error == 0 else np.inf)
            if not k.same_type or not k.nonfinite_match:
                ratio = np.inf
            if ratio > row["worst_ratio"] or not row["worst_value"]:
                row.update(worst_ratio=float(ratio), worst_error=float(error), worst_bound=float(bound),
                           worst_value=c.value)
        return dict(sorted(rows.items()))

    def table(self) -> str:
        header = ("TF op type", "checked", "bit-exact", "within bound", "failed", "worst error", "its bound")
        rows = []
        for op_type, r in self.by_type().items():
            rows.append((op_type, str(r["checked"]), str(r["bit_exact"]), str(r["within_bound"]), str(r["failed"]),
                         _short(r["worst_error"]), "0 (bits)" if r["worst_bound"] == 0 else _short(r["worst_bound"])))
        widths = [max(len(row[i]) for row in [header] + rows) for i in range(len(header))]
        lines = ["per-node verification: each converted op run on TF's own input values (TF's Eigen kernels)",
                 "  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(),
                 "  ".join("-" * w for w in widths)]
        lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
        exact = sum(1 for c in self.checks if c.check.exact)
        lines.append(f"{len(self.checks)} values checked ({exact} bit for bit) in {self.groups} groups of the "
                     f"model's {self.nodes} nodes; worst error and its bound are of one element")
        if self.unanchored:
            lines.append(f"{self.unanchored} ONNX values named after a TF tensor hold another layout or type and "
                         "were checked through the values computed from them")
        lines += self.notes
        first = self.first_failure
        if first is not None:
            lines += ["", f"first failing node ({len(self.failures)} values failed):", *self.describe(first)]
        lines.append("per-node verification " + ("passed" if self.ok else "FAILED"))
        return "\n".join(lines)

    @staticmethod
    def describe(c: NodeCheck) -> List[str]:
        k = c.check
        if k.exact:
            error = f"{k.n_differing} of {k.size} elements differ in bits (max error {_short(k.max_abs_err)})"
        else:
            err = k.max_abs_err if k.error is None else k.error
            error = f"{k.n_outside} of {k.size} elements outside their bound (error {_short(err)} against bound " \
                    f"{_short(k.bound)} at one element; max error {_short(k.max_abs_err)})"
        return [f"  TF op {c.tf_op!r} ({c.tf_type}), tensor {c.tf_tensor}, ONNX value {c.value!r}",
                f"  judged {k.kind if k.kind.startswith('bits,') or not k.exact else 'bit for bit'}: {error}"
                + (f"; {k.note}" if k.note else ""),
                f"  ONNX nodes: {', '.join(c.onnx_nodes)}",
                f"  inputs from: {'; '.join(c.sources) or 'constants only'}"]

    def to_dict(self) -> dict:
        first = self.first_failure
        return {"ok": self.ok, "nodes": self.nodes, "groups": self.groups, "checked": len(self.checks),
                "unanchored": self.unanchored, "notes": list(self.notes), "seconds": self.seconds,
                "by_tf_op_type": self.by_type(), "first_failure": None if first is None else first.to_dict(),
                "checks": [c.to_dict() for c in self.checks]}

    def to_json(self, path=None) -> str:
        from converters.verification import report_json

        return report_json(self.to_dict(), path)

    def __str__(self) -> str:
        return self.table()


def _short(x: float) -> str:
    if x is None:
        return "-"
    if not np.isfinite(x):
        return str(x)
    return "0" if x == 0 else f"{x:.1e}"


# ------------------------------------------------------------------------------------------- TF side


def freeze_like_converter(concrete_func, onnx_model):
    """The function frozen as the converter froze it for ``onnx_model`` (the same variable-update outputs and
    trainable inputs, read from the model's metadata), so that tensor names agree; and the renames from TF
    tensor names to the model's input and output names."""
    from converters.frontends import _io_names, _structured_renames
    from converters.variable_state import TRAINABLE_INPUTS_KEY, VARIABLE_UPDATES_KEY, freeze

    props = {p.key: p.value for p in onnx_model.metadata_props}
    inputs, outputs = _io_names(concrete_func)
    renames = _structured_renames(concrete_func, inputs, outputs)
    quiet = [logging.getLogger(n) for n in ("converters.variable_state", "tf2onnx")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.ERROR)  # the variable updates left out are the converter's news, not the verifier's
    try:
        frozen = freeze(concrete_func, inputs, outputs,
                        variable_updates="outputs" if props.get(VARIABLE_UPDATES_KEY) else "warn",
                        trainable_inputs=bool(props.get(TRAINABLE_INPUTS_KEY)))
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)
    renames.update(frozen.renames)
    return frozen, renames


def freeze_graph_def(graph_def, input_names, output_names):
    """A GraphDef (a proto or a .pb path) frozen as converters.from_graph_def freezes it, with no renames."""
    from converters.frontends import freeze_graph_def as frontend_freeze
    from converters.variable_state import FrozenFunction

    frozen, inputs, outputs = frontend_freeze(graph_def, input_names, output_names)
    return FrozenFunction(frozen, list(inputs), list(outputs), {}, [], {}), {}


def _tf_run(graph, frozen, renames, inputs: dict, initializers: dict, fetch: List[str]) -> dict:
    """TF's values of the ``fetch`` tensors of the imported frozen graph, fed by ONNX input name."""
    import tensorflow as tf

    feeds = {}
    for tf_name in frozen.input_names:
        name = renames.get(tf_name, tf_name)
        value = inputs.get(name, initializers.get(name))
        if value is None:
            raise ValueError(f"no value for the TF input {tf_name} (ONNX input {name!r})")
        feeds[graph.get_tensor_by_name(tf_name)] = value
    # Grappler off: TF runs the frozen graph's own ops with their own kernels, the ones that were converted (its
    # rewrites would fuse or fold some of them away, and their outputs with them).
    config = tf.compat.v1.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    with tf.compat.v1.Session(graph=graph, config=config) as sess:
        values = sess.run([graph.get_tensor_by_name(n) for n in fetch], feeds)
    return dict(zip(fetch, (np.asarray(v) for v in values)))


# ------------------------------------------------------------------------------------------- anchors


def _candidates(graph, renames, onnx_values) -> Dict[str, str]:
    """ONNX value name -> TF tensor name, for every ONNX value named after a TF tensor (or its rename) whose TF
    tensor is a real value (not a resource, not a family op's placeholder output)."""
    import tensorflow as tf

    import ort_ops

    by_onnx = {}
    for op in graph.get_operations():
        placeholders = ()
        if op.type in ort_ops.OP_NAMES:
            placeholders = ort_ops.get_spec(op.type).placeholder_outputs() + _unwritten_outputs(op)
        for t in op.outputs:
            if t.dtype in (tf.resource, tf.variant) or t.value_index in placeholders:
                continue
            name = renames.get(t.name, t.name)
            if name in onnx_values:
                by_onnx[name] = t.name
    return by_onnx


def _inserted_name(node_name: str, op_name: str) -> bool:
    """tf2onnx's name for a node a handler inserted: ``OP__N`` (the standard lowering's own nodes are
    ``OP__std_...``, and read the op's outputs inside the op: not inserted on its output)."""
    return node_name.startswith(op_name + "__") and node_name[len(op_name) + 2:].isdigit()


def _follow_inserted(model: onnx.ModelProto, by_onnx: Dict[str, str]) -> int:
    """Move candidates past the nodes a handler inserted on its op's output. tf2onnx's handlers often write a TF
    op as a node that keeps the op's output name followed by nodes inserted on that output
    (``insert_new_node_on_output``: SquaredDifference as Sub named after it, then a Mul; a convolution as Conv,
    then a Transpose back): the inserted node, named after the op (``NAME__N``, N digits), reads the named value
    and takes over its readers. The named value then holds an intermediate (Sub's x - y), and the op's output is
    the last inserted node's. Returns how many candidates moved."""
    consumers = defaultdict(list)
    for node in model.graph.node:
        for name in node.input:
            consumers[name].append(node)
    outputs = {o.name for o in model.graph.output}
    moved = 0
    for value in list(by_onnx):
        tf_name = by_onnx[value]
        op_name = tf_name.rsplit(":", 1)[0]
        current, seen = value, 0
        while seen < 16:
            # tf2onnx's clean-up may have merged the intermediate with an equal one of another op (Keras 3's batch
            # norm computes x - mean twice), so the named value can have other readers too.
            inserted = {id(n): n for n in consumers.get(current, []) if _inserted_name(n.name, op_name)}
            if current in outputs or len(inserted) != 1:
                break
            (reader,) = inserted.values()
            nxt = reader.output[0] if len(reader.output) == 1 else ""
            if not nxt or nxt in by_onnx:
                break
            current, seen = nxt, seen + 1
        if current != value:
            del by_onnx[value]
            by_onnx[current] = tf_name
            moved += 1
    return moved


def _domain_inputs(model: onnx.ModelProto, graph, by_onnx: Dict[str, str], sources: set) -> Dict[str, str]:
    """More candidates: the inputs of the domain's nodes that a layout op computes. A node of the domain is its TF
    op, input for input (converters.lowering_custom), so an input the layout optimizer renamed (a Transpose moved
    in front of it) is still TF's input of that op, in some layout."""
    from ort_ops.schemas import DOMAIN

    more = {}
    producers = {out: node.op_type for node in model.graph.node for out in node.output}
    for node in model.graph.node:
        if node.domain != DOMAIN:
            continue
        op = None
        for out in node.output:
            if out in by_onnx:
                tensor = through_identities(graph.get_tensor_by_name(by_onnx[out]))
                if tensor.op.type == node.op_type:
                    op = tensor.op
                    break
        if op is None or len(op.inputs) != len(node.input):
            continue
        for name, tf_input in zip(node.input, op.inputs):
            # Only a value a layout op computes: anything else may be an input the converter rewrote (a ReLU6
            # dropped before a quantizer that clamps anyway, a batch norm folded into the convolution).
            if name and name not in by_onnx and name not in sources and name not in more and \
                    producers.get(name) in _LAYOUT_OPS:
                more[name] = tf_input.name
    return more


def _lost_names(model: onnx.ModelProto, graph, by_onnx: Dict[str, str], sources: set) -> Dict[str, str]:
    """More candidates, where the optimizer renamed a TF op's output (a Transpose moved behind it): tf2onnx names
    the nodes a TF op becomes after it (``NAME`` or ``NAME__...``); where the nodes of a one-output TF op whose
    output has no ONNX value yield exactly one value that other nodes (or the graph) read, that value is the
    op's output, in some layout (a wrong guess would fail its check loudly, never pass a wrong value: the value
    is judged against TF's tensor, and its readers get TF's)."""
    import tensorflow as tf

    named = {}
    for i, node in enumerate(model.graph.node):
        base = node.name.split("__")[0]
        named.setdefault(base, []).append(i)
    have = set(by_onnx.values())
    consumers = defaultdict(set)
    for i, node in enumerate(model.graph.node):
        for name in node.input:
            consumers[name].add(i)
    outputs = {o.name for o in model.graph.output}
    producer = {out: i for i, node in enumerate(model.graph.node) for out in node.output if out}
    more = {}
    for base, members in named.items():
        try:
            op = graph.get_operation_by_name(base)
        except (KeyError, ValueError):
            continue
        if len(op.outputs) != 1 or op.outputs[0].name in have or op.outputs[0].dtype in (tf.resource, tf.variant):
            continue
        inside = set(members)
        leaving = {out for i in members for out in model.graph.node[i].output
                   if out and (out in outputs or consumers[out] - inside)}
        if op.type not in _TF_REARRANGING_OPS:
            # The layout node a handler put on the op's *input* is named after the op too; its value leaves the
            # op's nodes where the op's main node was renamed (tf2onnx's Conv + Add fusion), and it holds the
            # op's input, not its output (a Reshape where the input has one channel: then its NCHW shape can be
            # the op's output's).
            leaving = {out for out in leaving if not _rearranges_incoming(model, out, producer, inside)}
        if len(leaving) == 1:
            (value,) = leaving
            if value not in by_onnx and value not in sources:
                more[value] = op.outputs[0].name
    return more


# TF ops whose output is their input rearranged: the one value a layout node computes may be theirs.
_TF_REARRANGING_OPS = frozenset({"Identity", "Snapshot", "StopGradient", "PreventGradient", "Reshape", "Transpose",
                                 "ExpandDims", "Squeeze"})


def _rearranges_incoming(model: onnx.ModelProto, value: str, producer: dict, inside: set) -> bool:
    """Whether ``value`` is computed by layout nodes alone from a value that comes from outside ``inside``."""
    while True:
        i = producer.get(value)
        if i is None or i not in inside:
            return True
        node = model.graph.node[i]
        if node.op_type not in _LAYOUT_OPS or not node.input:
            return False
        value = node.input[0]


# A TF op that adds a constant to a convolution's output, and the convolutions tf2onnx fuses it into.
_BIAS_ADDS = ("BiasAdd", "BiasAddV1", "Add", "AddV2")
_TF_CONVOLUTIONS = ("Conv2D", "Conv3D", "DepthwiseConv2dNative", "Conv2DBackpropInput", "Conv3DBackpropInputV2")


def _fused_bias_outputs(model: onnx.ModelProto, graph, by_onnx: Dict[str, str]) -> Dict[str, str]:
    """More candidates: a Conv that tf2onnx's layout optimizer fused with the Add of a bias after it
    (``_add_handler`` in its transpose optimizer) is a new node with a new name, and neither the convolution's
    output nor the Add's keeps a name. Its bias input is still the TF tensor the Add read (an initializer keeps
    its name), so its output is that Add's output, in some layout: where the bias tensor is read by exactly one
    Add of a convolution's output and that Add's output has no ONNX value, the fused Conv computes it."""
    have = set(by_onnx.values())
    more = {}
    for node in model.graph.node:
        if node.op_type not in ("Conv", "ConvTranspose") or node.domain not in ("", "ai.onnx") or \
                len(node.input) != 3 or not node.output or node.output[0] in by_onnx:
            continue
        try:
            bias = graph.get_tensor_by_name(node.input[2])
        except (KeyError, ValueError):
            continue
        readers, todo = [], list(bias.consumers())
        while todo:
            op = todo.pop()
            if op.type in ("Identity", "Snapshot"):
                todo.extend(op.outputs[0].consumers())
            else:
                readers.append(op)
        if len(readers) != 1 or readers[0].type not in _BIAS_ADDS or len(readers[0].inputs) != 2:
            continue
        add = readers[0]
        data = [t for t in add.inputs if through_identities(t).name != through_identities(bias).name]
        if len(data) == 1 and through_identities(data[0]).op.type in _TF_CONVOLUTIONS and \
                add.outputs[0].name not in have:
            more[node.output[0]] = add.outputs[0].name
    return more


def _unwritten_outputs(op) -> tuple:
    """Outputs TF's Eigen kernel leaves unwritten (its memory, not a value): an inference-mode batch norm's
    reserve_space_1/2 (docs/semantics.md 3.7; the project's kernels write the given mean and variance there)."""
    if op.type.startswith("FusedBatchNorm") and "Grad" not in op.type:
        try:
            if not op.get_attr("is_training"):
                return (3, 4)
        except ValueError:
            pass
    return ()


def _layouts(tf_value: np.ndarray, onnx_shape: tuple):
    """The (perm, reshape) ways ``tf_value`` can take ``onnx_shape``."""
    found = []
    if tf_value.shape == onnx_shape:
        found.append((None, None))
    for perm in _LAYOUTS.get(tf_value.ndim, []):
        if tuple(tf_value.shape[p] for p in perm) == onnx_shape:
            found.append((perm, None))
    non_unit = [d for d in tf_value.shape if d != 1]
    # A reshape (unit dimensions added or dropped) only where the order of the other dimensions shows: with two of
    # them equal ([N, C] with N == C), ONNX's [C, N, 1, 1] (a channels-first mean over a CNHW tensor) would pass
    # for TF's [N, C] reshaped. Such a value is judged inside the group of the nodes that read it.
    if not found and tf_value.size == int(np.prod(onnx_shape, dtype=np.int64)) and \
            non_unit == [d for d in onnx_shape if d != 1] and len(set(non_unit)) == len(non_unit):
        found.append((None, onnx_shape))
    return found


def _distance(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    finite = np.isfinite(a64) & np.isfinite(b64)
    if not finite.any():
        return 0.0
    return float(np.abs(a64[finite] - b64[finite]).mean())


def find_anchors(candidates: Dict[str, str], tf_values: dict, onnx_values: dict,
                 model: Optional[onnx.ModelProto] = None, known: Optional[Dict[str, Anchor]] = None,
                 as_tf: Optional[Dict[str, str]] = None):
    """({ONNX value: Anchor}, names left out because no layout of the TF tensor matches ONNX's value).

    ``as_tf``: ONNX values known to hold a TF tensor in TF's own layout (the graph's outputs, each named after
    the function's output it is: end-to-end verification compares them as they are), by TF tensor; such a
    value anchored to that tensor takes TF's layout, however many layouts its shape allows (a 3x3x3x3 kernel
    gradient: the layout nearest ORT's value is a guess where ORT's value is rounding noise, and a wrong guess
    compares the value with its own transpose).
    Where two layouts give ONNX's shape (H == W == C), the graph decides when ``model`` is given: the layout of
    the value's anchored neighbours of the same rank across layout-keeping nodes (``_resolve_by_graph``); ORT's own
    value decides only where the graph does not (the layout whose transpose of TF's value is closest to it).
    ORT's value alone misleads where it is far from TF's anyway: a training step's values after a ReLU mask
    flipped, which per-node verification exists to tell apart from a wrong node."""
    anchors, left_out, ambiguous = {}, [], {}
    for name, tf_name in candidates.items():
        tf_value, onnx_value = tf_values.get(tf_name), onnx_values.get(name)
        if tf_value is None or onnx_value is None or tf_value.dtype != onnx_value.dtype:
            left_out.append(name)
            continue
        options = _layouts(tf_value, onnx_value.shape)
        if as_tf and as_tf.get(name) == tf_name and (None, None) in options:
            options = [(None, None)]
        if not options:
            left_out.append(name)
        elif len(options) == 1:
            anchors[name] = Anchor(name, tf_name, *options[0])
        else:
            ambiguous[name] = options
    if ambiguous and model is not None:
        context = dict(known or {})
        context.update(anchors)
        _resolve_by_graph(model, ambiguous, candidates, tf_values, context, anchors)
    for name, options in ambiguous.items():
        tf_name = candidates[name]
        # Where the TF values of the two are equal the choice does not matter.
        options.sort(key=lambda o: _distance(Anchor(name, tf_name, *o).to_onnx_layout(tf_values[tf_name]),
                                             onnx_values[name]))
        anchors[name] = Anchor(name, tf_name, *options[0])
    return anchors, left_out


# Nodes whose inputs and outputs of one rank need not share a layout.
_LAYOUT_CHANGING = ("Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Einsum", "MatMul", "Gemm", "Shape")


def _perm(anchor: "Anchor", ndim: int) -> tuple:
    return tuple(anchor.perm) if anchor.perm is not None else tuple(range(ndim))


def _layout_edges(model) -> Dict[str, list]:
    """value -> [(neighbour, how the neighbour's layout follows from the value's)]: across a layout-keeping node
    the same layout, across a Transpose the perm composed with (or undone by) the Transpose's."""
    # Constants (initializers, Constant nodes) are no path: a shape or an axes list shared by two Slices would
    # carry one tensor's layout to an unrelated one.
    constants = {i.name for i in model.graph.initializer}
    constants.update(o for n in model.graph.node if n.op_type == "Constant" for o in n.output)
    edges = defaultdict(list)
    for node in model.graph.node:
        if node.op_type == "Transpose":
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            if perm is None or not node.input or not node.output:
                continue
            q = tuple(perm)
            inverse = tuple(int(i) for i in np.argsort(q))
            edges[node.input[0]].append((node.output[0], q))  # out == transpose(in, q)
            edges[node.output[0]].append((node.input[0], inverse))
            continue
        if node.op_type in _LAYOUT_CHANGING:
            continue
        values = [v for v in list(node.input) + list(node.output) if v and v not in constants]
        for v in values:
            edges[v].extend((w, None) for w in values if w != v)
    return edges


def _resolve_by_graph(model, ambiguous: dict, candidates: dict, tf_values: dict, context: dict, anchors: dict):
    """Moves the entries of ``ambiguous`` that the graph decides into ``anchors`` (and ``context``): the layouts the
    decided values of the same rank imply for it, followed through layout-keeping nodes (same layout) and
    Transposes (their perm composed), across values no TF tensor names. A value is decided where exactly one
    implied layout is among the ones its shape allows; a decided value implies layouts in turn."""
    edges = _layout_edges(model)
    changed = True
    while changed and ambiguous:
        changed = False
        for ndim in {tf_values[candidates[name]].ndim for name in ambiguous}:
            implied = defaultdict(set)  # value -> layouts the decided values of this rank imply for it
            frontier = []
            for name, anchor in context.items():
                if anchor.shape is None and anchor.tf_name in tf_values and tf_values[anchor.tf_name].ndim == ndim:
                    implied[name].add(_perm(anchor, ndim))
                    frontier.append(name)
            seen = set(frontier)
            while frontier:
                value = frontier.pop()
                for other, transform in edges.get(value, ()):
                    for perm in list(implied[value]):
                        if transform is None:
                            implied[other].add(perm)
                        elif len(transform) == len(perm):
                            implied[other].add(tuple(perm[i] for i in transform))
                    if other not in seen and other not in context:
                        seen.add(other)
                        frontier.append(other)
            for name in [n for n in ambiguous if tf_values[candidates[n]].ndim == ndim]:
                allowed = {tuple(perm) if perm is not None else tuple(range(ndim)): perm
                           for perm, shape in ambiguous[name] if shape is None}
                matching = {p for p in implied.get(name, ()) if p in allowed}
                if len(matching) == 1:
                    anchors[name] = context[name] = Anchor(name, candidates[name], allowed[matching.pop()], None)
                    del ambiguous[name]
                    changed = True


_LAYOUT_OPS = ("Transpose", "Reshape", "Identity", "Squeeze", "Unsqueeze", "Flatten")


def follow_layout_ops(model: onnx.ModelProto, anchors: Dict[str, Anchor], tf_values: dict, onnx_values: dict,
                      graph_inputs: Optional[Dict[str, Anchor]] = None) -> int:
    """Correct the anchors that tf2onnx's layout optimizer gave another tensor's name. Where it moves a Transpose
    across an op, the Transpose keeps its output's name: after Transpose(NCHW -> NHWC) -> AddN became AddN ->
    Transpose, the value named after the Transpose's old output holds the AddN's result; after x -> FakeQuant ->
    Transpose(NHWC -> NCHW) became Transpose -> FakeQuant (an elementwise op: the Transpose moved in front of
    it), it holds x transposed. A layout op's output holds its input's tensor, so where the input is an anchor,
    or a graph input (``graph_inputs``: the graph input's own TF tensor, as TF was fed it), the output is
    anchored to the same TF tensor (in the layout its shape says). Returns how many anchors changed."""
    graph_inputs = graph_inputs or {}
    changed = 0
    for node in model.graph.node:
        if node.op_type not in _LAYOUT_OPS or not node.output or node.output[0] not in anchors:
            continue
        source, out = anchors.get(node.input[0]) or graph_inputs.get(node.input[0]), node.output[0]
        if source is None or source.tf_name == anchors[out].tf_name:
            continue
        moved, _ = find_anchors({out: source.tf_name}, tf_values, onnx_values, model, anchors)
        if out in moved:
            anchors[out] = moved[out]
            changed += 1
    return changed


# ------------------------------------------------------------------------------------------- groups


def _subgraph_inputs(node) -> set:
    """Outer-scope names a node's subgraphs read."""
    names = set()
    for attr in node.attribute:
        graphs = list(attr.g.node and [attr.g] or []) + list(attr.graphs)
        for g in graphs:
            defined = {i.name for i in g.input} | {i.name for i in g.initializer}
            for n in g.node:
                defined.update(n.output)
            for n in g.node:
                names.update(i for i in n.input if i and i not in defined)
                names.update(_subgraph_inputs(n) - defined)
    return names


def group_nodes(graph, anchored: set, sources: set) -> List[int]:
    """The group of each node: nodes joined by a value that is neither an anchor nor a source (a graph input or
    an initializer) are in one group."""
    parent = list(range(len(graph.node)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    producer = {}
    for i, node in enumerate(graph.node):
        for out in node.output:
            if out:
                producer[out] = i
    for i, node in enumerate(graph.node):
        inner = _subgraph_inputs(node)
        for name in list(node.input) + sorted(inner):
            if not name or name in sources or name not in producer:
                continue
            if name in anchored and name not in inner:
                continue
            a, b = find(i), find(producer[name])
            if a != b:
                parent[max(a, b)] = min(a, b)
    return [find(i) for i in range(len(graph.node))]


def per_node_model(model: onnx.ModelProto, anchors: Dict[str, Anchor], tf_values: dict, groups: List[int]):
    """The model whose nodes read TF's value of every anchor they consume (graph inputs ``tf_value::NAME``) and
    whose outputs are the anchors the nodes compute; and its feeds."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    graph_inputs = {i.name for i in graph.input}
    produced_in = {}
    for i, node in enumerate(graph.node):
        for out in node.output:
            produced_in[out] = groups[i]
    new_nodes, feeds, new_inputs, outputs = [], {}, [], []
    for i, node in enumerate(graph.node):
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        inner = _subgraph_inputs(node)
        for k, name in enumerate(copy.input):
            if name in anchors and name not in graph_inputs and name not in initializers and name not in inner:
                fed = TF_PREFIX + name
                copy.input[k] = fed
                if fed not in feeds:
                    feeds[fed] = anchors[name].to_onnx_layout(tf_values[anchors[name].tf_name])
                    elem = helper.np_dtype_to_tensor_dtype(feeds[fed].dtype)
                    new_inputs.append(helper.make_tensor_value_info(fed, elem, list(feeds[fed].shape)))
        new_nodes.append(copy)
        for out in node.output:
            if out in anchors and out not in graph_inputs:
                value = tf_values[anchors[out].tf_name]
                outputs.append(helper.make_tensor_value_info(out, helper.np_dtype_to_tensor_dtype(value.dtype), None))
    result = onnx.ModelProto()
    result.CopyFrom(model)
    del result.graph.node[:]
    result.graph.node.extend(new_nodes)
    result.graph.input.extend(new_inputs)
    del result.graph.output[:]
    result.graph.output.extend(outputs)
    return result, feeds


# ------------------------------------------------------------------------------------------- quantizer flips

FAKE_QUANT_FORWARD = ("FakeQuantWithMinMaxArgs", "FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxVarsPerChannel")
# A quantizer input within FLIP_RTOL * max|input| of a rounding tie of TF's grid may round either way when the
# group computes it (a few ulps of a sum, 1e-5 as the verifier's float and sum tolerances).
FLIP_RTOL = 1e-5


def quantizer_inputs(graph) -> List[str]:
    """The TF tensors the forward quantizers read (input, and min/max where they are inputs)."""
    return [t.name for op in graph.get_operations() if op.type in FAKE_QUANT_FORWARD for t in op.inputs]


def near_ties(op, tf_values: dict):
    """(where TF's input to the quantizer ``op`` lies within FLIP_RTOL * max|input| of a rounding tie of its nudged
    grid, the grid step; both in TF layout), or None when its input values are not at hand."""
    from ort_ops.reference._fake_quant import nudge, quant_bounds

    values = [tf_values.get(t.name) for t in op.inputs]
    if any(v is None for v in values):
        return None
    x = values[0].astype(np.float64)
    if op.type == "FakeQuantWithMinMaxArgs":
        mn, mx = op.get_attr("min"), op.get_attr("max")
    else:
        mn, mx = values[1], values[2]
    quant_min, quant_max = quant_bounds(op.get_attr("num_bits"), op.get_attr("narrow_range"))
    nudged_min, nudged_max, scale, _ = nudge(mn, mx, quant_min, quant_max)
    nudged_min, nudged_max, scale = (np.asarray(a, np.float64) for a in (nudged_min, nudged_max, scale))
    with np.errstate(all="ignore"):
        position = (np.clip(x, nudged_min, nudged_max) - nudged_min) / scale
        distance = np.abs(position - np.floor(position) - 0.5) * scale
    finite = np.isfinite(x)
    largest = float(np.abs(x[finite]).max(initial=0.0))
    return finite & (distance <= FLIP_RTOL * largest), np.broadcast_to(scale, x.shape)


def judge_quantizer(name, expected, actual, ties: np.ndarray, scale_of_step: np.ndarray):
    """A forward quantizer's output whose input the group computes: bit for bit, except that an element may be one
    grid step off where TF's input lies at a rounding tie (``ties``, in the output's layout)."""
    from converters.verification import judge_output, same_bits

    check = judge_output(name, expected, actual, exact=True)
    if check.ok or not check.same_type:
        return check
    differing = ~same_bits(expected, actual)
    e64, a64 = expected.astype(np.float64), actual.astype(np.float64)
    with np.errstate(invalid="ignore"):
        # One step: the grid's values are float32 roundings of nudged_min + q * scale (a few ulps of the value).
        slack = 4 * np.finfo(np.float32).eps * np.maximum(np.abs(e64), np.abs(a64))
        one_step = np.abs(a64 - e64) <= scale_of_step + slack
    allowed = differing & ties & one_step
    if np.array_equal(allowed, differing):
        check.ok = True
        check.n_outside = 0
        check.verdict = f"ok: {int(differing.sum())} element(s) one grid step off at rounding ties of TF's input"
    else:
        check.n_outside = int(np.count_nonzero(differing & ~allowed))
        check.verdict = f"FAIL: {check.n_outside} of {check.size} differ in bits away from a rounding tie"
    check.kind = "bits, flips at ties"
    return check


# ------------------------------------------------------------------------------------------- the check


def _with_outputs(model: onnx.ModelProto, names) -> onnx.ModelProto:
    extended = onnx.ModelProto()
    extended.CopyFrom(model)
    have = {o.name for o in extended.graph.output}
    extended.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in have)
    return extended


def verify_nodes(onnx_model, tf_fn, inputs=None, seed: int = 0, rtol: Optional[float] = None,
                 sum_rtol: Optional[float] = None, atol: Optional[float] = None, threads: Optional[int] = None,
                 print_table: bool = True, json_path=None, frozen=None) -> NodeReport:
    """Judge every converted op of ``onnx_model`` on TF's own input values (see the module docstring).

    ``tf_fn``: the function the model was converted from (a tf.function, ConcreteFunction, SavedModel signature,
    or a Keras model converted by from_keras with its batch left free), run on ``inputs`` (by ONNX input name,
    a list in input order, or None for the verifier's seeded random inputs). ``frozen``: (FrozenFunction,
    renames) from :func:`freeze_like_converter`, when the caller froze it already (it must be frozen before a
    training step runs: the step assigns variables).
    ``rtol``, ``sum_rtol``, ``atol``: as converters.verification.verify. Prints the report's table unless
    ``print_table`` is false; writes its JSON to ``json_path`` if given.
    """
    import tensorflow as tf

    from converters.exact_outputs import exact_cone
    from converters.verification import (VERIFY_LOG_SEVERITY, absolute_error_atol, judge_output, random_inputs,
                                         run_onnx, run_with_magnitudes)
    from converters.verify_tf import concrete_function

    seconds = {}
    start = time.perf_counter()
    graph = onnx_model.graph
    init_values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    graph_inputs = [vi.name for vi in graph.input if vi.name not in init_values]
    if inputs is None:
        inputs = random_inputs(onnx_model, seed)
    elif not isinstance(inputs, dict):
        inputs = dict(zip(graph_inputs, inputs))
    inputs = {name: np.asarray(inputs[name]) for name in graph_inputs}
    if frozen is None:
        if hasattr(tf_fn, "layers") and hasattr(tf_fn, "inputs"):
            # A Keras model: its inference function as from_keras traced it (batch left free), not one traced at
            # these inputs' shapes (grappler folds a graph with fixed shapes differently, and names change).
            from converters.frontends import keras_concrete_function

            concrete = keras_concrete_function(tf_fn)
        else:
            concrete = concrete_function(tf_fn, inputs)
        frozen = freeze_like_converter(concrete, onnx_model)
    frozen_fn, renames = frozen
    tf_graph = tf.Graph()
    with tf_graph.as_default():
        tf.compat.v1.import_graph_def(frozen_fn.graph_def, name="")
    seconds["freeze"] = time.perf_counter() - start

    node_values = {o for n in graph.node for o in n.output if o}
    sources = set(init_values) | {vi.name for vi in graph.input}
    candidates = _candidates(tf_graph, renames, node_values)
    _follow_inserted(onnx_model, candidates)
    candidates.update(_domain_inputs(onnx_model, tf_graph, candidates, sources))
    candidates.update(_lost_names(onnx_model, tf_graph, candidates, sources))
    candidates.update(_fused_bias_outputs(onnx_model, tf_graph, candidates))
    t0 = time.perf_counter()
    fetch = sorted(set(candidates.values()) | set(quantizer_inputs(tf_graph)))
    tf_values = _tf_run(tf_graph, frozen_fn, renames, inputs, init_values, fetch)
    seconds["tf"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    onnx_values = run_onnx(_with_outputs(onnx_model, sorted(candidates)), inputs, threads, VERIFY_LOG_SEVERITY)
    seconds["onnx_end_to_end"] = time.perf_counter() - t0
    output_tf_name = {renames.get(t, t): t for t in frozen_fn.output_names}
    anchors, left_out = find_anchors(candidates, tf_values, onnx_values, onnx_model,
                                     as_tf={o.name: output_tf_name[o.name] for o in graph.output
                                            if o.name in output_tf_name})
    input_tf_name = {renames.get(t, t): t for t in frozen_fn.input_names}
    # A graph input is TF's input tensor as fed (a layout op the optimizer moved in front of the first op reads it).
    input_anchors = {}
    for name in graph_inputs:
        tf_name = input_tf_name.get(name)
        if tf_name is not None and name not in anchors:
            tf_values.setdefault(tf_name, inputs[name])
            input_anchors[name] = Anchor(name, tf_name)
    follow_layout_ops(onnx_model, anchors, tf_values, onnx_values, input_anchors)
    del onnx_values

    groups = group_nodes(graph, set(anchors), sources)
    model, feeds = per_node_model(onnx_model, anchors, tf_values, groups)
    feeds.update(inputs)
    float_outputs = [o.name for o in model.graph.output
                     if o.type.tensor_type.elem_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE,
                                                         onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)]
    t0 = time.perf_counter()
    values, magnitudes, magnitude_note, terms = run_with_magnitudes(model, float_outputs, feeds, threads,
                                                                    additions=True)
    seconds["onnx_per_node"] = time.perf_counter() - t0

    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    tf_input_names = set(frozen_fn.input_names)
    checks = []
    for i, node in enumerate(graph.node):
        for out in node.output:
            anchor = anchors.get(out)
            if anchor is None or out in inputs:
                continue
            cone = _nodes_computing(graph, producer, groups, out, anchors)
            stops, where = set(tf_input_names), []
            for k in cone:
                for name in graph.node[k].input:
                    if name in anchors and name not in sources:
                        stops.add(anchors[name].tf_name)
                        text = f"{name} <- TF {anchors[name].tf_name}"
                    elif name in inputs:
                        text = f"{name} <- graph input {input_tf_name.get(name, name)}"
                    else:
                        continue
                    if text not in where:
                        where.append(text)
            tensor = tf_graph.get_tensor_by_name(anchor.tf_name)
            expected = anchor.to_onnx_layout(tf_values[anchor.tf_name])
            exact = exact_cone(tensor, frozenset(stops))
            source = through_identities(tensor)
            grid = None
            if not exact and source.op.type in FAKE_QUANT_FORWARD and expected.dtype.kind == "f":
                grid = near_ties(source.op, tf_values)
            if grid is not None and grid[0].shape == tf_values[anchor.tf_name].shape:
                ties, steps = grid
                check = judge_quantizer(out, expected, values[out], anchor.to_onnx_layout(ties),
                                        anchor.to_onnx_layout(np.ascontiguousarray(steps)))
            else:
                # (an exact judgment ignores atol)
                check = judge_output(out, expected, values[out], exact, rtol, sum_rtol,
                                     (atol or 0.0) + absolute_error_atol(node.op_type, expected.dtype),
                                     magnitudes.get(out), terms=terms.get(out))
            layout = "as TF" if anchor.perm is None and anchor.shape is None else \
                f"TF transposed {list(anchor.perm)}" if anchor.perm is not None else f"TF reshaped {list(anchor.shape)}"
            op = through_identities(tensor).op
            nodes = [f"{graph.node[k].name} ({graph.node[k].op_type})" for k in cone]
            checks.append(NodeCheck(out, anchor.tf_name, op.name, op.type, groups[i], nodes, where, layout, check))
    notes = [magnitude_note] if magnitude_note else []
    seconds["total"] = time.perf_counter() - start
    report = NodeReport(checks, len(graph.node), len(set(groups)), len(left_out), notes,
                        {k: round(v, 3) for k, v in seconds.items()})
    if json_path is not None:
        report.to_json(json_path)
    if print_table:
        print(report.table())
    return report


def _nodes_computing(graph, producer, groups, value, anchors) -> List[int]:
    """The nodes that compute ``value`` in the per-node model: its producer and the nodes of its group upstream
    of it, up to the anchors (which the per-node model reads from TF); in the graph's order."""
    g = groups[producer[value]]
    todo, seen = [producer[value]], set()
    while todo:
        i = todo.pop()
        if i in seen:
            continue
        seen.add(i)
        for name in graph.node[i].input:
            j = producer.get(name)
            if j is not None and j not in seen and groups[j] == g and name not in anchors:
                todo.append(j)
    return sorted(seen)
