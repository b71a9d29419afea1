"""Errors name the input or attribute at fault where TensorFlow's own message does not.

TF's message is kept whole (users search for it), and a short statement of what is wrong leads it:
QuantizeAndDequantizeV4 with axis=5 on a rank-1 input says "axis 5 is out of range for input of rank
1: Shape must be at least rank 6 but is rank 1", where TF says only the part after the colon.

Each case below runs on both backends (the NumPy kernels and ONNX Runtime with the library) and
checks that the message names the op, carries TF's message (as TF 2.21 gives it on CPU for these
inputs), and names the input or attribute at fault; the two backends and the op's shape function
must say exactly the same. TensorFlow is not needed: its messages are written out here.
"""

import numpy as np
import pytest

import ort_ops
from backends import BACKENDS, BackendError, run
from ort_ops.conformance.rules import key_phrase
from ort_ops.spec import OpError

F32 = np.float32
QDQ_V4 = "QuantizeAndDequantizeV4"
DW = "DepthwiseConv2dNative"
DW_BPI = "DepthwiseConv2dNativeBackpropInput"
DW_BPF = "DepthwiseConv2dNativeBackpropFilter"
STRIDE_1 = {"strides": [1, 1, 1, 1]}


def _vec(n):
    return np.ones(n, F32)


def _nhwc(*shape):
    return np.ones(shape, F32)


def _sizes(*dims):
    return np.array(dims, np.int32)


# (op, inputs, attrs, TF's message, what ours must name)
CASES = [
    (QDQ_V4, [_vec(3), F32(0), F32(1)], {"axis": 5},
     "Shape must be at least rank 6 but is rank 1", "axis 5 is out of range for input of rank 1"),
    ("QuantizeAndDequantizeV2", [_nhwc(2, 3), F32(0), F32(1)], {"axis": 2},
     "Shape must be at least rank 3 but is rank 2", "axis 2 is out of range for input of rank 2"),
    ("FusedBatchNormV3", [_nhwc(3, 3, 4), _vec(4), _vec(4), _vec(4), _vec(4)], {},
     "input must be 4 or 5-dimensional[3,3,4]", "x has rank 3"),
    ("FusedBatchNormGrad", [_nhwc(2, 4), _nhwc(2, 4), _vec(4), _vec(4), _vec(4)], {},
     "input must be 4 or 5-dimensional[2,4]", "y_backprop has rank 2"),
    ("FusedBatchNormGradV3", [_nhwc(1, 3, 3, 4), _nhwc(3, 3, 4), _vec(4), _vec(4), _vec(4), _vec(4)], {},
     "input must be 4 or 5-dimensional[3,3,4]", "x has rank 3"),
    ("FusedBatchNormV3", [_nhwc(1, 2, 2, 4), _vec(4), _vec(4), _nhwc(2, 2), _vec(4)], {},
     "estimated_mean must be 1-dimensional[2,2]", "mean has rank 2"),
    ("FusedBatchNormV2", [_nhwc(1, 2, 2, 4), _vec(4), _vec(4), _vec(4), F32(1)], {},
     "estimated_variance must be 1-dimensional[]", "variance has rank 0"),
    ("FusedBatchNormGradV2", [_nhwc(1, 2, 2, 4), _nhwc(1, 2, 2, 4), _vec(4), _nhwc(1, 4), _vec(4)], {},
     "saved mean must be 1-dimensional[1,4]", "reserve_space_1 has rank 2"),
    ("FusedBatchNormGrad", [_nhwc(1, 2, 2, 4), _nhwc(1, 2, 2, 4), _vec(4), _vec(4), F32(1)], {},
     "saved variance must be 1-dimensional[]", "reserve_space_2 has rank 0"),
    # TF's shape function's message (its Eigen kernel rejects every dilation before looking at the values).
    (DW, [_nhwc(1, 4, 4, 2), _nhwc(2, 2, 2, 1)], {**STRIDE_1, "padding": "VALID", "dilations": [1, 0, 1, 1]},
     "Dilated rates should be larger than 0, got [0, 1]", "dilations"),
    (DW, [_nhwc(1, 4, 4, 2), _nhwc(2, 2, 2, 1)],
     {**STRIDE_1, "padding": "EXPLICIT", "explicit_paddings": [1, 0, 0, 0, 0, 0, 0, 0]},
     "Nonzero explicit padding in the batch or depth dimensions is not supported", "explicit_paddings"),
    (DW, [_nhwc(1, 2, 4, 2), _nhwc(5, 1, 2, 1)], {**STRIDE_1, "padding": "VALID"},
     "Computed output size would be negative: -2 [input_size: 2, effective_filter_size: 5, stride: 1]",
     "filter rows span 5 (size 5, dilation 1), more than input rows 2 with VALID padding"),
    (DW, [_nhwc(1, 4, 2, 2), _nhwc(1, 2, 2, 1)], {**STRIDE_1, "padding": "VALID", "dilations": [1, 1, 4, 1]},
     "Computed output size would be negative: -2 [input_size: 2, effective_filter_size: 5, stride: 1]",
     "filter cols span 5 (size 2, dilation 4), more than input cols 2 with VALID padding"),
    (DW_BPI, [_sizes(1, 4, 4), _nhwc(2, 2, 2, 1), _nhwc(1, 4, 4, 2)], {**STRIDE_1, "padding": "SAME"},
     "DepthwiseConv2DBackpropInput: input must be 4-dimensional", "input_sizes has 3 values"),
    (DW_BPF, [_nhwc(1, 4, 4, 2), _sizes(2, 2, 2), _nhwc(1, 4, 4, 2)], {**STRIDE_1, "padding": "SAME"},
     "DepthwiseConv2DBackpropFilter: filter must be 4-dimensional", "filter_sizes has 3 values"),
    (DW_BPI, [_sizes(1, 4, 4, 2), _nhwc(2, 2, 2, 2), _nhwc(1, 4, 4, 3)], {**STRIDE_1, "padding": "SAME"},
     "DepthwiseConv2DBackpropInput: depth_multiplier * in_depth not equal to out_depth",
     "out_backprop depth 3 is not in_depth 2 * depth_multiplier 2"),
    (DW_BPF, [_nhwc(1, 4, 4, 2), _sizes(2, 2, 2, 1), _nhwc(1, 4, 4, 3)], {**STRIDE_1, "padding": "SAME"},
     "DepthwiseConv2DBackpropFilter: depth_multiplier * in_depth not equal to out_depth",
     "out_backprop depth 3 is not in_depth 2 * depth_multiplier 1"),
    # TF's backprops give the output-size message without their label, as the forward op does.
    (DW_BPI, [_sizes(1, 2, 2, 2), _nhwc(5, 5, 2, 1), _nhwc(1, 1, 1, 2)], {**STRIDE_1, "padding": "VALID"},
     "Computed output size would be negative: -2 [input_size: 2, effective_filter_size: 5, stride: 1]",
     "filter rows span 5"),
    (DW_BPF, [_nhwc(1, 2, 2, 2), _sizes(5, 5, 2, 1), _nhwc(1, 1, 1, 2)], {**STRIDE_1, "padding": "VALID"},
     "Computed output size would be negative: -2 [input_size: 2, effective_filter_size: 5, stride: 1]",
     "filter rows span 5"),
]
IDS = [f"{i}-{case[0]}-{case[4][:24]}" for i, case in enumerate(CASES)]


def problems(op, text, tf_message, names):
    """What a message lacks: the op, TF's words, or the name of the input or attribute at fault."""
    missing = []
    if f"{op}: " not in text:
        missing.append(f"the op ({op})")
    if key_phrase(tf_message) not in text or tf_message not in text:
        missing.append(f"TF's message ({tf_message!r})")
    if names not in text:
        missing.append(f"what is at fault ({names!r})")
    return missing


def error_of(backend, op, inputs, attrs):
    with pytest.raises(BackendError) as info:
        run(backend, op, inputs, attrs)
    return str(info.value)


@pytest.mark.parametrize("op, inputs, attrs, tf_message, names", CASES, ids=IDS)
def test_message_names_op_keeps_tf_words_and_names_what_is_at_fault(backend, op, inputs, attrs, tf_message, names):
    text = error_of(backend, op, inputs, attrs)
    assert not problems(op, text, tf_message, names), f"{text!r} lacks {problems(op, text, tf_message, names)}"


@pytest.mark.parametrize("op, inputs, attrs, tf_message, names", CASES, ids=IDS)
def test_backends_and_shape_function_say_the_same(op, inputs, attrs, tf_message, names):
    numpy_text = error_of("numpy", op, inputs, attrs)
    assert numpy_text in error_of("ort", op, inputs, attrs)  # ORT adds where it ran the node
    spec = ort_ops.get_spec(op)
    shapes = [tuple(np.shape(x)) for x in inputs]
    values = [np.asarray(x) if np.asarray(x).dtype == np.int32 else None for x in inputs]
    # Every rule is the spec's (the kernels run behind it), so with every shape and the sizes vectors
    # known the shape function judges each case.
    with pytest.raises(OpError) as info:
        spec.shape_fn(shapes, values, spec.with_defaults(attrs))
    assert str(info.value) == numpy_text



def test_check_rejects_tf_message_alone():
    """The check above is not vacuous: TF's bare message, or ours without TF's words, fails it."""
    op, _, _, tf_message, names = CASES[0]
    assert problems(op, f"{op}: {tf_message}", tf_message, names) == [f"what is at fault ({names!r})"]
    assert problems(op, f"{op}: {names}", tf_message, names) == [f"TF's message ({tf_message!r})"]
    assert problems(op, f"{names}: {tf_message}", tf_message, names) == [f"the op ({op})"]


def test_every_backend_is_covered():
    assert set(BACKENDS) == {"numpy", "ort"}
