"""How quantization outputs are compared with TensorFlow's: bit for bit, NaN signs and payloads included.

The one exception is the outputs the spec flags ``summed`` (the min/max gradients of
FakeQuantWithMinMaxVarsGradient and ...PerChannelGradient): which NaN, and which rounding, a sum keeps
depends on its order.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import ort_ops
from backends import BackendError, run


def bit_mismatch(expected, actual):
    """None when ``actual`` equals ``expected`` bit for bit (NaN signs and payloads included), else why not."""
    expected, actual = np.asarray(expected), np.asarray(actual)
    if expected.dtype != actual.dtype or expected.shape != actual.shape:
        return f"dtype/shape {actual.dtype}{actual.shape} != {expected.dtype}{expected.shape}"
    nan_e, nan_a = np.isnan(expected), np.isnan(actual)
    if (nan_e != nan_a).any():
        return "NaN positions differ"
    uint = {4: np.uint32, 8: np.uint64}[expected.dtype.itemsize]
    diff = (expected.view(uint) != actual.view(uint))
    if diff.any():
        i = np.flatnonzero(diff.reshape(-1))[0]
        return f"{diff.sum()} values differ, first at {i}: {actual.reshape(-1)[i]!r} != {expected.reshape(-1)[i]!r}"
    return None


def sum_mismatch(expected, actual, gradients):
    """Summed outputs may be accumulated in any order: within 1e-6 * sum|g|, NaN-ness equal."""
    expected, actual = np.asarray(expected), np.asarray(actual)
    if expected.dtype != actual.dtype or expected.shape != actual.shape:
        return f"dtype/shape {actual.dtype}{actual.shape} != {expected.dtype}{expected.shape}"
    if (np.isnan(expected) != np.isnan(actual)).any():
        return "NaN positions differ"
    g = np.abs(np.asarray(gradients, dtype=np.float64))
    tol = 1e-6 * g[np.isfinite(g)].sum()
    ok = np.isnan(expected) | (expected == actual) | (np.abs(expected.astype(np.float64) - actual) <= tol)
    return None if ok.all() else f"sums differ: {actual} != {expected} (tolerance {tol})"


def outputs_mismatch(op, inputs, expected, actual):
    """Every output bit for bit, except the spec's summed outputs (to ``sum_mismatch``'s tolerance)."""
    if len(expected) != len(actual):
        return f"{len(actual)} outputs, expected {len(expected)}"
    summed = ort_ops.get_spec(op).summed_outputs()
    for k, (e, a) in enumerate(zip(expected, actual)):
        why = sum_mismatch(e, a, inputs[0]) if k in summed else bit_mismatch(e, a)
        if why:
            return f"output {k}: {why}"
    return None


def key_phrase(message: str) -> str:
    """The part of TF's message before the first number: what every implementation must say."""
    return re.split(r"[-+]?\d", message, maxsplit=1)[0].strip(" :,")


def check_error(op, backend, inputs, attrs, tf_message):
    """The backend rejects the input with a message that names the op and carries TF's key phrase."""
    with pytest.raises(BackendError) as info:
        run(backend, op, inputs, attrs)
    text = str(info.value)
    assert op in text, f"error does not name the op: {text}"
    assert key_phrase(tf_message) in text, f"{text!r} lacks {key_phrase(tf_message)!r}"
