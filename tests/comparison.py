"""How the suite compares what an implementation gives with what it should give, in one place.

* Bit for bit: ``bits_mismatch`` / ``assert_bits_equal``, built on the product's own primitive
  (``converters.verification.same_bits``). +0 and -0 differ; NaNs must sit in the same places, and with
  ``nan_payloads`` (the default) carry the same sign and payload. Where which NaN survives depends on an
  order the claim does not fix (a sum, which operand the CPU propagates), callers pass
  ``nan_payloads=False``.
* Sums whose order TF does not fix (the outputs the spec flags ``summed``): ``sum_mismatch``.
* The quantization ops against TF: ``quantization_mismatch`` (every output bit for bit, the summed ones to
  ``sum_mismatch``'s tolerance).
* Rejections: ``key_phrase`` / ``check_error`` (the op's name and TF's message up to its first number).

The ``*_mismatch`` functions return None when the arrays agree, else a one-line reason.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pytest

import ort_ops
from backends import BackendError, run
from converters.verification import same_bits
from ort_ops.conformance import judge, rules
from ort_ops.conformance.rules import key_phrase  # noqa: F401 (the suite's name for it)


def _isnan(a):
    if a.dtype.kind in "iub":
        return np.zeros(a.shape, bool)
    return np.isnan(a.astype(np.float64) if a.dtype.name == "bfloat16" else a)


def bits_mismatch(want, got, nan_payloads: bool = True) -> Optional[str]:
    """None when ``got`` equals ``want`` bit for bit (signed zeros included; NaN payloads and signs too
    when ``nan_payloads``, else only the NaN positions)."""
    want, got = np.asarray(want), np.asarray(got)
    if want.dtype != got.dtype or want.shape != got.shape:
        return f"dtype/shape {got.dtype}{got.shape} != {want.dtype}{want.shape}"
    nan_w, nan_g = _isnan(want), _isnan(got)
    if (nan_w != nan_g).any():
        i = np.flatnonzero((nan_w != nan_g).reshape(-1))[0]
        return (f"NaN positions differ ({int((nan_w != nan_g).sum())}), first at {i}: "
                f"{got.reshape(-1)[i]!r} != {want.reshape(-1)[i]!r}")
    diff = ~same_bits(want, got, nan_payloads)
    if diff.any():
        uint = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[want.dtype.itemsize]
        flat = np.flatnonzero(diff.reshape(-1))
        i = flat[0]
        w, g = want.reshape(-1)[i], got.reshape(-1)[i]
        return (f"{flat.size} of {diff.size} values differ, first at {np.unravel_index(i, want.shape)}: "
                f"{g!r} (bits {int(got.view(uint).reshape(-1)[i]):#x}) != {w!r} (bits {int(want.view(uint).reshape(-1)[i]):#x})")
    return None


def assert_bits_equal(want, got, what, nan_payloads: bool = True):
    """``bits_mismatch`` as an assertion, its message led by ``what``."""
    why = bits_mismatch(want, got, nan_payloads)
    assert why is None, f"{what}: {why}"


def sum_mismatch(expected, actual, gradients) -> Optional[str]:
    """Summed outputs may be accumulated in any order: within 1e-6 * sum|g|, NaN-ness equal."""
    return judge.bounded_mismatch(expected, actual, rules.sum_bound(gradients))


def outputs_mismatch(expected, actual, summed=(), gradients=None) -> Optional[str]:
    """Every output bit for bit (NaN payloads included), except those at the indices ``summed``: to
    ``sum_mismatch``'s tolerance for the terms ``gradients``."""
    if len(expected) != len(actual):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for k, (e, a) in enumerate(zip(expected, actual)):
        why = sum_mismatch(e, a, gradients) if k in summed else bits_mismatch(e, a)
        if why:
            return f"output {k}: {why}"
    return None


def quantization_mismatch(op, inputs, expected, actual) -> Optional[str]:
    """A quantization op's outputs against TF's: bit for bit, the spec's summed outputs (FakeQuant's min/max
    gradients, sums of ``inputs[0]``) to ``sum_mismatch``'s tolerance."""
    return outputs_mismatch(expected, actual, ort_ops.get_spec(op).summed_outputs(), inputs[0])


def check_error(op, backend, inputs, attrs, tf_message):
    """The backend rejects the input with a message that names the op and carries TF's key phrase."""
    with pytest.raises(BackendError) as info:
        run(backend, op, inputs, attrs)
    text = str(info.value)
    assert op in text, f"error does not name the op: {text}"
    assert key_phrase(tf_message) in text, f"{text!r} lacks {key_phrase(tf_message)!r}"
