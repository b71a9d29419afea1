"""``onnx.reference.ReferenceEvaluator`` support: one OpRun class per op, running the NumPy kernels."""
from __future__ import annotations

from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from ort_ops.schemas import DOMAIN
from ort_ops.spec import OpSpec
from ort_ops.specs import OP_SPECS


def _make_op_run(spec: OpSpec):
    def _run(self, *inputs, **attrs):
        # OpRun passes every attribute of the schema-less op as a keyword, None when absent
        # from the node; drop those so the spec fills in TF's defaults.
        given = {k: v for k, v in attrs.items() if v is not None}
        return tuple(spec.kernel_function()(*inputs, **spec.with_defaults(given)))

    # OpRun discovers the attribute names from the signature of _run; spell them out.
    params = ", ".join(f"{a.name}=None" for a in spec.attrs)
    args = ", ".join(f"{a.name}={a.name}" for a in spec.attrs)
    namespace = {"_impl": _run}
    exec(f"def _run(self, *inputs, {params}):\n    return _impl(self, *inputs, {args})\n", namespace)  # noqa: S102
    return type(spec.name, (OpRun,), {"op_domain": DOMAIN, "_run": namespace["_run"]})


OP_RUN_CLASSES = tuple(_make_op_run(spec) for spec in OP_SPECS)


def reference_evaluator(model, **kwargs) -> ReferenceEvaluator:
    """A ReferenceEvaluator over ``model`` that runs every op of the domain with the NumPy kernels."""
    new_ops = list(kwargs.pop("new_ops", [])) + list(OP_RUN_CLASSES)
    return ReferenceEvaluator(model, new_ops=new_ops, **kwargs)
