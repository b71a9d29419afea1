"""The specs are the one source of truth: an attribute added to one op's spec reaches every consumer
that is derived from specs (schema, op reference, C++ op table, the converters' attribute reading, the
validation entry point) with no edit anywhere else. Only the op's kernels, which give it meaning, and
the generated files (docs/ops.md's op reference, the C++ table) change with it."""
import dataclasses

import numpy as np
import pytest

import ort_ops
from converters.family import tf_attributes
from converters.lowering_custom import onnx_attributes
from ort_ops import codegen, docs, schemas
from ort_ops.spec import Attr, OpError
from ort_ops.specs import SPECS_BY_NAME

OP = "QuantizeAndDequantizeV4"
KNOB = Attr("test_knob", "int", 3, "an attribute that exists only in this test")


@pytest.fixture
def patched(monkeypatch):
    spec = dataclasses.replace(ort_ops.get_spec(OP), attrs=ort_ops.get_spec(OP).attrs + (KNOB,))
    monkeypatch.setitem(SPECS_BY_NAME, OP, spec)
    return spec


class _TfNode:
    """A tf2onnx node as the converters' handlers see it, with only `given` attributes set."""

    def __init__(self, given):
        self.given = given

    def get_attr(self, name):
        return self.given.get(name)

    def get_attr_value(self, name, default=None):
        return self.given.get(name, default)


def test_defaults_and_values_come_from_the_spec(patched):
    assert patched.with_defaults({})["test_knob"] == 3
    assert patched.with_defaults({"test_knob": 5})["test_knob"] == 5
    with pytest.raises(OpError, match="test_knob must be an int"):
        patched.with_defaults({"test_knob": "five"})


def test_schema_and_op_reference_carry_it(patched):
    assert "test_knob" in schemas.build_schema(patched).attributes
    assert "| `test_knob` | int | 3 | an attribute that exists only in this test |" in docs.render_op(patched)


def test_the_cpp_op_table_carries_it(patched):
    assert 'IntAttr("test_knob", 3)' in codegen.generate([patched])


def test_both_lowerings_read_it_through_the_spec(patched):
    # The standard lowerings' Lowering.attrs and the custom handler both read a TF node through tf_attributes.
    read = tf_attributes(_TfNode({}), patched)
    assert read["test_knob"] == 3
    assert onnx_attributes(OP, read)["test_knob"] == 3  # written on the domain node with TF's default
    assert tf_attributes(_TfNode({"test_knob": 7}), patched)["test_knob"] == 7


def test_the_reference_kernel_receives_it(patched, monkeypatch):
    seen = {}

    def kernel(*inputs, **attrs):
        seen.update(attrs)
        return (inputs[0],)

    monkeypatch.setattr(type(patched), "kernel_function", lambda self: kernel)
    x = np.zeros(3, np.float32)
    patched.run_reference([x, np.float32(-1), np.float32(1)], {})
    assert seen["test_knob"] == 3
