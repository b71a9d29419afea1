"""Conformance of the FakeQuantWithMinMax* ops: bit for bit against TensorFlow 2.21's golden cases.

Golden cases (ort_ops/conformance/goldens/FakeQuant*.npz, written by tools/goldens/gen_fake_quant.py), bad input and the
reference evaluator; every test runs on the NumPy kernels and through ONNX Runtime. No TensorFlow here:
the live comparisons are in test_fake_quant_live.py.
"""
from __future__ import annotations

import numpy as np
import pytest

import ort_ops
from backends import BackendError, run
from ort_ops.conformance.goldens import load_cases
from comparison import check_error, quantization_mismatch

F32 = np.float32
OPS = (
    "FakeQuantWithMinMaxArgs",
    "FakeQuantWithMinMaxArgsGradient",
    "FakeQuantWithMinMaxVars",
    "FakeQuantWithMinMaxVarsGradient",
    "FakeQuantWithMinMaxVarsPerChannel",
    "FakeQuantWithMinMaxVarsPerChannelGradient",
)


# The golden cases run through the conformance kit (tests/test_conformance.py): every output bit for bit (the
# summed ones to their sum bound), TF's rejections with TF's words (ort_ops/conformance/rules.py).


X = np.linspace(-2, 2, 6, dtype=F32).reshape(2, 3)
R3 = (F32([-1, -1, -1]), F32([1, 1, 1]))

BAD_INPUTS = [
    # (op, inputs, attrs, expected phrase)
    ("FakeQuantWithMinMaxArgs", [X], {"num_bits": 17}, "num_bits must be between 2 and 16, inclusive"),
    ("FakeQuantWithMinMaxArgs", [X], {"min": 1.0, "max": 1.0}, "min has to be smaller than max, was: 1 >= 1"),
    ("FakeQuantWithMinMaxArgsGradient", [X[:1], X], {}, "must have the same size and shape"),
    ("FakeQuantWithMinMaxVars", [X, F32([-1]), F32(1)], {}, "`min` must be rank 0 but is rank 1"),
    ("FakeQuantWithMinMaxVars", [X, F32(-1), F32(1)], {"num_bits": 1}, "num_bits must be between 2 and 16"),
    ("FakeQuantWithMinMaxVarsGradient", [X.T, X, F32(-1), F32(1)], {}, "gradient and input must be the same size"),
    ("FakeQuantWithMinMaxVarsGradient", [X, X, F32(-1), F32([[1]])], {}, "`max` must be rank 0 but is rank 2"),
    # TF 2.21 aborts the process on a scalar input to the PerChannel ops; here it is an error.
    ("FakeQuantWithMinMaxVarsPerChannel", [F32(1), F32([-1]), F32([1])], {}, "input must be at least rank 1"),
    ("FakeQuantWithMinMaxVarsPerChannelGradient", [F32(1), F32(1), F32([-1]), F32([1])], {}, "input must be at least rank 1"),
    ("FakeQuantWithMinMaxVarsPerChannel", [X, F32([-1, -1]), R3[1]], {}, "min has incorrect size, expected 3 was 2"),
    ("FakeQuantWithMinMaxVarsPerChannel", [X, R3[0], F32(1)], {}, "`max` must be rank 1 but is rank 0"),
    ("FakeQuantWithMinMaxVarsPerChannelGradient", [X, X, R3[0], F32([1, 1])], {}, "max has incorrect size, expected 3 was 2"),
    ("FakeQuantWithMinMaxVarsPerChannelGradient", [X[:1], X, *R3], {}, "gradient and input must be the same size"),
    # `axis` is the domain's (TF's op has none): -1 or a dim of `inputs`, and min/max fit that dim.
    ("FakeQuantWithMinMaxVarsPerChannel", [X, *R3], {"axis": 2}, "attribute axis must be -1 or in [0, rank) = [0, 2), was 2"),
    ("FakeQuantWithMinMaxVarsPerChannel", [X, *R3], {"axis": -2}, "attribute axis must be -1 or in [0, rank) = [0, 2), was -2"),
    ("FakeQuantWithMinMaxVarsPerChannelGradient", [X, X, *R3], {"axis": 5}, "attribute axis must be -1 or in [0, rank)"),
    ("FakeQuantWithMinMaxVarsPerChannel", [X, *R3], {"axis": 0}, "min has incorrect size, expected 2 was 3"),
]


@pytest.mark.parametrize("op,inputs,attrs,phrase", BAD_INPUTS, ids=[f"{b[0]}-{b[3][:30]}" for b in BAD_INPUTS])
def test_bad_input(op, inputs, attrs, phrase, backend):
    with pytest.raises(BackendError) as info:
        run(backend, op, inputs, attrs)
    assert op in str(info.value) and phrase in str(info.value), str(info.value)


@pytest.mark.parametrize("op", OPS)
def test_reference_evaluator_runs(op):
    case = next(c for c in load_cases(op) if "error" not in c and c["inputs"][-1].size and c["attrs"])
    model = ort_ops.make_single_op_model(op, case["inputs"], case["attrs"])
    names = [p.name for p in ort_ops.get_spec(op).inputs]
    got = ort_ops.reference_evaluator(model).run(None, dict(zip(names, case["inputs"])))
    assert quantization_mismatch(op, case["inputs"], case["outputs"], got) is None


AXIS_SHAPES = [((3, 5, 7, 4), axis) for axis in range(4)] + [((4, 3, 50, 50), 1), ((7,), 0)]


@pytest.mark.parametrize("shape,axis", AXIS_SHAPES, ids=[f"{s}-axis{a}" for s, a in AXIS_SHAPES])
@pytest.mark.parametrize("op", ["FakeQuantWithMinMaxVarsPerChannel", "FakeQuantWithMinMaxVarsPerChannelGradient"])
def test_axis_is_the_last_dim_op_on_the_transposed_input(op, shape, axis, backend):
    """axis != -1 (set by the layout optimizer) gives bit for bit TF's op (axis -1) on the input transposed
    so that `axis` is last, transposed back; the gradient's per-channel sums too, as the channel's elements
    are summed in their memory order, which is the transposed input's. The channel ranges include an
    all-zero one, an empty one and NaN/infinite ones; the inputs NaNs and values outside the ranges."""
    if backend == "cuda" and op.endswith("Gradient") and axis != len(shape) - 1:
        pytest.skip("the CUDA gradient supports only the last dim so far")
    rng = np.random.default_rng(len(shape) * 10 + axis)
    depth = shape[axis]
    mn = -rng.uniform(0.1, 3, depth).astype(F32)
    mx = rng.uniform(0.1, 3, depth).astype(F32)
    specials = [(0, 0), (1, 1), (-np.inf, 1), (np.nan, 2)]
    for c, (lo, hi) in zip(range(1, depth), specials):
        mn[c], mx[c] = lo, hi
    x = (rng.standard_normal(shape) * 2).astype(F32)
    x.reshape(-1)[:: 97] = np.nan
    g = rng.standard_normal(shape).astype(F32)
    attrs = {"num_bits": 5, "narrow_range": True}
    tensors = (g, x) if op.endswith("Gradient") else (x,)
    last = [np.ascontiguousarray(np.moveaxis(a, axis, -1)) for a in tensors]
    want = run(backend, op, [*last, mn, mx], {**attrs, "axis": -1})
    got = run(backend, op, [*tensors, mn, mx], {**attrs, "axis": axis})
    want = [np.moveaxis(want[0], -1, axis), *want[1:]]
    for i, (w, o) in enumerate(zip(want, got)):
        assert w.shape == o.shape and np.array_equal(np.asarray(w).view(np.uint32), np.asarray(o).view(np.uint32)), \
            f"output {i} differs"
