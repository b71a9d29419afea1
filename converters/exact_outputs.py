"""Which values of a converted model are held bit-exact: those whose whole cone of inputs is exact.

An output is bit-exact against TensorFlow only when everything it is computed from is: a quantizer's output
is a function of its input, so it has TF's bits exactly when its input does. A quantizer fed by a convolution
(or a quantized gradient fed by Conv2DBackpropFilter) inherits the convolution's summation order, which TF and
ONNX Runtime do not share. :func:`exact_cone` therefore walks back from a tensor through the TF graph to its
sources (placeholders and constants, or the given stop tensors: values supplied from TF itself, as per-node
verification does) and calls the tensor exact only when every op on the way is exact by construction:

* the quantization ops (FakeQuant*, QuantizeAndDequantize*) for their non-summed outputs (their min/max
  gradients are sums whose order TF does not fix: it splits them by thread count);
* ops that move or select values without arithmetic (reshapes, transposes, slices, concatenations, gathers,
  ReLU, ReLU6, max, min, select, the ReLU gradients, casts, rounding to integers, ...);
* any op whose output is an integer or boolean (a comparison of exact floats is exact).

The converter (converters.pipeline) records the model outputs that are exact from the graph inputs in the
model's metadata; the verifiers read the record (end to end) or call :func:`exact_cone` with their own stop
tensors (per node). A module of its own so that the conversion core does not depend on the QA modules.
"""
from __future__ import annotations

import ort_ops
from converters.family import QUANTIZATION_OPS

_PASS_THROUGH = {"Identity", "IdentityN", "StopGradient", "Snapshot", "PreventGradient"}

# Ops that compute their float outputs without rounding: data movement and selection (given the same inputs,
# every implementation returns the same bits). Arithmetic (even a single correctly rounded add) is left out:
# tf2onnx may write it in other ops, and TF flushes subnormal results where ONNX Runtime may not.
EXACT_TF_OPS = frozenset({
    "Identity", "IdentityN", "StopGradient", "Snapshot", "PreventGradient", "Const", "Placeholder",
    "PlaceholderWithDefault", "Reshape", "Transpose", "ConjugateTranspose", "ExpandDims", "Squeeze", "Pack", "Unpack",
    "Concat", "ConcatV2", "Split", "SplitV", "Slice", "StridedSlice", "Gather", "GatherV2", "GatherNd", "Tile",
    "BroadcastTo", "Pad", "PadV2", "MirrorPad", "Fill", "ZerosLike", "OnesLike", "Reverse", "ReverseV2",
    "SpaceToDepth", "DepthToSpace", "Relu", "Relu6", "ReluGrad", "Relu6Grad", "Maximum", "Minimum", "Neg", "Abs",
    "Sign", "Select", "SelectV2", "Where", "ClipByValue", "Floor", "Ceil", "Round", "Rint", "MaxPool", "MaxPoolV2",
    "ReduceMax", "Max", "Min", "Cast", "Shape", "ShapeN", "Size", "Rank", "OneHot",
})


# Sources, and ops that read only their input's shape.
_SOURCES = frozenset({"Const", "Placeholder", "Shape", "ShapeN", "Size", "Rank", "ZerosLike", "OnesLike"})


def _exact_op_output(tensor) -> bool:
    op = tensor.op
    if op.type in QUANTIZATION_OPS:
        return tensor.value_index not in ort_ops.get_spec(op.type).summed_outputs()
    return op.type in EXACT_TF_OPS


def _integer(tensor) -> bool:
    dtype = tensor.dtype
    return dtype.is_integer or dtype.is_bool


def exact_cone(tensor, stop=frozenset(), limit: int = 100_000) -> bool:
    """Whether ``tensor`` (of a TF graph) is computed exactly from its sources: every op between the sources
    (placeholders, constants, and the tensor names in ``stop``) and it is exact by construction (see the
    module docstring). An integer or boolean tensor is always judged bit for bit, so it counts as exact."""
    if _integer(tensor):
        return True
    seen, todo = set(), [tensor]
    while todo:
        t = todo.pop()
        if t.name in stop or t.name in seen:
            continue
        seen.add(t.name)
        if len(seen) > limit:
            return False
        if not (_integer(t) or _exact_op_output(t)):
            return False
        op = t.op
        if op.type in _SOURCES:
            continue
        if op.type == "IdentityN":
            todo.append(op.inputs[t.value_index])
            continue
        # An integer inside the cone (a comparison's mask, an index) is exact only where its own inputs are.
        todo.extend(op.inputs)
    return True


def through_identities(tensor):
    """The tensor behind identity-like ops (a renamed model output is TF's Identity of the op's output)."""
    seen = 0
    while tensor.op.type in _PASS_THROUGH and tensor.op.inputs and seen < 64:
        tensor = tensor.op.inputs[tensor.value_index if tensor.op.type == "IdentityN" else 0]
        seen += 1
    return tensor


def producer_type(tensor) -> str:
    """The op type behind a TF graph tensor, looking through identity-like ops."""
    return through_identities(tensor).op.type


EXACT_OUTPUTS_KEY = "converters.bit_exact_outputs"


def recorded_exact_outputs(onnx_model) -> set:
    """Output names the converter recorded as bit-exact from the graph inputs."""
    for prop in onnx_model.metadata_props:
        if prop.key == EXACT_OUTPUTS_KEY:
            return {n for n in prop.value.split(",") if n}
    return set()


def quantization_outputs(tf_graph, output_names, renames=None) -> list:
    """Those of ``output_names`` (tensor names in ``tf_graph``) that are float outputs computed exactly from the
    graph's sources through at least one quantization op (the outputs the model claims bit for bit)."""
    renames = renames or {}
    found = []
    for n in output_names:
        tensor = tf_graph.get_tensor_by_name(n)
        if not _integer(tensor) and producer_type(tensor) in QUANTIZATION_OPS and exact_cone(tensor):
            found.append(renames.get(n, n))
    return found
