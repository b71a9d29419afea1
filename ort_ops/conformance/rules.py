"""How each output of a golden case is judged, and how a rejection is recognised: the conformance rules.

One place for them: the kit's manifest is written from here, and the suite's own comparisons with TensorFlow
(live tests, CUDA checks) use the same bounds.

* ``bits``: every byte equal. Signed zeros differ, NaNs must carry TF's sign and payload. The quantization
  ops (FakeQuant*, QuantizeAndDequantize*, the fused batch norm + clip + FakeQuant) are judged so.
* ``sum``: an output TF accumulates in an order it does not fix (FakeQuant's min/max gradients):
  |got - want| <= 1e-6 * sum(|terms|), the terms being the incoming gradient; NaN positions equal.
* ``tolerance``: the float ops (FusedBatchNorm*, DepthwiseConv2dNative*), NaN and infinity positions and
  infinities' signs equal, every finite value within a bound (one number or one per element), derived in
  ``batch_norm_output_bound`` (per channel for the gradients' summed scale/offset outputs) and
  ``depthwise_bound``.
* ``placeholder``: an output TF leaves undefined (the generator stored no value); not compared.

A rejection (input TF refuses) passes when the implementation refuses it with a message containing the op's
name and TF's message: all of it for the float ops, its part before the first number for the quantization
ops (``key_phrase``), whose numbers are formatted differently in C++ and Python.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

from ort_ops.checks.batch_norm import channel_axis
from ort_ops.specs import get_spec

BITS, SUM, TOLERANCE, PLACEHOLDER = "bits", "sum", "tolerance", "placeholder"
JUDGES = (BITS, SUM, TOLERANCE, PLACEHOLDER)

SUM_RELATIVE = 1e-6  # of sum(|terms|)

# ------------------------------------------------------------------------------------------- batch norm
# TF's AVX kernels compute rsqrt for channels that fill whole 8-float packets as RSQRTPS plus one Newton step
# (1-2 float32 ulp from the correctly rounded value, CPU-vendor dependent), and oneDNN sums the per-channel
# reductions in its own order. Every output is a few float32 operations from that rsqrt and those sums, so
# its error relative to the size of its terms, max(1, max|want|) (inputs are O(1)), is a few ulps; measured
# worst over goldens and live cases: 3.9 float32 ulps. The bound is 16 ulps (2^-19), 4x headroom; dropping
# epsilon moves y by about eps/(2*var), more than that (tests/test_batch_norm.py proves it fails).
# float16/bfloat16 outputs are the float32 result rounded to T: one ulp of T at that size.
BATCH_NORM_ULPS = {"float32": 16 * 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}


def batch_norm_bound(want: np.ndarray) -> float:
    """The absolute bound for every finite value of a FusedBatchNorm* output ``want`` (module docstring)."""
    w = np.asarray(want).astype(np.float64)
    finite = w[np.isfinite(w)]
    size = max(1.0, float(np.max(np.abs(finite)))) if finite.size else 1.0
    return BATCH_NORM_ULPS[np.asarray(want).dtype.name] * size


# FusedBatchNormGrad's scale_backprop and offset_backprop (outputs 1 and 2) are per-channel sums of n = N*H*W
# terms: dy*(x - mean)*rsqrt(var + eps) and dy. They are judged as sums (the developers' standard): against the
# size of what was summed, S = sum(|terms|), not against their own value, which cancellation makes small. TF's
# CPU kernel adds them one after the other, a GPU kernel in a tree; any two orders in float32 are within
# 2*(n+1)*u*S (Higham's gamma_n, twice), as for depthwise sums. The first H200 run measured 1.5e-7*S between the
# CUDA and CPU kernels at n = 8192, where the 16-ulp bound at the output's own size failed. Dropped epsilon or a
# flipped sign still fail: tests/test_batch_norm.py.
BATCH_NORM_GRAD_SUMS = (1, 2)
_GRAD_OPS = ("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3")


def batch_norm_grad_sum_bound(op: str, inputs, attrs, k: int) -> Optional[np.ndarray]:
    """The per-channel summation bound of summed output ``k`` (1 or 2) of a FusedBatchNormGrad* case, or None
    where the inputs do not give one (an empty batch, statistics of another shape)."""
    attrs = get_spec(op).with_defaults(attrs or {})
    dy, x, _, mean, variance = (np.asarray(a, dtype=np.float64) for a in list(inputs)[:5])
    axis = channel_axis(x.ndim, attrs["data_format"])
    channels = x.shape[axis]
    rows = lambda a: np.moveaxis(a, axis, -1).reshape(-1, channels)  # noqa: E731
    dy = rows(dy)
    n = dy.shape[0]
    if n == 0 or mean.shape != (channels,) or variance.shape != (channels,):
        return None
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if k == 2:
            terms = np.abs(dy)
        else:
            c0 = np.abs(1.0 / np.sqrt(variance + np.float64(np.float32(attrs["epsilon"]))))
            terms = np.abs(dy * (rows(x) - mean)) * c0
    gamma = 2 * (n + 1) * UNIT_ROUNDOFF["float32"]  # every type computes in float32
    return gamma * np.where(np.isfinite(terms), terms, 0.0).sum(axis=0)


def batch_norm_output_bound(op: str, inputs, attrs, k: int, want) -> Union[float, np.ndarray]:
    """The bound of output ``k`` of a FusedBatchNorm* case: 16 ulps at the output's size, and for the summed
    outputs of the gradients at least the summation bound of each channel."""
    bound = batch_norm_bound(want)
    if op in _GRAD_OPS and k in BATCH_NORM_GRAD_SUMS:
        sums = batch_norm_grad_sum_bound(op, inputs, attrs, k)
        if sums is not None and sums.shape == np.shape(want):
            return np.maximum(bound, sums)
    return bound


# -------------------------------------------------------------------------------------------- depthwise
# Each output element is a sum of n products (forward: kh*kw taps; BackpropInput: kh*kw*M; BackpropFilter:
# N*oh*ow positions); S = sum(|products|). float32/float64: any two summation orders are within 2*(n+1)*u*S
# (Higham's gamma_n, twice). float16/bfloat16: products are exact in float32, and
# |ours - TF| <= |ref - exact| + |TF - exact|, the first term computed exactly from the reference kernel, the
# second max(u*|exact| + 2*(n+1)*2^-24*S (TF accumulating in float32), LAMBDA*sqrt(n)*u*S (TF rounding
# after every addition: Higham & Mary's probabilistic bound, SIAM J. Sci. Comput. 41(5), 2019)). An absolute
# n*tiny(T) covers TF flushing subnormals to zero. tests/test_depthwise.py states the measured margins and
# proves that zeros or a flipped sign fail.
UNIT_ROUNDOFF = {"float32": 2.0**-24, "float64": 2.0**-53, "float16": 2.0**-11, "bfloat16": 2.0**-8}
TINY = {"float32": 2.0**-126, "float64": 2.0**-1022, "float16": 2.0**-14, "bfloat16": 2.0**-126}
LAMBDA = 5
DEPTHWISE_FORWARD = "DepthwiseConv2dNative"
DEPTHWISE_BACKPROP_INPUT = "DepthwiseConv2dNativeBackpropInput"


def _spatial(shape, data_format):
    """(N, H, W, C) of a 4-D shape in ``data_format``."""
    return (shape[0], shape[2], shape[3], shape[1]) if data_format == "NCHW" else tuple(shape)


def depthwise_terms(op: str, inputs, attrs) -> int:
    """How many products each output element of a depthwise op sums."""
    if op == DEPTHWISE_FORWARD:
        kh, kw = np.shape(inputs[1])[:2]
        return kh * kw
    if op == DEPTHWISE_BACKPROP_INPUT:
        kh, kw, _, m = np.shape(inputs[1])
        return kh * kw * m
    n, oh, ow, _ = _spatial(np.shape(inputs[2]), attrs.get("data_format", "NHWC"))
    return n * oh * ow


def _reference(op, inputs, attrs):
    return get_spec(op).run_reference(inputs, attrs)[0]


def _float64(inputs):
    return [x if x.dtype == np.int32 else x.astype(np.float64) for x in inputs]


def depthwise_magnitude(op: str, inputs, attrs) -> np.ndarray:
    """sum(|products|) per output element: the op in float64 on absolute values."""
    absolute = [x if x.dtype == np.int32 else np.abs(x.astype(np.float64)) for x in map(np.asarray, inputs)]
    with np.errstate(invalid="ignore", over="ignore"):
        return _reference(op, absolute, attrs)


def depthwise_bound(op: str, inputs, attrs, dtype) -> np.ndarray:
    """The largest |got - want| allowed per output element of a depthwise op (see above)."""
    inputs = [np.asarray(x) for x in inputs]
    name = np.dtype(dtype).name
    n = depthwise_terms(op, inputs, attrs)
    u = UNIT_ROUNDOFF[name]
    total = depthwise_magnitude(op, inputs, attrs)
    if name not in ("float16", "bfloat16"):
        return 2 * (n + 1) * u * total + n * TINY[name]
    with np.errstate(invalid="ignore", over="ignore"):
        exact = _reference(op, _float64(inputs), attrs)
        ours = np.abs(_reference(op, inputs, attrs).astype(np.float64) - exact)
    float32_accumulation = u * np.abs(exact) + 2 * (n + 1) * UNIT_ROUNDOFF["float32"] * total
    stepwise_rounding = LAMBDA * np.sqrt(n) * u * total
    return ours + np.maximum(float32_accumulation, stepwise_rounding) + n * TINY[name]


# ------------------------------------------------------------------------------------------------- sums


def sum_bound(terms) -> float:
    """The bound of an output summed in any order over ``terms``: 1e-6 * sum(|finite terms|)."""
    g = np.abs(np.asarray(terms, dtype=np.float64))
    return SUM_RELATIVE * float(g[np.isfinite(g)].sum())


# ------------------------------------------------------------------------------------------- the rules


@dataclass(frozen=True)
class Rule:
    """How one output is judged; ``bound`` is a number or, for per-element bounds, an array of the output's shape."""

    judge: str
    bound: Union[None, float, np.ndarray] = None

    def __post_init__(self):
        if self.judge not in JUDGES:
            raise ValueError(f"unknown judge {self.judge!r}; one of {JUDGES}")


def is_undefined(want) -> bool:
    """A golden output TF leaves undefined (the store holds an empty bool array there)."""
    return np.asarray(want).dtype == np.bool_


def output_rules(op: str, inputs, attrs, outputs) -> list:
    """The rule for each output of a case TF computes (``outputs``: TF's values)."""
    spec = get_spec(op)
    summed = spec.summed_outputs()
    rules = []
    for k, want in enumerate(outputs):
        if is_undefined(want):
            rules.append(Rule(PLACEHOLDER))
        elif spec.family == "batch_norm":
            rules.append(Rule(TOLERANCE, batch_norm_output_bound(op, inputs, attrs, k, want)))
        elif spec.family == "depthwise":
            rules.append(Rule(TOLERANCE, depthwise_bound(op, inputs, attrs, np.asarray(want).dtype)))
        elif k in summed:
            rules.append(Rule(SUM, sum_bound(inputs[0])))
        else:
            rules.append(Rule(BITS))
    return rules


def key_phrase(message: str) -> str:
    """The part of TF's message before its first number: what every implementation must say."""
    return re.split(r"[-+]?\d", message, maxsplit=1)[0].strip(" :,")


def rejection_phrases(op: str, tf_message: str) -> list:
    """What the message of an implementation that rejects TF-rejected input must contain."""
    exact = get_spec(op).family in ("batch_norm", "depthwise")
    return [op, tf_message if exact else key_phrase(tf_message)]
