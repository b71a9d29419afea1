"""Shrinking a finding to a small reproducer, and printing it as a runnable Python snippet.

``minimize(case, judge)`` tries simpler variants of the case and keeps one whenever ``judge`` (a case ->
Verdict function, normally both sides run and classified) gives the same class as the original. Variants,
biggest step first: every dimension of one size cut to 1 or to half across all inputs at once (so that
shapes which must agree keep agreeing; shape-input values of that size follow), attributes back to their
defaults, and values made simpler: blocks of elements set to 0 or 1, then each element rounded.
"""
from __future__ import annotations

import math
from typing import Callable, Iterator

import numpy as np

import ort_ops
from tools.fuzz.cases import Case, is_safe


def _sizes(case: Case) -> list:
    sizes = set()
    for x in case.inputs:
        sizes.update(d for d in np.shape(x) if d > 1)
    return sorted(sizes, reverse=True)


def _cut(case: Case, size: int, start: int, new: int, axis=None) -> Case:
    """Every axis of length ``size`` (only at position ``axis`` if given) cut to entries [start, start + new);
    int32 shape values equal to ``size`` become ``new`` too (when every such axis is cut)."""
    inputs = []
    for x in case.inputs:
        x = np.asarray(x)
        cut = [d == size and (axis is None or k == axis) for k, d in enumerate(x.shape)]
        shape = tuple(new if c else d for c, d in zip(cut, x.shape))
        if x.size == 0:  # (a huge dim beside a zero one: nothing to copy, never an index of that size)
            x = np.zeros(shape, x.dtype)
        else:
            x = x[tuple(slice(start, start + new) if c else slice(None) for c in cut)]
        if x.dtype == np.int32 and x.ndim == 1 and axis is None:
            x = np.where(x == size, new, x).astype(np.int32)
        inputs.append(x)
    return case.replace(inputs=inputs)


def _shape_variants(case: Case) -> Iterator[Case]:
    """Per dimension size, first on every axis of that size, then on one axis position at a time (where two
    axes share a size): each half, then each single entry (at most 16 of them, spread out)."""
    for size in _sizes(case):
        positions = sorted({k for x in case.inputs for k, d in enumerate(np.shape(x)) if d == size})
        for axis in [None] + (positions if len(positions) > 1 else []):
            half = size // 2
            yield _cut(case, size, 0, half, axis)
            yield _cut(case, size, half, size - half, axis)
            for start in sorted(set(np.linspace(0, size - 1, min(size, 16)).astype(int).tolist())):
                yield _cut(case, size, start, 1, axis)


def _attr_variants(case: Case) -> Iterator[Case]:
    spec = ort_ops.get_spec(case.op)
    for name in list(case.attrs):
        attr = spec.attr(name) if name in {a.name for a in spec.attrs} else None
        if attr is not None and not attr.required:
            yield case.replace(attrs={k: v for k, v in case.attrs.items() if k != name})


def _float_inputs(case: Case):
    return [k for k, x in enumerate(case.inputs)
            if np.asarray(x).dtype.kind == "f" or np.asarray(x).dtype.name == "bfloat16"]


def _with(case: Case, k: int, value: np.ndarray) -> Case:
    inputs = list(case.inputs)
    inputs[k] = value
    return case.replace(inputs=inputs)


def _value_variants(case: Case) -> Iterator[Case]:
    for k in _float_inputs(case):
        x = np.asarray(case.inputs[k])
        n = x.size
        block = n
        while block >= 1 and n:
            for start in range(0, n, block):
                for simpler in ((0.0,), (0.0, 1.0)):  # +0 is simplest, then 1; never back to a less simple value
                    simple = simpler[-1]
                    flat = x.reshape(-1).copy()
                    part = flat[start:start + block].astype(np.float64)
                    if np.all(np.isin(part, simpler) & ~np.signbit(part)):
                        continue
                    flat[start:start + block] = simple
                    yield _with(case, k, flat.reshape(x.shape))
            block //= 2
        with np.errstate(all="ignore"):
            wide = x.astype(np.float64).reshape(-1)
            for i, v in enumerate(wide):
                if math.isfinite(v) and v != round(v, 1):
                    flat = wide.copy()
                    flat[i] = round(v, 1)
                    yield _with(case, k, flat.astype(x.dtype).reshape(x.shape))


def _same(a: Case, b: Case) -> bool:
    """Identical cases (bit for bit), so that a variant that changes nothing is not counted as progress."""
    if a.attrs != b.attrs or len(a.inputs) != len(b.inputs):
        return False
    for x, y in zip(a.inputs, b.inputs):
        x, y = np.asarray(x), np.asarray(y)
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            return False
    return True


def minimize(case: Case, judge: Callable, budget: int = 300, expected=None) -> tuple:
    """(the smallest case found with ``case``'s class, its verdict, how many variants were tried). With
    ``expected`` (the verdict the campaign saw), a case whose re-run is classed otherwise is not minimized
    but returned as not reproducible (its outcome depends on what ran before it)."""
    target = judge(case)
    if expected is not None and target.cls != expected.cls:
        return case, expected._replace(detail=f"NOT REPRODUCIBLE alone (re-run: {target.cls}): {expected.detail}"), 1
    best, tried = case, 0
    progress = True
    while progress and tried < budget:
        progress = False
        for variants in (_shape_variants, _attr_variants, _value_variants):
            for candidate in variants(best):
                if tried >= budget:
                    break
                if _same(candidate, best) or not is_safe(candidate):
                    continue
                tried += 1
                verdict = judge(candidate)
                if verdict.cls == target.cls and verdict.finding == target.finding:
                    best, target, progress = candidate, verdict, True
                    break  # start again from the biggest steps on the smaller case
            if progress:
                break
    return best, target, tried


# ----------------------------------------------------------------------------------------------- printing

def _literal(v: float) -> str:
    if math.isnan(v):
        return "-np.nan" if math.copysign(1.0, v) < 0 else "np.nan"
    if math.isinf(v):
        return "-np.inf" if v < 0 else "np.inf"
    return repr(v)


def _array_source(x) -> str:
    x = np.asarray(x)
    dtype = "ml_dtypes.bfloat16" if x.dtype.name == "bfloat16" else f"np.{x.dtype.name}"
    if x.size == 0:
        return f"np.zeros({tuple(int(d) for d in x.shape)}, {dtype})"
    if x.dtype.kind in "iub":
        values = ", ".join(str(v) for v in x.reshape(-1).tolist())
    else:
        values = ", ".join(_literal(float(v)) for v in x.astype(np.float64).reshape(-1))
    return f"np.array([{values}], {dtype}).reshape({tuple(int(d) for d in x.shape)})"


def reproducer(case: Case, verdict=None) -> str:
    """A Python snippet, run from the repository root, that feeds ``case`` to TF and to the library."""
    header = f"# {case.op}: {verdict.cls}: {verdict.detail[:300]}" if verdict else f"# {case.op}"
    inputs = ",\n    ".join(_array_source(x) for x in case.inputs)
    return f'''{header}
import os, sys
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"  # TF's Eigen kernels, as the suite pins them
sys.path[:0] = [".", "tests"]
import ml_dtypes
import numpy as np
import tensorflow as tf
from backends import BackendError, run_ort
from ort_ops import get_spec
from tools.goldens._fused_chain import tf_op

op = {case.op!r}
inputs = [
    {inputs},
]
attrs = {case.attrs!r}
spec = get_spec(op)
try:
    if spec.family == "fused":  # the project's own op: TF's chain of the ops it fuses
        print("TF:", tf_op(op, [tf.constant(x) for x in inputs], attrs))
    else:
        names = [p.name for p in spec.inputs]
        print("TF:", getattr(tf.raw_ops, op)(**{{n: tf.constant(x) for n, x in zip(names, inputs)}}, **attrs))
except Exception as e:
    print("TF error:", e)
try:
    print("library:", run_ort(op, inputs, attrs))
except BackendError as e:
    print("library error:", e)
'''
