"""Graph fusions around the domain's nodes, as tf2onnx optimizers (they run in its optimizer loop).

* ``PadIntoDepthwise`` (always on, exact): a zero Pad of the spatial dims feeding a depthwise
  convolution with VALID or EXPLICIT padding becomes the convolution's explicit padding, as Keras'
  ZeroPadding2D + DepthwiseConv2D(padding="valid") in MobileNetV2's stride-2 blocks. The depthwise
  kernels add the taps inside the input in order and skip the padding's; the padded tensor made them
  add w * 0 = +-0 there instead, which changes no sum (a sum is never -0: it starts at +0), unless w is
  an infinity or a NaN (w * 0 = NaN). So the fusion needs a constant, finite filter.
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


def _str_attr(node, name, default):
    value = node.get_attr_value(name, default)
    return value.decode() if isinstance(value, bytes) else value


def _const(node):
    return None if node is None or not node.is_const() else node.get_tensor_value(as_list=False)


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
            filt = _const(node.inputs[1])
            pads = _const(pad.inputs[1])
            value = _const(pad.inputs[2]) if len(pad.input) > 2 and pad.input[2] else np.zeros(1)
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
            params = [_const(n) for n in node.inputs[1:5]]
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
            w = _const(conv.inputs[1])
            bias = _const(conv.inputs[2]) if len(conv.input) > 2 and conv.input[2] else np.zeros(w.shape[0], np.float32)
            if w is None or bias is None or w.dtype != np.float32 or w.shape[0] != k.shape[0]:
                return False
            new_w = g.make_const(conv.name + "__bn_folded_w", (w * k.reshape([-1] + [1] * (w.ndim - 1))).astype(np.float32))
            new_b = g.make_const(conv.name + "__bn_folded_b", ((bias - mean) * k + offset).astype(np.float32))
            g.replace_inputs(conv, [conv.input[0], new_w.output[0], new_b.output[0]])
            self._bypass(g, bn, conv.output[0])
            return True

        def _into_depthwise(self, g, bn, dw, k, offset, mean, fmt):
            f = _const(dw.inputs[1])
            if f is None or f.dtype != np.float32 or f.shape[2] * f.shape[3] != k.shape[0]:
                return False
            new_f = g.make_const(dw.name + "__bn_folded_filter", (f * k.reshape(f.shape[2], f.shape[3])).astype(np.float32))
            g.replace_input(dw, dw.input[1], new_f.output[0], 1)
            bias = ((np.float32(0) - mean) * k + offset).astype(np.float32)
            bias = g.make_const(dw.name + "__bn_folded_b", bias.reshape([-1, 1, 1]) if fmt == "NCHW" else bias)
            add = g.make_node("Add", [dw.output[0], bias.output[0]], shapes=[g.get_shape(bn.output[0])],
                              dtypes=[g.get_dtype(bn.output[0])])
            self._bypass(g, bn, add.output[0])
            return True

        @staticmethod
        def _bypass(g, bn, source):
            """Consumers of bn's y read ``source``; bn goes."""
            g.replace_all_inputs(bn.output[0], source)
            g.remove_node(bn.name)

    return FoldBatchNorm
