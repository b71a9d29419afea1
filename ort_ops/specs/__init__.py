"""Every op of the domain, one spec each, listed per family."""
from ort_ops.specs import batch_norm, depthwise, fake_quant, fused, quantize_dequantize

FAMILIES = (fake_quant, quantize_dequantize, batch_norm, depthwise, fused)

OP_SPECS = tuple(spec for family in FAMILIES for spec in family.SPECS)
SPECS_BY_NAME = {spec.name: spec for spec in OP_SPECS}


def get_spec(op_type: str):
    try:
        return SPECS_BY_NAME[op_type]
    except KeyError:
        raise KeyError(f"{op_type!r} is not an op of the domain; known ops: {sorted(SPECS_BY_NAME)}") from None
