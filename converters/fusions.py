"""Graph fusions around the domain's nodes, as tf2onnx optimizers (they run in its optimizer loop).

* ``PadIntoDepthwise`` (always on, exact): a zero Pad of the spatial dims feeding a depthwise
  convolution with VALID or EXPLICIT padding becomes the convolution's explicit padding, as Keras'
  ZeroPadding2D + DepthwiseConv2D(padding="valid") in MobileNetV2's stride-2 blocks. The depthwise
  kernels add the taps inside the input in order and skip the padding's; the padded tensor made them
  add w * 0 = +-0 there instead, which changes no sum (a sum is never -0: it starts at +0), unless w is
  an infinity or a NaN (w * 0 = NaN). So the fusion needs a constant, finite filter.
* ``BatchNormClipFakeQuant`` (always on, exact): an inference-mode FusedBatchNorm whose y only a
  ``Clip`` (tf2onnx's Relu6) or ``Relu`` and then a FakeQuantWithMinMaxVars or Args with a constant
  range read (tfmot's Conv -> BatchNorm -> ReLU6 -> quantizer), or only the quantizer, becomes one
  ``FusedBatchNormClipFakeQuant`` node: one pass over the tensor instead of three (or two). The fused
  kernel computes the three ops' float32 operations in their order, so the model's bits do not move.
  The clip's bounds must be constants that its kernel compares as ONNX Runtime's Clip does: not NaN,
  in order, and not subnormal (the fused kernel compares under TF's denormals-are-zero mode).
* ``MergeClips`` (always on, exact): a ``Clip`` whose input is another ``Clip`` that nothing else reads,
  both with constant float32 bounds, becomes one ``Clip`` (tf2onnx's Relu6 before the standard lowering's
  quantizer clamp, when the quantizer's range reaches below 0 or above 6 so that the ReLU cannot be
  dropped, converters.redundant_clamps). ONNX Runtime's Clip only compares and selects (``v < lo ? lo : v``,
  then ``hi < v ? hi : v``): a NaN passes, a value equal to a bound is kept. Two such clips with ordered,
  overlapping bounds [a, b] then [c, d] select exactly what one clip with lo = (a < c ? c : a) and
  hi = (d < b ? d : b) selects, the sign of a zero included (``merged_clip_bounds``); disjoint bounds make
  the pair a constant and stay as they are. No bound may be NaN or subnormal (``_clip_bounds``).
* ``FoldBatchNorm`` (``fold_batch_norm=True``, off by default): an inference-mode FusedBatchNorm node
  with constant statistics after a Conv or a depthwise node with a constant filter is folded into that
  filter (w * k per output channel, k = scale / sqrt(variance + epsilon)) and a bias
  ((bias - mean) * k + offset), as ONNX Runtime's and tf2onnx's own fusions do for BatchNormalization.
  Not exact: (x * w) * k and x * (w * k) round differently, so outputs move by a few ulps and,
  rarely, a quantized value downstream moves by a grid step. docs/layout.md has the measurements.
"""
from __future__ import annotations

import numpy as np

import ort_ops
from converters.family import tf_attributes
from ort_ops.checks.depthwise import spatial_axes
from ort_ops.schemas import DOMAIN

DEPTHWISE = "DepthwiseConv2dNative"
BATCH_NORMS = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
BATCH_NORM_CLIP_FAKE_QUANT = "FusedBatchNormClipFakeQuant"
FUSED_QUANTIZERS = ("FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxArgs")


def _str_attr(node, name, default):
    value = node.get_attr_value(name, default)
    return value.decode() if isinstance(value, bytes) else value


def constant_value(node):
    """The value of ``node``'s output as a NumPy array if it is a constant, seen through Identity nodes
    (a TF graph right after parsing still has them); else None."""
    while node is not None and node.type == "Identity":
        node = node.inputs[0]
    if node is None or not node.is_const():
        return None
    return np.asarray(node.get_tensor_value(as_list=False))


def only_consumer(g, output: str, node) -> bool:
    """Whether ``node`` is the one reader of tensor ``output`` of tf2onnx graph ``g`` (and it is no graph output)."""
    return output not in g.outputs and [c.name for c in g.find_output_consumers(output)] == [node.name]


def _attrs(node) -> dict:
    """A domain node's attributes read through its spec (TF's defaults filled in)."""
    return tf_attributes(node, ort_ops.get_spec(node.type))


def _optimizer_base():
    from tf2onnx.optimizer.optimizer_base import GraphOptimizerBase

    return GraphOptimizerBase


class _Fusion:
    """A tf2onnx optimizer made of one rewrite tried at every node until none applies."""

    def _optimize(self, graph):
        return self._apply_optimization(graph, self._run)

    def _run(self, g):
        changed = True
        while changed:
            changed = False
            for node in list(g.get_nodes()):
                if g.get_node_by_name(node.name) is not None and self.rewrite(g, node):
                    self.graph_been_opt = True
                    changed = True
        return g


def pad_into_depthwise_class():
    class PadIntoDepthwise(_Fusion, _optimizer_base()):
        def rewrite(self, g, node) -> bool:
            if node.type != DEPTHWISE or node.domain != DOMAIN:
                return False
            pad = node.inputs[0]
            if pad is None or pad.type != "Pad" or not only_consumer(g, pad.output[0], node):
                return False
            attrs = _attrs(node)
            padding = attrs["padding"]
            mode = _str_attr(pad, "mode", "constant")
            if padding not in ("VALID", "EXPLICIT") or mode != "constant" or len(pad.input) < 2:
                return False
            filt = constant_value(node.inputs[1])
            pads = constant_value(pad.inputs[1])
            value = constant_value(pad.inputs[2]) if len(pad.input) > 2 and pad.input[2] else np.zeros(1)
            if len(pad.input) > 3 or filt is None or pads is None or value is None:
                return False
            if not np.all(np.isfinite(filt)) or np.any(value != 0) or pads.shape != (8,) or np.any(pads < 0):
                return False
            begin, end = pads[:4], pads[4:]
            rows, cols, _ = spatial_axes(attrs["data_format"])
            if any(begin[a] or end[a] for a in range(4) if a not in (rows, cols)):
                return False  # padding the batch or the channels changes the output's shape
            explicit = attrs["explicit_paddings"] or [0] * 8
            for a in (rows, cols):
                explicit[2 * a] += int(begin[a])
                explicit[2 * a + 1] += int(end[a])
            g.replace_input(node, node.input[0], pad.input[0], 0)
            node.set_attr("padding", "EXPLICIT")
            node.set_attr("explicit_paddings", explicit)
            if not g.find_output_consumers(pad.output[0]):
                g.remove_node(pad.name)
            return True

    return PadIntoDepthwise


def fold_batch_norm_class():
    class FoldBatchNorm(_Fusion, _optimizer_base()):
        def rewrite(self, g, node) -> bool:
            if node.type not in BATCH_NORMS or node.domain != DOMAIN:
                return False
            attrs = _attrs(node)
            if attrs["is_training"]:
                return False
            if node.output[0] in g.outputs or any(g.find_output_consumers(o) or o in g.outputs for o in node.output[1:]):
                return False  # only y may be used, by nodes
            producer = node.inputs[0]
            if producer is None or not only_consumer(g, node.input[0], node):
                return False
            params = [constant_value(n) for n in node.inputs[1:5]]
            if any(p is None for p in params) or g.get_dtype(node.input[0]) != 1:  # float32 only
                return False
            scale, offset, mean, var = (np.asarray(p, np.float32) for p in params)
            eps = np.float32(attrs["epsilon"])
            k = (np.float32(1) / np.sqrt(var + eps)) * scale
            fmt = attrs["data_format"]
            if producer.type == "Conv" and producer.domain in ("", "ai.onnx") and fmt == "NCHW":
                return self._into_conv(g, node, producer, k, offset, mean)
            if producer.type == DEPTHWISE and producer.domain == DOMAIN and _attrs(producer)["data_format"] == fmt:
                return self._into_depthwise(g, node, producer, k, offset, mean, fmt)
            return False

        def _into_conv(self, g, bn, conv, k, offset, mean):
            w = constant_value(conv.inputs[1])
            bias = constant_value(conv.inputs[2]) if len(conv.input) > 2 and conv.input[2] else np.zeros(w.shape[0], np.float32)
            if w is None or bias is None or w.dtype != np.float32 or w.shape[0] != k.shape[0]:
                return False
            new_w = g.make_const(conv.name + "__bn_folded_w", (w * k.reshape([-1] + [1] * (w.ndim - 1))).astype(np.float32))
            new_b = g.make_const(conv.name + "__bn_folded_b", ((bias - mean) * k + offset).astype(np.float32))
            self._replace(g, conv, [conv.input[0], new_w.output[0], new_b.output[0]], bn)
            return True

        def _into_depthwise(self, g, bn, dw, k, offset, mean, fmt):
            f = constant_value(dw.inputs[1])
            if f is None or f.dtype != np.float32 or f.shape[2] * f.shape[3] != k.shape[0]:
                return False
            new_f = g.make_const(dw.name + "__bn_folded_filter", (f * k.reshape(f.shape[2], f.shape[3])).astype(np.float32))
            bias = ((np.float32(0) - mean) * k + offset).astype(np.float32)
            bias = g.make_const(dw.name + "__bn_folded_b", bias.reshape([-1, 1, 1]) if fmt == "NCHW" else bias)
            y, shape, dtype = bn.output[0], g.get_shape(bn.output[0]), g.get_dtype(bn.output[0])
            scaled = self._replace(g, dw, [dw.input[0], new_f.output[0], *dw.input[2:]], None)
            g.remove_node(bn.name)  # before its y gets a new producer
            g.make_node("Add", [scaled, bias.output[0]], outputs=[y], shapes=[shape], dtypes=[dtype])
            return True

        @staticmethod
        def _replace(g, node, inputs, bn):
            """A copy of ``node`` (a convolution) reading ``inputs``, in its place; it writes bn's y and bn goes
            (``bn`` given), or a fresh name (returned). Never the old output's name: that name is the TF
            tensor of the unfolded convolution, which per-node verification compares it with."""
            from tf2onnx import utils

            attrs = {a: node.get_attr_value(a) for a in node.attr}
            name, op_type, domain = node.name, node.type, node.domain
            if bn is not None:
                outputs, shapes, dtypes = [bn.output[0]], [g.get_shape(bn.output[0])], [g.get_dtype(bn.output[0])]
                g.remove_node(bn.name)
            else:
                outputs = [utils.make_name(name + "__bn_folded")]
                shapes, dtypes = [g.get_shape(node.output[0])], [g.get_dtype(node.output[0])]
            g.remove_node(name)
            g.make_node(op_type, inputs, attr=attrs, outputs=outputs, name=name, shapes=shapes, dtypes=dtypes,
                        domain=domain)
            return outputs[0]

    return FoldBatchNorm


def _clip_bounds(g, clip):
    """The constant (lo, hi) of a ``Clip`` or ``Relu`` node that the fused kernel compares exactly as ONNX
    Runtime does, or None. Clip: Eigen's cwiseMax(lo).cwiseMin(hi); Relu: cwiseMax(0), i.e. Clip(0, inf)."""
    if clip.domain not in ("", "ai.onnx") or g.get_dtype(clip.input[0]) != 1:
        return None
    if clip.type == "Relu":
        return 0.0, float("inf")
    if clip.type != "Clip":
        return None
    if len(clip.input) > 1:  # opset 11: optional inputs
        bounds = []
        for i, default in ((1, -np.inf), (2, np.inf)):
            if len(clip.input) > i and clip.input[i]:
                value = constant_value(clip.inputs[i])
                if value is None or np.size(value) != 1:
                    return None
                bounds.append(np.float32(np.asarray(value).reshape(())))
            else:
                bounds.append(np.float32(default))
    else:  # opset 6: attributes
        bounds = [np.float32(clip.get_attr_value("min", -3.4028234663852886e38)),
                  np.float32(clip.get_attr_value("max", 3.4028234663852886e38))]
    lo, hi = bounds
    tiny = np.finfo(np.float32).tiny
    if np.isnan(lo) or np.isnan(hi) or not lo <= hi or any(0 < abs(b) < tiny for b in bounds):
        return None
    return float(lo), float(hi)


def batch_norm_clip_fake_quant_class():
    class BatchNormClipFakeQuant(_Fusion, _optimizer_base()):
        def rewrite(self, g, node) -> bool:
            if node.type not in FUSED_QUANTIZERS or node.domain != DOMAIN:
                return False
            fq_attrs = _attrs(node)
            if node.type == "FakeQuantWithMinMaxArgs":
                rng = (np.float32(fq_attrs["min"]), np.float32(fq_attrs["max"]))
            else:
                rng = (constant_value(node.inputs[1]), constant_value(node.inputs[2]))
            if any(r is None or np.shape(r) != () for r in rng):
                return False  # a range computed in the graph keeps its own node (and its own error messages)
            clip, bounds = None, (-np.inf, np.inf)
            producer = node.inputs[0]
            if producer is not None and producer.type in ("Clip", "Relu"):
                bounds = _clip_bounds(g, producer)
                if bounds is None or not only_consumer(g, producer.output[0], node):
                    return False
                clip, producer = producer, producer.inputs[0]
            bn = producer
            if bn is None or bn.type not in BATCH_NORMS or bn.domain != DOMAIN:
                return False
            bn_attrs = _attrs(bn)
            if bn_attrs["is_training"] or g.get_dtype(bn.input[0]) != 1:
                return False  # float32 x only: the quantizers are float32 ops
            if any(g.find_output_consumers(o) or o in g.outputs for o in bn.output[1:]):
                return False
            if not only_consumer(g, bn.output[0], clip if clip is not None else node):
                return False
            attrs = {
                "epsilon": bn_attrs["epsilon"],
                "data_format": bn_attrs["data_format"],
                "clip_min": bounds[0],
                "clip_max": bounds[1],
                "fake_quant": node.type,
                "num_bits": fq_attrs["num_bits"],
                "narrow_range": int(fq_attrs["narrow_range"]),
            }
            spec = ort_ops.get_spec(BATCH_NORM_CLIP_FAKE_QUANT)
            try:  # the quantizer's range rules (Args: min < max) hold, or the chain keeps its own nodes
                x_shape = g.get_shape(bn.input[0])
                x_shape = None if x_shape is None else tuple(d if d >= 0 else None for d in x_shape)
                spec.validate([x_shape] + [None] * 4 + [(), ()],
                              [None] * 5 + [np.float32(r) for r in rng], None, spec.with_defaults(attrs))
            except ort_ops.OpError:
                return False
            if node.type == "FakeQuantWithMinMaxArgs":
                range_inputs = [g.make_const(node.name + "__min", np.array(rng[0], np.float32)).output[0],
                                g.make_const(node.name + "__max", np.array(rng[1], np.float32)).output[0]]
            else:
                range_inputs = [node.input[1], node.input[2]]
            inputs = list(bn.input[:5]) + range_inputs
            output, shape, dtype = node.output[0], g.get_shape(node.output[0]), g.get_dtype(node.output[0])
            for gone in (node, clip, bn):
                if gone is not None:
                    g.remove_node(gone.name)
            g.make_node(BATCH_NORM_CLIP_FAKE_QUANT, inputs, attr=attrs, outputs=[output], shapes=[shape],
                        dtypes=[dtype], domain=DOMAIN, name=node.name)
            return True

    return BatchNormClipFakeQuant


def merged_clip_bounds(inner, outer):
    """The bounds of one Clip that selects what Clip(Clip(v, *inner), *outer) selects, for every v, or None
    where the two ranges do not overlap. On ties (equal values, e.g. +0 and -0) the inner bound is the
    one the pair returns: the outer clip keeps a value equal to its bound."""
    (a, b), (c, d) = inner, outer
    lo = c if a < c else a
    hi = d if d < b else b
    return (lo, hi) if lo <= hi else None


def merge_clips_class():
    class MergeClips(_Fusion, _optimizer_base()):
        def rewrite(self, g, node) -> bool:
            if node.type != "Clip" or node.domain not in ("", "ai.onnx") or g.opset < 11:
                return False
            inner = node.inputs[0]
            if inner is None or inner.type != "Clip" or inner.domain not in ("", "ai.onnx"):
                return False
            inner_bounds, outer_bounds = _clip_bounds(g, inner), _clip_bounds(g, node)
            if inner_bounds is None or outer_bounds is None or not only_consumer(g, inner.output[0], node):
                return False
            bounds = merged_clip_bounds(inner_bounds, outer_bounds)
            if bounds is None:
                return False
            lo, hi = (g.make_const(f"{node.name}__{side}", np.array(v, np.float32)).output[0]
                      for side, v in zip(("min", "max"), bounds))
            output, shape, dtype = node.output[0], g.get_shape(node.output[0]), g.get_dtype(node.output[0])
            source = inner.input[0]
            g.remove_node(node.name)
            g.remove_node(inner.name)
            g.make_node("Clip", [source, lo, hi], outputs=[output], shapes=[shape], dtypes=[dtype], name=node.name)
            return True

    return MergeClips
