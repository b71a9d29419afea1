"""The library's size cap (issue 11, item 6; docs/semantics.md section 4.5): an output of more than 2^31
elements is refused with the library's own error naming the op and the input its shape comes from, in the
NumPy kernels, the C++ library and the shape functions alike (TF itself runs out of memory or aborts)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from backends import BACKENDS, BackendError, run_numpy, run_ort
from ort_ops.model import make_single_op_model
from ort_ops.schemas import register_schemas
from ort_ops.checks.depthwise import MAX_OUTPUT_ELEMENTS, output_size_message

F32 = np.float32
SAME = {"strides": [1, 1, 1, 1], "padding": "SAME"}
BPF = "DepthwiseConv2dNativeBackpropFilter"
BPI = "DepthwiseConv2dNativeBackpropInput"
CASES = {
    # the case: 2^31 - 1 filter rows times 8 channels (64 GiB of float32)
    "filter_sizes": (BPF, [np.ones((1, 4, 4, 1), F32), np.int32([2147483647, 1, 1, 8]), np.ones((1, 4, 4, 8), F32)]),
}


def test_the_cap_is_2_to_the_31_elements():
    assert MAX_OUTPUT_ELEMENTS == 2**31
    assert output_size_message((2, 2**30), "x") is None  # exactly at the cap: allowed
    assert "(from x)" in output_size_message((2, 2**30 + 1), "x")


@pytest.mark.parametrize("backend", BACKENDS)
def test_filter_sizes_beyond_the_cap_is_an_error(backend):
    op, inputs = CASES["filter_sizes"]
    run = run_numpy if backend == "numpy" else run_ort
    with pytest.raises(BackendError) as err:
        run(op, inputs, SAME)
    message = str(err.value)
    assert op in message and "(from filter_sizes)" in message and "2^31 elements" in message, message


def test_shape_function_applies_the_cap_to_constant_sizes():
    register_schemas()
    op, inputs = CASES["filter_sizes"]
    model = make_single_op_model(op, inputs, SAME, constant_inputs=(1,), typed_outputs=False)
    with pytest.raises(onnx.shape_inference.InferenceError, match=r"\(from filter_sizes\) is too large"):
        onnx.shape_inference.infer_shapes(model, strict_mode=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_input_sizes_beyond_the_cap_is_an_error(backend):
    # 2^32 input positions; a stride of 65536 keeps out_backprop at one element
    inputs = [np.int32([1, 65536, 65536, 1]), np.ones((1, 1, 1, 1), F32), np.ones((1, 1, 1, 1), F32)]
    run = run_numpy if backend == "numpy" else run_ort
    with pytest.raises(BackendError, match=r"(?s)DepthwiseConv2dNativeBackpropInput.*\(from input_sizes\) is too large"):
        run(BPI, inputs, {"strides": [1, 65536, 65536, 1], "padding": "SAME"})
