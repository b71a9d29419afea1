"""TF's fake-quantization grids as ONNX QuantizeLinear / DequantizeLinear parameters.

A FakeQuantWithMinMax{Args,Vars,VarsPerChannel} node maps x to ``q * scale`` with q an integer of
``[quant_min - zp, quant_max - zp]``, where scale and the zero point zp come from TF's nudging of [min, max]
(ort_ops.reference._fake_quant: the one implementation of TF's arithmetic in this project). ONNX's
DequantizeLinear computes ``(k - zero_point) * scale`` in float32: with ``k = q + zp`` stored as an integer,
the same single rounding of the same product, so a dequantized value is TF's fake-quantized value to the bit.
QuantizeLinear differs from TF's rounding (ONNX: ``round_half_to_even(x / scale) + zp``; TF: ``floor((clamp(x) -
nudged_min) / scale - quant_zero + 0.5)``): at a tie and within an ulp of one they can pick neighbouring
integers, which is why an integer model is judged in quantization steps (converters.integer.steps).

A QuantizeAndDequantize{V2,V3,V4} node maps x to ``q * inverse`` with ``q = round(clamp(x) * scale)`` on the
symmetric grid [-2^(b-1), 2^(b-1) - 1] (narrow range: from -2^(b-1) + 1) or the unsigned [0, 2^b - 1]
(ort_ops.reference._quantize_dequantize): the same form, with TF's ``inverse`` as the ONNX scale and zero point
128 (signed, stored as uint8 ``q + 128``) or 0 (unsigned). Its range is fixed where it is given
(``range_given``), or where the quantized tensor is a constant (a weight: TF takes the range of its values);
a range computed from an activation at run time has no fixed grid, and is refused.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from converters.errors import ConversionError
from ort_ops.reference import _fake_quant as fq
from ort_ops.reference import _quantize_dequantize as qdq

# The quantizers the integer lowering reads, with whether TF divides by the scale (Vars) or multiplies by its
# inverse (Args, PerChannel): the two differ by an ulp, and the exact input quantization must follow TF.
FAKE_QUANT_DIVIDES = {
    "FakeQuantWithMinMaxArgs": False,
    "FakeQuantWithMinMaxVars": True,
    "FakeQuantWithMinMaxVarsPerChannel": False,
}
QUANTIZE_DEQUANTIZE_OPS = ("QuantizeAndDequantizeV2", "QuantizeAndDequantizeV3", "QuantizeAndDequantizeV4")
QUANTIZER_OPS = tuple(FAKE_QUANT_DIVIDES) + QUANTIZE_DEQUANTIZE_OPS
FAKE_QUANT_ROUNDING = "fake_quant"  # Grid.rounding of TF's fake quantization; else a QuantizeAndDequantize round_mode


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
    rounding: str = FAKE_QUANT_ROUNDING  # or qdq.HALF_TO_EVEN / qdq.HALF_UP: q = round(clamp(x) * inv_scale)
    clamps: bool = True  # a QuantizeAndDequantize without a given range does not clamp (its range is the data's)

    def __post_init__(self):
        # The integers are stored as uint8 (a narrower grid lives inside it, its integers clipped: ``needs_clip``).
        if self.num_bits > 8:
            raise ConversionError(f"{self.node}: a {self.num_bits}-bit quantizer; the integer lowering writes 8 bits "
                                  "or fewer (convert this model with lowering='custom' or 'standard')")

    @property
    def needs_clip(self) -> bool:
        """Whether QuantizeLinear's saturation to [0, 255] is wider than TF's grid [quant_min, quant_max], so that
        the integers must be clipped to it after the QuantizeLinear (narrow range, or fewer than 8 bits)."""
        return self.quant_min != 0 or self.quant_max != 255

    def integers(self, x) -> np.ndarray:
        """TF's integers k = q + zero_point of ``x`` (the stored values of the integer model), as int64."""
        return self.signed_integers(x) + self._along(self.zero_point, np.ndim(x)).astype(np.int64)

    def signed_integers(self, x) -> np.ndarray:
        """TF's q (relative to the zero point): ``q * scale`` is TF's quantized value."""
        x = np.asarray(x, np.float32)
        nudged_min, nudged_max, scale, inv_scale = self._broadcast(x.ndim)
        if self.rounding == FAKE_QUANT_ROUNDING:
            q = fq.quantized_integers(x, nudged_min, nudged_max, scale, inv_scale, divide=self.divide)
        else:
            q = qdq.quantized_integers(x, nudged_min, nudged_max, inv_scale, self.clamps, self.rounding)
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


def quantize_dequantize_grid(node_name: str, op_type: str, attrs: dict, min_value=None, max_value=None,
                             data=None) -> Grid:
    """The Grid of a QuantizeAndDequantize{V2,V3,V4} node (``attrs`` with TF's defaults filled in; V3's num_bits
    tensor given as ``attrs["num_bits"]``): over its given range, or over the values of ``data`` (a constant
    input) when the range is not given. Refuses a range computed at run time, a non-positive or non-finite
    scale, and more than 8 bits (Grid.__post_init__)."""
    if op_type not in QUANTIZE_DEQUANTIZE_OPS:
        raise ConversionError(f"{op_type} (node {node_name!r}): not a QuantizeAndDequantize op")
    signed, num_bits, narrow = bool(attrs["signed_input"]), int(attrs["num_bits"]), bool(attrs["narrow_range"])
    range_given, axis = bool(attrs["range_given"]), int(attrs["axis"])
    rounding = attrs.get("round_mode", qdq.HALF_TO_EVEN)  # V3 has no attribute: it rounds half to even
    rounding = rounding.decode() if isinstance(rounding, bytes) else rounding
    if range_given:
        lo = np.asarray(min_value, np.float32).reshape(-1)
        hi = np.asarray(max_value, np.float32).reshape(-1)
    elif data is not None:
        lo, hi = qdq.data_range(qdq.channel_view(np.asarray(data, np.float32), axis), per_axis=axis != -1)
    else:
        raise ConversionError(
            f"{op_type} (node {node_name!r}): range_given is false, so TF quantizes each batch over its own range "
            "at run time; an integer model needs a fixed grid. Give the range (range_given=True with the "
            "calibrated input_min/input_max), or convert with lowering='custom' or 'standard'")
    new_min, new_max, scale, inverse = qdq.compute_range(lo, hi, signed, num_bits, narrow)
    q_lo, q_hi = qdq.quantized_bounds(signed, num_bits, narrow)
    zero = 128 if signed else 0
    step = inverse.copy()
    if data is not None and not range_given:
        # A constant whose channel is all zeros has range [0, 0]: TF's step is 0 and every integer of it is 0,
        # which any positive step dequantizes to the same zeros (a pruned filter); 1 keeps the weight scale valid.
        step = np.where((lo == 0) & (hi == 0), np.float32(1), step).astype(np.float32)
    tiny = np.finfo(np.float32).tiny
    bad = ~np.isfinite(step) | (step < tiny) | ~np.isfinite(scale)
    if bad.any():
        raise ConversionError(
            f"{op_type} (node {node_name!r}): its range [{lo[:4]}, {hi[:4]}] gives no positive, finite, normal "
            "step (a zero-width, subnormal or non-finite range), which no integer model can hold. Convert with "
            "lowering='custom' or 'standard'")
    per_tensor = axis == -1
    shaped = (lambda a: np.asarray(a, np.float32).reshape(())) if per_tensor else (
        lambda a: np.asarray(a, np.float32))
    zp = np.full(np.shape(shaped(step)), zero, np.float32)
    return Grid(node_name, shaped(step), shaped(scale), shaped(new_min), shaped(new_max), zp, q_lo + zero,
                q_hi + zero, num_bits, narrow, False, None if per_tensor else axis, rounding, range_given)


def quantizer_grid(node_name: str, op_type: str, attrs: dict, min_value=None, max_value=None, data=None) -> Grid:
    """The Grid of any quantizer of QUANTIZER_OPS (fake_quant_grid or quantize_dequantize_grid)."""
    if op_type in QUANTIZE_DEQUANTIZE_OPS:
        return quantize_dequantize_grid(node_name, op_type, attrs, min_value, max_value, data)
    return fake_quant_grid(node_name, op_type, attrs, min_value, max_value)
