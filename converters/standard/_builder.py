"""A small helper for writing one TF node as a chain of standard ONNX nodes inside a tf2onnx graph.

The lowering functions follow tf2onnx's handler contract: they read what they need from the TF node,
remove it, and build standard-domain nodes whose final outputs carry the TF node's output names, so
every consumer downstream stays connected.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import numpy as np
from onnx import TensorProto, helper

import ort_ops
from converters.errors import LoweringError
from converters.family import tf_attributes, validate_node
from ort_ops.spec import OpError

# ONNX element type -> NumPy dtype for the types the family uses.
NP_TYPES = {
    TensorProto.FLOAT: np.float32,
    TensorProto.DOUBLE: np.float64,
    TensorProto.FLOAT16: np.float16,
    TensorProto.INT32: np.int32,
    TensorProto.INT64: np.int64,
    TensorProto.BOOL: np.bool_,
}


# Single IEEE operations, correctly rounded both by NumPy and by ONNX Runtime's float kernels (Lowering.op).
_FOLDED = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Sqrt": np.sqrt,
           "Neg": np.negative}


class Lowering:
    """Builds the replacement of one TF node.

    Create it, read attributes and input facts, call ``take_over()`` (which removes the TF node and
    remembers its outputs' shapes and types), then build nodes with ``op``/``const`` and route the
    results to the original output names with ``emit``.
    """

    def __init__(self, ctx, node):
        self.ctx = ctx
        self.node = node
        self.op_type = node.type
        self.name = node.name
        self.inputs = list(node.input)
        self.outputs = list(node.output)
        self._out_shapes = {}
        self._out_dtypes = {}
        self._counter = 0
        self._emitted = {}  # built value -> the output name it was renamed to

    # ----- facts about the TF node, read before take_over() -----
    def fail(self, reason: str):
        raise LoweringError(self.op_type, self.name, reason)

    def attr(self, name: str, default=None):
        """An attribute of a TF op outside the domain (the gradient handlers' ops have no spec);
        the domain's ops read ``attrs``, through their spec."""
        value = self.node.get_attr_value(name, default)
        return value.decode() if isinstance(value, bytes) else value

    @functools.cached_property
    def spec(self):
        return ort_ops.get_spec(self.op_type)

    @functools.cached_property
    def attrs(self) -> dict:
        """The op's attributes read through its spec: TF's defaults filled in, values normalized."""
        try:
            return tf_attributes(self.node, self.spec)
        except OpError as e:
            self.fail(e.detail)

    def validate(self) -> list:
        """The spec's checks on the node's static facts (attributes, element types, shapes, constant
        inputs): what TF rejects fails here in the spec's words. Returns the inferred output shapes."""
        attrs = self.attrs
        try:
            return validate_node(self.ctx, self.node, self.spec, attrs)
        except OpError as e:
            self.fail(e.detail)

    def dtype(self, index: int) -> int:
        return self.ctx.get_dtype(self.inputs[index])

    def shape(self, index: int) -> Optional[list]:
        """The input's static shape, unknown dims as -1, or None when the rank is unknown."""
        return self.ctx.get_shape(self.inputs[index])

    def rank(self, index: int) -> Optional[int]:
        return self.ctx.get_rank(self.inputs[index])

    def constant_value(self, index: int) -> Optional[np.ndarray]:
        """The input's value when it is a constant in the graph, else None."""
        name = self.inputs[index]
        if not self.ctx.is_const(name):
            return None
        return np.asarray(self.ctx.get_tensor_value(name, as_list=False))

    def take_over(self):
        """Remove the TF node; from here on its output names are free for the new nodes."""
        for out in self.outputs:
            self._out_shapes[out] = self.ctx.get_shape(out)
            self._out_dtypes[out] = self.ctx.get_dtype(out)
        self.ctx.remove_node(self.name)

    # ----- building -----
    def _fresh(self, what: str) -> str:
        self._counter += 1
        return f"{self.name}__std_{what}_{self._counter}"

    def const(self, value, dtype) -> str:
        """A constant tensor of ``dtype`` (a NumPy dtype); returns its output name."""
        return self.ctx.make_const(self._fresh("const"), np.asarray(value, dtype=dtype)).output[0]

    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attrs):
        """One standard-domain node; returns its output name (or a list of names when outputs > 1).

        An IEEE operation on float constants (``_FOLDED``) is computed here instead, as a constant:
        e.g. batch norm's per-channel factor from frozen statistics. NumPy rounds each of these
        operations correctly, as ONNX Runtime's kernels do, and neither flushes subnormals, so the
        constant holds the bits the node would have computed.
        """
        folded = self._fold(op_type, inputs, outputs, attrs)
        if folded is not None:
            return folded
        node = self.ctx.make_node(op_type, list(inputs), attr=attrs, output_count=outputs, name=self._fresh(op_type))
        return node.output[0] if outputs == 1 else list(node.output)

    def _fold(self, op_type: str, inputs, outputs: int, attrs):
        fn = _FOLDED.get(op_type)
        if fn is None or outputs != 1 or attrs or not all(self.ctx.is_const(i) for i in inputs):
            return None
        values = [np.asarray(self.ctx.get_tensor_value(i, as_list=False)) for i in inputs]
        dtype = values[0].dtype
        if dtype not in (np.float32, np.float64) or any(v.dtype != dtype for v in values):
            return None
        with np.errstate(all="ignore"):
            return self.const(fn(*values), dtype)

    def emit(self, index: int, source: str):
        """Make ``source`` the TF node's output ``index``.

        A value built here is renamed in place (its producer writes the output name, consumers are
        rewired), so no Identity is left behind: ONNX Runtime 1.31's identity elimination breaks
        graphs where an Identity chain ends in a graph output while its producer has other
        consumers. Inputs passed through, and a value emitted twice, go through an Identity.
        """
        out = self.outputs[index]
        shape, dtype = self._out_shapes.get(out), self._out_dtypes.get(out)
        producer = self.ctx.get_node_by_output(source)
        mine = producer is not None and producer.name.startswith(f"{self.name}__std_") and producer.type != "Const"
        if mine and source not in self._emitted:
            self.ctx.replace_all_inputs(source, out)
            outputs = list(producer.output)
            outputs[outputs.index(source)] = out
            producer.output = outputs  # the setter moves the output-name mapping
            if shape is not None:
                self.ctx.set_shape(out, shape)
            if dtype is not None:
                self.ctx.set_dtype(out, dtype)
            self._emitted[source] = out
            return
        source = self._emitted.get(source, source)
        self.ctx.make_node(
            "Identity",
            [source],
            outputs=[out],
            name=self._fresh("out"),
            shapes=[shape] if shape is not None else None,
            dtypes=[dtype] if dtype is not None else None,
        )

    # ----- common patterns -----
    def where(self, cond: str, a: str, b: str, signed_zero_type=None) -> str:
        """cond ? a : b. With ``signed_zero_type`` (the operands' NumPy float type) bit for bit.

        ONNX Runtime's CPU Where (1.31) returns +0 where the selected value is -0 (it merges the
        two selected halves by addition), and TF's results carry signed zeros that matter (e.g.
        -g*0 in gradients, -0 range ends in QuantizeAndDequantize). So the sign is put back: the
        selected value's reciprocal (-inf exactly for -0) is selected too, and a zero result whose
        reciprocal is negative is made -0 again. (Where sometimes keeps -0, e.g. for broadcast
        scalars, so every zero is first made +0; not with x + 0, which ORT's optimizer removes.)
        Leave ``signed_zero_type`` out only when the
        operands cannot hold -0 (booleans, constants without -0).
        """
        picked = self.op("Where", cond, a, b)
        if signed_zero_type is None:
            return picked
        t = signed_zero_type
        recip = self.op("Where", cond, self.op("Reciprocal", a), self.op("Reciprocal", b))
        zero = self.const(0.0, t)
        is_zero = self.op("Equal", picked, zero)
        is_negative_zero = self.op("And", is_zero, self.op("Less", recip, zero))
        sign = self.op("Where", is_negative_zero, self.const(-1.0, t), self.const(1.0, t))
        normalized = self.op("Where", is_zero, zero, picked)
        return self.op("Mul", normalized, sign)

    def flush(self, v: str, np_type, keep_sign: bool = True) -> str:
        """Subnormal -> zero of the same sign. TF runs its CPU kernels with flush-to-zero and
        denormals-are-zero on, so subnormal operands act as zeros and subnormal results become zeros;
        ONNX Runtime computes with subnormals.

        Written as ``v * (|v| >= tiny)``: a normal value or an infinity times 1 is itself, a subnormal
        or a zero times 0 is a zero of its own sign, and a NaN times anything keeps its bits (|NaN| >= tiny
        is false, NaN * 0 is that NaN). Four nodes, exact with the sign, no Where (whose -0 handling
        would need the repair in ``where``). ``keep_sign`` is accepted for callers that do not need the
        sign; the result is the same.
        """
        del keep_sign
        normal = self.op("GreaterOrEqual", self.op("Abs", v), self.const(np.finfo(np_type).tiny, np_type))
        return self.op("Mul", v, self.cast(normal, helper.np_dtype_to_tensor_dtype(np.dtype(np_type))))

    def cast(self, x: str, onnx_type: int) -> str:
        return self.op("Cast", x, to=onnx_type)

    def mask_as(self, cond: str, onnx_type: int) -> str:
        """A boolean mask as 1/0 of ``onnx_type`` (to multiply with, as TF's kernels do)."""
        return self.cast(cond, onnx_type)

    def reduce(self, kind: str, x: str, axes: Optional[Sequence[int]], keepdims: bool) -> str:
        """ReduceSum/Min/Max/Mean over ``axes`` (None: all). Axes go in as an input from opset 18
        (ReduceSum: 13) and as an attribute before."""
        keep = 1 if keepdims else 0
        if axes is None:
            return self.op(kind, x, keepdims=keep)
        axes = [int(a) for a in axes]
        if kind == "ReduceSum" or self.ctx.opset >= 18:
            return self.op(kind, x, self.const(axes, np.int64), keepdims=keep)
        return self.op(kind, x, axes=axes, keepdims=keep)

    def dims_of(self, x: str, indices: Sequence[int]) -> str:
        """Shape(x)[indices] (int64), as a Gather of constant indices.

        Not Shape's own start/end attributes: tf2onnx's optimizers evaluate a Shape node as the whole
        shape whatever they say (its symbolic Reshape folding and its shape propagation, which then
        builds e.g. a ConstantOfShape of the wrong rank); nor a Slice, whose bounds ONNX Runtime clamps.
        """
        return self.op("Gather", self.op("Shape", x), self.const(list(indices), np.int64), axis=0)

    def reshape(self, x: str, dims, like: Optional[str] = None) -> str:
        """Reshape ``x`` to ``dims``: an int is a size (at most one -1), ``None`` copies the dim at the
        same index of ``like`` (default: ``x``) at run time.

        ONNX's own copy marker, a 0 in the shape, is never written: tf2onnx's optimizers fold
        Reshape(Reshape(a, s1), s2) into Reshape(a, s2), reading a 0 of s2 against a's dims instead of
        the intermediate's, and they turn a Transpose that only moves size-1 dims (NHWC -> CNHW of one
        channel) into such a Reshape. The folded shape is then wrong (for the 1-channel depthwise filter
        gradient it made a Conv whose dilated kernel is larger than its padded input, and a Slice of
        its negative-size output aborts assertion-enabled ONNX Runtime builds). A single copied dim
        next to positive constant sizes is written as -1; otherwise the copied dims come from Shape.
        """
        dims = [None if d is None else int(d) for d in dims]
        if None not in dims:
            return self.op("Reshape", x, self.const(dims, np.int64))
        known = [d for d in dims if d is not None]
        if like is None and dims.count(None) == 1 and all(d > 0 for d in known):
            return self.op("Reshape", x, self.const([-1 if d is None else d for d in dims], np.int64))
        return self.op("Reshape", x, self._dims(dims, x if like is None else like))

    def nonempty(self, x: str, axis: int, rank: int) -> str:
        """``x`` with one slice of zeros appended along ``axis`` when that axis is empty at run time (a Pad
        by 0, a plain copy, otherwise). For a dim that is only known at run time and must not be 0 where
        it becomes a Conv's channel axis: ONNX Runtime's Conv loops forever over zero input channels."""
        size = self.dims_of(x, [axis])
        extra = self.op("Sub", self.const([1], np.int64), self.op("Min", size, self.const([1], np.int64)))
        pads = self.op("Concat", self.const([0] * (rank + axis), np.int64), extra,
                       self.const([0] * (rank - axis - 1), np.int64), axis=0)
        return self.op("Pad", x, pads)

    def reshape_to(self, x: str, shape: str) -> str:
        """Reshape ``x`` to the run-time shape ``shape`` (a TF shape: a 0 in it is an empty dim, never
        ONNX's copy marker), with allowzero from opset 14."""
        if self.ctx.opset >= 14:
            return self.op("Reshape", x, shape, allowzero=1)
        return self.op("Reshape", x, shape)

    def zeros(self, shape: Sequence, np_type, like: Optional[str] = None) -> str:
        """Zeros of ``shape`` (ints; ``None`` copies the dim at that index of ``like`` at run time)."""
        onnx_type = helper.np_dtype_to_tensor_dtype(np.dtype(np_type))
        zero = helper.make_tensor("value", onnx_type, [1], [0])
        shape = [None if d is None else int(d) for d in shape]
        if None not in shape:
            return self.op("ConstantOfShape", self.const(shape, np.int64), value=zero)
        return self.op("ConstantOfShape", self._dims(shape, like), value=zero)

    def _dims(self, dims, like: str) -> str:
        """An int64 shape: constant runs of ``dims`` as they are, runs of None from Shape(like)."""
        parts, i = [], 0
        while i < len(dims):
            j = i
            copy = dims[i] is None
            while j < len(dims) and (dims[j] is None) == copy:
                j += 1
            parts.append(self.dims_of(like, range(i, j)) if copy else self.const(dims[i:j], np.int64))
            i = j
        return parts[0] if len(parts) == 1 else self.op("Concat", *parts, axis=0)

    def zeros_like(self, x: str, np_type) -> str:
        """Zeros of ``x``'s runtime shape (never x*0, which keeps NaN)."""
        zero = helper.make_tensor("value", helper.np_dtype_to_tensor_dtype(np.dtype(np_type)), [1], [0])
        return self.op("ConstantOfShape", self.op("Shape", x), value=zero)
