"""TF's fake-quantization grids as ONNX QuantizeLinear / DequantizeLinear parameters.

A FakeQuantWithMinMax{Args,Vars,VarsPerChannel} node maps x to ``q * scale`` with q an integer of
``[quant_min - zp, quant_max - zp]``, where scale and the zero point zp come from TF's nudging of [min, max]
(ort_ops.reference._fake_quant: the one implementation of TF's arithmetic in this project). ONNX's
DequantizeLinear computes ``(k - zero_point) * scale`` in float32: with ``k = q + zp`` stored as an integer,
the same single rounding of the same product, so a dequantized value is TF's fake-quantized value to the bit.
QuantizeLinear differs from TF's rounding (ONNX: ``round_half_to_even(x / scale) + zp``; TF: ``floor((clamp(x) -
nudged_min) / scale - quant_zero + 0.5)``): at a tie and within an ulp of one they can pick neighbouring
integers, which is why an integer model is judged in quantization steps (converters.integer.steps).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
from onnx import TensorProto

from converters.errors import ConversionError
from ort_ops.reference import _fake_quant as fq

# The quantizers the integer lowering reads, with whether TF divides by the scale (Vars) or multiplies by its
# inverse (Args, PerChannel): the two differ by an ulp, and the exact input quantization must follow TF.
FAKE_QUANT_DIVIDES = {
    "FakeQuantWithMinMaxArgs": False,
    "FakeQuantWithMinMaxVars": True,
    "FakeQuantWithMinMaxVarsPerChannel": False,
}


@dataclasses.dataclass
class Grid:
    """One quantizer's grid: per tensor (``axis`` None, scalar arrays) or per channel along ``axis``."""

    node: str  # the quantizer's node name, for messages
    scale: np.ndarray  # float32
    inv_scale: np.ndarray  # float32, TF's own division, for the exact input quantization
    nudged_min: np.ndarray
    nudged_max: np.ndarray
    zero_point: np.ndarray  # float32 holding integers of [quant_min, quant_max]
    quant_min: int
    quant_max: int
    num_bits: int
    narrow_range: bool
    divide: bool
    axis: Optional[int]

    @property
    def onnx_type(self) -> int:
        """uint8 for 8 bits or fewer (a narrower grid lives inside it, its integers clipped: ``needs_clip``)."""
        if self.num_bits > 8:
            raise ConversionError(f"{self.node}: a {self.num_bits}-bit quantizer; the integer lowering writes 8 bits "
                                  "or fewer (convert this model with lowering='custom' or 'standard')")
        return TensorProto.UINT8

    @property
    def needs_clip(self) -> bool:
        """Whether QuantizeLinear's saturation to [0, 255] is wider than TF's grid [quant_min, quant_max], so that
        the integers must be clipped to it after the QuantizeLinear (narrow range, or fewer than 8 bits)."""
        return self.quant_min != 0 or self.quant_max != 255

    def integers(self, x) -> np.ndarray:
        """TF's integers k = q + zero_point of ``x`` (the stored values of the integer model), as int64."""
        q = fq.quantized_integers(x, *self._broadcast(np.ndim(x)), divide=self.divide)
        return (q + self._along(self.zero_point, np.ndim(x))).astype(np.int64)

    def signed_integers(self, x) -> np.ndarray:
        """TF's q (relative to the zero point): ``q * scale`` is TF's fake-quantized value."""
        q = fq.quantized_integers(x, *self._broadcast(np.ndim(x)), divide=self.divide)
        return q.astype(np.int64)

    def scale_along(self, rank: int) -> np.ndarray:
        return self._along(self.scale, rank)

    def _along(self, p, rank):
        return p if self.axis is None else fq.along_axis(p, rank, self.axis)

    def _broadcast(self, rank):
        return tuple(self._along(p, rank) for p in (self.nudged_min, self.nudged_max, self.scale, self.inv_scale))


def fake_quant_grid(node_name: str, op_type: str, attrs: dict, min_value=None, max_value=None) -> Grid:
    """The Grid of a FakeQuantWithMinMax* node: Args from its attributes, Vars/VarsPerChannel from its constant
    min/max. Refuses what has no integer model: a range of zero width (TF then outputs zeros), a non-finite range."""
    if op_type not in FAKE_QUANT_DIVIDES:
        raise ConversionError(f"{op_type} (node {node_name!r}): the integer lowering reads FakeQuantWithMinMax* "
                              "quantizers only")
    num_bits, narrow = int(attrs.get("num_bits", 8)), bool(attrs.get("narrow_range", 0))
    if op_type == "FakeQuantWithMinMaxArgs":
        min_value, max_value = attrs.get("min", -6.0), attrs.get("max", 6.0)
    mn = np.asarray(min_value, np.float32)
    mx = np.asarray(max_value, np.float32)
    quant_min, quant_max = fq.quant_bounds(num_bits, narrow)
    nudged_min, nudged_max, scale, inv_scale, zp = fq.nudge_with_zero_point(mn, mx, quant_min, quant_max)
    bad = ~np.isfinite(scale) | (scale <= 0) | ~np.isfinite(nudged_min) | ~np.isfinite(nudged_max)
    if bad.any():
        raise ConversionError(
            f"{op_type} (node {node_name!r}): its range [min, max] = [{mn.ravel()[:4]}, {mx.ravel()[:4]}] gives no "
            "positive finite scale (a zero-width or non-finite range), which no integer model can hold; TF outputs "
            "zeros or NaN there. Convert with lowering='custom' or 'standard'")
    axis = None
    if op_type == "FakeQuantWithMinMaxVarsPerChannel":
        axis = int(attrs.get("axis", -1))
    return Grid(node_name, scale, inv_scale, nudged_min, nudged_max, zp, quant_min, quant_max, num_bits, narrow,
                FAKE_QUANT_DIVIDES[op_type], axis)
