"""The library's documented deviations from TF, each recognised by name and by a precise predicate.

A disagreement is "documented: <name>" only when an entry here covers its op and its class and its
predicate holds; every entry quotes (by prefix) one of the op spec's ``deviations``, the texts docs/ops.md
shows next to the op (``check()`` verifies the quotes). Anything else is a finding.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import numpy as np

import ort_ops
from tools.fuzz.cases import Case

BN_GRADS = ("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3")
DEPTHWISE = ("DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter")
BACKPROPS = DEPTHWISE[1:]


class Deviation(NamedTuple):
    name: str
    ops: tuple
    cls: str  # the class it explains: only_tf_rejects, only_lib_rejects, mismatch or crash_tf
    documented: str  # a prefix of one of each op's spec deviations
    applies: Callable  # (case, tf_result, lib_result) -> bool


def _tf_says(result, text):
    return text in result.get("message", "")


def _attrs(case):
    return ort_ops.get_spec(case.op).with_defaults(case.attrs)


def _dilated(case):
    attrs = _attrs(case)
    return any(d != 1 for d in attrs["dilations"])


def _pads(case):
    """Whether the op's window reaches over padding (SAME with a nonzero total, or nonzero EXPLICIT)."""
    attrs = _attrs(case)
    if attrs["padding"] == "EXPLICIT":
        return any(attrs["explicit_paddings"])
    return attrs["padding"] == "SAME"


def _non_finite(*arrays):
    return any(not np.all(np.isfinite(np.asarray(a, dtype=np.float64))) for a in arrays)


def _only_extra_tf_nans(case, tf, lib):
    """The outputs differ only where TF has NaN and the library a number (then the comparison's own rule)."""
    from tools.fuzz.compare import mismatch

    want, got = np.asarray(tf["outputs"][0]), np.asarray(lib["outputs"][0])
    if want.shape != got.shape or want.dtype != got.dtype:
        return False
    extra = np.isnan(want.astype(np.float64)) & ~np.isnan(got.astype(np.float64))
    if not extra.any():
        return False
    patched = want.copy()
    patched[extra] = got[extra]
    return mismatch(case, [patched], [got]) is None


def _padding_taps(case, tf, lib):
    """A non-finite value meets the padding: filter taps (forward, BackpropInput) or out_backprop
    (BackpropFilter) times a padded zero is NaN in TF's Eigen kernel and an exact zero here, and that is the
    only difference. BackpropInput pads out_backprop whatever the padding (it is a transposed convolution),
    the others only with SAME or a nonzero EXPLICIT padding."""
    if case.op == "DepthwiseConv2dNativeBackpropFilter":
        meets = _pads(case) and _non_finite(case.inputs[2])
    elif case.op == "DepthwiseConv2dNativeBackpropInput":
        meets = _non_finite(case.inputs[1])
    else:
        meets = _pads(case) and _non_finite(case.inputs[1])
    return meets and _only_extra_tf_nans(case, tf, lib)


def _only_x_backprop_rank_differs(case, tf, lib):
    """An empty 5-D x whose x_backprop TF returns 4-D, and every other output agrees."""
    from tools.fuzz.compare import mismatch

    x = np.asarray(case.inputs[1])
    if x.ndim != 5 or x.size or np.ndim(tf["outputs"][0]) != 4:
        return False
    reshaped = [np.reshape(tf["outputs"][0], x.shape)] + list(tf["outputs"][1:])
    return mismatch(case, reshaped, lib["outputs"]) is None


def _per_axis_range(case, tf, lib):
    attrs = _attrs(case)
    return attrs["axis"] >= 0 and attrs["range_given"] and _tf_says(tf, "must be a scalar")


DEVIATIONS = (
    Deviation(
        "batch-norm-grad-inference-channels-first", BN_GRADS, "only_tf_rejects", "is_training=0 accepts NCHW/NCDHW",
        lambda case, tf, lib: not _attrs(case)["is_training"] and _attrs(case)["data_format"].startswith("NC")
        and _tf_says(tf, "only support NHWC tensor format"),
    ),
    Deviation(
        "depthwise-nchw", DEPTHWISE, "only_tf_rejects", "NCHW is supported",
        lambda case, tf, lib: _attrs(case)["data_format"] == "NCHW"
        and _tf_says(tf, "only supported for NHWC format"),
    ),
    Deviation(
        "depthwise-dilations-forward", DEPTHWISE[:1], "only_tf_rejects", "dilations > 1 compute the true dilated",
        lambda case, tf, lib: _dilated(case) and _tf_says(tf, "does not support dilations"),
    ),
    Deviation(
        "depthwise-dilations-backprops", BACKPROPS, "mismatch", "dilations > 1 compute the true dilated",
        lambda case, tf, lib: _dilated(case),
    ),
    Deviation(
        "depthwise-dilations-backprops-shape", BACKPROPS, "only_tf_rejects", "dilations > 1 compute the true dilated",
        lambda case, tf, lib: _dilated(case) and _tf_says(tf, "doesn't match computed"),
    ),
    Deviation(
        "depthwise-padding-taps", DEPTHWISE, "mismatch", "Padding taps contribute exact zeros", _padding_taps,
    ),
    Deviation(
        "depthwise-backprop-filter-empty-out-backprop", DEPTHWISE[2:], "mismatch", "An empty out_backprop gives a zero",
        lambda case, tf, lib: np.asarray(case.inputs[2]).size == 0,
    ),
    Deviation(
        "depthwise-backprop-input-empty-out-backprop", DEPTHWISE[1:2], "mismatch", "An empty out_backprop (channel",
        lambda case, tf, lib: np.asarray(case.inputs[2]).size == 0,
    ),
    Deviation(
        "batch-norm-grad-empty-5d-x", BN_GRADS, "mismatch", "For an empty 5-D x, x_backprop has x's shape",
        lambda case, tf, lib: _only_x_backprop_rank_differs(case, tf, lib),
    ),
    Deviation(
        "qdq-v3-non-scalar-range", ("QuantizeAndDequantizeV3",), "only_lib_rejects",
        "axis < -1 and non-scalar input_min/input_max with axis=-1 are rejected",
        lambda case, tf, lib: _attrs(case)["axis"] == -1 and max(np.ndim(case.inputs[1]), np.ndim(case.inputs[2])) > 0
        and "must be a scalar" in lib.get("message", ""),
    ),
    Deviation(
        "qdq-per-axis-range-given", ("QuantizeAndDequantizeV2", "QuantizeAndDequantizeV4"), "only_tf_rejects",
        "Per-axis with range_given=1 takes input_min/input_max vectors", _per_axis_range,
    ),
)


def find(case: Case, cls: str, tf_result: dict, lib_result: dict, deviations=DEVIATIONS) -> Optional[Deviation]:
    """The documented deviation that explains this disagreement, or None."""
    for d in deviations:
        if case.op in d.ops and d.cls == cls:
            try:
                if d.applies(case, tf_result, lib_result):
                    return d
            except ort_ops.OpError:  # attributes the spec refuses: no deviation is about those
                continue
    return None


def check(deviations=DEVIATIONS) -> list:
    """Problems with the list itself: duplicate names, or a quote that no spec deviation of the op starts with."""
    problems = []
    names = [d.name for d in deviations]
    problems += [f"duplicate deviation name {n}" for n in set(names) if names.count(n) > 1]
    for d in deviations:
        for op in d.ops:
            if not any(text.startswith(d.documented) for text in ort_ops.get_spec(op).deviations):
                problems.append(f"{d.name}: {op} documents no deviation starting {d.documented!r}")
    return problems
