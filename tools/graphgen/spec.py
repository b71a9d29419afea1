"""A generated graph as data, and the shape rules that keep it valid.

A ``GraphSpec`` is plain JSON: the family it is written in, the input (batch, H, W, C), and either a chain of
Keras layers (``layers``: each a dict with ``op`` and its arguments; a ``residual`` or ``concat`` layer holds its
branches) or a chain of raw TF ops (``raw``, the ``raw`` family). The same spec always builds the same graph, so a
campaign's results can be replayed and a failure minimized by editing the spec (drop a layer, shrink a shape).

This module imports neither TensorFlow nor Keras.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
from typing import List, Optional, Tuple

# The families a graph is written in.
TFMOT = "tfmot"  # tf_keras under tfmot's quantize_model (default 8-bit scheme)
TFMOT_4BIT = "tfmot_4bit"  # tf_keras, tfmot with a user QuantizeConfig: 4-bit per-tensor kernels on Conv2D/Dense
TFMOT_PARTIAL = "tfmot_partial"  # tf_keras, tfmot's quantize_annotate_layer on part of the model
TF_KERAS = "tf_keras"  # float tf_keras
KERAS3 = "keras3"  # float Keras 3
KERAS3_FAKE_QUANT = "keras3_fq"  # Keras 3 with keras.quantizers fake-quant layers (activations and kernels)
KERAS3_QUANTIZE = "keras3_quantize"  # Keras 3's model.quantize("int8" | "int4" | "float8")
RAW = "raw"  # a tf.function calling the family's ops directly, with their attributes
FAMILIES = (TFMOT, TFMOT_4BIT, TFMOT_PARTIAL, TF_KERAS, KERAS3, KERAS3_FAKE_QUANT, KERAS3_QUANTIZE, RAW)
TF_KERAS_FAMILIES = (TFMOT, TFMOT_4BIT, TFMOT_PARTIAL, TF_KERAS)
QAT_FAMILIES = (TFMOT, TFMOT_4BIT, TFMOT_PARTIAL, KERAS3_FAKE_QUANT)

# The signatures of every graph's SavedModel (models.graphs.ClassifierGraphs; the raw family's module has the same).
INFERENCE, TRAIN_STEP, SALIENCY = "serving_default", "train_step", "saliency"
KINDS = (INFERENCE, TRAIN_STEP, SALIENCY)

CLASSES = 4  # the verifier's random labels are 0..3 (converters.verification.random_inputs)


class InvalidGraph(ValueError):
    """The spec asks for a layer its input cannot take (a kernel larger than the padded input, ...)."""


@dataclasses.dataclass
class GraphSpec:
    seed: int
    index: int
    family: str
    batch: int  # the training step's batch (inference runs with the verifier's batch)
    input: Tuple[int, int, int]  # H, W, C
    layers: list = dataclasses.field(default_factory=list)
    head: str = "flatten"  # "flatten" or "gap", then Dense(CLASSES)
    raw: list = dataclasses.field(default_factory=list)  # the raw family's op chain
    quantize_mode: Optional[str] = None  # keras3_quantize: "int8", "int4" or "float8"
    optimizer: Optional[str] = None  # None (the step returns loss and gradients), "sgd" or "adam"
    train_steps: int = 3

    @property
    def name(self) -> str:
        return f"s{self.seed}-g{self.index:05d}"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "GraphSpec":
        data = dict(data)
        data["input"] = tuple(data["input"])
        return cls(**data)

    def copy(self) -> "GraphSpec":
        return GraphSpec.from_json(copy.deepcopy(self.to_json()))

    def describe(self) -> str:
        h, w, c = self.input
        body = self.raw if self.family == RAW else self.layers
        return f"{self.family} {self.batch}x{h}x{w}x{c}: " + " -> ".join(layer_text(op) for op in body)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)


def layer_text(op: dict) -> str:
    args = ",".join(f"{k}={v}" for k, v in sorted(op.items()) if k not in ("op", "branch", "branches"))
    inner = ""
    if "branch" in op:
        inner = "[" + " -> ".join(layer_text(o) for o in op["branch"]) + "]"
    if "branches" in op:
        inner = "[" + " | ".join(" -> ".join(layer_text(o) for o in b) for b in op["branches"]) + "]"
    return f"{op['op']}({args}){inner}"


# ----------------------------------------------------------------------------------------------------------------
# Shape rules (NHWC). Each returns the output (H, W, C) or raises InvalidGraph.

def _conv_size(n: int, kernel: int, stride: int, dilation: int, padding: str) -> int:
    effective = (kernel - 1) * dilation + 1
    if padding == "same":
        return math.ceil(n / stride)
    if n < effective:
        raise InvalidGraph(f"a {kernel}x{kernel} kernel with dilation {dilation} over {n} valid pixels")
    return (n - effective) // stride + 1


def layer_shape(op: dict, shape: Tuple[int, int, int]) -> Tuple[int, int, int]:
    h, w, c = shape
    kind = op["op"]
    if kind in ("conv", "dwconv", "sepconv"):
        k, s, d, p = op["kernel"], op.get("strides", 1), op.get("dilation", 1), op["padding"]
        if s > 1 and d > 1:
            raise InvalidGraph("Keras takes strides > 1 or dilation > 1, not both")
        oh, ow = _conv_size(h, k, s, d, p), _conv_size(w, k, s, d, p)
        if kind == "conv":
            groups = op.get("groups", 1)
            if c % groups or op["filters"] % groups:
                raise InvalidGraph(f"groups {groups} do not divide {c} input or {op['filters']} output channels")
            return oh, ow, op["filters"]
        if kind == "dwconv":
            return oh, ow, c * op["multiplier"]
        return oh, ow, op["filters"]
    if kind == "pool":
        k, s, p = op["size"], op["strides"], op["padding"]
        return _conv_size(h, k, s, 1, p), _conv_size(w, k, s, 1, p), c
    if kind == "zeropad":
        (t, b), (left, right) = op["pad"]
        return h + t + b, w + left + right, c
    if kind == "upsample":
        return h * op["factor"], w * op["factor"], c
    if kind in ("bn", "act", "fq"):
        return h, w, c
    if kind == "residual":
        out = chain_shapes(op["branch"], shape)[-1]
        if out != shape:
            raise InvalidGraph(f"a residual branch gives {out}, its input is {shape}")
        return shape
    if kind == "concat":
        outs = [chain_shapes(b, shape)[-1] for b in op["branches"]]
        if len({o[:2] for o in outs}) != 1:
            raise InvalidGraph(f"concatenated branches of spatial sizes {[o[:2] for o in outs]}")
        return outs[0][0], outs[0][1], sum(o[2] for o in outs)
    raise InvalidGraph(f"unknown layer {kind!r}")


def chain_shapes(layers: List[dict], shape) -> list:
    shapes = [tuple(shape)]
    for op in layers:
        shapes.append(layer_shape(op, shapes[-1]))
    return shapes


def check(spec: GraphSpec) -> None:
    """Raises InvalidGraph unless every layer of ``spec`` is valid for its input."""
    if spec.family not in FAMILIES:
        raise InvalidGraph(f"unknown family {spec.family!r}")
    if min(spec.input) < 1 or spec.batch < 1:
        raise InvalidGraph(f"input {spec.batch}x{spec.input}")
    if spec.family == RAW:
        from tools.graphgen.raw_ops import raw_chain_check

        raw_chain_check(spec)
        return
    chain_shapes(spec.layers, spec.input)


# ----------------------------------------------------------------------------------------------------------------
# What a graph reaches: the family's TF ops with the attribute values the coverage table counts.

def op_features(node_op: str, attrs: dict) -> List[str]:
    """``OpType`` and ``OpType attr=value`` entries for one TF node of the family (attrs: name -> Python value)."""
    out = [node_op]
    for key in COVERED_ATTRS.get(node_op, ()):
        if key in attrs:
            out.append(f"{node_op} {key}={attrs[key]}")
    return out


_FQ = ("num_bits", "narrow_range")
_QDQ = ("signed_input", "range_given", "narrow_range", "round_mode", "axis")
_BN = ("is_training", "data_format", "exponential_avg_factor_set")
_BN_GRAD = ("is_training", "data_format")
_DW = ("strides", "dilations", "padding", "data_format", "multiplier")
COVERED_ATTRS = {
    "FakeQuantWithMinMaxArgs": _FQ, "FakeQuantWithMinMaxArgsGradient": _FQ,
    "FakeQuantWithMinMaxVars": _FQ, "FakeQuantWithMinMaxVarsGradient": _FQ,
    "FakeQuantWithMinMaxVarsPerChannel": _FQ, "FakeQuantWithMinMaxVarsPerChannelGradient": _FQ,
    # (V3 has no round_mode: it always rounds half to even; its num_bits is an input)
    "QuantizeAndDequantizeV2": _QDQ + ("num_bits",),
    "QuantizeAndDequantizeV3": tuple(a for a in _QDQ if a != "round_mode"),
    "QuantizeAndDequantizeV4": _QDQ + ("num_bits",), "QuantizeAndDequantizeV4Grad": ("axis",),
    "FusedBatchNorm": _BN, "FusedBatchNormV2": _BN, "FusedBatchNormV3": _BN,
    "FusedBatchNormGrad": _BN_GRAD, "FusedBatchNormGradV2": _BN_GRAD, "FusedBatchNormGradV3": _BN_GRAD,
    "DepthwiseConv2dNative": _DW, "DepthwiseConv2dNativeBackpropInput": _DW,
    "DepthwiseConv2dNativeBackpropFilter": _DW,
}
FAMILY_OPS = tuple(COVERED_ATTRS)
