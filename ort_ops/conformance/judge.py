"""Comparing what an implementation gave with TF's output under a rule (``rules.Rule``).

``mismatch`` returns None when the output passes, else a one-line reason; ``error_ratio`` the worst
|got - want| / bound of a passing bounded output (0 for exact ones), for reports.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ort_ops.conformance.rules import BITS, PLACEHOLDER, Rule

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _float64(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64)


def _header(want, got) -> Optional[str]:
    if want.dtype != got.dtype or want.shape != got.shape:
        return f"dtype/shape {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
    return None


def bits_mismatch(want, got) -> Optional[str]:
    """Every byte equal (signed zeros and NaN payloads included)."""
    want, got = np.asarray(want), np.asarray(got)
    why = _header(want, got)
    if why or want.size == 0:
        return why
    uint = _UINT[want.dtype.itemsize]
    w, g = want.reshape(-1).view(uint), np.ascontiguousarray(got).reshape(-1).view(uint)
    differ = np.flatnonzero(w != g)
    if differ.size == 0:
        return None
    i = int(differ[0])
    return (f"{differ.size} of {want.size} values differ, first at {np.unravel_index(i, want.shape)}: "
            f"{got.reshape(-1)[i]!r} (bits {int(g[i]):#x}), expected {want.reshape(-1)[i]!r} (bits {int(w[i]):#x})")


def bounded_mismatch(want, got, bound) -> Optional[str]:
    """NaN positions equal, infinities equal, every finite value within ``bound`` (a number or an array)."""
    want, got = np.asarray(want), np.asarray(got)
    why = _header(want, got)
    if why or want.size == 0:
        return why
    w, g = _float64(want), _float64(got)
    nan_w, nan_g = np.isnan(w), np.isnan(g)
    if (nan_w != nan_g).any():
        i = int(np.flatnonzero((nan_w != nan_g).reshape(-1))[0])
        return (f"NaN positions differ ({int((nan_w != nan_g).sum())}), first at {np.unravel_index(i, w.shape)}: "
                f"{g.reshape(-1)[i]!r}, expected {w.reshape(-1)[i]!r}")
    inf_w = np.isinf(w)
    if (inf_w != np.isinf(g)).any() or not np.array_equal(g[inf_w], w[inf_w]):
        return f"infinities differ: {int(np.isinf(g).sum())} in the output, expected {int(inf_w.sum())} (signs must match too)"
    finite = np.isfinite(w)
    with np.errstate(invalid="ignore"):  # inf - inf where both are the same infinity
        err = np.abs(g - w)
    limit = np.broadcast_to(np.asarray(bound, dtype=np.float64), w.shape)
    over = finite & ~(err <= limit)
    if over.any():
        i = int(np.argmax(np.where(over, err - limit, -np.inf).reshape(-1)))
        at = np.unravel_index(i, w.shape)
        return (f"{int(over.sum())} of {w.size} values off by more than the bound, worst at {at}: "
                f"{g[at]!r}, expected {w[at]!r} (|error| {err[at]:.3g} > bound {limit[at]:.3g})")
    return None


def mismatch(rule: Rule, want, got) -> Optional[str]:
    """None when ``got`` passes ``rule`` against TF's ``want``, else the reason."""
    if rule.judge == PLACEHOLDER:
        return None
    if rule.judge == BITS:
        return bits_mismatch(want, got)
    return bounded_mismatch(want, got, rule.bound)


def outputs_mismatch(rules, wants, gots) -> Optional[str]:
    """None when every output in ``gots`` passes its rule against TF's ``wants``, else the first reason."""
    if len(gots) != len(wants):
        return f"{len(gots)} outputs, expected {len(wants)}"
    for k, (rule, want, got) in enumerate(zip(rules, wants, gots)):
        why = mismatch(rule, want, got)
        if why:
            return f"output {k} ({rule.judge}): {why}"
    return None


def error_ratio(rule: Rule, want, got) -> float:
    """The worst |got - want| / bound over the finite values (0 for bit-exact and placeholder outputs)."""
    if rule.judge in (BITS, PLACEHOLDER):
        return 0.0
    w, g = _float64(np.asarray(want)), _float64(np.asarray(got))
    finite = np.isfinite(w) & np.isfinite(g)
    if not finite.any():
        return 0.0
    limit = np.broadcast_to(np.asarray(rule.bound, dtype=np.float64), w.shape)[finite]
    with np.errstate(divide="ignore", invalid="ignore"):
        err = np.abs(g - w)[finite]
        ratio = np.where(err == 0, 0.0, err / limit)
    return float(np.max(ratio))


def rejection_mismatch(phrases, message: str) -> Optional[str]:
    """None when the implementation's ``message`` contains every phrase (the op's name, TF's words)."""
    missing = [p for p in phrases if p not in message]
    return None if not missing else f"the message lacks {missing!r}: {message!r}"
