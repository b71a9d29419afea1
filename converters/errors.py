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


# Why an op is left behind and what to do, for the ops users meet most (others: tf2onnx has no handler for them).
_HINTS = {
    "random": ("TF's random numbers cannot be reproduced outside TF (a Dropout, GaussianNoise or random augmentation "
               "layer in training mode): convert with the layer's rate at 0, or the inference graph"),
    "call": ("a function call that was not inlined; convert a function whose body TF can inline, and report the "
             "model if TF's own layers made it"),
}


def _hint(op_type: str):
    if "Random" in op_type or op_type in ("Multinomial", "RngReadAndSkip"):
        return "random"
    if op_type in ("PartitionedCall", "StatefulPartitionedCall"):
        return "call"
    return None


class UnconvertedOpsError(ConversionError):
    """Conversion left TF ops behind. ``ops`` lists (op_type, node name) for every one of them; the message says
    why where the op type tells (a random op, a function call)."""

    def __init__(self, ops):
        self.ops = list(ops)
        lines = "\n".join(f"  {op_type}: {name}" for op_type, name in self.ops)
        hints = sorted({h for h in (_hint(t) for t, _ in self.ops) if h})
        why = "".join(f"\n{_HINTS[h]}" for h in hints)
        super().__init__(f"{len(self.ops)} TensorFlow op(s) could not be converted:\n{lines}{why}")
