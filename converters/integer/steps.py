"""Judging an integer model against TF in quantization steps.

An integer model's quantized output is a grid value ``(k - zero_point) * step``, as is TF's fake-quantized one
(converters.integer.grid), so their difference is a whole number of steps: the natural unit of its error. It is
not zero everywhere, and cannot be: the integer model rounds where TF rounds in float, with other operands:

* QuantizeLinear rounds half to even, TF's fake quantization half up after a shift (at a tie, and within an ulp
  of one, they pick neighbouring integers);
* the bias is an int32 in units of input scale x weight scale (TF adds it in float), and the batch norm's factor
  is folded into the weight scale (TF multiplies after the sum): pre-rounding values move by up to ~1e-3 step;
* so a value within that distance of a rounding boundary lands on the other integer, and the next layer reads a
  neighbouring input: flips propagate and multiply through a deep network, as they do between TF's own Eigen and
  oneDNN kernels (which round their float sums in different orders).

An output computed from a quantized tensor by a Softmax has no grid; it is judged in half the logits' step (a
Softmax moves no probability by more than half the largest logit error), converters.integer.rewrite records it.

The verdict therefore bounds the largest error in steps (``DEFAULT_STEP_BOUND``, docs/integer.md has the
measurements it rests on), and reports what a user weighs beside it: the share of values identical and within
one step, and for a [batch, classes] output the share of rows whose top-1 class agrees. A wrong scale, zero point,
weight or bias moves outputs by a large part of the grid and fails by far (tests/test_integer_lowering.py mutates
each and checks).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

# The default bound, in steps. Measured (docs/integer.md): the example models on their 360 held-out digits reach
# at most 18 steps (the QAT MobileNetV2, 52 quantized layers; LiteRT's int8 model of it: 17) and 1-2 steps (the
# small CNNs); on the verifier's random inputs the MobileNetV2 reaches 7. A wrong zero point or weight moves an
# output by hundreds of steps (tests/test_integer_lowering.py); a subtler error in one layer of a deep network can
# hide in its drift end to end, which is what the per-tensor check (converters.integer.per_tensor) is for.
DEFAULT_STEP_BOUND = 32.0


@dataclasses.dataclass
class StepCheck:
    name: str
    step: float
    size: int
    max_steps: float
    identical: float  # share of values on the same integer as TF's
    within_one: float  # share within one step
    top1: Optional[float]  # share of rows with TF's top-1 class ([batch, classes] outputs)
    tf_spread_steps: Optional[float]  # max |TF Eigen - TF oneDNN| in steps, where measured
    bound: float
    nonfinite_match: bool

    @property
    def ok(self) -> bool:
        return self.nonfinite_match and self.max_steps <= self.bound

    def row(self) -> str:
        top1 = "-" if self.top1 is None else f"{100 * self.top1:.1f}%"
        spread = "-" if self.tf_spread_steps is None else f"{self.tf_spread_steps:g}"
        verdict = "ok" if self.ok else ("FAIL: NaN/Inf differ" if not self.nonfinite_match else "FAIL")
        return (f"{self.name:24s} {self.step:10.4g} {self.max_steps:9g} {100 * self.identical:9.1f}% "
                f"{100 * self.within_one:9.1f}% {top1:>7s} {spread:>9s} {self.bound:7g}  {verdict}")

    def to_dict(self) -> dict:
        return {k: (v if not isinstance(v, float) or np.isfinite(v) else None)
                for k, v in dataclasses.asdict(self).items()} | {"ok": self.ok}


HEADER = (f"{'output':24s} {'step':>10s} {'max steps':>9s} {'identical':>10s} {'within 1':>10s} {'top-1':>7s} "
          f"{'TF spread':>9s} {'bound':>7s}  verdict")


def steps_between(expected, actual, step: float) -> np.ndarray:
    """|actual - expected| in steps (float64; whole numbers up to the float32 rounding of the grid values)."""
    with np.errstate(all="ignore"):
        return np.abs(np.asarray(actual, np.float64) - np.asarray(expected, np.float64)) / float(step)


def judge_steps(name: str, expected, actual, step: float, bound: float = DEFAULT_STEP_BOUND,
                onednn=None) -> StepCheck:
    expected, actual = np.asarray(expected), np.asarray(actual)
    if expected.shape != actual.shape:
        raise ValueError(f"output {name!r}: TF's shape {expected.shape}, the model's {actual.shape}")
    finite = np.isfinite(expected) & np.isfinite(actual)
    nonfinite_match = bool(np.array_equal(np.isfinite(expected), np.isfinite(actual)))
    d = np.rint(steps_between(expected[finite], actual[finite], step))  # grid values: whole steps apart
    top1 = None
    if expected.ndim == 2 and expected.shape[1] > 1 and expected.shape[0] > 0:
        top1 = float(np.mean(expected.argmax(1) == actual.argmax(1)))
    spread = None
    if onednn is not None and np.shape(onednn) == expected.shape:
        s = steps_between(expected, onednn, step)
        spread = float(np.rint(np.nanmax(s))) if s.size else 0.0
    size = int(d.size)
    return StepCheck(name, float(step), int(expected.size), float(d.max()) if size else 0.0,
                     float(np.mean(d == 0)) if size else 1.0, float(np.mean(d <= 1)) if size else 1.0, top1, spread,
                     float(bound), nonfinite_match)


def table(checks) -> str:
    lines = ["integer model: quantized outputs judged in quantization steps (converters.integer.steps)", HEADER]
    lines += [c.row() for c in checks]
    return "\n".join(lines)
