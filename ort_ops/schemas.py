"""onnx schemas for the domain, built from the specs, with type and shape inference."""
from __future__ import annotations

import threading

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.defs import OpSchema

from ort_ops.spec import BFLOAT16, DOUBLE, FLOAT, FLOAT16, INT32, REQUIRED, OpError, OpSpec
from ort_ops.specs import OP_SPECS

DOMAIN = "ai.onnx.converters.tensorflow"
OPSET_VERSION = 1

ELEM_TYPES = {
    FLOAT: TensorProto.FLOAT,
    DOUBLE: TensorProto.DOUBLE,
    FLOAT16: TensorProto.FLOAT16,
    BFLOAT16: TensorProto.BFLOAT16,
    INT32: TensorProto.INT32,
}
_ATTR_TYPES = {
    "float": OpSchema.AttrType.FLOAT,
    "int": OpSchema.AttrType.INT,
    "bool": OpSchema.AttrType.INT,
    "string": OpSchema.AttrType.STRING,
    "ints": OpSchema.AttrType.INTS,
}
_lock = threading.Lock()
_registered = False


def _schema_attr(attr):
    if attr.required:
        return OpSchema.Attribute(attr.name, _ATTR_TYPES[attr.kind], attr.doc, required=True)
    default = attr.default
    if attr.kind == "bool":
        default = int(default)
    proto = helper.make_attribute(attr.name, default, attr_type=_ATTR_TYPES[attr.kind].value)
    proto.doc_string = attr.doc
    return OpSchema.Attribute(attr.name, proto, attr.doc)


def _param(p, spec):
    type_str = p.type if p.type in spec.type_constraints else p.type
    return OpSchema.FormalParameter(p.name, type_str, p.doc)


def _read_attrs(spec: OpSpec, ctx) -> dict:
    attrs = {}
    for a in spec.attrs:
        proto = ctx.get_attribute(a.name)
        if proto is None:
            continue
        attrs[a.name] = helper.get_attribute_value(proto)
    return spec.with_defaults(attrs)


def _input_shape(ctx, i):
    tp = ctx.get_input_type(i)
    if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in tp.tensor_type.shape.dim)


def output_elem_types(spec: OpSpec, input_elem_types):
    """Element type of each output given the inputs' element types (0 where unknown)."""
    by_letter = {}
    for p, t in zip(spec.inputs, input_elem_types):
        if p.type in spec.type_constraints and t:
            by_letter.setdefault(p.type, t)
    return [by_letter.get(p.type, 0) if p.type in spec.type_constraints else ELEM_TYPES[p.type] for p in spec.outputs]


def _make_inference(spec: OpSpec):
    def infer(ctx):
        n = ctx.get_num_inputs()
        in_types = []
        for i in range(n):
            tp = ctx.get_input_type(i)
            in_types.append(tp.tensor_type.elem_type if tp is not None and tp.HasField("tensor_type") else 0)
        shapes = [_input_shape(ctx, i) for i in range(n)]
        values = []
        for i in range(n):
            data = ctx.get_input_data(i)
            values.append(None if data is None else numpy_helper.to_array(data))
        try:
            out_shapes = spec.shape_fn(shapes, values, _read_attrs(spec, ctx))
        except OpError as e:
            raise onnx.shape_inference.InferenceError(str(e)) from None
        for i, (elem, shape) in enumerate(zip(output_elem_types(spec, in_types), out_shapes)):
            if i >= ctx.get_num_outputs():
                break
            if not elem:
                continue
            if shape is None:
                ctx.set_output_type(i, helper.make_tensor_type_proto(elem, None))
            else:
                ctx.set_output_type(i, helper.make_tensor_type_proto(elem, list(shape)))

    return infer


def build_schema(spec: OpSpec) -> OpSchema:
    schema = OpSchema(
        spec.name,
        DOMAIN,
        OPSET_VERSION,
        spec.doc,
        inputs=[_param(p, spec) for p in spec.inputs],
        outputs=[_param(p, spec) for p in spec.outputs],
        type_constraints=[(k, list(v), f"allowed types of {k}") for k, v in spec.type_constraints.items()],
        attributes=[_schema_attr(a) for a in spec.attrs],
    )
    schema.set_type_and_shape_inference_function(_make_inference(spec))
    return schema


def register_schemas() -> None:
    """Register every op of the domain with onnx (process-global; safe to call more than once)."""
    global _registered
    with _lock:
        if _registered:
            return
        for spec in OP_SPECS:
            if onnx.defs.has(spec.name, DOMAIN):
                continue
            onnx.defs.register_schema(build_schema(spec))
        _registered = True


__all__ = ["DOMAIN", "OPSET_VERSION", "ELEM_TYPES", "register_schemas", "build_schema", "output_elem_types", "REQUIRED"]
