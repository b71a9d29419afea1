"""Conformance of QuantizeAndDequantize{V2,V3,V4} and V4Grad: bit for bit against TensorFlow 2.21's goldens.

Golden cases (ort_ops/conformance/goldens/QuantizeAndDequantize*.npz, from tools/goldens/gen_quantize_dequantize.py),
TF-crashing and bad inputs; each on the NumPy kernels and through ORT. No TensorFlow here: the live
comparisons are in test_quantize_dequantize_live.py.
"""
from __future__ import annotations

import numpy as np
import pytest

import ort_ops
from backends import BackendError, run
from ort_ops.conformance.goldens import load_cases
from comparison import outputs_mismatch

OPS = ("QuantizeAndDequantizeV2", "QuantizeAndDequantizeV3", "QuantizeAndDequantizeV4", "QuantizeAndDequantizeV4Grad")


# The golden cases run through the conformance kit (tests/test_conformance.py): every output bit for bit (the
# summed ones to their sum bound), TF's rejections with TF's words (ort_ops/conformance/rules.py).


X = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
F = np.float32
BAD_INPUTS = [
    # TF 2.21 aborts the process on these two (issues #94116, #99458); here they are errors.
    ("QuantizeAndDequantizeV3", [X, F(-1), F(1), np.int32(8)], {"axis": -2}, "axis should be at least -1"),
    ("QuantizeAndDequantizeV3", [X, F([-1]), F([1]), np.int32(8)], {}, "input_min must be a scalar"),
    ("QuantizeAndDequantizeV2", [X, F(-1), F(1)], {"num_bits": 0}, "num_bits is out of range: 0 with signed_input_ 1"),
    ("QuantizeAndDequantizeV4", [X, F(2), F(1)], {"range_given": True}, "Invalid range: input_min 2 > input_max 1"),
    ("QuantizeAndDequantizeV4", [X, F(-1), F(1)], {"axis": -2}, "Axis must be at least -1. Found -2"),
    ("QuantizeAndDequantizeV2", [X, F(-1), F(1)], {"axis": 2}, "Shape must be at least rank 3 but is rank 2"),
    ("QuantizeAndDequantizeV2", [X, F([-1, -1]), F([1, 1])], {"axis": 1, "range_given": True}, "input_min_tensor has incorrect size"),
    ("QuantizeAndDequantizeV2", [X, F(-1), F(1)], {"round_mode": "HALF_DOWN"}, "round_mode"),
    # Mixed element types: ONNX Runtime itself refuses the node before any kernel runs, with its
    # own message ("no kernel def matches node inputs for Op: <op>").
    ("QuantizeAndDequantizeV2", [X, np.float64(-1), F(1)], {}, ("input_min", "no kernel def matches node inputs")),
    ("QuantizeAndDequantizeV3", [X, F(-1), F(1), np.int32([8])], {}, "The `num_bits` tensor should be a scalar"),
    ("QuantizeAndDequantizeV4Grad", [X[:1], X, F(-1), F(1)], {}, "gradient and input must be the same size"),
    ("QuantizeAndDequantizeV4Grad", [X, X, F([-1, 0]), F([1, 1, 1])], {"axis": 1}, "min has incorrect size, expected 3 was 2"),
    ("QuantizeAndDequantizeV4Grad", [X, X, F([[-1]]), F(1)], {}, "Input min tensor must have dimension 0 or 1"),
]


@pytest.mark.parametrize("op,inputs,attrs,phrase", BAD_INPUTS, ids=[f"{b[0]}-{str(b[3])[:30]}" for b in BAD_INPUTS])
def test_bad_input(op, inputs, attrs, phrase, backend):
    with pytest.raises(BackendError) as info:
        run(backend, op, inputs, attrs)
    phrases = phrase if isinstance(phrase, tuple) else (phrase,)
    assert op in str(info.value) and any(p in str(info.value) for p in phrases), str(info.value)


@pytest.mark.parametrize("op", OPS)
def test_reference_evaluator_runs(op):
    case = next(c for c in load_cases(op) if "error" not in c and c["inputs"][1].size and c["inputs"][0].size > 3)
    model = ort_ops.make_single_op_model(op, case["inputs"], case["attrs"])
    names = [p.name for p in ort_ops.get_spec(op).inputs]
    got = ort_ops.reference_evaluator(model).run(None, dict(zip(names, case["inputs"])))
    assert outputs_mismatch(case["outputs"], got) is None
