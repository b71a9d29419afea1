"""Comparing the library's outputs with TensorFlow's, by the conformance suite's own rules (imported from
``tests/``, not restated): quantization ops bit for bit with the summed FakeQuant gradients to their
tolerance (tests/comparison.py), batch norm to tests/test_batch_norm.py's ``assert_close`` and
depthwise to tests/test_depthwise.py's ``assert_close`` (each module's docstring justifies its tolerance).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import numpy as np

import ort_ops
from tools.fuzz.cases import Case

TESTS = Path(__file__).resolve().parents[2] / "tests"


def _suite():
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    import comparison
    import test_batch_norm
    import test_depthwise

    return comparison, test_batch_norm, test_depthwise


def undefined_outputs(case: Case) -> tuple:
    """Outputs TF leaves undefined, so there is nothing to compare: reserve_space_1/2 of the forward batch
    norms in inference mode and for an empty x (TF's Eigen kernel never writes them; the spec's deviation
    "reserve_space_1/2 hold the given mean/variance in inference mode ..." documents what the library does)."""
    spec = ort_ops.get_spec(case.op)
    if spec.family != "batch_norm" or "Grad" in case.op:
        return ()
    attrs = spec.with_defaults(case.attrs)
    if not attrs["is_training"] or np.asarray(case.inputs[0]).size == 0:
        return (3, 4)
    return ()


def mismatch(case: Case, expected, actual) -> Optional[str]:
    """None when the library's outputs ``actual`` agree with TF's ``expected``, else what differs."""
    comparison, batch_norm, depthwise = _suite()
    if len(expected) != len(actual):
        return f"{len(actual)} outputs, TF gives {len(expected)}"
    family = ort_ops.get_spec(case.op).family
    if family in ("fake_quant", "quantize_dequantize", "fused"):  # the fused op's output is a quantizer's
        return comparison.quantization_mismatch(case.op, case.inputs, list(expected), list(actual))
    skip = undefined_outputs(case)
    for k, (want, got) in enumerate(zip(expected, actual)):
        if k in skip:
            continue
        try:
            if family == "batch_norm":
                batch_norm.assert_close(got, want, f"output {k}")
            else:
                depthwise.assert_close(case.op, np.asarray(got), np.asarray(want), case.inputs, case.attrs,
                                       f"output {k}")
        except AssertionError as e:
            return str(e).split("\n")[0]
        except Exception as e:  # noqa: BLE001 - e.g. the reference refusing what both sides ran
            return f"output {k} could not be compared: {type(e).__name__}: {e}"
    return None
