"""FusedBatchNormClipFakeQuant: inference batch norm, clip, fake quantization, as the three ops compute them.

The op is the composition by definition (ort_ops/specs/fused.py), so this kernel calls the family's own
kernels in turn. The clip compares as the C++ kernel does, under TF's denormals-are-zero mode (a
subnormal bound acts as a signed zero); the converter fuses only clips whose bounds are not subnormal,
where that is also what ONNX Runtime's Clip computes.
"""
import numpy as np

from ort_ops.reference import _batch_norm as _bn
from ort_ops.reference import _fake_quant as fq
from ort_ops.reference import op_fake_quant_with_min_max_args as fq_args
from ort_ops.reference import op_fake_quant_with_min_max_vars as fq_vars


def run(x, scale, offset, mean, variance, min, max, *, epsilon, data_format, clip_min, clip_max,  # noqa: A002
        fake_quant, num_bits, narrow_range):
    y = _bn.forward(x, scale, offset, mean, variance, epsilon, 1.0, data_format, False)[0]
    lo, hi = fq.flush(np.float32(clip_min)), fq.flush(np.float32(clip_max))
    clipped = fq.eigen_min(fq.eigen_max(y, lo), hi)  # Eigen's cwiseMax(lo).cwiseMin(hi), as ORT's Clip
    if fake_quant == "FakeQuantWithMinMaxArgs":
        return fq_args.run(clipped, min=float(min), max=float(max), num_bits=num_bits, narrow_range=narrow_range)
    return fq_vars.run(clipped, np.float32(min), np.float32(max), num_bits=num_bits, narrow_range=narrow_range)
