"""``onnx.reference.ReferenceEvaluator`` support: one OpRun class per op, running the NumPy kernels."""
from __future__ import annotations

from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from ort_ops.schemas import DOMAIN
from ort_ops.spec import OpSpec
from ort_ops.specs import OP_SPECS


class DomainOp(OpRun):
    """An op of the domain: validates through its spec and runs its NumPy kernel.

    OpRun passes the node's attributes as keywords (and, where it finds the registered schema, every
    schema attribute, ``None`` when the node leaves it out); the spec fills in TF's defaults.
    """

    op_domain = DOMAIN
    spec: OpSpec

    def _run(self, *inputs, **attrs):
        given = {name: value for name, value in attrs.items() if value is not None}
        return self.spec.run_reference(inputs, given)


def _op_class(spec: OpSpec) -> type:
    # ReferenceEvaluator finds an op's class by its class name (the op type) and op_domain.
    return type(spec.name, (DomainOp,), {"spec": spec, "__doc__": spec.doc})


OP_RUN_CLASSES = tuple(_op_class(spec) for spec in OP_SPECS)


def reference_evaluator(model, **kwargs) -> ReferenceEvaluator:
    """A ReferenceEvaluator over ``model`` that runs every op of the domain with the NumPy kernels."""
    new_ops = list(kwargs.pop("new_ops", [])) + list(OP_RUN_CLASSES)
    return ReferenceEvaluator(model, new_ops=new_ops, **kwargs)
