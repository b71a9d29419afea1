"""The declarative op spec: the single source of truth for every op of the domain.

An :class:`OpSpec` names an op's inputs, outputs, attributes and element types in TensorFlow's
terms, and points at the two pieces of behaviour that cannot be tabulated: the shape function
and the NumPy reference kernel. Everything else -- the onnx schemas (``schemas.py``), the
reference evaluator (``evaluator.py``), the generated op reference in docs/ops.md (``docs.py``),
the C++ op table ``cpp_ops/src/ort/op_table.generated.h`` (written by ``codegen.py``; the C++
adapters read their attribute defaults from it) and the converters -- is derived from these objects.

Validation has one entry point, :meth:`OpSpec.validate`: attribute values, element types (from the
type constraints and ``kernels``) and then the shape function, which calls the family's checks in
``ort_ops.checks``. The NumPy kernels run behind it (:meth:`OpSpec.run_reference`), the schemas'
shape inference, the standard lowerings and the custom lowering's handler call it with what they
know, so a rule is written once and every path reports it in the same words.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Optional, Sequence

import numpy as np

# ONNX element type names used in type constraints, and the NumPy dtype each one maps to.
FLOAT = "tensor(float)"
DOUBLE = "tensor(double)"
FLOAT16 = "tensor(float16)"
BFLOAT16 = "tensor(bfloat16)"
INT32 = "tensor(int32)"


class OpError(ValueError):
    """A node of the domain was given inputs or attributes that TensorFlow rejects.

    The message always starts with the op name, so a user can tell which node failed.
    """

    def __init__(self, op: str, message: str):
        self.op = op
        self.detail = message
        super().__init__(f"{op}: {message}")


@dataclasses.dataclass(frozen=True)
class Param:
    """A formal input or output: its TF name and either a type-constraint letter or a fixed type.

    Two flags say how an output is compared with TensorFlow's, so that every check reads them here:

    * ``summed``: a float sum whose order TF leaves to Eigen's thread split (FakeQuant's min/max
      gradients). Its last bits, and which NaN it keeps, depend on that order: it is held to a tolerance
      (or, against kernels that reproduce the order, bit for bit without NaN payloads), not bit for bit.
    * ``placeholder``: an output TF fills with a placeholder whose shape depends on TF's build (batch
      norm's unused reserve spaces: a scalar or shape [0]); nothing reads it, so its value is not compared.
    """

    name: str
    type: str  # a key of OpSpec.type_constraints ("T", "U", ...) or a fixed type such as INT32
    doc: str = ""
    summed: bool = False
    placeholder: bool = False


@dataclasses.dataclass(frozen=True)
class Attr:
    """A TF attribute as it appears on the ONNX node.

    ``kind`` is one of ``float``, ``int``, ``bool`` (stored as an INT attribute 0/1), ``string``
    and ``ints``. ``default`` is TF's default, or ``REQUIRED``. ``choices`` restricts strings.
    """

    name: str
    kind: str
    default: Any
    doc: str = ""
    choices: Optional[tuple] = None

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


REQUIRED = object()


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One op of the domain.

    ``shape_fn(input_shapes, input_values, attrs) -> list of output shapes`` works on shapes whose
    dims are ints or ``None`` (unknown); a whole shape may be ``None`` (unknown rank). ``input_values``
    holds the NumPy value of inputs that are constant (``None`` otherwise), which ops such as
    ``DepthwiseConv2dNativeBackpropInput`` need. It raises :class:`OpError` on what it can already
    tell is invalid, and returns ``None`` for an output whose shape it cannot tell.

    ``reference`` is ``"module:function"`` inside ``ort_ops.reference``: a NumPy kernel taking the
    input arrays positionally and every attribute as a keyword (with its default filled in) and
    returning a tuple of output arrays.
    """

    name: str
    family: str
    doc: str
    inputs: tuple
    outputs: tuple
    attrs: tuple
    type_constraints: dict  # letter -> tuple of allowed types (FLOAT, ...)
    shape_fn: Callable
    reference: str
    # Extra legal type combinations beyond "every letter independent", e.g. V2 batch norm
    # requires U == float. Left as documentation; allowed combos are listed in ``kernels``.
    kernels: tuple = ()  # tuple of dicts letter -> type: every type combination TF's CPU kernels take
    deviations: tuple = ()  # where this project deliberately differs from TF, and why

    def attr(self, name: str) -> Attr:
        for a in self.attrs:
            if a.name == name:
                return a
        raise KeyError(f"{self.name} has no attribute {name!r}")

    def with_defaults(self, attrs: dict) -> dict:
        """Return ``attrs`` with TF's defaults filled in, after rejecting unknown and missing ones."""
        known = {a.name for a in self.attrs}
        unknown = sorted(set(attrs) - known)
        if unknown:
            raise OpError(self.name, f"unknown attribute(s) {unknown}; known: {sorted(known)}")
        out = {}
        for a in self.attrs:
            if a.name in attrs:
                out[a.name] = normalize_attr(self.name, a, attrs[a.name])
            elif a.required:
                raise OpError(self.name, f"missing required attribute {a.name!r}")
            else:
                out[a.name] = a.default
        return out

    def check_types(self, dtypes: Sequence) -> None:
        """Reject input element types that no TF kernel of this op takes.

        ``dtypes`` holds one NumPy dtype (or ONNX type string) per input, ``None`` where unknown.
        The message names the first input at fault and what it may be.
        """
        bound = {}  # type letter -> (the input that fixed it, its type)
        for param, dtype in zip(self.inputs, dtypes):
            if dtype is None:
                continue
            got = _type_string(dtype)
            if param.type not in self.type_constraints:
                if got != param.type:
                    raise OpError(self.name, f"{param.name} must be {type_name(param.type)}, got {type_name(got)}")
                continue
            if param.type in bound:
                first, want = bound[param.type]
                if got != want:
                    raise OpError(
                        self.name,
                        f"{param.name} must have the same type as {first} ({type_name(want)}), got {type_name(got)}",
                    )
                continue
            allowed = self.type_constraints[param.type]
            if got not in allowed:
                raise OpError(self.name, f"{param.name} must be {_alternatives(allowed)}, got {type_name(got)}")
            bound[param.type] = (param.name, got)
        if bound and not any(all(k.get(letter, t) == t for letter, (_, t) in bound.items()) for k in self.kernels):
            given = ", ".join(f"{first} {type_name(t)}" for first, t in bound.values())
            combos = "; ".join(", ".join(f"{l}={type_name(t)}" for l, t in k.items()) for k in self.kernels)
            raise OpError(self.name, f"TF has no kernel for {given} (its kernels: {combos})")

    def validate(self, shapes: Sequence, values: Optional[Sequence] = None, dtypes: Optional[Sequence] = None,
                 attrs: Optional[dict] = None) -> list:
        """Every check TF makes that the given facts decide; returns the output shapes.

        ``attrs`` are complete (``with_defaults``); ``shapes``, ``values`` and ``dtypes`` hold one
        entry per input, ``None`` where unknown (see ``shape_fn``). Raises :class:`OpError`.
        """
        n = len(self.inputs)
        self.check_types(list(dtypes) if dtypes is not None else [None] * n)
        return self.shape_fn(list(shapes), list(values) if values is not None else [None] * n, attrs)

    def summed_outputs(self) -> tuple:
        """Indices of the outputs flagged ``summed`` (see :class:`Param`)."""
        return tuple(i for i, p in enumerate(self.outputs) if p.summed)

    def placeholder_outputs(self) -> tuple:
        """Indices of the outputs flagged ``placeholder`` (see :class:`Param`)."""
        return tuple(i for i, p in enumerate(self.outputs) if p.placeholder)

    def kernel_function(self) -> Callable:
        module, func = self.reference.split(":")
        return getattr(importlib.import_module(f"ort_ops.reference.{module}"), func)

    def run_reference(self, inputs: Sequence[np.ndarray], attrs: Optional[dict] = None) -> tuple:
        """Run the NumPy kernel on ``inputs`` with ``attrs`` (TF defaults filled in)."""
        if len(inputs) != len(self.inputs):
            raise OpError(self.name, f"expects {len(self.inputs)} inputs, got {len(inputs)}")
        attrs = self.with_defaults(attrs or {})
        arrays = [np.asarray(x) for x in inputs]
        self.validate([a.shape for a in arrays], arrays, [a.dtype for a in arrays], attrs)
        return tuple(self.kernel_function()(*arrays, **attrs))


def normalize_attr(op: str, attr: Attr, value: Any) -> Any:
    """Convert an attribute value as found on an ONNX node (bytes, 0/1 ints...) to its Python form."""
    if attr.kind == "string":
        if isinstance(value, bytes):
            value = value.decode()
        if not isinstance(value, str):
            raise OpError(op, f"attribute {attr.name} must be a string, got {value!r}")
        if attr.choices and value not in attr.choices:
            # TF's words (its op registry rejects the value before any kernel runs); the C++ adapters say the same.
            allowed = ", ".join(f'"{c}"' for c in attr.choices)
            raise OpError(op, f"Value for attr '{attr.name}' of \"{value}\" is not in the list of allowed values: {allowed}")
        return value
    if attr.kind == "bool":
        if value not in (0, 1, True, False):
            raise OpError(op, f"attribute {attr.name} must be 0 or 1, got {value!r}")
        return bool(value)
    if attr.kind == "int":
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise OpError(op, f"attribute {attr.name} must be an int, got {value!r}")
        return int(value)
    if attr.kind == "float":
        if not isinstance(value, (int, float, np.floating, np.integer)) or isinstance(value, bool):
            raise OpError(op, f"attribute {attr.name} must be a float, got {value!r}")
        return float(np.float32(value))  # TF stores float attributes as float32
    if attr.kind == "ints":
        try:
            return [int(v) for v in value]
        except TypeError:
            raise OpError(op, f"attribute {attr.name} must be a list of ints, got {value!r}") from None
    raise AssertionError(f"unknown attribute kind {attr.kind}")


def snake_case(name: str) -> str:
    """``FakeQuantWithMinMaxArgs`` -> ``fake_quant_with_min_max_args``; names the per-op files."""
    out = []
    for i, ch in enumerate(name):
        prev_lower = i and (name[i - 1].islower() or name[i - 1].isdigit())
        next_lower = i + 1 < len(name) and name[i + 1].islower()
        if ch.isupper() and i and (prev_lower or (name[i - 1].isupper() and next_lower)):
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


NUMPY_DTYPES = {
    FLOAT: np.dtype(np.float32),
    DOUBLE: np.dtype(np.float64),
    FLOAT16: np.dtype(np.float16),
    INT32: np.dtype(np.int32),
}


def type_name(onnx_type: str) -> str:
    """``tensor(float)`` -> ``float32``: types in messages are written as TF writes them."""
    return numpy_dtype(onnx_type).name if onnx_type in NUMPY_DTYPES or onnx_type == BFLOAT16 else onnx_type


def _alternatives(types) -> str:
    names = [type_name(t) for t in types]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _type_string(dtype) -> str:
    if isinstance(dtype, str) and dtype.startswith("tensor("):
        return dtype
    try:
        return onnx_type_of(dtype)
    except TypeError:
        return f"tensor({np.dtype(dtype).name})"


def tf_shape(shape) -> str:
    """A shape as TF's TensorShape::DebugString writes it in messages: ``[2,3,?]`` (``?``: unknown dim)."""
    if shape is None:
        return "<unknown>"
    return "[" + ",".join("?" if d is None else str(int(d)) for d in shape) + "]"


def numpy_dtype(onnx_type: str) -> np.dtype:
    if onnx_type == BFLOAT16:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return NUMPY_DTYPES[onnx_type]


def onnx_type_of(dtype) -> str:
    """The ONNX type string of a NumPy dtype (bfloat16 through ml_dtypes)."""
    dtype = np.dtype(dtype)
    for name, dt in NUMPY_DTYPES.items():
        if dt == dtype:
            return name
    if dtype.name == "bfloat16":
        return BFLOAT16
    raise TypeError(f"no ONNX type for dtype {dtype}")
