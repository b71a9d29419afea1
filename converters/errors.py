"""Errors the converters raise. Each says which op (and which node) and why."""


class ConversionError(Exception):
    """A TF graph could not be turned into a correct ONNX model."""


class LoweringError(ConversionError):
    """An op of the family cannot be written in the requested lowering (e.g. standard ONNX) exactly.

    ``op`` is the TF op type, ``node`` the node name, ``reason`` why.
    """

    def __init__(self, op: str, node: str, reason: str):
        self.op, self.node, self.reason = op, node, reason
        super().__init__(f"{op} (node {node!r}) cannot be lowered: {reason}")


class UnconvertedOpsError(ConversionError):
    """Conversion left TF ops behind. ``ops`` lists (op_type, node name) for every one of them."""

    def __init__(self, ops):
        self.ops = list(ops)
        lines = "\n".join(f"  {op_type}: {name}" for op_type, name in self.ops)
        super().__init__(f"{len(self.ops)} TensorFlow op(s) could not be converted:\n{lines}")
