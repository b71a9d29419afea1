"""Fused ops: chains of the family's ops that the converter writes as one node (converters/fusions.py).

They are this project's, not TensorFlow's: each computes exactly what its chain of nodes computes, the
same float32 operations in the same order, so a model gives the same bits fused and unfused. They
exist because each op of the chain is a pass over memory, and on the CPU the chain is memory-bound.

* ``FusedBatchNormClipFakeQuant``: inference-mode FusedBatchNorm{,V2,V3} (its y only), then a clip
  (tf2onnx's ``Clip`` for a ``Relu6``; without one the bounds are -inf and +inf, which changes no
  value), then FakeQuantWithMinMaxVars or FakeQuantWithMinMaxArgs: tfmot's Conv -> BatchNorm -> ReLU6
  -> activation quantizer, after the convolution.
"""
import math

from ort_ops.checks import batch_norm as bn_checks
from ort_ops.checks import fake_quant as fq_checks
from ort_ops.checks.batch_norm import FORMATS_5D
from ort_ops.spec import FLOAT, Attr, OpError, OpSpec, Param, snake_case
from ort_ops.specs.batch_norm import EPSILON
from ort_ops.specs.fake_quant import NARROW_RANGE, NUM_BITS

FAMILY = "fused"

# The quantizers the fused op can end in: they differ in one operation (Vars divides by the grid
# step, Args multiplies by its own inverse) and in what a range is allowed to be.
QUANTIZERS = ("FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxArgs")


def _batch_norm_clip_fake_quant_shape(shapes, values, attrs):
    op = "FusedBatchNormClipFakeQuant"
    bn_attrs = dict(attrs, is_training=False, exponential_avg_factor=1.0)
    bn_checks.check_forward(op, FORMATS_5D, shapes[:5], bn_attrs)
    clip_min, clip_max = attrs["clip_min"], attrs["clip_max"]
    if math.isnan(clip_min) or math.isnan(clip_max) or not clip_min <= clip_max:
        raise OpError(op, f"clip_min must be <= clip_max (and neither NaN), got {clip_min} and {clip_max}")
    fq_checks.num_bits(op, attrs)
    fq_checks.scalar_range(op, shapes[5], shapes[6])
    if attrs["fake_quant"] == "FakeQuantWithMinMaxArgs" and values[5] is not None and values[6] is not None:
        fq_checks.args_range(op, {"min": float(values[5]), "max": float(values[6])})
    return [shapes[0]]


SPECS = (
    OpSpec(
        name="FusedBatchNormClipFakeQuant",
        family=FAMILY,
        doc="Inference-mode FusedBatchNorm's y, clipped to [clip_min, clip_max], fake-quantized to the nudged grid "
            "of the scalars [min, max]: the three ops' float32 operations in their order, in one pass.",
        inputs=(
            Param("x", FLOAT, "input, 4-D or 5-D; the channel dim is the last one for NHWC and NDHWC, dim 1 for NCHW "
                  "and NCDHW"),
            Param("scale", FLOAT, "[C] gamma"),
            Param("offset", FLOAT, "[C] beta"),
            Param("mean", FLOAT, "[C] population mean"),
            Param("variance", FLOAT, "[C] population variance"),
            Param("min", FLOAT, "scalar lower end of the quantization range"),
            Param("max", FLOAT, "scalar upper end of the quantization range"),
        ),
        outputs=(Param("y", FLOAT),),
        attrs=(
            EPSILON,
            Attr("data_format", "string", "NHWC", "layout of x (channels last or channels first)", choices=FORMATS_5D),
            Attr("clip_min", "float", -math.inf, "lower clip bound, applied as ONNX Runtime's Clip does (max(v, "
                 "clip_min) keeping v when it is NaN or equal)"),
            Attr("clip_max", "float", math.inf, "upper clip bound (min(v, clip_max) likewise); >= clip_min"),
            Attr("fake_quant", "string", QUANTIZERS[0], "the quantizer whose arithmetic and range rules apply",
                 choices=QUANTIZERS),
            NUM_BITS,
            NARROW_RANGE,
        ),
        type_constraints={},
        shape_fn=_batch_norm_clip_fake_quant_shape,
        reference=f"op_{snake_case('FusedBatchNormClipFakeQuant')}:run",
        kernels=({},),
        deviations=(
            "This op is the project's own (TF has no such op): the converter writes it for an inference-mode "
            "FusedBatchNorm whose y only a Clip with constant bounds and then a FakeQuant with a constant range "
            "read. Its output is that chain's, bit for bit.",
        ),
    ),
)
