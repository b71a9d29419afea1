"""tf2onnx's transpose optimizer, taught the domain's ops and the element-wise ops our lowerings write.

tf2onnx writes every NHWC convolution as Transpose -> Conv (NCHW) -> Transpose and then pushes the
NCHW->NHWC Transposes down the graph until they meet the next convolution's NHWC->NCHW Transpose and
cancel. It only pushes through op types it has a handler for; any other node keeps a Transpose pair
on each side. Left alone, every node of our domain and every Floor or Where of the standard lowering
stops the push, which costs two full copies of the tensor per node (issue 12).

``optimizers()`` is tf2onnx's optimizer list with its transpose optimizer replaced by
``LayoutOptimizer``, which adds handlers for:

* the domain's ops whose result does not depend on the layout they are computed in:
  - FakeQuantWithMinMaxArgs, FakeQuantWithMinMaxVars (scalar range): element-wise;
  - QuantizeAndDequantizeV2/V3/V4 with a given range: element-wise per tensor, and per axis with the
    axis moved along (a range taken from the data is not: which NaN or signed zero the reduction keeps
    follows the element order, docs/semantics.md 2.6);
  - FakeQuantWithMinMaxVarsPerChannel: element-wise per channel; TF's channels are the last dim, so the
    node gets the domain's ``axis`` attribute naming where that dim went;
  - FusedBatchNorm{,V2,V3} in inference mode: the node takes ``data_format`` NCHW (per-channel
    element-wise work, the same float operations in either layout; a training-mode node sums its
    columns in an order that follows the layout, so it keeps its own);
  - DepthwiseConv2dNative and its two backprops: the node takes ``data_format`` NCHW with strides,
    dilations, explicit paddings and the input_sizes shape permuted (the library computes every
    layout with the same per-element order, so the bits do not change);
* the standard element-wise ops tf2onnx has no handler for (Floor, Round, Div, Where, comparisons ...).

Before any of this, on the TF graph as tf2onnx parsed it, ``absorb_channel_transposes`` removes the
Transpose pair Keras 3 puts around a per-channel FakeQuant (and its gradient) quantizing another axis than
the last: the node takes the domain's ``axis`` instead, in both lowerings (see its docstring).

Gradients whose outputs include sums over the tensor (FakeQuant*Gradient, QuantizeAndDequantizeV4Grad,
FusedBatchNormGrad*) take the layout only when no node reads those sums (a saliency map reads only dx):
a different order of the same sum changes its last bits. FakeQuantWithMinMaxVarsPerChannelGradient keeps
its layout: the kernels (CPU and CUDA) take a moved axis, but tfmot quantizes per channel only weights,
whose Transposes (HWIO -> OIHW) are not the activations' NCHW->NHWC ones this optimizer pushes.
"""
from __future__ import annotations

from collections import OrderedDict

import ort_ops
from converters.family import tf_attributes
from ort_ops.schemas import DOMAIN

NHWC_TO_NCHW = [0, 3, 1, 2]
NCHW_TO_NHWC = [0, 2, 3, 1]
# The format a 4-D domain node takes when the Transpose with this perm is removed from its input. Only
# NCHW->NHWC Transposes are pushed down through the domain's nodes: the direction tf2onnx pushes them
# for its NCHW convolutions, until they cancel against the next convolution's NHWC->NCHW Transpose.
_FLIPPED_FORMAT = {("NHWC", tuple(NCHW_TO_NHWC)): "NCHW"}
SWEEPS = True  # False: tf2onnx's own loop (the tests compare the two)
_ELEMENTWISE_DOMAIN = ("FakeQuantWithMinMaxArgs", "FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxVarsPerChannel",
                       "QuantizeAndDequantizeV2", "QuantizeAndDequantizeV3", "QuantizeAndDequantizeV4")
# Domain ops whose `axis` names a dim of input 0 even at -1 (the last dim): it moves with every Transpose.
# (The per-channel gradient keeps its layout, see the module docstring, so it is not listed.)
_CHANNEL_AXIS = ("FakeQuantWithMinMaxVarsPerChannel",)

# Standard ops that act element by element (with broadcasting), missing from tf2onnx's handler map.
_UNARY_ELEMENTWISE = ("Floor", "Ceil", "Round", "IsNaN", "IsInf", "Not", "Sign", "Erf")
_NARY_ELEMENTWISE = ("Div", "Pow", "Mod", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal", "And", "Or",
                     "Xor", "Where")


def _layout_optimizer_class():
    from tf2onnx import utils
    from tf2onnx.optimizer.transpose_optimizer import TransposeOptimizer

    class LayoutOptimizer(TransposeOptimizer):
        """tf2onnx's TransposeOptimizer with handlers for the domain's ops (see the module docstring)."""

        def _initialize_handlers(self):
            super()._initialize_handlers()
            for op in _UNARY_ELEMENTWISE:
                self._handler_map.setdefault(op, self._simple_through_handler)
            for op in _NARY_ELEMENTWISE:
                self._handler_map.setdefault(op, self._handle_node_having_branches)
            domain = {
                "FakeQuantWithMinMaxArgs": self._domain_elementwise,
                "FakeQuantWithMinMaxVars": self._domain_elementwise,
                "QuantizeAndDequantizeV2": self._domain_qdq,
                "QuantizeAndDequantizeV3": self._domain_qdq,
                "QuantizeAndDequantizeV4": self._domain_qdq,
                "FakeQuantWithMinMaxVarsPerChannel": self._domain_qdq,
                "FusedBatchNorm": self._domain_batch_norm,
                "FusedBatchNormV2": self._domain_batch_norm,
                "FusedBatchNormV3": self._domain_batch_norm,
                "FusedBatchNormClipFakeQuant": self._domain_batch_norm,
                "DepthwiseConv2dNative": self._domain_depthwise,
                "DepthwiseConv2dNativeBackpropInput": self._domain_depthwise_backprop_input,
                "DepthwiseConv2dNativeBackpropFilter": self._domain_depthwise_backprop_filter,
                "FakeQuantWithMinMaxArgsGradient": self._domain_gradient,
                "FakeQuantWithMinMaxVarsGradient": self._domain_gradient,
                "QuantizeAndDequantizeV4Grad": self._domain_gradient,
                "FusedBatchNormGrad": self._domain_gradient,
                "FusedBatchNormGradV2": self._domain_gradient,
                "FusedBatchNormGradV3": self._domain_gradient,
            }
            for op, handler in domain.items():
                self._handler_map[op] = (lambda h: lambda trans, node: node.domain == DOMAIN and h(trans, node))(handler)

        def _add_handler(self, trans, node):
            """tf2onnx's, except for a 0-d constant addend (hard-swish's ``x + 3`` after a convolution, in
            MobileNetV3): tf2onnx's merge of Conv and Add into a bias takes ``max()`` of the addend's shape and
            raises on an empty one. A scalar broadcasts in any layout, so the Transpose moves past the Add as
            past any element-wise op, and TF's two roundings (the sum, then the addition) stay two."""
            addend = node.inputs[1] if len(node.inputs) > 1 else None
            if addend is not None and addend.is_const() and addend.get_tensor_value(as_list=False).ndim == 0:
                return self._handle_node_having_branches(trans, node)
            return super()._add_handler(trans, node)

        def _mul_handler(self, trans, node):
            """tf2onnx's, plus the shape its square case forgets. For ``Mul(t, t)`` (a batch norm's
            ``(x - mean)^2`` in the standard lowering) tf2onnx moves the Transpose below the Mul but leaves the
            Mul's recorded output shape in the old layout. post_optimize_action later writes a Transpose that
            moves only size-1 dims as a Reshape to a shape computed from that record: with H or W of 1, a
            Reshape valid only for the old layout, which sums a variance over the wrong axes. Here the Mul's
            shape is permuted as tf2onnx's own switch of a Transpose and a node does."""
            square = list(node.input) == [trans.output[0]] * 2
            shape = self._g.get_shape(node.output[0]) if square else None
            if not super()._mul_handler(trans, node):
                return False
            if shape:
                self._g.set_shape(node.output[0], [shape[i] for i in _inverse(trans.get_attr_value("perm"))])
                self._g.set_shape(trans.output[0], shape)
            return True

        def _optimize_at_current_graph_level(self, graph):
            """tf2onnx's loop, without its restarts. tf2onnx goes back to the first node after every change
            and so tries every Transpose that could not move once per change: nodes x moves, 170 s of the
            200 s the quantized MobileNetV2 saliency graph took to convert. Here a pass visits the nodes in
            graph order and then the nodes its own moves create, in the order they are created, and passes
            repeat until one changes nothing: the same moves, each tried on the graph as it is then. The
            order of the moves differs, so the result is the same graph by test, not by construction
            (tests/test_linear_cost.py compares both loops)."""
            if not SWEEPS:
                return super()._optimize_at_current_graph_level(graph)
            self._g = graph
            self.pre_optimize_action()
            changed = True
            while changed:
                changed = False
                self._force_stop = {}
                work = list(graph.get_nodes())
                known = {id(n) for n in work}
                i = 0
                while i < len(work):
                    n = work[i]
                    i += 1
                    if graph.get_node_by_name(n.name) is not n:
                        continue  # removed by an earlier move
                    if n.type == "Transpose" and n.get_attr("perm"):
                        if self._handle_nhwc_tranpose(n):
                            changed = True
                            self.graph_been_opt = True
                        elif graph.get_node_by_name(n.name) is n and _keeps_every_axis(n):
                            changed = True
                            self._remove_useless_tranpose(n)
                        _take_new_nodes(graph, work, known)
                if self._force_stop.get("stop") == 1:
                    break
            self.merge_duplicated_transposes()
            self.post_optimize_action()
            return self._g

        # ----- helpers -----
        def _fed_at(self, trans, node, index: int) -> bool:
            """Whether ``trans`` feeds input ``index`` of ``node`` and no other input."""
            hits = [i for i, name in enumerate(node.input) if name == trans.output[0]]
            return hits == [index]

        def _flipped_format(self, trans, node):
            fmt = _attrs(node)["data_format"]
            return _FLIPPED_FORMAT.get((fmt, tuple(trans.get_attr_value("perm"))))

        def _set_format(self, node, fmt: str, perm_of_attrs):
            """Set data_format and reorder the per-dim attributes (strides, dilations, explicit_paddings'
            pairs) to the new format's order: new[j] = old[perm_of_attrs[j]]."""
            node.set_attr("data_format", fmt)
            for name in ("strides", "dilations"):
                values = node.get_attr_value(name)
                if values:
                    node.set_attr(name, [values[p] for p in perm_of_attrs])
            pads = node.get_attr_value("explicit_paddings")
            if pads:
                node.set_attr("explicit_paddings", [v for p in perm_of_attrs for v in pads[2 * p: 2 * p + 2]])

        def _bypass_transposes(self, node, indices):
            """Inputs ``indices`` of ``node`` read their Transposes' inputs; a Transpose left unread goes."""
            g = self._g
            producers = {}
            for index in indices:
                producer = node.inputs[index]
                producers[producer.name] = producer
                g.replace_input(node, node.input[index], producer.input[0], index)
            for producer in producers.values():
                if not g.find_output_consumers(producer.output[0]) and producer.output[0] not in g.outputs:
                    g.remove_node(producer.name)

        @staticmethod
        def _elementwise(node) -> bool:
            """Whether a domain node computes element by element (per tensor or per given axis)."""
            if node.domain != DOMAIN or node.type not in _ELEMENTWISE_DOMAIN:
                return False
            if node.type.startswith("QuantizeAndDequantize"):
                return _attrs(node)["range_given"]
            return True

        # ----- handlers -----
        def _domain_elementwise(self, trans, node):
            """One tensor input at 0, the rest scalars; one output of the same shape."""
            if not self._fed_at(trans, node, 0) or trans.get_attr_value("perm") != NCHW_TO_NHWC:
                return False
            return self._switch_transpose_and_node(node, trans)

        def _domain_qdq(self, trans, node):
            if not self._fed_at(trans, node, 0) or not self._elementwise(node):
                return False
            perm = trans.get_attr_value("perm")
            if perm != NCHW_TO_NHWC:
                return False
            axis = _attrs(node)["axis"]
            if not self._switch_transpose_and_node(node, trans):
                return False
            if _axis_moves(node, axis):  # the node now sees the Transpose's input: its old dim `axis` is perm[axis]
                node.set_attr("axis", _moved_axis(axis, perm))
            return True

        def _domain_batch_norm(self, trans, node):
            # The fused batch norm (converters.fusions) is inference-mode by definition.
            if not self._fed_at(trans, node, 0) or _attrs(node).get("is_training", False):
                return False
            fmt = self._flipped_format(trans, node)
            if fmt is None or not self._switch_transpose_and_node(node, trans):
                return False
            node.set_attr("data_format", fmt)
            return True

        def _domain_depthwise(self, trans, node):
            fmt = self._flipped_format(trans, node)
            if fmt is None or not self._fed_at(trans, node, 0):
                return False
            if not self._switch_transpose_and_node(node, trans):
                return False
            self._set_format(node, fmt, _inverse(trans.get_attr_value("perm")))
            return True

        def _domain_depthwise_backprop_input(self, trans, node):
            """input_sizes (a constant, permuted here), filter, out_backprop <- trans."""
            fmt = self._flipped_format(trans, node)
            if fmt is None or not self._fed_at(trans, node, 2) or not node.inputs[0].is_const():
                return False
            perm = trans.get_attr_value("perm")
            sizes = node.inputs[0].get_tensor_value(as_list=False)
            if sizes.shape != (4,) or not self._switch_transpose_and_node(node, trans):
                return False
            new_sizes = self._g.make_const(utils.make_name(node.name + "_input_sizes"), sizes[_inverse(perm)])
            self._g.replace_input(node, node.input[0], new_sizes.output[0], 0)
            self._set_format(node, fmt, _inverse(perm))
            return True

        def _domain_depthwise_backprop_filter(self, trans, node):
            """input and out_backprop both arrive through Transposes of the same perm; the output is the
            filter, which has no layout."""
            fmt = self._flipped_format(trans, node)
            if fmt is None or trans.output[0] not in (node.input[0], node.input[2]):
                return False
            perm = trans.get_attr_value("perm")
            for index in (0, 2):
                producer = node.inputs[index]
                if producer is None or producer.type != "Transpose" or producer.get_attr_value("perm") != perm:
                    return False
            self._bypass_transposes(node, (0, 2))
            self._set_format(node, fmt, _inverse(perm))
            return True

        def _domain_gradient(self, trans, node):
            """A gradient whose summed outputs nobody reads (a saliency map needs only dx) is element-wise
            in its first two inputs (the incoming gradient and the forward input): both arrive through
            Transposes of one perm, which move behind dx. FakeQuantWithMinMaxArgsGradient has no sum;
            QuantizeAndDequantizeV4Grad's range is given, its axis moves; an inference-mode batch-norm
            gradient (dx = dy * k per channel) takes data_format NCHW. Read sums keep the layout: a sum
            in another order rounds differently."""
            g = self._g
            perm = trans.get_attr_value("perm")
            if perm != NCHW_TO_NHWC or trans.output[0] not in node.input[:2]:
                return False
            if any(g.find_output_consumers(o) or o in g.outputs for o in node.output[1:]):
                return False
            fmt = None
            if node.type.startswith("FusedBatchNormGrad"):
                fmt = self._flipped_format(trans, node)
                if fmt is None or _attrs(node)["is_training"]:
                    return False
            # An input that does not arrive through such a Transpose gets a cancelling pair (as tf2onnx does
            # for Add and Mul): its NHWC->NCHW half then moves up the graph or stays, one copy for the two
            # this rewrite saves.
            for index in (0, 1):
                p = node.inputs[index]
                if p is None or p.type != "Transpose" or p.get_attr_value("perm") != perm:
                    to_nchw = g.make_node("Transpose", [node.input[index]], attr={"perm": _inverse(perm)})
                    to_nhwc = g.make_node("Transpose", [to_nchw.output[0]], attr={"perm": perm})
                    g.replace_input(node, node.input[index], to_nhwc.output[0], index)
            self._bypass_transposes(node, (0, 1))
            dx = node.output[0]
            consumers = g.find_output_consumers(dx)
            back = g.make_node("Transpose", [dx], attr={"perm": perm})
            g.replace_all_inputs(dx, back.output[0], ops=consumers)
            shape = g.get_shape(dx)
            if shape:
                g.set_shape(back.output[0], shape)
                g.set_shape(dx, [shape[i] for i in _inverse(perm)])
            g.set_dtype(back.output[0], g.get_dtype(dx))
            if fmt is not None:
                node.set_attr("data_format", fmt)
            axis = _attrs(node)["axis"] if node.type == "QuantizeAndDequantizeV4Grad" else -1
            if axis != -1:
                node.set_attr("axis", _moved_axis(axis, perm))
            return True

        # ----- after the pushes -----
        def post_optimize_action(self):
            self._raise_transposes_over_elementwise()
            super().post_optimize_action()

        def _raise_transposes_over_elementwise(self):
            """Transpose(q(x)) -> q(Transpose(x)) for element-wise domain nodes q of a graph input x: the
            quantizer of a graph's NHWC input then reads the Transpose the first NCHW convolution needs,
            which sits on the graph input instead of between two nodes. The same copy, moved; the pushes
            above never move a Transpose of this direction back down."""
            g = self._g
            graph_inputs = {n.output[0] for n in g.get_nodes() if n.type == "Placeholder"}
            moved = False
            changed = True
            while changed:
                changed = False
                for trans in list(g.get_nodes()):
                    if trans.type != "Transpose" or g.get_node_by_name(trans.name) is None:
                        continue
                    q = trans.inputs[0]
                    if q is None or not self._elementwise(q) or trans.output[0] in g.outputs:
                        continue
                    if q.output[0] in g.outputs or len(g.find_output_consumers(q.output[0])) != 1:
                        continue
                    if q.input[0] not in graph_inputs:
                        continue
                    perm = trans.get_attr_value("perm")
                    x, y = q.input[0], trans.output[0]
                    g.replace_all_inputs(y, q.output[0], ops=g.find_output_consumers(y))
                    g.replace_input(trans, trans.input[0], x, 0)
                    g.replace_input(q, x, y, 0)
                    shape = g.get_shape(x)
                    if shape:
                        g.set_shape(y, [shape[i] for i in perm])
                        g.set_shape(q.output[0], [shape[i] for i in perm])
                    axis = _attrs(q)["axis"] if "axis" in {a.name for a in ort_ops.get_spec(q.type).attrs} else -1
                    if _axis_moves(q, axis):  # q now reads Transpose(x), whose dim inverse(perm)[axis] is x's dim `axis`
                        q.set_attr("axis", _moved_axis(axis, _inverse(perm)))
                    changed = moved = True
            if moved:
                g.topological_sort(g.get_nodes())

    return LayoutOptimizer


def _take_new_nodes(graph, work, known):
    """Append to ``work`` the nodes created since ``known`` was filled: make_node appends, so they are the
    tail of the node list after the last known node (cost: the new nodes, not the graph)."""
    nodes = graph.get_nodes()
    j = len(nodes)
    while j > 0 and id(nodes[j - 1]) not in known:
        j -= 1
    for n in nodes[j:]:
        known.add(id(n))
        work.append(n)


def _keeps_every_axis(node) -> bool:
    """A Transpose whose perm leaves every axis in place (tf2onnx's loop removes it as useless)."""
    perm = node.get_attr_value("perm")
    return node.type == "Transpose" and bool(perm) and list(perm) == list(range(len(perm)))


def _attrs(node) -> dict:
    """A domain node's attributes read through its spec, TF's defaults filled in."""
    return tf_attributes(node, ort_ops.get_spec(node.type))


def _axis_moves(node, axis: int) -> bool:
    """Whether a node's `axis` names a dim that a Transpose moves: a per-axis QuantizeAndDequantize (-1 is
    per tensor there), or a per-channel FakeQuant at any value (-1 is its last dim)."""
    return axis != -1 or node.type in _CHANNEL_AXIS


def _moved_axis(axis: int, perm) -> int:
    """The dim of a Transpose's input that is dim ``axis`` (negative counts from the end) of its output."""
    return perm[axis if axis >= 0 else axis + len(perm)]


def _inverse(perm):
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


# ----- before the handlers: Transposes that only bring a per-channel quantizer's channel last -----

PER_CHANNEL_OPS = ("FakeQuantWithMinMaxVarsPerChannel", "FakeQuantWithMinMaxVarsPerChannelGradient")


def _constant_perm(node) -> "list | None":
    """The perm of a TF Transpose node (tf2onnx's parse: the perm is input 1) when it is a constant."""
    if node is None or node.type != "Transpose" or len(node.input) != 2:
        return None
    perm_node = node.inputs[1]
    if perm_node is None or not perm_node.is_const():
        return None
    perm = [int(p) for p in perm_node.get_tensor_value(as_list=False).reshape(-1)]
    return perm if sorted(perm) == list(range(len(perm))) else None


def _inverse_transposes(g, output: str, perm) -> "list | None":
    """The consumers of ``output`` when every one of them is a Transpose by the inverse of ``perm`` whose
    result is no graph output (so it can be bypassed), else None."""
    if output in g.outputs:
        return None
    consumers = g.find_output_consumers(output)
    inverse = _inverse(perm)
    for c in consumers:
        if _constant_perm(c) != inverse or c.input[0] != output or c.output[0] in g.outputs:
            return None
    return consumers


def keeps_sum_order(perm, shape) -> bool:
    """Whether the per-channel gradient's sums add each channel's elements in the same order after the
    Transpose ``perm`` (which puts the channel last) is replaced by the node's ``axis``.

    TF views the transposed tensor as [N, d] and reduces each channel in the row-major order of its
    leading dims, i.e. of x's dims ``perm[:-1]`` in that order; with ``axis`` the kernels take the rows in
    the row-major order of x's own dims other than the channel (ort_ops' reference moves the axis last).
    The orders agree when ``perm[:-1]`` is ascending once the dims known to be 1 are left out:
    Keras' swap of axis and last dim keeps it for axis rank-2 (and every axis of a 2-D tensor), not for
    axis 1 of a 4-D tensor."""
    rows = [d for d in perm[:-1] if not (shape is not None and d < len(shape) and shape[d] == 1)]
    return rows == sorted(rows)


def absorb_channel_transposes(g, lowering: str) -> int:
    """Remove the Transpose pair around each per-channel FakeQuant of tf2onnx graph ``g`` (TF op types,
    before the family is shielded) by setting the node's ``axis`` instead. Returns how many nodes changed.

    TF's FakeQuantWithMinMaxVarsPerChannel and its gradient quantize along the last dim only, so Keras 3's
    ``keras.quantizers.fake_quant_with_min_max_vars(..., axis=a)`` swaps dim a with the last dim, quantizes
    and swaps back; its gradient does the same around FakeQuantWithMinMaxVarsPerChannelGradient. The
    domain's ops take an ``axis`` (ort_ops/specs/fake_quant.py, "the result is TF's op on the input
    transposed so that axis is last, transposed back") and the standard lowering broadcasts its [d]
    parameters along it, so the pair is two full copies of the tensor that change nothing: the node
    reads the Transpose's input, takes ``axis = perm[-1]`` and its consumers, Transposes by the inverse
    perm, are bypassed. This runs before the handlers because the standard lowering writes the
    quantizer as broadcast arithmetic, where no single node could take the axis later, and because a
    training step's Transpose of x feeds both the forward node and the gradient, a shared Transpose
    that tf2onnx's push loop does not split for perms other than NCHW->NHWC.

    Exact: the forward node and dx are element-wise per channel. The gradient's min/max sums add each
    channel's elements in an order the layout decides; the custom kernels reproduce TF's order for the
    layout they are given, so in the custom lowering a gradient whose sums are read changes only where
    ``keeps_sum_order`` holds (the pair stays otherwise). The standard lowering sums with ReduceSum in
    ONNX Runtime's own order in either layout, so there its sums are TF's only when the sum is exact in
    any order, before and after this rewrite.
    """
    changed = 0
    for node in list(g.get_nodes()):
        if node.type not in PER_CHANNEL_OPS or node.get_attr("axis") is not None:
            continue
        gradient = node.type.endswith("Gradient")
        tensor_inputs = (0, 1) if gradient else (0,)
        transposes = [node.inputs[i] for i in tensor_inputs]
        perms = [_constant_perm(t) for t in transposes]
        perm = perms[0]
        if perm is None or any(p != perm for p in perms):
            continue
        backs = _inverse_transposes(g, node.output[0], perm)
        if backs is None:
            continue
        if gradient and lowering == "custom":
            sums_read = any(g.find_output_consumers(o) or o in g.outputs for o in node.output[1:])
            if sums_read and not keeps_sum_order(perm, g.get_shape(transposes[1].input[0])):
                continue
        for i, t in zip(tensor_inputs, transposes):
            g.replace_input(node, node.input[i], t.input[0], i)
        node.set_attr("axis", perm[-1])
        for back in backs:
            g.replace_all_inputs(back.output[0], node.output[0])
            g.remove_node(back.name)
        shape = g.get_shape(node.input[tensor_inputs[-1]])
        if shape is not None:
            g.set_shape(node.output[0], shape)
        for t in set(transposes):
            if not g.find_output_consumers(t.output[0]) and t.output[0] not in g.outputs:
                g.remove_node(t.name)
        changed += 1
    return changed


def optimizers() -> "OrderedDict":
    """tf2onnx's optimizers in its order, with the transpose optimizer replaced by LayoutOptimizer."""
    from tf2onnx import optimizer
    from tf2onnx.optimizer.transpose_optimizer import TransposeOptimizer

    layout = _layout_optimizer_class()
    return OrderedDict(
        (name, layout if factory is TransposeOptimizer else factory) for name, factory in optimizer._get_optimizers().items()
    )
