"""Helpers for golden generators: run one TF raw op on NumPy inputs and record the outcome as a case.

A case records TF's outputs, or TF's error message (without TF's "{{function_node ...}}" prefix and
"[Op:...]" suffix) for input TF rejects. Never feed a case that makes TF abort the process.

Importing this module pins TF to its Eigen kernels (``TF_ENABLE_ONEDNN_OPTS=0``) unless the caller pinned a
mode already: TF's default depends on the CPU (oneDNN on with AVX-512), and the goldens must not.
"""
from __future__ import annotations

import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # noqa: E402


def check_tf_mode(onednn: bool) -> None:
    """Stop a generator whose TF does not run the kernels it claims to record."""
    from tensorflow.python.util import _pywrap_util_port

    if bool(_pywrap_util_port.IsMklEnabled()) != onednn:
        raise SystemExit(f"TensorFlow's oneDNN mode is {not onednn}, expected {onednn}: set TF_ENABLE_ONEDNN_OPTS")


def tf_error_message(exc) -> str:
    msg = getattr(exc, "message", str(exc))
    msg = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", msg)
    msg = re.sub(r"\s*\[Op:[^\]]*\].*$", "", msg, flags=re.S)
    return msg.strip()


def run_tf(op: str, inputs, attrs: dict):
    """(outputs, None) or (None, message) from TF's computation of ``op`` (``_fused_chain.tf_op``: its raw op
    called with the spec's input names, or for a fused op, which TF has none of, the chain of ops it fuses)."""
    import tensorflow as tf

    from tools.goldens._fused_chain import tf_op

    try:
        result = tf_op(op, [np.asarray(x) for x in inputs], attrs)
    except (tf.errors.OpError, ValueError, TypeError) as e:
        return None, tf_error_message(e)
    return [np.asarray(r.numpy()) for r in result], None


def tf_case(op: str, inputs, attrs: dict, note: str) -> dict:
    outputs, error = run_tf(op, inputs, attrs)
    case = {"attrs": dict(attrs), "inputs": [np.asarray(x) for x in inputs], "note": note}
    if error is not None:
        case["error"] = error
    else:
        case["outputs"] = outputs
    return case


def neighbours(values, dtype):
    """Each value, and one ulp below and above it, in ``dtype``."""
    v = np.asarray(values, dtype=dtype)
    with np.errstate(all="ignore"):
        return np.concatenate([v, np.nextafter(v, dtype(-np.inf)), np.nextafter(v, dtype(np.inf))]).astype(dtype)


def specials(dtype):
    """±0, ±inf, NaN, the smallest subnormal, the largest finite value and their negatives."""
    fi = np.finfo(dtype)
    tiny = np.nextafter(dtype(0), dtype(1))
    return np.array([0.0, -0.0, np.inf, -np.inf, np.nan, tiny, -tiny, fi.tiny, -fi.tiny, fi.max, -fi.max], dtype=dtype)
