"""The magnitude of a sum: what a summed output of a converted model is judged against.

A sum's rounding error is not relative to its own value. ``Σ t_i`` computed by two kernels (TF's and ONNX
Runtime's, in different orders, from terms that carry their own few-ulps differences) differs by a few ulps
of ``Σ |t_i|``, the size of what was summed; where the terms cancel, the value is far smaller than that, and a
sum that vanishes in exact arithmetic (the gradient of a bias in front of a batch norm) is rounding noise on
both sides. The verifier therefore accepts an element of a summed output where

    |ort - tf| <= rtol * |tf| + sum_rtol * magnitude

(converters.verification), and this module computes ``magnitude`` for every output that is, or is computed
from, a sum.

Method: first-order running error analysis in absolute values, on the ONNX graph (so that it serves every
frontend and both lowerings). Walking back from an output, each value ``v`` gets a magnitude ``m(v) >= |v|``
that bounds how far the rounding upstream of it can move it, in units of the few ulps one rounding contributes
(the difference of two implementations, each within a few ulps, is within a few ulps too):

* a leaf (a graph input, an initializer, or the output of any node not listed below: an exp, a softmax, a
  quantizer, a cast, ...) is taken to carry only its own rounding: ``m(v) = |v|``;
* a linear sum (ReduceSum/Mean/SumSquare/L1/L2, AveragePool, GlobalAveragePool, CumSum, the domain
  quantizer gradients' min/max sums) is the same node evaluated on the magnitudes of its inputs,
  ``Σ m(t_i)``; ``a + b`` and ``a - b`` give ``m(a) + m(b)``, and an elementwise Sum (TF's AddN: a gradient's
  paths added) ``Σ m(t_i)``, as chains: they count as no level of sums (below), though a Sum is judged as one;
* a product and a multilinear sum (Mul, MatMul, Gemm, Conv, ConvTranspose, Einsum, the domain's depthwise
  convolution and its two backprops) follow the product rule ``d(ab) = a db + b da``: the node evaluated
  once per input whose magnitude exceeds its absolute value, on that magnitude and the absolute values of
  the others, and the evaluations added (Gemm with |alpha| and |beta|; a bias enters once). So inflations add
  along a path instead of multiplying. ``a / b`` gives ``(m(a) + |a/b| m(b)) / |b|``;
* shape-only nodes (Identity, Reshape, Squeeze, Unsqueeze, Flatten, Transpose, Expand, Slice, Gather, Tile,
  Split, Concat, Pad, ...) and selections (Relu, Clip, Neg, Abs, Where, MaxPool, ReduceMax/Min, the masks of
  the quantizers' gradients) carry the magnitude of what they move (of the largest candidate, for a max);
* the domain's batch norm, whose outputs mix sums with per-channel scaling, is evaluated on magnitudes, in
  inference mode where a training-mode evaluation would subtract: ``y`` (training):
  ``(m(x) + mean(m(x))) |gamma| r + |beta| + |xhat| |gamma| mean(|xhat| m(x) r)``, r = rsqrt(var + eps)
  (the last term: the variance's error, through r; inference: ``(m(x) + |mean|) |gamma| r + |beta|``);
  ``offset_backprop``: ``Σ m(dy)``; ``scale_backprop``: ``Σ m(dy) |xhat| + |dy| e`` with ``e = m(x) r``
  where m(x) exceeds |x| (else 0); ``x_backprop``: ``|gamma| r (m(dy) + mean(m(dy)) + (|xhat| + e)
  mean(m(dy) |xhat| + |dy| e))`` in training, ``|gamma| r m(dy)`` in inference.

Two levels of sums. The walk follows at most LEVELS = 2 sums back along each path; the outputs of sums
further up are leaves. One level (the sum's own terms, at their face value) misses a term that is itself a
cancelled sum: on a Conv2D -> BatchNormalization -> ReLU -> Dense training step, the batch norm's beta
gradient (the sum of the dense layer's backprop, which cancels) differs by up to 87 ulps of its one-level
magnitude, 2.3 of its two-level one. An elementwise addition is no level: it adds paths, not the terms of a
layer, and TF's AddN is where the paths through a batch norm's statistics cancel; counted as a level, it cut
the walk short of that cancellation, so that an exactly-zero gradient further up (a Keras 3 batch norm before a
global average pool at batch 1: uniform dy, dx == 0) was judged against a few ulps of its own noise.
Without a limit, worst-case bounds compound through every layer of a deep network (an unlimited version of
these rules passed 1e20 on MobileNetV2's activations) while its actual differences are governed by TF's own
spread (converters.verification); at two levels MobileNetV2's gradients keep a median |value| / magnitude of
0.007 to 0.04, so a 1% error in a gradient still stands out.

Smooth functions (exp, log, softmax, ...) are leaves on purpose: carrying a sum's error through them (times
|f'|) is correct to first order, but every gradient behind a loss then inherits the forward pass's worst-case
bound, an order of magnitude looser than the differences measured with them as leaves.

Terms per element. Each summing node also gives the number of terms one element of it adds, from its shapes (a
reduction: input size over output size; Conv: C/group*kh*kw; MatMul, Gemm: K; ConvTranspose: at most C/group
taps; the batch norm's statistics and gradient sums: N*H*W; the depthwise ops: kh*kw, kh*kw*multiplier,
N*out_h*out_w; Einsum: the contracted dimensions), and a value the largest count on its path back (within the
levels followed): the n of the summation-order bound 2(n+1)u*magnitude (converters.verification.
summation_coefficient). First order, a sum of sums errs by at most the largest n times u times the magnitude,
which already includes the inner sums' terms.

An output is judged as a sum when a sum lies on its path back; the others keep the plain relative
tolerance. The magnitudes come from a companion model (the original graph plus these nodes, their results as
extra outputs) run in ONNX Runtime on the same inputs. The magnitude is computed from the model under test:
a model wrong in its structure computes the magnitude of its own wrong terms, which is what its errors are
then compared with (a wrong term still moves the value by far more than a few ulps of it).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ort_ops.schemas import DOMAIN

ALL = None  # every input is data

# Nodes that move or select values: the same node on the magnitudes of their data inputs (the other inputs,
# such as shapes, axes, indices and conditions, are kept). ALL: every input.
_MOVES = {
    "Identity": (0,), "Reshape": (0,), "Squeeze": (0,), "Unsqueeze": (0,), "Flatten": (0,), "Transpose": (0,),
    "Expand": (0,), "Slice": (0,), "Gather": (0,), "GatherElements": (0,), "GatherND": (0,), "Tile": (0,),
    "Split": (0,), "Concat": ALL, "DepthToSpace": (0,), "SpaceToDepth": (0,), "Pad": (0, 2), "Where": (1, 2),
    "MaxPool": (0,), "ReduceMax": (0,), "ReduceMin": (0,), "LeakyRelu": (0,),
}
_RENAMED = {"ReduceMin": "ReduceMax"}  # the selected element's magnitude is at most the largest one
# Nodes whose output's magnitude is their first input's (|relu(x) - relu(x')| <= |x - x'|, ...).
_ALIASES = {"Relu", "Clip", "Neg", "Abs"}
# Linear sums: the same node on the magnitudes of the data inputs.
_SUMS = {
    "ReduceSum": (0,), "ReduceMean": (0,), "ReduceSumSquare": (0,), "ReduceL1": (0,), "ReduceL2": (0,),
    "AveragePool": (0,), "GlobalAveragePool": (0,), "CumSum": (0,),
}
# Multilinear sums: (factors, linear addends). The product rule, one evaluation per factor with a sum's error.
_MULTILINEAR = {
    "MatMul": ((0, 1), ()), "Gemm": ((0, 1), (2,)), "Conv": ((0, 1), (2,)), "ConvTranspose": ((0, 1), (2,)),
    "Einsum": (ALL, ()),
}
_DOMAIN_MULTILINEAR = {
    "DepthwiseConv2dNative": (0, 1),
    "DepthwiseConv2dNativeBackpropInput": (1, 2),
    "DepthwiseConv2dNativeBackpropFilter": (0, 2),
}
# Domain ops linear in their gradient input: which outputs are sums (the others mask the gradient).
_DOMAIN_LINEAR = {
    "FakeQuantWithMinMaxVarsGradient": (1, 2),
    "FakeQuantWithMinMaxVarsPerChannelGradient": (1, 2),
}
_DOMAIN_MASKS = {"FakeQuantWithMinMaxArgsGradient", "QuantizeAndDequantizeV4Grad"}  # output 0: gradient or 0
_BN_FORWARD = {"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"}
_BN_GRAD = {"FusedBatchNormGrad": "FusedBatchNorm", "FusedBatchNormGradV2": "FusedBatchNormV2",
            "FusedBatchNormGradV3": "FusedBatchNormV3"}
LEVELS = 2  # sums followed back from an output (see the module docstring)
_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


@dataclasses.dataclass
class Companion:
    """The original graph plus magnitude nodes; ``outputs`` maps each summed output to its magnitude output."""

    model: onnx.ModelProto
    outputs: Dict[str, str]
    terms: Dict[str, str] = dataclasses.field(default_factory=dict)  # summed output -> its number of terms


@dataclasses.dataclass(frozen=True)
class _Mag:
    name: str  # the magnitude tensor
    derived: bool  # differs from the value's absolute value (a sum, or a chain with an addition)
    summed: bool  # a sum lies on the path back (within this level)
    terms: str = ""  # a float32 scalar: the most terms one element of a sum on the path back adds ("" for none)


class _Builder:
    def __init__(self, model: onnx.ModelProto):
        self.producer = {}
        for node in model.graph.node:
            for i, out in enumerate(node.output):
                if out:
                    self.producer[out] = (node, i)
        self.nodes: List[onnx.NodeProto] = []
        self.initializers: List[onnx.TensorProto] = []
        self.memo: Dict[Tuple[str, int], _Mag] = {}  # (value, levels of sums still followed back) -> magnitude
        self.abs_memo: Dict[str, str] = {}
        self.count = 0

    # -- building blocks

    def name(self, hint: str) -> str:
        self.count += 1
        return f"verify_magnitude/{self.count}/{hint}"

    def add(self, op_type, inputs, n_outputs=1, domain="", template: Optional[onnx.NodeProto] = None, **attrs) -> list:
        """A new node; with ``template``, a copy of that node (domain and attributes) with new inputs."""
        outputs = [self.name(op_type) for _ in range(n_outputs)]
        if template is not None:
            node = onnx.NodeProto()
            node.CopyFrom(template)
            node.op_type = op_type
            node.name = self.name(template.name or op_type)
            node.input[:] = list(inputs)
            node.output[:] = outputs
            for key, value in attrs.items():
                _set_attr(node, key, value)
        else:
            node = helper.make_node(op_type, list(inputs), outputs, name=self.name(op_type), domain=domain, **attrs)
        self.nodes.append(node)
        return outputs

    def const(self, value: float) -> str:
        name = self.name("const")
        self.initializers.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def abs(self, value: str) -> str:
        if value not in self.abs_memo:
            self.abs_memo[value] = self.add("Abs", [value])[0]
        return self.abs_memo[value]

    def total(self, values: list) -> str:
        return values[0] if len(values) == 1 else self.add("Sum", values)[0]

    def filled_like(self, stats: str, value: float) -> str:
        """A float32 vector shaped like ``stats`` filled with ``value`` (batch norm's statistics are float32)."""
        (shape,) = self.add("Shape", [stats])
        return self.add("Expand", [self.const(value), shape])[0]

    # -- the walk

    def magnitude(self, value: str, levels: int = 2) -> _Mag:
        """The magnitude of ``value``, following at most ``levels`` sums back on each path (the outputs of
        sums further up count as exact: leaves). Iterative, memoized."""
        stack = [(value, levels)]
        while stack:
            key = stack[-1]
            if key in self.memo:
                stack.pop()
                continue
            needed = [k for k in self._needs(*key) if k not in self.memo]
            if needed:
                stack.extend(needed)
                continue
            stack.pop()
            self._build(*key)
        return self.memo[(value, levels)]

    def _rule(self, value):
        """(node, output index, "sum" or "chain", indices of the data inputs); kind None for a leaf."""
        entry = self.producer.get(value)
        if entry is None:
            return None, 0, None, ()
        node, index = entry
        op, kind, data = node.op_type, None, ()
        if node.domain in ("", "ai.onnx"):
            if op in _SUMS:
                kind, data = "sum", _SUMS[op]
            elif op in _MULTILINEAR:
                factors, addends = _MULTILINEAR[op]
                kind, data = "sum", (ALL if factors is ALL else factors + addends)
            elif op in _MOVES:
                kind, data = "chain", _MOVES[op]
            elif op in _ALIASES:
                kind, data = "chain", (0,)
            elif op in ("Add", "Sub", "Mul", "Div"):
                kind, data = "chain", (0, 1)
            elif op == "Sum":  # elementwise, as Add (TF's AddN: a gradient's paths added)
                kind, data = "chain", ALL
            elif op == "Resize":
                # Linear interpolation is a sum of the input's pixels with non-negative weights (TF's ResizeBilinear
                # and ONNX's Resize round it in different orders); nearest only selects one. Cubic has negative
                # weights, for which the same node on magnitudes is no bound: it stays a leaf.
                mode = _attrs(node).get("mode", "nearest")
                if mode == "linear":
                    kind, data = "sum", (0,)
                elif mode == "nearest":
                    kind, data = "chain", (0,)
        elif node.domain == DOMAIN:
            if op in _DOMAIN_MULTILINEAR:
                kind, data = "sum", _DOMAIN_MULTILINEAR[op]
            elif op in _DOMAIN_LINEAR and index in _DOMAIN_LINEAR[op]:
                kind, data = "sum", (0,)
            elif (op in _DOMAIN_LINEAR or op in _DOMAIN_MASKS) and index == 0:
                kind, data = "chain", (0,)
            elif op in _BN_FORWARD and index in (0, 1, 3):
                kind, data = "sum", (0,)
            elif op in _BN_GRAD and index in (0, 1, 2):
                kind, data = "sum", (0, 1)
        if kind is None:
            return node, index, None, ()
        n = len(node.input)
        indices = range(n) if data is ALL else (i for i in data if i < n)
        return node, index, kind, [i for i in indices if node.input[i]]

    def _needs(self, value, levels):
        node, _, kind, data = self._rule(value)
        if kind is None or (kind == "sum" and levels == 0):
            return []
        return [(node.input[i], levels - 1 if kind == "sum" else levels) for i in data]

    def _leaf(self, value, levels):
        self.memo[(value, levels)] = _Mag(self.abs(value), False, False)

    def _build(self, value, levels):
        node, index, kind, data = self._rule(value)
        if kind is None or (kind == "sum" and levels == 0):
            return self._leaf(value, levels)
        inner = levels - 1 if kind == "sum" else levels
        mags = {i: self.memo[(node.input[i], inner)] for i in data}
        if kind == "sum":
            inherited = [m.terms for m in mags.values()]
            terms = [self.largest([own] + inherited) for own in self._terms(node)]
            self._set_sums(node, self._build_sum(node, data, mags), terms, levels)
        else:
            self._build_chain(node, value, levels, mags)
        if (value, levels) not in self.memo:
            self._leaf(value, levels)

    def _build_chain(self, node, value, levels, mags):
        op = node.op_type
        derived = any(m.derived for m in mags.values())
        summed = any(m.summed for m in mags.values())
        terms = self.largest([m.terms for m in mags.values()])
        if op in _ALIASES:
            self.memo[(value, levels)] = mags[0]
            return
        if op in ("Add", "Sub"):
            out, derived = self.add("Add", [mags[0].name, mags[1].name])[0], True
        elif op == "Sum":  # Σ m(t_i), as Add, but a sum of its own: judged as one, its inputs' count its terms
            out = self.total([mags[i].name for i in sorted(mags)])
            terms = self.largest([terms] + self._terms(node))
            derived, summed = derived or len(mags) > 1, True
        elif op == "Mul":
            out = self._multilinear(node, (0, 1), (), mags)[0]
        elif op == "Div":  # (m(a) + |a/b| m(b)) / |b|
            (rel,) = self.add("Mul", [self.abs(value), mags[1].name])
            (num,) = self.add("Add", [mags[0].name, rel])
            out, derived = self.add("Div", [num, self.abs(node.input[1])])[0], True
        else:  # a move or a selection (a quantizer gradient's mask included): the same node on magnitudes
            inputs = [mags[i].name if i in mags else name for i, name in enumerate(node.input)]
            n_outputs = 1 if op == "MaxPool" else len(node.output)  # MaxPool's second output holds indices
            outs = self.add(_RENAMED.get(op, op), inputs, n_outputs, template=node)
            if node.domain == DOMAIN:
                outs = [self.abs(outs[0])]
            for name, mag in zip(node.output, outs):
                if name and (name, levels) not in self.memo:
                    self.memo[(name, levels)] = _Mag(mag, derived, summed, terms)
            return
        self.memo[(value, levels)] = _Mag(out, derived, summed, terms)

    def _multilinear(self, node, factors, addends, mags, **attrs) -> list:
        """The node's outputs to first order: one evaluation per factor whose magnitude is derived, on that
        factor's magnitude and the absolute values of the other factors, added; linear addends in the first
        evaluation only; one evaluation on absolute values when no factor is derived."""
        derived = [i for i in factors if mags[i].derived] or [None]
        evaluations = []
        for k, j in enumerate(derived):
            inputs = list(node.input)
            for i in factors:
                inputs[i] = mags[i].name if i == j else self.abs(node.input[i])
            for i in addends:
                inputs[i] = mags[i].name if k == 0 else ""
            while inputs and inputs[-1] == "":
                inputs.pop()
            evaluations.append(self.add(node.op_type, inputs, len(node.output), template=node, **attrs))
        return [self.total([e[o] for e in evaluations]) for o in range(len(node.output))]

    def _set_sums(self, node, outputs, terms, levels):
        for name, mag, n in zip(node.output, outputs, terms):
            if name and mag and (name, levels) not in self.memo:
                self.memo[(name, levels)] = _Mag(mag, True, True, n)

    # -- the number of terms one element of a sum adds (for the summation-order bound, converters.verification)

    def largest(self, counts: list) -> str:
        counts = sorted({c for c in counts if c})
        if len(counts) <= 1:
            return counts[0] if counts else ""
        return self.add("Max", counts)[0]

    def as_float(self, value: str) -> str:
        return self.add("Cast", [value], to=onnx.TensorProto.FLOAT)[0]

    def size(self, value: str) -> str:
        return self.as_float(self.add("Size", [value])[0])

    def dim(self, value: str, axis: int) -> str:
        (shape,) = self.add("Shape", [value])
        index = self.name("axis")
        self.initializers.append(numpy_helper.from_array(np.asarray(axis, np.int64), index))
        return self.as_float(self.add("Gather", [shape, index], axis=0)[0])

    def ratio(self, numerator: str, *denominators: str) -> str:
        for d in denominators:
            (numerator,) = self.add("Div", [numerator, d])
        return numerator

    def _terms(self, node) -> list:
        """Per output of a summing node, a float32 scalar: the most terms one element of it adds ("" where the
        output is not a sum of many). Upper bounds where elements differ (a strided transposed convolution)."""
        op, inputs, attrs = node.op_type, node.input, _attrs(node)
        outputs = len(node.output)
        if node.domain == DOMAIN:
            channel = 1 if attrs.get("data_format", "NHWC") == "NCHW" else -1
            if op == "DepthwiseConv2dNative":  # kh * kw taps
                return [self.ratio(self.size(inputs[1]), self.dim(inputs[1], 2), self.dim(inputs[1], 3))]
            if op == "DepthwiseConv2dNativeBackpropInput":  # kh * kw * multiplier
                return [self.ratio(self.size(inputs[1]), self.dim(inputs[1], 2))]
            if op == "DepthwiseConv2dNativeBackpropFilter":  # N * out_h * out_w
                return [self.ratio(self.size(inputs[2]), self.dim(inputs[2], channel))]
            if op in _DOMAIN_LINEAR:  # the range gradients: every element of the incoming gradient (per channel)
                return [self.ratio(self.size(inputs[0]), self.size(out)) if i in _DOMAIN_LINEAR[op] and out else ""
                        for i, out in enumerate(node.output)]
            if op in _BN_FORWARD or op in _BN_GRAD:  # the statistics and the gradients' sums: N * H * W
                training = attrs.get("is_training", 1)
                if not training and op in _BN_FORWARD:
                    return [""] * outputs
                x, scale = (inputs[1], inputs[2]) if op in _BN_GRAD else (inputs[0], inputs[1])
                per_channel = self.ratio(self.size(x), self.size(scale))
                return [per_channel if training or i > 0 else "" for i in range(outputs)]
            return [""] * outputs
        if op in ("ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL1", "ReduceL2", "GlobalAveragePool"):
            return [self.ratio(self.size(inputs[0]), self.size(node.output[0]))]
        if op == "Sum":
            return [self.const(float(len([i for i in inputs if i])))]
        if op == "AveragePool":
            return [self.const(float(np.prod(attrs.get("kernel_shape", [1]))))]
        if op == "CumSum":
            (axis,) = self.add("Cast", [inputs[1]], to=onnx.TensorProto.INT64)
            (shape,) = self.add("Shape", [inputs[0]])
            return [self.as_float(self.add("Gather", [shape, axis], axis=0)[0])]
        if op == "MatMul":
            return [self.dim(inputs[0], -1)]
        if op == "Gemm":
            return [self.dim(inputs[0], 0 if attrs.get("transA", 0) else 1)]
        if op == "Conv":  # C / group * kernel taps
            return [self.ratio(self.size(inputs[1]), self.dim(inputs[1], 0))]
        if op == "ConvTranspose":  # at most C / group * kernel taps
            group = self.const(float(attrs.get("group", 1)))
            return [self.ratio(self.size(inputs[1]), self.dim(inputs[1], 1), group)]
        if op == "Einsum":
            return [self._einsum_terms(node, attrs)]
        return [""] * outputs

    def _einsum_terms(self, node, attrs) -> str:
        """The product of the contracted dimensions (with an ellipsis: the size of all inputs over the output's,
        an upper bound)."""
        equation = attrs.get("equation", "").replace(" ", "")
        lhs, _, rhs = equation.partition("->")
        operands = lhs.split(",")
        if "..." in equation or len(operands) != len(node.input):
            total = self.size(node.input[0])
            for other in node.input[1:]:
                (total,) = self.add("Mul", [total, self.size(other)])
            return self.ratio(total, self.size(node.output[0]))
        if "->" not in equation:  # implicit output: the letters that appear once
            letters = "".join(operands)
            rhs = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
        dims = {}
        for name, letters in zip(node.input, operands):
            for axis, c in enumerate(letters):
                if c not in rhs and c not in dims:
                    dims[c] = self.dim(name, axis)
        if not dims:
            return ""
        values = list(dims.values())
        total = values[0]
        for v in values[1:]:
            (total,) = self.add("Mul", [total, v])
        return total

    def _build_sum(self, node, data, mags) -> list:
        """The magnitudes of the node's summed outputs, in output order ("" where not computed)."""
        op = node.op_type
        if node.domain == DOMAIN:
            if op in _DOMAIN_MULTILINEAR:
                return self._multilinear(node, list(data), [], mags)
            if op in _DOMAIN_LINEAR:
                inputs = list(node.input)
                inputs[0] = mags[0].name
                outs = self.add(op, inputs, len(node.output), template=node)
                return [self.abs(o) if i in _DOMAIN_LINEAR[op] else "" for i, o in enumerate(outs)]
            if op in _BN_FORWARD:
                return self._bn_forward(node, mags[0])
            return self._bn_grad(node, mags[0], mags[1])
        if op in _MULTILINEAR:
            factors, addends = _MULTILINEAR[op]
            factors = list(data) if factors is ALL else [i for i in factors if i in mags]
            attrs = {a.name: abs(helper.get_attribute_value(a)) for a in node.attribute if a.name in ("alpha", "beta")}
            return self._multilinear(node, factors, [i for i in addends if i in mags], mags, **attrs)
        inputs = [mags[i].name if i in mags else name for i, name in enumerate(node.input)]
        return self.add(op, inputs, len(node.output), template=node)

    # -- batch norm

    def _bn(self, op, x, scale, offset, mean, variance, epsilon, data_format, training):
        n_outputs = 6 if op == "FusedBatchNormV3" else 5
        return self.add(op, [x, scale, offset, mean, variance], n_outputs, domain=DOMAIN, epsilon=float(epsilon),
                        data_format=data_format, is_training=int(training), exponential_avg_factor=1.0)

    def _per_channel(self, forward, values, scale, eps, fmt, ones, zeros):
        """values * scale per channel: an inference-mode forward run with mean 0 and variance 1 - eps."""
        return self._bn(forward, values, scale, zeros, zeros, self.filled_like(ones, 1.0 - float(eps)), eps, fmt,
                        False)[0]

    def _channel_mean(self, forward, values, eps, fmt, ones, zeros):
        """The mean over all but the channel dim: reserve_space_1 of a training-mode forward run."""
        return self._bn(forward, values, ones, zeros, zeros, ones, eps, fmt, True)[3]

    def _bn_forward(self, node, x_mag: _Mag) -> list:
        attrs = _attrs(node)
        eps, fmt = attrs.get("epsilon", 1e-4), attrs.get("data_format", "NHWC")
        op = node.op_type
        x, scale, offset, mean, variance = node.input[:5]
        if not attrs.get("is_training", 1):
            (neg,) = self.add("Neg", [self.abs(mean)])
            y = self._bn(op, x_mag.name, self.abs(scale), self.abs(offset), neg, variance, eps, fmt, False)
            return [y[0]]
        # mean(m(x)) per channel (reserve_space_1 of a training-mode run on m(x)) and the running mean's.
        stats = self.add(op, [x_mag.name, scale, offset, self.abs(mean), self.abs(variance)], len(node.output),
                         template=node)
        (neg,) = self.add("Neg", [stats[3]])
        # (m(x) + mean(m(x))) |gamma| rsqrt(var + eps) + |beta|, var the biased batch variance (output 4) ...
        y = self._bn(op, x_mag.name, self.abs(scale), self.abs(offset), neg, node.output[4], eps, fmt, False)[0]
        # ... + |xhat| |gamma| mean(|xhat| m(x) rsqrt(var + eps)): the variance's own error, through rsqrt.
        ones, zeros = self.filled_like(scale, 1.0), self.filled_like(scale, 0.0)
        xhat = self.abs(self._bn(op, x, ones, zeros, node.output[3], node.output[4], eps, fmt, False)[0])
        e = self._bn(op, x_mag.name, ones, zeros, zeros, node.output[4], eps, fmt, False)[0]
        (xhat_e,) = self.add("Mul", [xhat, e])
        (scale_v,) = self.add("Mul", [self.abs(scale), self._channel_mean(op, xhat_e, eps, fmt, ones, zeros)])
        (y,) = self.add("Add", [y, self._per_channel(op, xhat, scale_v, eps, fmt, ones, zeros)])
        return [y, self.abs(stats[1]), "", stats[3]]

    def _bn_grad(self, node, dy_mag: _Mag, x_mag: _Mag) -> list:
        attrs = _attrs(node)
        eps, fmt, training = attrs.get("epsilon", 1e-4), attrs.get("data_format", "NHWC"), attrs.get("is_training", 1)
        forward = _BN_GRAD[node.op_type]
        dy, x, scale, rs1, rs2 = node.input[:5]
        ones, zeros = self.filled_like(rs1, 1.0), self.filled_like(rs1, 0.0)
        xhat = self.abs(self._bn(forward, x, ones, zeros, rs1, rs2, eps, fmt, False)[0])
        (dy_xhat,) = self.add("Mul", [dy_mag.name, xhat])
        xhat_mag = xhat
        if x_mag.derived:  # e = m(x) rsqrt(var + eps): x's own error, through the normalization
            e = self._bn(forward, x_mag.name, ones, zeros, zeros, rs2, eps, fmt, False)[0]
            (xhat_mag,) = self.add("Add", [xhat, e])
            (dy_e,) = self.add("Mul", [self.abs(dy), e])
            (dy_xhat,) = self.add("Add", [dy_xhat, dy_e])

        def channel_sum(values):  # Σ over all but the channel dim: the gradient op's offset_backprop
            inputs = list(node.input)
            inputs[0] = values
            return self.add(node.op_type, inputs, len(node.output), template=node)[2]

        grad_in = dy_mag.name
        if training:  # m(dy) + mean(m(dy)) + (|xhat| + e) mean(m(dy) |xhat| + |dy| e)
            terms = self._bn(forward, xhat_mag, self._channel_mean(forward, dy_xhat, eps, fmt, ones, zeros),
                             self._channel_mean(forward, dy_mag.name, eps, fmt, ones, zeros), zeros,
                             self.filled_like(rs1, 1.0 - float(eps)), eps, fmt, False)[0]
            (grad_in,) = self.add("Add", [dy_mag.name, terms])
        inputs = list(node.input)
        inputs[0], inputs[2] = grad_in, self.abs(scale)
        dx = self.add(node.op_type, inputs, len(node.output), template=node, is_training=0)[0]
        return [self.abs(dx), self.abs(channel_sum(dy_xhat)), self.abs(channel_sum(dy_mag.name))]


def _attrs(node) -> dict:
    out = {}
    for a in node.attribute:
        value = helper.get_attribute_value(a)
        out[a.name] = value.decode() if isinstance(value, bytes) else value
    return out


def _set_attr(node, key, value):
    for a in list(node.attribute):
        if a.name == key:
            node.attribute.remove(a)
    node.attribute.append(helper.make_attribute(key, value))


def companion(model: onnx.ModelProto, outputs=None, levels: int = None, additions: bool = False) -> Companion:
    """The model plus a magnitude output for each of ``outputs`` (default: all float outputs) that has a sum
    upstream (see the module docstring); ``Companion.outputs`` names them. ``additions=True``: also for those
    with an addition or subtraction upstream (per-node verification, whose inputs come from TF: a node that adds
    terms of opposite sign, as a batch norm written in standard ops does, is a sum of its own)."""
    floats = {o.name: o.type.tensor_type.elem_type for o in model.graph.output
              if o.type.tensor_type.elem_type in _FLOAT_TYPES}
    builder = _Builder(model)
    found = {}
    for name in (outputs if outputs is not None else list(floats)):
        if name in floats:
            mag = builder.magnitude(name, LEVELS if levels is None else levels)
            if mag.summed or (additions and mag.derived):
                found[name] = mag
    result = onnx.ModelProto()
    result.CopyFrom(model)
    result.graph.node.extend(builder.nodes)
    result.graph.initializer.extend(builder.initializers)
    named, terms = {}, {}
    for name, mag in found.items():
        out = f"verify_magnitude/of/{name}"
        result.graph.node.append(helper.make_node("Identity", [mag.name], [out], name=f"verify_magnitude/out/{name}"))
        result.graph.output.append(helper.make_tensor_value_info(out, floats[name], None))
        named[name] = out
        if mag.terms:
            count = f"verify_magnitude/terms/{name}"
            result.graph.node.append(helper.make_node("Identity", [mag.terms], [count],
                                                      name=f"verify_magnitude/terms_out/{name}"))
            result.graph.output.append(helper.make_tensor_value_info(count, onnx.TensorProto.FLOAT, None))
            terms[name] = count
    return Companion(result, named, terms)
