"""Building ONNX models with nodes of the domain."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
from onnx import AttributeProto, ModelProto, TensorProto, helper, numpy_helper

from ort_ops.schemas import DOMAIN, ELEM_TYPES, OPSET_VERSION, output_elem_types
from ort_ops.spec import onnx_type_of
from ort_ops.specs import get_spec

DEFAULT_ONNX_OPSET = 17

# Every model this project writes carries the lowest IR version its opsets and element types need (onnx 1.23
# stamps IR 14 by default, which onnxruntime 1.31 cannot read; onnxruntime 1.17 reads IR 9 at most). Types that
# came after the opsets that can use them are checked too, in case a tensor carries one.
_TYPE_IR = {TensorProto.FLOAT8E4M3FN: 9, TensorProto.FLOAT8E4M3FNUZ: 9, TensorProto.FLOAT8E5M2: 9,
            TensorProto.FLOAT8E5M2FNUZ: 9, TensorProto.UINT4: 10, TensorProto.INT4: 10}
if hasattr(TensorProto, "FLOAT4E2M1"):
    _TYPE_IR[TensorProto.FLOAT4E2M1] = 11


def _element_types(graph):
    for init in graph.initializer:
        yield init.data_type
    for value in list(graph.input) + list(graph.output) + list(graph.value_info):
        if value.type.HasField("tensor_type"):
            yield value.type.tensor_type.elem_type


def lowest_ir_version(model: ModelProto) -> int:
    """The lowest ONNX IR version that ``model``'s opset imports (this domain's aside) and tensor types need."""
    ir = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    return max([ir] + [_TYPE_IR.get(t, 0) for t in _element_types(model.graph)])


def set_lowest_ir_version(model: ModelProto) -> ModelProto:
    """Stamp ``model`` with ``lowest_ir_version(model)`` (in place) and return it."""
    model.ir_version = lowest_ir_version(model)
    return model


def elem_type_of(dtype) -> int:
    """The ONNX element type of a NumPy dtype: the domain's types, or any other onnx knows (so a
    model can carry a wrongly typed input for the runtime to reject)."""
    try:
        return ELEM_TYPES[onnx_type_of(dtype)]
    except TypeError:
        return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def node_attributes(op_type: str, attrs: dict) -> dict:
    """Attribute values as they go on an ONNX node: bools become 0/1 ints, everything else as is."""
    spec = get_spec(op_type)
    out = {}
    for name, value in attrs.items():
        kind = spec.attr(name).kind
        if kind == "bool":
            value = int(bool(value))
        elif kind == "float":
            value = float(value)
        elif kind == "ints":
            value = [int(v) for v in value]
        out[name] = value
    return out


def make_node(op_type: str, inputs: Sequence[str], outputs: Sequence[str], name: Optional[str] = None, **attrs):
    """An ONNX node of the domain; ``attrs`` use TF names and Python values."""
    values = node_attributes(op_type, attrs)
    # onnx cannot infer the type of an empty list (e.g. explicit_paddings=[]): add those as typed INTS.
    empty = [k for k, v in values.items() if isinstance(v, list) and not v]
    node = helper.make_node(
        op_type, list(inputs), list(outputs), name=name, domain=DOMAIN, **{k: v for k, v in values.items() if k not in empty}
    )
    for key in empty:
        node.attribute.append(helper.make_attribute(key, [], attr_type=AttributeProto.INTS))
    return node


def finish_model(graph, opset: int = DEFAULT_ONNX_OPSET, producer: str = "ort_ops") -> ModelProto:
    """Wrap ``graph`` in a model importing the default domain and this one, at the lowest IR version it needs."""
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(DOMAIN, OPSET_VERSION)],
        producer_name=producer,
    )
    return set_lowest_ir_version(model)


def make_single_op_model(
    op_type: str,
    inputs: Sequence[np.ndarray],
    attrs: Optional[dict] = None,
    constant_inputs: Sequence[int] = (),
    typed_outputs: bool = True,
) -> ModelProto:
    """A model holding one node of ``op_type`` whose graph inputs match ``inputs``' dtypes and shapes.

    Inputs listed in ``constant_inputs`` become initializers holding the given value (so shape
    inference can read them, e.g. ``input_sizes``). With ``typed_outputs`` the graph outputs carry
    the types and shapes the spec infers (which rejects input it can already tell is bad); without,
    they are left untyped so that the runtime sees and judges every input itself.
    """
    spec = get_spec(op_type)
    attrs = attrs or {}
    names = [p.name for p in spec.inputs]
    graph_inputs, initializers, in_types = [], [], []
    for i, (name, value) in enumerate(zip(names, inputs)):
        value = np.asarray(value)
        elem = elem_type_of(value.dtype)
        in_types.append(elem)
        if i in constant_inputs:
            initializers.append(numpy_helper.from_array(value, name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, elem, list(value.shape)))
    out_names = [p.name for p in spec.outputs]
    values = [np.asarray(v) if i in constant_inputs else None for i, v in enumerate(inputs)]
    if not typed_outputs:
        outputs = [helper.make_empty_tensor_value_info(name) for name in out_names]
        node = make_node(op_type, names, out_names, name=op_type, **attrs)
        return finish_model(helper.make_graph([node], op_type, graph_inputs, outputs, initializer=initializers))
    shapes = spec.shape_fn([np.shape(v) for v in inputs], values, spec.with_defaults(attrs))
    outputs = []
    for i, (name, elem, shape) in enumerate(zip(out_names, output_elem_types(spec, in_types), shapes)):
        # The checker wants a shape on typed graph outputs: unknown dims get names, an unknown
        # rank leaves the output untyped for shape inference to fill.
        dims = None if shape is None else [d if d is not None else f"{name}_dim{j}" for j, d in enumerate(shape)]
        outputs.append(
            helper.make_tensor_value_info(name, elem, dims) if dims is not None else helper.make_empty_tensor_value_info(name)
        )
    node = make_node(op_type, names, out_names, name=op_type, **attrs)
    graph = helper.make_graph([node], op_type, graph_inputs, outputs, initializer=initializers)
    return finish_model(graph)
