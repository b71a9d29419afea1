"""A fuzz case (one op, its inputs and attributes) and the size estimates that keep a campaign safe.

Inputs are NumPy arrays of any dtype (a wrongly typed input is a case too); attributes use TF's names and
Python values, as ``ort_ops.make_single_op_model`` and ``tf.raw_ops`` both take them.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

import ort_ops
from ort_ops.spec import OpError

# The library refuses any output of more than 2^31 elements (ort_ops/checks/depthwise.py MAX_OUTPUT_ELEMENTS).
LIBRARY_CAP = 1 << 31
# A case the generator keeps: at most this many input elements, and every output either at most
# SMALL_OUTPUT elements or beyond the library's cap (which the library must refuse by itself). Outputs in
# between would make the library allocate gigabytes legitimately, which a campaign must not ask for.
MAX_INPUT_ELEMENTS = 1 << 18
SMALL_OUTPUT = 1 << 22
# TensorFlow has no such cap (it tries to allocate, and zero-fills what it gets): the oracle is not run
# on a case whose outputs would be larger than this.
ORACLE_OUTPUT_LIMIT = 1 << 26


@dataclasses.dataclass
class Case:
    op: str
    inputs: list
    attrs: dict
    note: str = ""  # what the generator did to make this case (which input class)

    def describe(self) -> str:
        shapes = ", ".join(f"{np.asarray(x).dtype}{list(np.shape(x))}" for x in self.inputs)
        return f"{self.op}({shapes}) {self.attrs} [{self.note}]"

    def replace(self, **changes) -> "Case":
        return dataclasses.replace(self, **changes)


def input_elements(case: Case) -> int:
    return sum(int(np.asarray(x).size) for x in case.inputs)


def _sizes_input(op: str) -> Optional[int]:
    """The index of a depthwise backprop's shape input (input_sizes / filter_sizes), else None."""
    names = [p.name for p in ort_ops.get_spec(op).inputs]
    for name in ("input_sizes", "filter_sizes"):
        if name in names:
            return names.index(name)
    return None


def largest_output(case: Case) -> int:
    """The element count of the case's largest output as the spec's shape function sees it, or the
    product of a shape input's values when the shape function refuses them (e.g. for the cap); 0 when
    the case is invalid in another way (no side should allocate for it)."""
    spec = ort_ops.get_spec(case.op)
    if len(case.inputs) != len(spec.inputs):
        return 0
    arrays = [np.asarray(x) for x in case.inputs]
    try:
        shapes = spec.shape_fn([a.shape for a in arrays], arrays, spec.with_defaults(case.attrs))
    except OpError:
        index = _sizes_input(case.op)
        if index is not None and arrays[index].ndim == 1 and arrays[index].size == 4:
            values = [int(v) for v in arrays[index]]
            return int(np.prod(values, dtype=object)) if min(values) >= 0 else 0
        return 0
    except Exception:  # a shape function meeting a wrongly typed input: judged by the sides
        return 0
    largest = 0
    for shape in shapes:
        if shape is not None and all(d is not None for d in shape):
            largest = max(largest, int(np.prod([int(d) for d in shape], dtype=object)))
    return largest


def is_safe(case: Case) -> bool:
    """Whether a campaign may run this case (see SMALL_OUTPUT)."""
    if input_elements(case) > MAX_INPUT_ELEMENTS:
        return False
    out = largest_output(case)
    return out <= SMALL_OUTPUT or out > LIBRARY_CAP
