"""Run TensorFlow and ONNX Runtime on the same seeded inputs and judge every output by what it is.

TensorFlow's kernels. :func:`verify` compares with TF's Eigen kernels, the ones the project's exactness
claims are made against (TF_ENABLE_ONEDNN_OPTS=0; the CLI pins it before importing TF). Where this process
imported TF with oneDNN (TF's default on CPUs with AVX-512), the Eigen run happens in a child process and
the report says so. With ``spread=True`` (default) TF's other kernel set (oneDNN) runs the same function on
the same inputs in a child process (converters.verify_tf_child), and each output's ``max |eigen - onednn|``
is reported next to ours: TF's own spread on this CPU.

How each output is judged:

* bit for bit: outputs of quantization ops (FakeQuant*, QuantizeAndDequantize*, recorded by the converter
  or traced in the TF graph) whose whole cone of inputs is exact (converters.exact_outputs: a quantizer fed by
  a convolution, or a quantized gradient fed by a backprop, inherits the sum's order and is judged as a float
  or a sum; per-node verification, converters.node_verification, holds it to bits on TF's inputs), and integer and
  boolean outputs. NaN matches any NaN; +0 and -0 differ.
* a float output: ``|ort - tf| <= rtol*|tf|``, rtol a few ulps of the element type (DEFAULT_RTOL: float32
  1e-5, float64 1e-12, float16 1e-3, bfloat16 1e-2).
* a sum (a reduction, a gradient, a convolution, a matmul, anything computed from one): against the size
  of what was summed, never against its own largest value:
  ``|ort - tf| <= rtol*|tf| + max(sum_rtol, 2(n+1)u) * magnitude``, where ``magnitude`` is ``Σ|terms|`` per element,
  propagated back through the graph (two levels of sums deep) by converters.verify_magnitude and computed by
  ONNX Runtime on the same inputs. A gradient that vanishes in exact arithmetic (a bias in front of a batch
  norm) is rounding noise on both sides and passes; a wrong one (a dropped epsilon, a flipped sign, a 1%
  scale, a swapped output) moves by far more.

  ``DEFAULT_SUM_RTOL``: float32 1e-5 (84 ulps of 1), float64 1e-12, float16 4e-3 and bfloat16 3e-2 (4 ulps:
  their kernels accumulate in float32 and round once). Each term of a sum carries the differences of the
  path that computed it, a few ulps per rounding on each side, which the magnitude accounts for; the
  summation itself adds up to (n-1) ulps of the magnitude in the worst case, about sqrt(n) for random
  rounding, log2(n) for the blocked and pairwise orders of Eigen, oneDNN and MLAS. So the coefficient is
  the larger of sum_rtol and the worst case of two orders, 2(n+1)u, n the terms one element adds (counted
  by converters.verify_magnitude; summation_coefficient): it grows past sum_rtol from n = 83. Measured: the largest
  ``|ort - tf| / magnitude`` on the training steps of Conv2D -> BatchNormalization -> ReLU -> Dense nets (six
  seeds, both lowerings, against TF's Eigen and oneDNN kernels) is 12 ulps, so the default leaves a factor 7;
  a 1% error fails wherever the output is more than 1e-3 of its magnitude (below that it is noise-sized).
* every mode: shapes and dtypes must match, and non-finite values must match exactly (inf by sign, NaN by
  position). Values below the type's smallest normal may differ (TF flushes subnormals to zero).

TF's own spread. A deep network's training step is beyond any rounding bound of this kind: on MobileNetV2
(alpha 0.35, 64x64, batch 4, random weights) TF's Eigen and oneDNN kernels differ by more than 1000 ulps of
the magnitude on 40 to 130 of its 159 gradients (ReLU6 and batch-norm boundaries amplify the last bits), and
ONNX Runtime is as far from Eigen as oneDNN is (verify passes that step in both lowerings, 137 and 67 of
the 159 outputs by the rule below). A non-exact output outside its bound passes where the largest
error among its elements outside the bound is at most TF's spread on that output (verdict "ok: within TF's
own spread") or at most SPREAD_FACTOR (2) times it ("ok: within twice TF's own spread"). Bit-exact outputs
are never judged by the spread.

``compare_output`` (the judge of models/run_all.py and the tests) keeps its own rules: element-wise with
``atol`` (default rtol times max|tf|) or normwise (``||ort - tf|| <= c * ||tf||`` over the elements finite in
both, with a noise floor for outputs that vanish in exact arithmetic).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

import numpy as np
import onnx

from converters.exact_outputs import exact_cone, producer_type, recorded_exact_outputs
from converters.family import QUANTIZATION_OPS
from converters.integer import read_summary as read_integer_summary
from converters.verify_tf import concrete_function as _concrete_function
from converters.verify_tf import graph_def_function  # noqa: F401 - part of this module's API
from converters.verify_tf import run_tf as _run_tf
from ort_ops.schemas import DOMAIN

DEFAULT_RTOL = {"float32": 1e-5, "float64": 1e-12, "float16": 1e-3, "bfloat16": 1e-2}
# Sums: times the magnitude of what was summed (see the module docstring for the reasons).
DEFAULT_SUM_RTOL = {"float32": 1e-5, "float64": 1e-12, "float16": 4e-3, "bfloat16": 3e-2}
# The unit roundoff of a sum's accumulator (float16 and bfloat16 accumulate in float32), for the summation-order
# bound 2(n+1)·u·Σ|terms| of a sum of n terms per element (summation_coefficient).
ACCUMULATOR_UNIT_ROUNDOFF = {"float64": 2.0 ** -53}
FLOAT32_UNIT_ROUNDOFF = 2.0 ** -24


def summation_coefficient(dtype: str, sum_rtol: float, terms) -> np.ndarray:
    """What a sum's error is allowed in units of Σ|terms|: the larger of ``sum_rtol`` (the terms' own few ulps)
    and the summation-order bound ``2(n+1)·u`` for ``n`` terms per element (``terms``; None: not known). A
    recursive sum of n terms in any order is within (n-1)·u·Σ|terms| of the exact sum, so two orders (TF's and
    ONNX Runtime's) are within twice that; n+1 also covers the rounding of each product and of the result, as
    the conformance bounds of the batch-norm gradients and the depthwise convolutions do
    (ort_ops/conformance/rules.py)."""
    if terms is None:
        return np.asarray(sum_rtol, np.float64)
    u = ACCUMULATOR_UNIT_ROUNDOFF.get(dtype, FLOAT32_UNIT_ROUNDOFF)
    n = np.where(np.isfinite(np.asarray(terms, np.float64)), np.asarray(terms, np.float64), 0.0)
    return np.maximum(sum_rtol, 2.0 * (np.maximum(n, 1.0) + 1.0) * u)
# Ops whose ONNX Runtime kernel errs by an absolute amount, not a relative one: an extra ``atol`` of this many ulps
# of 1 in the output's type where per-node verification judges their output. ORT's Sigmoid (MLAS's logistic, a
# rational approximation; outputs in [0, 1]) is off the exact value by up to 1.7e-7 (2.8 ulps of 1) in float32
# and off TF's Eigen kernel by up to 1.8e-7, measured over x in [-30, 30] (2M points); its relative error on
# small outputs is unbounded (6.8 at x = -18, an output of 1.5e-8), where Eigen's stays below 5e-7. 8 ulps leave
# a factor 2.7; a wrong Sigmoid (a dropped sign, a HardSigmoid, a missing scale) is off by 1e-2 and more.
ABSOLUTE_ERROR_ULPS = {"Sigmoid": 8}


def absolute_error_atol(op_type: str, dtype) -> float:
    """The extra absolute bound for an output of ONNX ``op_type`` (0 unless ABSOLUTE_ERROR_ULPS names it)."""
    ulps = ABSOLUTE_ERROR_ULPS.get(op_type)
    if not ulps or np.dtype(dtype).kind != "f":
        return 0.0
    return float(ulps * np.finfo(np.dtype(dtype)).eps / 2)


# ONNX Runtime's own messages during verification: errors only (a trainable input with a same-name
# initializer is deliberate, see converters.variable_state, and ORT warns once per such input).
VERIFY_LOG_SEVERITY = 3
# "Within TF's own spread": the largest error among an output's elements outside their bound is at most this many
# times TF's spread on that output (two other implementations, each as far from Eigen as oneDNN is, can be twice
# as far from each other, and on a given output ORT may be the farther one).
SPREAD_FACTOR = 2.0


@dataclasses.dataclass
class OutputCheck:
    """How one ONNX output compares to TensorFlow's."""

    name: str
    shape: tuple
    dtype: str
    exact: bool  # bit-exactness was required
    rtol: float
    atol: float
    max_abs_err: float
    max_rel_err: float
    n_differing: int  # elements not bit-identical (NaNs count as identical)
    n_outside: int  # elements outside the tolerance (== n_differing when exact; normwise: non-finite misplaced)
    ok: bool
    note: str = ""
    same_type: bool = True  # ORT gave TF's shape and dtype (nothing else is compared otherwise)
    nonfinite_match: bool = True  # every inf and NaN of either side sits where the other has the same one
    normwise: Optional[float] = None  # judged normwise with this c
    normwise_err: float = 0.0  # ||ort - tf|| / max(||tf||, noise floor) when judged normwise
    # Filled by verify():
    kind: str = ""  # "bits", "float" or "sum" (how verify judged it)
    sum_rtol: float = 0.0  # sums: times the magnitude of what was summed
    terms: Optional[float] = None  # sums: terms added per element (the summation-order bound's n; None: unknown)
    sum_coefficient: float = 0.0  # sums: max(sum_rtol, 2(n+1)u), what the magnitude was multiplied by
    bound: float = 0.0  # the error allowed at the element that came closest to (or went furthest past) its bound
    error: Optional[float] = None  # the error of that same element (None: judged bit for bit, see max_abs_err)
    spread: Optional[float] = None  # max |TF Eigen - TF oneDNN| of this output (None: not measured)
    spread_note: str = ""  # why the spread is missing or not comparable
    within_spread: bool = False  # outside its bound, but no further from TF than TF's kernel sets are apart
    verdict: str = ""

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def tolerance(self) -> str:
        if self.exact:
            return "bit-exact"
        if self.normwise is not None:
            return f"normwise {self.normwise:g} (got {self.normwise_err:.1e})"
        if self.kind == "sum":
            extra = f" + {self.atol:.1e}" if self.atol else ""
            if self.terms is not None and self.sum_coefficient > self.sum_rtol:
                coefficient = f"2(n+1)u·Σ|terms| (n={self.terms:g}: {self.sum_coefficient:.1e})"
                return f"rtol {self.rtol:.0e} + {coefficient}{extra}"
            return f"rtol {self.rtol:.0e} + {self.sum_rtol:.0e}·Σ|terms|{extra}"
        if self.kind == "float":
            return f"rtol {self.rtol:.0e}" + (f" + {self.atol:.1e}" if self.atol else "")
        return f"rtol={self.rtol:.0e} atol={self.atol:.2e}"

    def to_dict(self) -> dict:
        return {
            "name": self.name, "shape": list(self.shape), "dtype": self.dtype, "judged_as": self.kind or self.tolerance,
            "tolerance": self.tolerance, "rtol": self.rtol, "sum_rtol": self.sum_rtol, "atol": self.atol,
            "terms": self.terms, "sum_coefficient": self.sum_coefficient,
            "elements": self.size, "identical": self.size - self.n_differing if self.same_type else 0,
            "outside": self.n_outside, "max_abs_err": _finite_or_none(self.max_abs_err),
            "max_rel_err": _finite_or_none(self.max_rel_err), "bound": self.bound,
            "error_at_bound": None if self.error is None else _finite_or_none(self.error),
            "tf_spread": None if self.spread is None else _finite_or_none(self.spread),
            "tf_spread_note": self.spread_note, "within_tf_spread": self.within_spread, "ok": self.ok,
            "verdict": self.verdict or ("ok" if self.ok else "FAIL"), "note": self.note,
        }


def _finite_or_none(x):
    return float(x) if np.isfinite(x) else None


def _short(x: float) -> str:
    return "0" if x == 0 else f"{x:.1e}"


@dataclasses.dataclass
class VerifyReport:
    outputs: list
    inputs: dict
    notes: list = dataclasses.field(default_factory=list)  # lines about the run (TF's kernels, the spread child)
    tf_reference: str = ""  # which TF kernels the outputs were judged against, and where they ran
    tf_spread: str = ""  # how TF's spread was measured, or why not
    step_checks: list = dataclasses.field(default_factory=list)  # an integer model's outputs, in steps

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.outputs) and all(c.ok for c in self.step_checks)

    def table(self) -> str:
        if self.step_checks and not self.outputs:
            from converters.integer.steps import table

            return "\n".join([table(self.step_checks)] + [line for line in (self.tf_reference, self.tf_spread, *self.notes)
                                                           if line] + ["verification " + ("passed" if self.ok else "FAILED")])
        header = ("output", "shape", "dtype", "identical", "error", "bound", "judged as", "TF spread", "verdict")
        rows = []
        for c in self.outputs:
            if c.spread is not None:
                spread = _short(c.spread)
            else:
                spread = "n/a" if c.spread_note else "-"
            rows.append((
                c.name,
                "x".join(map(str, c.shape)) or "scalar",
                c.dtype,
                f"{c.size - c.n_differing}/{c.size}" if c.same_type else "-",
                _short(c.max_abs_err if c.exact or c.error is None else c.error),
                "0" if c.exact else _short(c.bound),
                "bit-exact" if c.exact else (c.kind or c.tolerance),
                spread,
                c.verdict or (("ok" if c.ok else "FAIL") + (f" ({c.note})" if c.note else "")),
            ))
        widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
        lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
        lines.append("  ".join("-" * w for w in widths))
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
        lines += self._legend()
        lines += [line for line in (self.tf_reference, self.tf_spread, *self.notes) if line]
        if self.step_checks:
            from converters.integer.steps import table

            lines.append(table(self.step_checks))
        lines.append("verification " + ("passed" if self.ok else "FAILED"))
        return "\n".join(lines)

    def _legend(self) -> list:
        judged = [c for c in self.outputs if c.kind in ("float", "sum") and c.same_type]
        if not judged:
            return []
        settings = {}
        for c in judged:
            entry = settings.setdefault(c.dtype, [f"rtol {c.rtol:.0e}"])
            if c.kind == "sum" and len(entry) == 1:
                entry.append(f"sum_rtol {c.sum_rtol:.0e}")
            if c.atol and f"atol {c.atol:.0e}" not in entry:
                entry.append(f"atol {c.atol:.0e}")
        per_type = "; ".join(f"{dtype}: {', '.join(v)}" for dtype, v in settings.items())
        return [f"float: |ort - tf| <= rtol*|tf|; sum: <= rtol*|tf| + max(sum_rtol, 2(n+1)u)*Σ|terms| (the magnitude "
                f"of what was summed, n terms per element, u the accumulator's unit roundoff); {per_type}",
                "error, bound: of one element, the one nearest its bound (or furthest past it); bit-exact rows: the "
                "largest error; TF spread: max |TF Eigen - TF oneDNN|"]

    def to_dict(self) -> dict:
        return {"ok": self.ok, "tf_reference": self.tf_reference, "tf_spread": self.tf_spread,
                "notes": list(self.notes), "outputs": [c.to_dict() for c in self.outputs],
                "steps": [c.to_dict() for c in self.step_checks]}

    def to_json(self, path=None) -> str:
        """The report as JSON (one entry per output, in the model's output order); written to ``path`` if given."""
        return report_json(self.to_dict(), path)

    def __str__(self) -> str:
        return self.table()


def report_json(data: dict, path=None) -> str:
    """A verification report's dict as JSON text (NumPy scalars as numbers), also written to ``path`` if given."""
    text = json.dumps(data, indent=2, default=_json_number)
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return text


def _json_number(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    raise TypeError(type(x).__name__)


def same_bits(a, b, nan_payloads: bool = False) -> np.ndarray:
    """Element-wise bit identity of two arrays of one dtype and shape (+0 and -0 differ).

    A NaN equals every NaN, or with ``nan_payloads`` only a NaN of the same bits (sign and payload):
    which NaN a sum keeps depends on its order, so only some comparisons can demand the payload.
    Integers and booleans compare by value.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
        width = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
        same = a.view(width) == b.view(width)
        if nan_payloads:
            return same
        both_nan = np.isnan(a.astype(np.float64)) & np.isnan(b.astype(np.float64))
        return same | both_nan
    return a == b


def error_stats(expected, actual):
    """(element-wise |actual - expected|, max abs error, max rel error), over the elements finite in both
    (the others count 0). Same shapes."""
    e64, a64 = np.asarray(expected).astype(np.float64), np.asarray(actual).astype(np.float64)
    finite = np.isfinite(e64) & np.isfinite(a64)
    with np.errstate(invalid="ignore"):  # inf - inf where both are infinite; masked out by `finite`
        err = np.where(finite, np.abs(a64 - e64), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(finite & (e64 != 0), err / np.abs(e64), 0.0)
    return err, float(err.max(initial=0.0)), float(rel.max(initial=0.0))


def _norms(expected, actual, noise_floor=0.0):
    """(||actual - expected||, max(||expected||, noise_floor * sqrt(n))) over the n elements finite in both."""
    e, a = np.asarray(expected).astype(np.float64), np.asarray(actual).astype(np.float64)
    finite = np.isfinite(e) & np.isfinite(a)
    ref = max(float(np.linalg.norm(e[finite])), noise_floor * float(np.sqrt(max(int(finite.sum()), 1))))
    return float(np.linalg.norm((a - e)[finite])), ref


def normwise_error(expected, actual, noise_floor=0.0) -> float:
    """``||actual - expected|| / max(||expected||, noise_floor * sqrt(n))`` over the n elements finite in both
    (0 where that reference is 0). The floor keeps an output that vanishes in exact arithmetic, and is
    rounding noise in both runs, from being judged against its own (noise) norm."""
    dist, ref = _norms(expected, actual, noise_floor)
    return dist / ref if ref else 0.0


def compare_output(name, expected, actual, exact=False, rtol=None, atol=None, atol_factor=None, normwise=None,
                   noise_floor=0.0) -> OutputCheck:
    """Compare one output (``expected`` from TF, ``actual`` from ORT).

    ``exact`` (and any non-float output): bit for bit, NaN matching any NaN. Otherwise ``normwise``: judged
    by :func:`normwise_error` (with ``noise_floor``) against ``normwise``; else element-wise,
    ``|ort - tf| <= rtol*|tf| + atol`` with atol given, or ``atol_factor`` (default: rtol) times max|tf|.
    Non-float outputs and non-finite values must match exactly in every mode.
    """
    expected, actual = np.asarray(expected), np.asarray(actual)
    dtype = expected.dtype.name
    is_float = expected.dtype.kind == "f" or dtype == "bfloat16"
    exact = exact or not is_float
    rtol = 0.0 if exact else (DEFAULT_RTOL.get(dtype, 1e-5) if rtol is None else rtol)
    if expected.shape != actual.shape or expected.dtype != actual.dtype:
        note = f"ORT gave {actual.dtype.name}{list(actual.shape)}, TF {dtype}{list(expected.shape)}"
        return OutputCheck(name, expected.shape, dtype, exact, rtol, 0.0, np.inf, np.inf, expected.size, expected.size,
                           False, note, same_type=False, nonfinite_match=False)
    same = same_bits(expected, actual)
    n_differing = int(np.count_nonzero(~same))
    err, max_abs, max_rel = error_stats(expected, actual)
    e64, a64 = expected.astype(np.float64), actual.astype(np.float64)
    finite = np.isfinite(e64) & np.isfinite(a64)
    nonfinite_match = bool(np.all(same | finite))
    if exact:
        atol, normwise = 0.0, None
        n_outside = n_differing
        ok = n_outside == 0
    elif normwise is not None:
        atol = 0.0
        n_outside = int(np.count_nonzero(~(same | finite)))
        dist, ref = _norms(expected, actual, noise_floor)
        ok = n_outside == 0 and dist <= normwise * ref
        return OutputCheck(name, expected.shape, dtype, exact, rtol, atol, max_abs, max_rel, n_differing, n_outside,
                           ok, nonfinite_match=nonfinite_match, normwise=normwise,
                           normwise_err=dist / ref if ref else 0.0)
    else:
        if atol is None:
            scale = np.abs(e64[np.isfinite(e64)]).max() if np.isfinite(e64).any() else 0.0
            atol = float((rtol if atol_factor is None else atol_factor) * scale)
        value_equal = (a64 == e64) | (np.isnan(a64) & np.isnan(e64))
        n_outside = int(np.count_nonzero(~(value_equal | (finite & (err <= rtol * np.abs(e64) + atol)))))
        ok = n_outside == 0
    return OutputCheck(name, expected.shape, dtype, exact, rtol, atol, max_abs, max_rel, n_differing, n_outside, ok,
                       nonfinite_match=nonfinite_match)


def _tiny(dtype) -> float:
    """The smallest normal number of a float dtype: TF flushes subnormal results to zero, ORT may not."""
    try:
        return float(np.finfo(dtype).tiny)
    except (TypeError, ValueError):
        import ml_dtypes

        return float(ml_dtypes.finfo(dtype).tiny)


def judge_output(name, expected, actual, exact=False, rtol=None, sum_rtol=None, atol=None, magnitude=None,
                 other_tf=None, terms=None) -> OutputCheck:
    """Judge one output as :func:`verify` does (see the module docstring).

    ``expected``: TF's reference (Eigen); ``actual``: ORT's. ``exact`` (and any non-float output): bit for bit.
    Otherwise ``|ort - tf| <= rtol*|tf| + atol + tiny``, plus ``sum_rtol * magnitude`` where ``magnitude``
    (Σ|terms| per element, converters.verify_magnitude) is given: the output is then judged as a sum, and
    ``terms`` (the number of terms summed per element, a scalar) raises the default ``sum_rtol`` to the
    summation-order bound ``2(n+1)u`` where that is larger (summation_coefficient); a ``sum_rtol`` the caller gives
    is used as given.
    ``other_tf``: TF's other kernel set (oneDNN) on the same inputs, for TF's spread.
    """
    expected, actual = np.asarray(expected), np.asarray(actual)
    dtype = expected.dtype.name
    is_float = expected.dtype.kind == "f" or dtype == "bfloat16"
    exact = exact or not is_float
    if exact or expected.shape != actual.shape or expected.dtype != actual.dtype:
        check = compare_output(name, expected, actual, exact=exact, rtol=rtol, atol=0.0)
        check.kind = "bits" if exact else ("sum" if magnitude is not None else "float")
        check.atol = 0.0
        inside = None
    else:
        rtol = DEFAULT_RTOL.get(dtype, 1e-5) if rtol is None else float(rtol)
        atol = 0.0 if atol is None else float(atol)
        same = same_bits(expected, actual)
        err, max_abs, max_rel = error_stats(expected, actual)
        e64, a64 = expected.astype(np.float64), actual.astype(np.float64)
        finite = np.isfinite(e64) & np.isfinite(a64)
        bound = rtol * np.abs(np.where(finite, e64, 0.0)) + atol + _tiny(expected.dtype)
        kind, note, coefficient = "float", "", 0.0
        if magnitude is not None:
            magnitude = np.asarray(magnitude, np.float64)
            if magnitude.shape == expected.shape:
                kind = "sum"
                if sum_rtol is None:
                    sum_rtol = DEFAULT_SUM_RTOL.get(dtype, 1e-5)
                    coefficient = summation_coefficient(dtype, sum_rtol, terms)
                else:  # the caller's own coefficient (--verify-sum-rtol), tighter or looser, is used as given
                    sum_rtol = float(sum_rtol)
                    coefficient = np.asarray(sum_rtol, np.float64)
                usable = np.isfinite(magnitude)  # an overflowed magnitude would accept anything: not used
                bound = bound + coefficient * np.where(usable, np.abs(magnitude), 0.0)
                if not usable.all():
                    note = f"magnitude not finite at {int(np.count_nonzero(~usable))} elements (judged by rtol there)"
            else:
                note = f"magnitude of shape {list(magnitude.shape)} ignored"
        value_equal = (a64 == e64) | (np.isnan(a64) & np.isnan(e64))
        inside = value_equal | (finite & (err <= bound))
        n_outside = int(np.count_nonzero(~inside))
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(err > 0, err / bound, 0.0)
        # Misplaced non-finite values (err 0 there) rank above every finite element.
        ratio = np.where(inside | finite, ratio, np.inf)
        worst = int(np.argmax(ratio)) if ratio.size else 0
        check = OutputCheck(
            name, expected.shape, dtype, False, rtol, atol, max_abs, max_rel, int(np.count_nonzero(~same)), n_outside,
            n_outside == 0, note, nonfinite_match=bool(np.all(same | finite)), kind=kind,
            sum_rtol=sum_rtol if kind == "sum" else 0.0, bound=float(bound.flat[worst]) if bound.size else 0.0,
            terms=float(np.max(terms)) if kind == "sum" and terms is not None else None,
            sum_coefficient=float(np.max(coefficient)) if kind == "sum" else 0.0,
            error=float(err.flat[worst]) if err.size else 0.0,
        )
    if other_tf is not None:
        _measure_spread(check, expected, np.asarray(other_tf))
    if not check.ok and not check.exact and inside is not None and check.nonfinite_match and check.spread is not None \
            and not check.spread_note:
        _, err_outside, _ = error_stats(expected[~inside], actual[~inside])
        if err_outside <= SPREAD_FACTOR * check.spread:
            check.ok = check.within_spread = True
            check.verdict = "ok: within TF's own spread" if err_outside <= check.spread else \
                "ok: within twice TF's own spread"
            return check
    check.verdict = _verdict(check)
    return check


def _measure_spread(check: OutputCheck, eigen, onednn) -> None:
    if eigen.shape != onednn.shape or eigen.dtype != onednn.dtype:
        check.spread_note = (f"TF's kernel sets give {eigen.dtype.name}{list(eigen.shape)} and "
                             f"{onednn.dtype.name}{list(onednn.shape)}")
        return
    if eigen.dtype.kind not in "fc" and eigen.dtype.name != "bfloat16":
        check.spread = float(np.count_nonzero(eigen != onednn))
        return
    _, spread, _ = error_stats(eigen, onednn)
    check.spread = spread
    e64, o64 = eigen.astype(np.float64), onednn.astype(np.float64)
    if not np.all((np.isfinite(e64) & np.isfinite(o64)) | (e64 == o64) | (np.isnan(e64) & np.isnan(o64))):
        check.spread_note = "TF's kernel sets disagree on non-finite values"


def _verdict(c: OutputCheck) -> str:
    if c.ok:
        return "ok"
    if not c.same_type:
        return f"FAIL: {c.note}"
    what = "differ in bits" if c.exact else "outside"
    text = f"FAIL: {c.n_outside} of {c.size} {what}"
    if not c.nonfinite_match:
        text += " (non-finite values misplaced)"
    return text


def _random_value(rng, elem_type, dims):
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 2 for d in dims]
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 4, shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    raise TypeError(f"cannot make a random input of type {dtype}")


def random_inputs(onnx_model, seed=0) -> dict:
    """Seeded standard-normal floats (small non-negative ints, random bools) for every graph input;
    unknown dims are 2."""
    rng = np.random.default_rng(seed)
    initializers = {t.name for t in onnx_model.graph.initializer}
    out = {}
    for vi in onnx_model.graph.input:
        if vi.name in initializers:
            continue
        tt = vi.type.tensor_type
        out[vi.name] = _random_value(rng, tt.elem_type, tt.shape.dim)
    return out


def session(onnx_model, threads: Optional[int] = None, log_severity_level: Optional[int] = None):
    """An ONNX Runtime CPU session of the model, with the custom-op library when the model uses the domain
    (a standard-lowered model runs in plain ONNX Runtime)."""
    import onnxruntime as ort

    import ort_ops

    uses_domain = any(imp.domain == DOMAIN for imp in onnx_model.opset_import)
    so = ort_ops.session_options() if uses_domain else ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    if log_severity_level is not None:
        so.log_severity_level = log_severity_level
    return ort.InferenceSession(onnx_model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def run_onnx(onnx_model, inputs: dict, threads: Optional[int] = None, log_severity_level: Optional[int] = None) -> dict:
    """Run the model in ONNX Runtime's CPU provider (see :func:`session`); outputs by name."""
    sess = session(onnx_model, threads, log_severity_level)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, inputs)))


def _one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:300]


def _run_other_tf(mode, source, source_error, inputs, keys):
    """(TF's outputs in ``mode`` by name from the child, or None; the reason when None)."""
    from converters import verify_tf_child

    if source is None:
        return None, f"the function could not be handed to a child process ({source_error})"
    try:
        flat = verify_tf_child.run_in_mode(mode, source, inputs)
    except verify_tf_child.ChildError as e:
        return None, str(e)
    if len(flat) != len(keys):
        return None, f"the child's function returned {len(flat)} outputs, {len(keys)} expected"
    return dict(zip(keys, flat)), ""


def _magnitudes(onnx_model, names, inputs, threads):
    """({output: Σ|terms| per element} for the outputs with a sum upstream, {output: terms summed per element},
    a note when that failed)."""
    from converters.verify_magnitude import companion

    if not names:
        return {}, {}, ""
    try:
        comp = companion(onnx_model, names)
        if not comp.outputs:
            return {}, {}, ""
        values = run_onnx(comp.model, inputs, threads, VERIFY_LOG_SEVERITY)
    except Exception as e:  # noqa: BLE001 - the verdicts say what this costs
        note = f"the magnitudes of sums could not be computed ({_one_line(e)}); sums were judged as plain floats"
        return {}, {}, note
    return ({name: values[mag] for name, mag in comp.outputs.items()},
            {name: values[count] for name, count in comp.terms.items()}, "")


def run_with_magnitudes(model, names, feeds, threads, additions=False):
    """Run ``model`` on ``feeds`` with the magnitudes of the ``names`` outputs that have a sum upstream (or an
    addition, with ``additions``; converters.verify_magnitude.companion): (its outputs by name, {output:
    Σ|terms|}, a note when the magnitudes could not be computed, {output: terms summed per element})."""
    from converters.verify_magnitude import companion

    try:
        comp = companion(model, names, additions=additions)
        values = run_onnx(comp.model, feeds, threads, VERIFY_LOG_SEVERITY)
    except Exception as e:  # noqa: BLE001 - the verdicts say what this costs
        note = f"the magnitudes of sums could not be computed ({_one_line(e)}); sums were judged as plain floats"
        return run_onnx(model, feeds, threads, VERIFY_LOG_SEVERITY), {}, note, {}
    magnitudes = {name: values.pop(mag) for name, mag in comp.outputs.items()}
    terms = {name: values.pop(count) for name, count in comp.terms.items()}
    return values, magnitudes, "", terms


def verify(
    onnx_model,
    tf_fn,
    inputs=None,
    seed: int = 0,
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
    exact_outputs=None,
    threads: Optional[int] = None,
    print_table: bool = True,
    sum_rtol: Optional[float] = None,
    spread: bool = True,
    json_path=None,
    tf_source: Optional[dict] = None,
    step_bound: Optional[float] = None,
) -> VerifyReport:
    """Run ``tf_fn`` and ``onnx_model`` on the same inputs and judge each output (see the module docstring).

    ``inputs``: a dict by ONNX input name, a list in ONNX input order, or None for :func:`random_inputs` with
    ``seed``. ``exact_outputs``: names to hold bit-exact in addition to the outputs of quantization ops (found
    by tracing the TF graph). ``rtol``: the float tolerance (default DEFAULT_RTOL of the output's type);
    ``sum_rtol``: a sum's tolerance in units of the magnitude of what was summed (default DEFAULT_SUM_RTOL);
    ``atol``: an absolute slack added to every float bound (default none). ``spread``: also run TF's oneDNN
    kernels in a child process and report TF's own spread (costs a TF import there, once per process).
    ``tf_source``: how the child loads the function (see converters.verify_tf_child; default: ``tf_fn``
    frozen to a GraphDef). An integer model (converters.integer) has its quantized outputs judged in quantization
    steps against ``step_bound`` (default converters.integer.steps.DEFAULT_STEP_BOUND). ``json_path``: also write :meth:`VerifyReport.to_json` there. Prints the table
    unless ``print_table`` is false; ``report.ok`` says whether every output passed.
    """
    import tensorflow as tf

    from converters import verify_tf_child

    initializers = {t.name for t in onnx_model.graph.initializer}
    graph_inputs = [vi.name for vi in onnx_model.graph.input if vi.name not in initializers]
    if inputs is None:
        inputs = random_inputs(onnx_model, seed)
    elif not isinstance(inputs, dict):
        inputs = dict(zip(graph_inputs, inputs))
    inputs = {name: np.asarray(inputs[name]) for name in graph_inputs}

    cf = _concrete_function(tf_fn, inputs)
    mode = verify_tf_child.process_mode() or "eigen"
    child_mode = "onednn" if mode == "eigen" else "eigen"
    need_child = spread or mode == "onednn"  # oneDNN here: the Eigen reference must come from a child
    source, source_error = tf_source, ""
    if need_child and source is None:
        try:
            source = verify_tf_child.frozen_source(cf)  # before the run below: a training step assigns variables
        except Exception as e:  # noqa: BLE001 - reported in one line
            source_error = _one_line(e)

    result = _run_tf(cf, inputs)
    onnx_names = [o.name for o in onnx_model.graph.output]
    # cf.outputs are the graph tensors of the flattened structured outputs, in the same order.
    graph_outputs = [t for t in cf.outputs if t.dtype != tf.dtypes.resource]
    if isinstance(result, dict):
        keys = tf.nest.flatten({k: k for k in result})
        here = {k: np.asarray(v) for k, v in result.items()}
    else:
        flat_values = [np.asarray(v) for v in tf.nest.flatten(result)]
        if len(flat_values) != len(onnx_names):
            raise ValueError(f"TF returned {len(flat_values)} outputs, the ONNX model has {len(onnx_names)}")
        keys = list(onnx_names)
        here = dict(zip(keys, flat_values))
    # Outputs exact from the inputs in the function's own graph (a tf.function's; a SavedModel signature's graph is
    # a call, traced through by the converter's record instead).
    traced_exact = {k for k, t in zip(keys, graph_outputs) if producer_type(t) in QUANTIZATION_OPS and exact_cone(t)}
    for name in onnx_names:
        if name not in here:
            raise ValueError(f"ONNX output {name!r} has no TF counterpart (TF outputs: {sorted(here)})")

    other, other_error = (None, "")
    if need_child:
        other, other_error = _run_other_tf(child_mode, source, source_error, inputs, keys)
    if mode == "eigen":
        reference, onednn = here, other
        tf_reference = "TF reference: Eigen kernels (TF_ENABLE_ONEDNN_OPTS=0), in this process"
        if not spread:
            tf_spread = "TF spread: not measured (spread off)"
        elif other is not None:
            tf_spread = "TF spread: oneDNN kernels (TF_ENABLE_ONEDNN_OPTS=1) in a child process, same inputs"
        else:
            tf_spread = f"TF spread: not measured, the oneDNN run failed: {other_error}"
    elif other is not None:
        reference, onednn = other, here
        tf_reference = ("TF reference: Eigen kernels, in a child process (this process imported TF with oneDNN on; "
                        "set TF_ENABLE_ONEDNN_OPTS=0 before importing TF to run Eigen here)")
        tf_spread = "TF spread: oneDNN kernels, in this process"
    else:
        reference, onednn = here, None
        tf_reference = (f"TF reference: oneDNN kernels, in this process: TF was imported with oneDNN on and the "
                        f"Eigen run failed ({other_error}); the project's exactness claims are made against Eigen")
        tf_spread = "TF spread: not measured"

    ort_values = run_onnx(onnx_model, inputs, threads, VERIFY_LOG_SEVERITY)
    # Bit-exact outputs: a quantizer's output whose whole cone of inputs is exact (converters.exact_outputs), as
    # the converter recorded it (it traced the frozen graph, which sees through SavedModel call wrappers) or as
    # traced here in the TF function's own graph.
    exact_names = set(exact_outputs or ()) | recorded_exact_outputs(onnx_model) | traced_exact
    exact = {name: name in exact_names for name in onnx_names}
    notes = []
    step_checks = []
    integer = read_integer_summary(onnx_model)
    if integer is not None:
        from converters.integer.steps import DEFAULT_STEP_BOUND, judge_steps

        steps = integer[1]
        bound = DEFAULT_STEP_BOUND if step_bound is None else step_bound
        step_checks = [judge_steps(n, reference[n], ort_values[n], steps[n], bound,
                                   None if onednn is None else onednn.get(n)) for n in onnx_names if n in steps]
        onnx_names = [n for n in onnx_names if n not in steps]
        exact = {n: False for n in onnx_names}  # nothing of an integer model is TF's float to the bit
    floats = [n for n in onnx_names
              if not exact[n] and (reference[n].dtype.kind == "f" or reference[n].dtype.name == "bfloat16")]
    magnitudes, terms, magnitude_note = _magnitudes(onnx_model, floats, inputs, threads)
    if magnitude_note:
        notes.append(magnitude_note)
    checks = [
        judge_output(name, reference[name], ort_values[name], exact[name], rtol, sum_rtol, atol, magnitudes.get(name),
                     None if onednn is None else onednn.get(name), terms.get(name))
        for name in onnx_names
    ]
    report = VerifyReport(checks, inputs, notes, tf_reference, tf_spread, step_checks)
    if json_path is not None:
        report.to_json(json_path)
    if print_table:
        print(report.table())
    return report


def verify_saved_model(path, onnx_model, signature_key="serving_default", tags=None, **kw) -> VerifyReport:
    """verify() against one signature of a SavedModel (outputs matched by name)."""
    import tensorflow as tf

    loaded = tf.saved_model.load(str(path), tags=tags)
    source = {"kind": "saved_model", "path": os.path.abspath(str(path)), "signature_key": signature_key, "tags": tags}
    kw.setdefault("tf_source", source)
    try:
        return verify(onnx_model, loaded.signatures[signature_key], **kw)
    finally:
        del loaded  # the signature function needs the loaded object alive until here


def verify_graph_def(graph_def, input_names, output_names, onnx_model, **kw) -> VerifyReport:
    """verify() against a GraphDef (a proto or a .pb path)."""
    if not hasattr(graph_def, "node"):
        from converters.frontends import load_graph_def

        graph_def = load_graph_def(graph_def)
    kw.setdefault("tf_source", {"kind": "graph_def", "graph_def": graph_def.SerializeToString(),
                                "inputs": list(input_names), "outputs": list(output_names)})
    return verify(onnx_model, graph_def_function(graph_def, input_names, output_names), **kw)


def verify_keras(model, onnx_model, **kw) -> VerifyReport:
    """verify() against a Keras model called with training=False (TF's other kernel set runs a frozen copy; pass
    ``tf_source={"kind": "keras", "path": FILE}`` to have it load a tf_keras file instead)."""
    return verify(onnx_model, model, **kw)
