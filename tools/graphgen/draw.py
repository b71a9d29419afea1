"""The seeded generator: ``draw_graph(seed, index)`` is the same valid GraphSpec on every machine.

Graphs are small on purpose (inputs from 1x1 to 12x12, 1-4 channels, a handful of layers): a campaign's worth is in
how many different graphs it tries, and the bugs found so far all reproduce with one or two layers. Each layer is
drawn among those valid for the shape it receives (``spec.layer_shape``), so every spec builds.
"""
from __future__ import annotations

import random

from tools.graphgen import raw_ops
from tools.graphgen.spec import (
    FAMILIES, KERAS3, KERAS3_FAKE_QUANT, KERAS3_QUANTIZE, RAW, TF_KERAS, TFMOT, TFMOT_4BIT, TFMOT_PARTIAL, GraphSpec,
    InvalidGraph, check, layer_shape,
)

FAMILY_WEIGHTS = {TFMOT: 24, TFMOT_4BIT: 6, TFMOT_PARTIAL: 8, TF_KERAS: 12, KERAS3: 12, KERAS3_FAKE_QUANT: 14,
                  KERAS3_QUANTIZE: 6, RAW: 24}
assert set(FAMILY_WEIGHTS) == set(FAMILIES)
SIZES = (1, 1, 2, 3, 4, 5, 6, 6, 7, 8, 8, 9, 10, 12)
ACTIVATIONS = ("relu", "relu6", "sigmoid", "tanh", "leaky_relu", "elu", "swish", "hard_sigmoid", "softmax")
# tfmot's default 8-bit registry quantizes these Activation / ReLU layers (others make quantize_model refuse).
TFMOT_ACTIVATIONS = ("relu", "relu6", "sigmoid", "tanh", "softmax", "swish")
MAX_ELEMENTS = 12 * 12 * 16  # per image, at any layer: keeps every run to seconds


def draw_graph(seed: int, index: int) -> GraphSpec:
    rng = random.Random(f"graphgen-{seed}-{index}")
    family = rng.choices(list(FAMILY_WEIGHTS), weights=list(FAMILY_WEIGHTS.values()))[0]
    for _ in range(50):
        spec = _draw(rng, seed, index, family)
        try:
            check(spec)
            return spec
        except InvalidGraph:
            continue
    raise RuntimeError(f"no valid graph drawn for seed {seed} index {index} ({family})")


def _draw(rng: random.Random, seed: int, index: int, family: str) -> GraphSpec:
    h = rng.choice(SIZES)
    w = h if rng.random() < 0.6 else rng.choice(SIZES)
    c = rng.randint(1, 4)
    spec = GraphSpec(seed=seed, index=index, family=family, batch=rng.choice((1, 1, 2, 3, 4)), input=(h, w, c),
                     head=rng.choice(("flatten", "gap")), optimizer=rng.choice((None, None, "sgd", "adam")),
                     train_steps=rng.randint(2, 5))
    if family == RAW:
        spec.raw = _draw_raw(rng, (h, w, c))
        return spec
    if family == KERAS3_QUANTIZE:
        spec.quantize_mode = rng.choice(("int8", "int8", "int4", "float8"))
    spec.layers = _draw_chain(rng, family, (h, w, c), rng.randint(1, 6), depth=0)
    return spec


# ----------------------------------------------------------------------------------------------------------------
# Keras layers.

def _layer_choices(family: str, depth: int):
    kinds = ["conv", "conv", "dwconv", "dwconv", "bn", "act", "act", "pool", "zeropad", "sepconv", "upsample"]
    if depth == 0:
        kinds += ["residual", "concat"]
    if family == KERAS3_FAKE_QUANT:
        kinds += ["fq", "fq"]
    return kinds


def _draw_chain(rng, family, shape, length, depth):
    layers = []
    for _ in range(length):
        for _attempt in range(20):
            op = _draw_layer(rng, family, shape, depth)
            if not _tfmot_accepts(family, op, layers[-1] if layers else None):
                continue
            try:
                out = layer_shape(op, shape)
            except InvalidGraph:
                continue
            if out[0] * out[1] * out[2] > MAX_ELEMENTS:
                continue
            layers.append(op)
            shape = out
            break
    return layers


def _tfmot_accepts(family, op, previous) -> bool:
    """tfmot's default scheme quantizes a BatchNormalization only right after a convolution without activation (it
    folds the pair), and not at all after one under the 4-bit QuantizeConfig; anywhere else quantize_model refuses
    the model. Keras' other families take it anywhere."""
    if family not in (TFMOT, TFMOT_4BIT, TFMOT_PARTIAL) or op["op"] != "bn":
        return True
    if family == TFMOT_4BIT:  # a convolution under the user's QuantizeConfig no longer folds a batch norm
        return False
    return previous is not None and previous["op"] in ("conv", "dwconv") and not previous.get("activation")


def _kernel_quantizer(rng):
    return {"bits": rng.choice((8, 8, 4, 2, 5)), "narrow": rng.random() < 0.5, "per_channel": rng.random() < 0.5}


def _draw_layer(rng, family, shape, depth) -> dict:
    h, w, c = shape
    kind = rng.choice(_layer_choices(family, depth))
    tfmot = family in (TFMOT, TFMOT_4BIT, TFMOT_PARTIAL)
    if kind in ("conv", "dwconv", "sepconv"):
        op = {"op": kind, "kernel": rng.choice((1, 2, 3, 3, 5)), "padding": rng.choice(("same", "valid")),
              "use_bias": rng.random() < 0.7}
        if rng.random() < 0.3:
            op["strides"] = 2
        elif rng.random() < 0.3:
            op["dilation"] = 2
        if kind == "conv":
            op["filters"] = rng.randint(1, 6)
            if rng.random() < 0.2 and c > 1:
                op["groups"] = rng.choice([g for g in range(2, c + 1) if c % g == 0])
                op["filters"] = op["groups"] * rng.randint(1, 2)
        elif kind == "dwconv":
            op["multiplier"] = rng.choice((1, 1, 2, 3))
        else:
            op["filters"] = rng.randint(1, 6)
            op["multiplier"] = rng.choice((1, 2))
        if rng.random() < 0.3:
            # tfmot quantizes a layer's own activation only for these (a ReLU6 must be its own layer)
            op["activation"] = rng.choice(("relu", "swish", "sigmoid", "tanh") if tfmot else ACTIVATIONS[:4])
        if family == KERAS3_FAKE_QUANT and kind != "sepconv" and rng.random() < 0.7:
            op["kernel_fq"] = _kernel_quantizer(rng)
        return op
    if kind == "bn":
        return {"op": "bn", "momentum": rng.choice((0.99, 0.9, 0.5)), "epsilon": rng.choice((1e-3, 1e-5, 0.1)),
                "center": rng.random() < 0.85, "scale": rng.random() < 0.85}
    if kind == "act":
        fn = rng.choice(TFMOT_ACTIVATIONS if tfmot else ACTIVATIONS)
        layer = "ReLU" if tfmot and fn == "relu6" else rng.choice(("Activation", "ReLU"))
        return {"op": "act", "fn": fn, "layer": layer}
    if kind == "pool":
        size = rng.choice((1, 2, 2, 3))
        return {"op": "pool", "kind": rng.choice(("max", "avg")), "size": size,
                "strides": rng.choice((1, size)) or 1, "padding": rng.choice(("same", "valid"))}
    if kind == "zeropad":
        if rng.random() < 0.5:
            p = rng.randint(1, 2)
            return {"op": "zeropad", "pad": [[p, p], [p, p]]}
        return {"op": "zeropad", "pad": [[rng.randint(0, 2), rng.randint(0, 2)], [rng.randint(0, 2), rng.randint(0, 2)]]}
    if kind == "upsample":
        return {"op": "upsample", "factor": 2, "interpolation": rng.choice(("nearest", "bilinear"))}
    if kind == "fq":
        lo = -rng.choice((1.0, 2.0, 3.0, 6.0)) if rng.random() < 0.7 else 0.0
        return {"op": "fq", "min": lo, "max": rng.choice((1.0, 2.0, 4.0, 6.0)), "bits": rng.choice((8, 8, 4, 6, 2, 16)),
                "narrow": rng.random() < 0.3, "per_channel": rng.random() < 0.2}
    if kind == "residual":
        branch = []
        for _ in range(rng.randint(1, 2)):
            branch.append({"op": "conv", "kernel": rng.choice((1, 3)), "padding": "same", "filters": c,
                           "use_bias": rng.random() < 0.5})
            if rng.random() < 0.5:
                branch.append({"op": "bn", "momentum": 0.9, "epsilon": 1e-3, "center": True, "scale": True})
            if rng.random() < 0.5:
                branch.append({"op": "act", "fn": "relu", "layer": "ReLU"})
        return {"op": "residual", "branch": branch, "after": rng.choice((None, "relu"))}
    if kind == "concat":
        return {"op": "concat", "branches": [
            [{"op": "conv", "kernel": 1, "padding": "same", "filters": rng.randint(1, 4), "use_bias": True}],
            [{"op": rng.choice(("conv", "dwconv")), "kernel": 3, "padding": "same", "filters": rng.randint(1, 4),
              "multiplier": 1, "use_bias": False}],
        ]}
    raise AssertionError(kind)


# ----------------------------------------------------------------------------------------------------------------
# Raw ops.

def _draw_raw(rng, shape):
    ops = []
    for _ in range(rng.randint(1, 5)):
        for _attempt in range(20):
            op = _draw_raw_op(rng, shape)
            try:
                out = raw_ops.raw_shape(op, shape)
            except InvalidGraph:
                continue
            if out[0] * out[1] * out[2] > MAX_ELEMENTS:
                continue
            ops.append(op)
            shape = out
            break
    return ops


def _range(rng):
    lo = rng.choice((-6.0, -3.0, -1.0, -0.5, 0.0, 0.3))
    hi = rng.choice((0.5, 1.0, 2.5, 6.0))
    return lo, max(hi, lo + 0.25)


def _draw_raw_op(rng, shape) -> dict:
    c = shape[2]
    kind = rng.choice(("fq_args", "fq_vars", "fq_vars_pc", "qdq", "qdq", "bn", "bn", "dw", "dw", "relu"))
    if kind in ("fq_args", "fq_vars"):
        lo, hi = _range(rng)
        return {"op": kind, "min": lo, "max": hi, "num_bits": rng.choice(raw_ops.FAKE_QUANT_BITS),
                "narrow_range": rng.random() < 0.5}
    if kind == "fq_vars_pc":
        ranges = [_range(rng) for _ in range(c)]
        return {"op": kind, "min": [r[0] for r in ranges], "max": [r[1] for r in ranges],
                "num_bits": rng.choice(raw_ops.FAKE_QUANT_BITS), "narrow_range": rng.random() < 0.5}
    if kind == "qdq":
        axis = -1 if rng.random() < 0.6 else rng.choice((0, 1, 2, 3))
        op = {"op": "qdq", "version": rng.choice(raw_ops.QDQ_VERSIONS), "signed_input": rng.random() < 0.6,
              "num_bits": rng.choice(raw_ops.QDQ_BITS), "range_given": rng.random() < 0.5,
              "round_mode": rng.choice(raw_ops.ROUND_MODES), "narrow_range": rng.random() < 0.4, "axis": axis}
        op["input_min"], op["input_max"] = _range(rng)
        return op
    if kind == "bn":
        return {"op": "bn", "version": rng.choice(raw_ops.BN_VERSIONS), "data_format": rng.choice(raw_ops.DATA_FORMATS),
                "is_training": rng.random() < 0.5, "epsilon": rng.choice((1e-3, 1e-5, 0.01)),
                "exponential_avg_factor": rng.choice((1.0, 1.0, 0.3))}
    if kind == "dw":
        # TF's CPU kernel runs neither an NCHW nor a dilated DepthwiseConv2dNative (UnimplementedError): a dilated
        # depthwise convolution reaches it as SpaceToBatchND -> depthwise -> BatchToSpaceND (the Keras families).
        op = {"op": "dw", "kernel": rng.choice((1, 2, 3)), "multiplier": rng.choice((1, 1, 2, 3)),
              "strides": rng.choice((1, 1, 2)), "dilations": 1, "padding": rng.choice(raw_ops.PADDINGS),
              "data_format": "NHWC"}
        if op["padding"] == "EXPLICIT":
            op["explicit"] = [[rng.randint(0, 2), rng.randint(0, 2)], [rng.randint(0, 2), rng.randint(0, 2)]]
        return op
    return {"op": "relu"}
