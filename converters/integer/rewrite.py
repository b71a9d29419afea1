"""The integer lowering's rewrite: a model whose family nodes are the domain's (converters.pipeline with
``lowering="integer"``) becomes standard QDQ that ONNX Runtime's QDQ transformers fuse into integer kernels.

What becomes what (docs/integer.md has the full account):

* an activation quantizer (FakeQuantWithMinMax{Args,Vars,VarsPerChannel}, or QuantizeAndDequantizeV2/V3/V4 with
  a given range, of a computed tensor) becomes QuantizeLinear -> DequantizeLinear on TF's grid
  (converters.integer.grid); where it reads the graph
  input (through layout ops only), the integers are computed with TF's own rounding instead (float ops, then a
  Cast), so the network's input integers are TF's to the bit; a grid narrower than uint8 (narrow range, fewer
  than 8 bits) gets a Clip of its integers to TF's [quant_min, quant_max] after its QuantizeLinear;
* a weight quantizer (the same ops on a constant, kept unfolded by converters.integer.unfolded) becomes an
  initializer holding TF's integers (uint8 with zero point 128 by default, int8 on request: docs/integer.md), with
  a per-output-channel scale into which the constant per-channel
  factors after the convolution (an inference batch norm, a Mul) are folded; the sign of a negative factor
  goes into the integers. The bias (the batch norm's shift, BiasAdd) is int32 with scale = input scale x weight
  scale, the only form ONNX Runtime fuses;
* Conv, DepthwiseConv2dNative (a grouped Conv) and MatMul (a Gemm) with such a weight, a quantized input and a
  quantizer after their per-channel affine tail become DQ -> Conv/Gemm -> Q groups. A ReLU or ReLU6 right before a
  quantizer becomes a Clip of its integers after the QuantizeLinear (exact: clamp and quantization are both
  monotone), dropped where QuantizeLinear's own saturation does the same clamp, so the group stays fused;
* MaxPool and layout ops on a quantized tensor keep its grid: DQ -> op -> Q -> DQ, run on the integers;
* a quantizer after a layout op (Squeeze of the global mean) also quantizes the layout op's input, so that the
  layout op runs on integers and the op before it has its Q.

What it cannot write as integers it leaves in float and names (``IntegerSummary.float_ops``): a convolution or
matmul without a quantized input or a quantizer after it, or whose kernel TF leaves float (tfmot does to a layer
before a ReLU layer); the quantizer after such a float island rounds as TF does, with no QuantizeLinear for ONNX
Runtime to quantize the island's float kernel against (quantizes_float_island). A depthwise convolution left in NHWC
is written between Transposes (emit_conv). A family node it has no rule for is a ConversionError naming the node.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Dict, List, Optional

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from converters.errors import ConversionError
import ort_ops
from converters.integer.grid import (FAKE_QUANT_ROUNDING, QUANTIZE_DEQUANTIZE_OPS, QUANTIZER_OPS, Grid,
                                     fake_quant_grid, quantize_dequantize_grid, quantizer_grid)
from ort_ops.reference._quantize_dequantize import HALF_UP
from ort_ops.schemas import DOMAIN

INT8_MIN, INT8_MAX = -128, 127
INT32_LIMIT = 2 ** 31 - 1
LAYOUT_OPS = ("Squeeze", "Unsqueeze", "Reshape", "Flatten", "Transpose")
# Ops whose output is on their input's grid (they move or select values; max commutes with the monotone
# quantization): ONNX Runtime runs them on the integers between a DequantizeLinear and a QuantizeLinear.
GRID_PRESERVING_OPS = ("MaxPool", "Identity", "Pad") + LAYOUT_OPS  # Pad: see _pads_on_grid
BATCH_NORM_OPS = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
# Standard ops a float island's result may pass on its way to its quantizer (quantizes_float_island): a
# per-channel tail, a clamp, a move.
ISLAND_TAIL_OPS = ("Relu", "Clip", "Add", "Sub", "Mul", "Identity") + LAYOUT_OPS


@dataclasses.dataclass
class IntegerSummary:
    """What the integer lowering wrote: counts, and every place left in float, by node and reason."""

    integer_ops: Dict[str, int] = dataclasses.field(default_factory=collections.Counter)  # Conv/Gemm groups
    compute_ops: Dict[str, int] = dataclasses.field(default_factory=collections.Counter)  # all Conv/MatMul
    activation_quantizers: int = 0
    weight_quantizers: int = 0
    exact_input_quantizers: int = 0
    island_output_quantizers: int = 0  # after a float convolution or matmul, with TF's rounding
    clipped_quantizers: List[str] = dataclasses.field(default_factory=list)  # narrow/low-bit grids
    integer_clamps: int = 0  # ReLU/ReLU6 (and narrow grids) written as a Clip of the integers
    dropped_clamps: int = 0  # ReLU/ReLU6 that QuantizeLinear's saturation already does
    float_ops: List[str] = dataclasses.field(default_factory=list)  # "node (op): why"
    weight_storage: str = "uint8 with zero point 128"

    def lines(self) -> List[str]:
        out = []
        for op in sorted(self.compute_ops):
            out.append(f"{op} in integer: {self.integer_ops.get(op, 0)}/{self.compute_ops[op]}")
        out.append(f"quantizers: {self.activation_quantizers} activation (QuantizeLinear/DequantizeLinear, "
                   f"{self.exact_input_quantizers} of the graph input and {self.island_output_quantizers} after a "
                   "convolution or matmul left in float, with TF's rounding), "
                   f"{self.weight_quantizers} weight (TF's int8 integers, stored as {self.weight_storage}); ReLU/ReLU6: "
                   f"{self.integer_clamps} as a Clip of the integers, {self.dropped_clamps} dropped (the grid clamps)")
        if self.clipped_quantizers:
            out.append(f"{len(self.clipped_quantizers)} quantizer(s) on a grid narrower than uint8 (narrow range or "
                       "fewer than 8 bits): a Clip keeps their integers on TF's grid after the QuantizeLinear, in "
                       "ONNX Runtime's 8-bit kernels: " + ", ".join(self.clipped_quantizers[:5])
                       + (" ..." if len(self.clipped_quantizers) > 5 else ""))
        if self.float_ops:
            out.append(f"{len(self.float_ops)} float island(s): " + "; ".join(self.float_ops[:8])
                       + (" ..." if len(self.float_ops) > 8 else ""))
        return out


@dataclasses.dataclass
class _QuantizedConstant:
    """A weight on TF's grid: signed integers q (TF's value is q * scale) and each element's scale."""

    q: np.ndarray  # int64
    scale: np.ndarray  # float32, q's shape
    source: str  # the weight quantizer's node name

    def transposed(self, perm):
        return _QuantizedConstant(np.transpose(self.q, perm), np.transpose(self.scale, perm), self.source)

    def reshaped(self, shape):
        return _QuantizedConstant(self.q.reshape(shape), self.scale.reshape(shape), self.source)


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


WEIGHT_TYPES = ("uint8", "int8")


class _Rewriter:
    def __init__(self, model: onnx.ModelProto, weights: str = "uint8"):
        if weights not in WEIGHT_TYPES:
            raise ValueError(f"integer_weights must be one of {WEIGHT_TYPES}, got {weights!r}")
        self.weight_type = weights
        self.model = model
        self.graph = model.graph
        self.constants = {i.name: numpy_helper.to_array(i) for i in self.graph.initializer}
        for node in self.graph.node:
            if node.op_type == "Constant" and not node.domain:
                self.constants[node.output[0]] = numpy_helper.to_array(_attrs(node)["value"])
        self.producer = {o: n for n in self.graph.node for o in n.output}
        self.consumers = collections.defaultdict(list)
        for node in self.graph.node:
            for i in node.input:
                self.consumers[i].append(node)
        self.graph_outputs = {o.name for o in self.graph.output}
        self.graph_inputs = {i.name for i in self.graph.input} - set(self.constants)
        self.shapes = self._shapes()
        self.summary = IntegerSummary()
        if weights == "int8":
            self.summary.weight_storage = "int8 (exact on VNNI x86 CPUs and ARM only)"
        self.new_nodes: List[onnx.NodeProto] = []
        self.new_initializers: List[onnx.TensorProto] = []
        self.absorbed = set()  # names of nodes a rewrite replaced
        self.activation_grids: Dict[str, Grid] = {}  # quantizer output -> its grid
        self.weights: Dict[str, _QuantizedConstant] = {}
        self.pre_quantized: Dict[str, Grid] = {}  # layout node name -> the grid of the quantizer after it
        self.output_steps: Dict[str, float] = {}
        self.inherited: Dict[str, onnx.NodeProto] = {}  # grid-preserving op's output -> the op
        self.clamps: Dict[str, onnx.NodeProto] = {}  # quantizer output -> the ReLU/Clip it absorbs
        self.float_results = set()  # outputs of the convolutions and matmuls written in float (float islands)

    # -- helpers ---------------------------------------------------------------------------------------------
    def _shapes(self) -> Dict[str, list]:
        try:
            inferred = onnx.shape_inference.infer_shapes(self.model)
        except Exception:  # shape inference is an aid here (Gemm needs rank 2), not a requirement
            return {}
        shapes = {}
        for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
                shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
        return shapes

    def sole_consumer(self, tensor: str):
        users = self.consumers.get(tensor, [])
        if len(users) != 1 or tensor in self.graph_outputs:
            return None
        return users[0]

    def initializer(self, name: str, value: np.ndarray) -> str:
        self.new_initializers.append(numpy_helper.from_array(value, name))
        return name

    def emit(self, op_type, inputs, outputs, name, doc_string=None, **attrs):
        self.new_nodes.append(helper.make_node(op_type, list(inputs), list(outputs), name=name, doc_string=doc_string,
                                               **attrs))
        return outputs[0]

    def is_family(self, node, *types) -> bool:
        return node.domain == DOMAIN and (not types or node.op_type in types)

    @staticmethod
    def layout(node) -> str:
        """The data format of a domain node (TF's default NHWC where unset); standard ONNX ops are NCHW."""
        return _text(_attrs(node).get("data_format", "NHWC")) if node.domain else "NCHW"

    def _grid_of(self, node) -> Optional[Grid]:
        """The Grid of a domain quantizer with a fixed range (None for other nodes)."""
        if not self.is_family(node, *QUANTIZER_OPS):
            return None
        attrs = {k: _text(v) for k, v in _attrs(node).items()}
        if node.op_type == "FakeQuantWithMinMaxArgs":
            return fake_quant_grid(node.name, node.op_type, attrs)
        if node.op_type in QUANTIZE_DEQUANTIZE_OPS:
            attrs = ort_ops.get_spec(node.op_type).with_defaults(attrs)
            if node.op_type == "QuantizeAndDequantizeV3":
                num_bits = self.constants.get(node.input[3])
                if num_bits is None:
                    raise ConversionError(f"{node.op_type} (node {node.name!r}): its num_bits is computed in the "
                                          "graph, not a constant; an integer model needs a fixed grid")
                attrs["num_bits"] = int(num_bits)
            if not attrs["range_given"]:  # over a constant's own values (a weight), else refused
                return quantize_dequantize_grid(node.name, node.op_type, attrs, data=self.constants.get(node.input[0]))
        mn, mx = (self.constants.get(t) for t in node.input[1:3])
        if mn is None or mx is None:
            raise ConversionError(f"{node.op_type} (node {node.name!r}): its min/max are computed in the graph, "
                                  "not constants; an integer model needs a fixed range (a training step or a "
                                  "range fed at run time cannot be one)")
        return quantizer_grid(node.name, node.op_type, attrs, mn, mx)

    # -- analysis --------------------------------------------------------------------------------------------
    def classify_quantizers(self):
        for node in self.graph.node:
            if self.is_family(node) and node.op_type not in QUANTIZER_OPS and node.op_type not in (
                    "DepthwiseConv2dNative",) + BATCH_NORM_OPS:
                raise ConversionError(
                    f"{node.op_type} (node {node.name!r}): the integer lowering has no rule for this op (it writes "
                    "FakeQuantWithMinMax* and QuantizeAndDequantizeV2/V3/V4 quantizers, convolutions, matmuls and "
                    "inference batch norms folded into them); convert with lowering='custom' or 'standard'")
            grid = self._grid_of(node)
            if grid is None:
                continue
            value = self.constants.get(node.input[0])
            if value is not None:
                q = grid.signed_integers(value)
                scale = np.broadcast_to(grid.scale_along(value.ndim), value.shape).astype(np.float32)
                self.weights[node.output[0]] = _QuantizedConstant(q, scale, node.name)
                self.summary.weight_quantizers += 1
            else:
                self.activation_grids[node.output[0]] = grid
        # Layout ops on a quantized weight (tf2onnx's Transpose to OIHW) move its integers with it.
        for node in self.graph.node:
            if node.input and node.input[0] in self.weights and not node.domain:
                w = self.weights[node.input[0]]
                if node.op_type == "Transpose":
                    self.weights[node.output[0]] = w.transposed(_attrs(node)["perm"])
                elif node.op_type == "Identity":
                    self.weights[node.output[0]] = w
                elif node.op_type == "Reshape" and node.input[1] in self.constants:
                    self.weights[node.output[0]] = w.reshaped(self._reshape_target(w.q.shape, self.constants[node.input[1]]))
        # A ReLU/Clip right before a quantizer becomes a clamp of its integers (see emit_activation_quantizer).
        for out, grid in self.activation_grids.items():
            clamp = self.producer.get(self.producer[out].input[0])
            if (clamp is not None and not clamp.domain and clamp.op_type in ("Relu", "Clip") and grid.axis is None
                    and self.sole_consumer(clamp.output[0]) is self.producer[out] and self._clamp_bounds(clamp)):
                self.clamps[out] = clamp
                self.absorbed.add(clamp.name)
        # Grid-preserving ops on a quantized tensor, with no quantizer of their own after them: their output gets
        # the same grid (a Q/DQ pair after them, exact: QuantizeLinear of a dequantized grid value is that integer).
        for node in self.graph.node:
            if (not node.domain and node.op_type in GRID_PRESERVING_OPS and node.input
                    and node.input[0] in self.activation_grids and node.output[0] not in self.activation_grids
                    and self.activation_grids[node.input[0]].axis is None
                    and (node.op_type != "Pad" or self._pads_on_grid(node, self.activation_grids[node.input[0]]))
                    and not any(u.output and u.output[0] in self.activation_grids for u in self.consumers[node.output[0]])):
                self.activation_grids[node.output[0]] = self.activation_grids[node.input[0]]
                self.inherited[node.output[0]] = node
        # A quantizer after a layout op that reads a float op: the layout op's input gets the quantizer too.
        for out, grid in self.activation_grids.items():
            fq = self.producer[out]
            layout = self.producer.get(fq.input[0])
            if (layout is not None and layout.op_type in LAYOUT_OPS and not layout.domain and grid.axis is None
                    and self.sole_consumer(layout.output[0]) is fq and layout.input[0] not in self.activation_grids
                    and layout.input[0] not in self.graph_inputs):
                self.pre_quantized[layout.name] = grid

    def _pads_on_grid(self, pad, grid: Grid) -> bool:
        """Whether a Pad's output stays on its input's grid: edge and reflect copy input values; a constant pad
        does where its value is a grid point (0 always is: TF's nudging puts zero on the grid)."""
        if _text(_attrs(pad).get("mode", "constant")) != "constant":
            return True
        if len(pad.input) < 3 or not pad.input[2]:
            return True  # ONNX's default: 0
        value = self.constants.get(pad.input[2])
        if value is None or value.size != 1:
            return False
        v = np.float32(value.reshape(()))
        k = np.rint(v / grid.scale) + grid.zero_point
        return bool(grid.quant_min <= k <= grid.quant_max
                    and np.float32((k - grid.zero_point) * grid.scale) == v)

    @staticmethod
    def _reshape_target(shape, target):
        target = [int(t) for t in target]
        for i, t in enumerate(target):
            if t == 0:
                target[i] = shape[i]
        return tuple(target)

    def reads_graph_input(self, tensor: str) -> bool:
        """Whether ``tensor`` is the graph input, through layout ops only."""
        seen = 0
        while tensor not in self.graph_inputs:
            node = self.producer.get(tensor)
            if node is None or node.domain or node.op_type not in LAYOUT_OPS or seen > 8:
                return False
            tensor, seen = node.input[0], seen + 1
        return True

    # -- activation quantizers -------------------------------------------------------------------------------
    def quantizer_params(self, prefix: str, grid: Grid, rank: Optional[int]):
        scale, zp = grid.scale, grid.zero_point.astype(np.uint8)
        attrs = {}
        if grid.axis is not None:
            if rank is None and grid.axis < 0:
                raise ConversionError(f"{grid.node}: a per-channel activation quantizer of unknown rank")
            attrs["axis"] = grid.axis if grid.axis >= 0 else grid.axis + rank
        s = self.initializer(prefix + "/scale", np.asarray(scale, np.float32))
        z = self.initializer(prefix + "/zero_point", np.asarray(zp, np.uint8))
        return s, z, attrs

    def emit_activation_quantizer(self, node, grid: Grid, source: Optional[str] = None, output: Optional[str] = None):
        x = source or node.input[0]
        out = output or node.output[0]
        prefix = f"{node.name}/integer" if output is None else f"{node.name}/integer_regrid"
        rank = len(self.shapes[x]) if x in self.shapes else None
        s, z, attrs = self.quantizer_params(prefix, grid, rank)
        integers = prefix + "/integers"
        clamp = self.clamps.get(out) if output is None else None
        if clamp is not None:
            x = clamp.input[0]
        island = self.quantizes_float_island(x)
        if island or (output is None and self.reads_graph_input(x)):
            self.emit_tf_rounding(prefix, x, grid, integers, rank)
            if output is None:
                if island:
                    self.summary.island_output_quantizers += 1
                else:
                    self.summary.exact_input_quantizers += 1
        else:
            self.emit("QuantizeLinear", [x, s, z], [integers], prefix + "/QuantizeLinear", **attrs)
        lo, hi = self.integer_bounds(grid, clamp)
        if (lo, hi) != (0, 255):
            if grid.axis is not None:
                raise ConversionError(f"{grid.node}: a per-channel activation grid narrower than uint8 (narrow range "
                                      "or fewer than 8 bits); the integer lowering writes such grids per tensor")
            clamped = prefix + "/integers_clamped"
            self.emit("Clip", [integers, self.initializer(prefix + "/integer_min", np.uint8(lo)),
                               self.initializer(prefix + "/integer_max", np.uint8(hi))], [clamped], prefix + "/Clip")
            integers = clamped
            if clamp is not None:
                self.summary.integer_clamps += 1
            if grid.needs_clip and grid.node not in self.summary.clipped_quantizers:
                self.summary.clipped_quantizers.append(grid.node)
        elif clamp is not None:
            self.summary.dropped_clamps += 1
        self.emit("DequantizeLinear", [integers, s, z], [out], prefix + "/DequantizeLinear", **attrs)
        if output is None:
            self.summary.activation_quantizers += 1
            if out in self.graph_outputs and grid.axis is None:
                self.output_steps[out] = float(grid.scale)

    def quantizes_float_island(self, tensor: str) -> bool:
        """Whether ``tensor`` (what a quantizer reads) is a float island's convolution or matmul, through its
        per-channel tail, clamps and moves only. Such a quantizer is written with TF's rounding
        (:meth:`emit_tf_rounding`), never as a QuantizeLinear: ONNX Runtime's WeightBiasQuantization (a level-1
        transformer, onnxruntime/core/optimizer/qdq_transformer/weight_bias_quantization.cc) gives a Conv or
        Gemm with a float filter its own per-tensor int8 quantization wherever it reads a per-tensor
        DequantizeLinear and reaches a QuantizeLinear through Relu/Clip alone (its Conv-Add, Conv-Mul and
        MatMul-Add fusions make more such paths), and the QDQ fusion then runs it in integer with a filter TF
        never had. With no QuantizeLinear after it, nothing in ONNX Runtime quantizes the island at any
        optimization level; and its float result rounds as TF's does (the graph input's exact quantizer)."""
        for _ in range(32):
            if tensor in self.float_results:
                return True
            node = self.producer.get(tensor)
            if node is None:
                return False
            if not self.is_family(node, *BATCH_NORM_OPS) and (node.domain or node.op_type not in ISLAND_TAIL_OPS):
                return False
            variable = [i for i in (node.input[:1] if node.domain else node.input) if i and i not in self.constants]
            if len(variable) != 1:
                return False
            tensor = variable[0]
        return False

    def emit_tf_rounding(self, prefix: str, x: str, grid: Grid, integers: str, rank: Optional[int]):
        """k = floor((clamp(x) - nudged_min) / scale - quant_zero + 0.5) + zero_point, in float32 as TF's
        kernel computes it (ort_ops.reference._fake_quant.quantized_integers), then a Cast to uint8; for a
        QuantizeAndDequantize, k = round(clamp(x) * scale) + zero_point."""
        along = (lambda p: np.asarray(p, np.float32)) if grid.axis is None else (
            lambda p: np.asarray(grid._along(p, rank), np.float32))
        quant_zero = np.floor((-grid.nudged_min * grid.inv_scale).astype(np.float32) + np.float32(0.5))
        c = lambda name, v: self.initializer(f"{prefix}/{name}", along(v))  # noqa: E731
        t = self.emit("Min", [x, c("nudged_max", grid.nudged_max)], [prefix + "/min"], prefix + "/Min")
        t = self.emit("Max", [t, c("nudged_min", grid.nudged_min)], [prefix + "/max"], prefix + "/Max")
        if grid.rounding != FAKE_QUANT_ROUNDING:
            # QuantizeAndDequantize: q = round(clamp(x) * scale) (ort_ops.reference._quantize_dequantize), ONNX's
            # Round being IEEE half to even as TF's rint, HALF_UP floor(v + 0.5) in float32 as TF computes it.
            t = self.emit("Mul", [t, c("inv_step", grid.inv_scale)], [prefix + "/scaled"], prefix + "/Mul")
            if grid.rounding == HALF_UP:
                t = self.emit("Add", [t, c("half", np.float32(0.5))], [prefix + "/half_up"], prefix + "/AddHalf")
                t = self.emit("Floor", [t], [prefix + "/q"], prefix + "/Floor")
            else:
                t = self.emit("Round", [t], [prefix + "/q"], prefix + "/Round")
            t = self.emit("Add", [t, c("zero_point_f", grid.zero_point)], [prefix + "/k"], prefix + "/AddZeroPoint")
            self.emit("Cast", [t], [integers], prefix + "/Cast", to=TensorProto.UINT8)
            return
        t = self.emit("Sub", [t, prefix + "/nudged_min"], [prefix + "/shifted"], prefix + "/Sub")
        if grid.divide:
            t = self.emit("Div", [t, c("step", grid.scale)], [prefix + "/scaled"], prefix + "/Div")
        else:
            t = self.emit("Mul", [t, c("inv_step", grid.inv_scale)], [prefix + "/scaled"], prefix + "/Mul")
        t = self.emit("Sub", [t, c("quant_zero", quant_zero)], [prefix + "/centred"], prefix + "/SubZero")
        t = self.emit("Add", [t, c("half", np.float32(0.5))], [prefix + "/half_up"], prefix + "/AddHalf")
        t = self.emit("Floor", [t], [prefix + "/q"], prefix + "/Floor")
        t = self.emit("Add", [t, c("zero_point_f", grid.zero_point)], [prefix + "/k"], prefix + "/AddZeroPoint")
        self.emit("Cast", [t], [integers], prefix + "/Cast", to=TensorProto.UINT8)

    # -- convolutions and matmuls ----------------------------------------------------------------------------
    def input_grid(self, node):
        """(the quantized input tensor, its grid, pads folded from a Pad between them) or None."""
        x = node.input[0]
        pads = None
        pad = self.producer.get(x)
        if pad is not None and pad.op_type == "Pad" and not pad.domain and self.sole_consumer(x) is node:
            mode = _text(_attrs(pad).get("mode", "constant"))
            value = self.constants.get(pad.input[2]) if len(pad.input) > 2 and pad.input[2] else np.float32(0)
            widths = self.constants.get(pad.input[1]) if len(pad.input) > 1 else None
            # ONNX's pads: [begin of each dim, end of each dim]; H and W are dims 2, 3 (NCHW) or 1, 2 (NHWC).
            h, w = (1, 2) if self.layout(node) == "NHWC" else (2, 3)
            others = [d for d in range(8) if d % 4 not in (h, w)]
            if (mode == "constant" and value is not None and float(value) == 0.0 and widths is not None
                    and len(widths) == 8 and not widths[others].any() and pad.input[0] in self.activation_grids
                    and (not self._pads_itself_same(node) or self._padded_size(node) is not None)):
                pads = [int(widths[h]), int(widths[w]), int(widths[h + 4]), int(widths[w + 4])]
                x = pad.input[0]
        grid = self.activation_grids.get(x)
        if grid is None or grid.axis is not None:
            return None
        return x, grid, pads, (pad if pads is not None else None)

    def _pads_itself_same(self, node) -> bool:
        """Whether the convolution pads SAME by itself (a Conv with auto_pad, a depthwise with padding SAME)."""
        attrs = _attrs(node)
        if node.domain:
            return _text(attrs.get("padding", "")) == "SAME"
        return _text(attrs.get("auto_pad", "NOTSET")) not in ("NOTSET", "VALID")

    def _padded_size(self, node):
        """(H, W) of the convolution's input (the Pad's output), known at conversion time, or None."""
        h, w = (1, 2) if self.layout(node) == "NHWC" else (2, 3)
        shape = self.shapes.get(node.input[0])
        if shape is None or len(shape) != 4 or not shape[h] or not shape[w]:
            return None
        return int(shape[h]), int(shape[w])

    def _same_pads(self, node, strides, dilations, kernel):
        """SAME's own pads [top, left, bottom, right] for the padded input (TF's: the odd pixel at the end)."""
        size = self._padded_size(node)
        if size is None:  # input_grid folds a Pad into a SAME convolution only where the size is known
            raise ConversionError(f"{node.op_type} (node {node.name!r}): a Pad before SAME padding over an input "
                                  "of unknown spatial size")
        before, after = [], []
        for n, s, d, k in zip(size, strides, dilations, kernel):
            total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
            before.append(total // 2)
            after.append(total - total // 2)
        return before + after

    def affine_tail(self, node):
        """Follow the compute node's output through per-channel constant Add / Mul / inference batch norms, then
        an optional ReLU/Clip, to a quantizer: (a, b, clamp node or None, last tail tensor, quantizer node,
        absorbed nodes) with the tail = conv * a + b per output channel, or None."""
        a = b = None
        absorbed = []
        out = node.output[0]
        while True:
            user = self.sole_consumer(out)
            if user is None:
                return None
            other = [i for i in user.input if i != out]
            if not user.domain and user.op_type in ("Add", "Mul") and len(other) == 1 and other[0] in self.constants:
                c = self.constants[other[0]].astype(np.float32)
                vec = self._per_channel(node, c)
                if vec is None:
                    break
                a = np.ones_like(vec) if a is None else a
                b = np.zeros_like(vec) if b is None else b
                if user.op_type == "Add":
                    b = (b + vec).astype(np.float32)
                else:
                    a, b = (a * vec).astype(np.float32), (b * vec).astype(np.float32)
            elif self.is_family(user, *BATCH_NORM_OPS) and user.input[0] == out:
                norm = self.inference_batch_norm(user) if self.layout(user) == self.layout(node) else None
                if norm is None:
                    return None
                k, mean, beta = norm
                a = np.ones_like(k) if a is None else a
                b = np.zeros_like(k) if b is None else b
                a, b = (a * k).astype(np.float32), ((b - mean) * k + beta).astype(np.float32)
            else:
                break
            absorbed.append(user)
            out = user.output[0]
        clamp = None
        user = self.sole_consumer(out)
        if user is not None and user.name in self.absorbed and user.op_type in ("Relu", "Clip"):
            clamp = user  # absorbed by the quantizer after it
            user = self.sole_consumer(user.output[0])
        if user is None or user.output[0] not in self.activation_grids:
            return None
        return a, b, clamp, out, user, absorbed

    def _per_channel(self, node, c):
        """A constant that broadcasts along the compute node's output channels only, as a [C] vector (None else)."""
        if node.op_type == "MatMul" or self.layout(node) == "NHWC":  # channels last
            return c.ravel() if c.ndim <= 1 or all(d == 1 for d in c.shape[:-1]) else None
        squeezed = c.reshape(-1) if c.size == 1 else None
        if squeezed is not None:
            return squeezed
        if c.ndim >= 3 and c.shape[-1] == 1 and c.shape[-2] == 1 and all(d == 1 for d in c.shape[:-3]):
            return c.reshape(-1)
        return None

    def _clamp_bounds(self, clamp):
        """(lo, hi) of a Relu or a Clip with constant (or absent) bounds, else None."""
        if clamp.op_type == "Relu":
            return np.float32(0), np.float32(np.inf)
        bounds = []
        for i, default in ((1, -np.inf), (2, np.inf)):
            if len(clamp.input) > i and clamp.input[i]:
                value = self.constants.get(clamp.input[i])
                if value is None or value.size != 1:
                    return None
                bounds.append(np.float32(value.reshape(())))
            else:
                bounds.append(np.float32(default))
        return tuple(bounds)

    def integer_bounds(self, grid: Grid, clamp):
        """The integers a quantizer's output may take: TF's grid [quant_min, quant_max], narrowed by a ReLU/Clip
        before it to [Q(lo), Q(hi)]. Clamp-then-quantize equals quantize-then-clamp-the-integers (both monotone),
        so the clamp moves after QuantizeLinear, where it leaves the op before the quantizer fused with it."""
        lo, hi = grid.quant_min, grid.quant_max
        if clamp is not None:
            c_lo, c_hi = self._clamp_bounds(clamp)

            def onnx_q(v):
                with np.errstate(all="ignore"):
                    return int(np.clip(np.rint(np.float32(v) / grid.scale) + grid.zero_point, 0, 255))

            lo, hi = max(lo, onnx_q(c_lo)), min(hi, onnx_q(c_hi))
        return lo, hi

    def rewrite_compute(self, node) -> bool:
        kind = "MatMul" if node.op_type == "MatMul" else ("DepthwiseConv2dNative" if node.domain else "Conv")
        if len(node.input) < 2:
            return False
        if node.input[1] not in self.weights:
            if node.input[1] not in self.constants:
                return False
            # A float constant filter: TF computes with the float kernel. tfmot's quantize_model does this to a
            # Conv2D, DepthwiseConv2D or Dense followed by a ReLU layer (docs/integer.md, "Float kernels").
            self.summary.compute_ops[kind] += 1
            what = "weight" if kind == "MatMul" else "filter"
            return self._float(node, kind, f"its {what} is not quantized in TF (TF computes with the float {what})")
        self.summary.compute_ops[kind] += 1
        why = None
        found = self.input_grid(node)
        tail = self.affine_tail(node)
        if found is None:
            why = "its input is not quantized"
        elif tail is None:
            why = "no quantizer after it (through a per-channel affine tail and a ReLU/Clip)"
        if why is None and node.op_type == "MatMul" and len(self.shapes.get(found[0], [])) != 2:
            why = "a MatMul of an input not known to be 2-D (written as Gemm only then)"
        if why is not None:
            return self._float(node, kind, why)
        x, in_grid, pads, pad_node = found
        a, b, _, tail_out, _, absorbed = tail
        w = self.weights[node.input[1]]
        q, scale = self.compute_layout(node, w)
        channels = q.shape[0]
        a = np.ones(channels, np.float32) if a is None else np.broadcast_to(a, (channels,)).astype(np.float32)
        b = np.zeros(channels, np.float32) if b is None else np.broadcast_to(b, (channels,)).astype(np.float32)
        if node.op_type == "Conv" and len(node.input) > 2 and node.input[2]:
            conv_bias = self.constants.get(node.input[2])
            if conv_bias is None:
                return self._float(node, kind, "its bias is not a constant")
            b = (conv_bias.astype(np.float32) * a + b).astype(np.float32)
        w_scale = (scale * np.abs(a)).astype(np.float32)
        sign = np.where(a < 0, -1, 1).reshape((-1,) + (1,) * (q.ndim - 1))
        q = q * sign
        name = node.name
        if not (np.isfinite(w_scale).all() and (w_scale >= np.finfo(np.float32).tiny).all()):
            raise ConversionError(f"{kind} (node {name!r}): folding its per-channel factors (batch norm, Mul) into the "
                                  "weight scale gives a zero, subnormal or non-finite scale; convert with "
                                  "lowering='custom' or 'standard'")
        if q.min() < INT8_MIN or q.max() > INT8_MAX:
            raise ConversionError(f"{kind} (node {name!r}): TF's weight integers (quantizer {w.source!r}) reach "
                                  f"[{q.min()}, {q.max()}], outside int8; the integer lowering writes int8 weights")
        bias_scale = (np.float32(in_grid.scale) * w_scale).astype(np.float32)
        bias = np.rint(b.astype(np.float64) / bias_scale.astype(np.float64))
        if not np.isfinite(bias).all() or np.abs(bias).max(initial=0) > INT32_LIMIT:
            raise ConversionError(f"{kind} (node {name!r}): its bias in units of input scale x weight scale does not "
                                  "fit int32")
        prefix = f"{name}/integer"
        # uint8 (the integers + 128, zero point 128) unless asked: ONNX Runtime's u8s8 kernels saturate on x86
        # CPUs without VNNI (docs/integer.md, "Weights as uint8").
        stored, zero = ((q + 128).astype(np.uint8), np.full(channels, 128, np.uint8)) if self.weight_type == "uint8" \
            else (q.astype(np.int8), np.zeros(channels, np.int8))
        w_dq = self.emit("DequantizeLinear", [
            self.initializer(prefix + "/weight", stored),
            self.initializer(prefix + "/weight_scale", w_scale),
            self.initializer(prefix + "/weight_zero_point", zero)], [prefix + "/weight_dq"],
            prefix + "/weight_dq", doc_string=f"the integers of TF's weight quantizer {w.source}", axis=0)
        b_dq = self.emit("DequantizeLinear", [
            self.initializer(prefix + "/bias", bias.astype(np.int32)),
            self.initializer(prefix + "/bias_scale", bias_scale),
            self.initializer(prefix + "/bias_zero_point", np.zeros(channels, np.int32))], [prefix + "/bias_dq"],
            prefix + "/bias_dq", axis=0)
        result = tail_out  # a ReLU/Clip after the tail is the quantizer's (integer_bounds)
        if node.op_type == "MatMul":
            self.emit("Gemm", [x, w_dq, b_dq], [result], name + "/Gemm", transB=1)
        else:
            self.emit_conv(node, [x, w_dq, b_dq], result, pads)
        self.absorbed.update(n.name for n in absorbed)
        if pad_node is not None:
            self.absorbed.add(pad_node.name)
        self.summary.integer_ops[kind] += 1
        return True

    def _float(self, node, kind, why):
        self.summary.float_ops.append(f"{node.name} ({kind}): {why}")
        self.write_float(node)
        return True

    def emit_conv(self, node, inputs, output: str, pads):
        """The ONNX Conv of a Conv node, or of a depthwise convolution (grouped); one the layout optimizer left in
        NHWC (no NCHW convolution before it to take the layout from: a network's first layer, or a
        single-channel tensor whose layout Transpose tf2onnx wrote as a Reshape) between Transposes to NCHW and
        back, which ONNX Runtime's QDQ propagation moves outside the QDQ group."""
        attrs = self.conv_attrs(node, pads)
        if self.layout(node) == "NCHW":
            return self.emit("Conv", inputs, [output], node.name, **attrs)
        x = self.emit("Transpose", [inputs[0]], [node.name + "/nchw_input"], node.name + "/ToNCHW", perm=[0, 3, 1, 2])
        y = self.emit("Conv", [x] + list(inputs[1:]), [node.name + "/nchw_output"], node.name, **attrs)
        return self.emit("Transpose", [y], [output], node.name + "/ToNHWC", perm=[0, 2, 3, 1])

    def _filter_shape(self, node):
        w = self.weights.get(node.input[1])
        return w.q.shape if w is not None else self.constants[node.input[1]].shape

    def compute_layout(self, node, w: _QuantizedConstant):
        """(q, per-output-channel scale) in the layout of the op written: Conv [O, I/g, kh, kw]; a depthwise
        filter [kh, kw, C, M] as [C*M, 1, kh, kw]; a MatMul's [K, N] as Gemm's transposed B [N, K]."""
        if node.op_type == "MatMul":
            w = w.transposed((1, 0))
        elif node.domain:
            kh, kw, c, m = w.q.shape
            w = w.transposed((2, 3, 0, 1)).reshaped((c * m, 1, kh, kw))
        per_out = w.scale.reshape(w.scale.shape[0], -1)
        if not (per_out == per_out[:, :1]).all():
            raise ConversionError(f"{node.op_type} (node {node.name!r}): its weight quantizer {w.source!r} is per "
                                  "channel along an input axis; integer kernels take one scale per output channel")
        return w.q, per_out[:, 0].copy()

    def conv_attrs(self, node, pads):
        attrs = _attrs(node)
        if not node.domain:
            out = {k: v for k, v in attrs.items() if k in ("dilations", "strides", "kernel_shape", "group", "pads", "auto_pad")}
            if pads is not None:
                auto_pad = _text(out.pop("auto_pad", "NOTSET"))
                if auto_pad == "SAME_UPPER":
                    # A zero Pad, then SAME over the padded size: explicit pads, SAME's own plus the Pad's.
                    kernel = list(out.get("kernel_shape") or self._filter_shape(node)[2:])
                    out["pads"] = self._same_pads(node, out.get("strides", [1, 1]), out.get("dilations", [1, 1]),
                                                  kernel)
                elif auto_pad not in ("NOTSET", "VALID"):
                    raise ConversionError(f"Conv (node {node.name!r}): a Pad before a Conv with auto_pad {auto_pad}")
                old = list(out.get("pads", [0, 0, 0, 0]))
                out["pads"] = [p + o for p, o in zip(pads, old)]
            return out
        fmt = self.layout(node)
        if fmt not in ("NCHW", "NHWC"):
            raise ConversionError(f"DepthwiseConv2dNative (node {node.name!r}): data_format {fmt!r}")
        h, w = (2, 3) if fmt == "NCHW" else (1, 2)
        strides, dilations = list(attrs["strides"]), list(attrs.get("dilations", [1, 1, 1, 1]))
        strides, dilations = [strides[h], strides[w]], [dilations[h], dilations[w]]
        filt = self._filter_shape(node)
        out = {"strides": strides, "dilations": dilations, "kernel_shape": [filt[0], filt[1]],
               "group": filt[2]}
        padding = _text(attrs["padding"])
        if padding == "SAME":
            if pads is not None:
                # A zero Pad, then SAME over the padded size: explicit pads, SAME's own plus the Pad's.
                same = self._same_pads(node, strides, dilations, out["kernel_shape"])
                out["pads"] = [p + o for p, o in zip(pads, same)]
            else:
                out["auto_pad"] = "SAME_UPPER"  # TF's SAME puts the odd pixel at the end, as SAME_UPPER does
        else:
            explicit = [0, 0, 0, 0]
            if padding == "EXPLICIT":
                e = list(attrs["explicit_paddings"])  # (before, after) per dim of data_format
                explicit = [e[2 * h], e[2 * w], e[2 * h + 1], e[2 * w + 1]]
            if pads is not None:
                explicit = [p + o for p, o in zip(pads, explicit)]
            out["pads"] = explicit
        return out

    def write_float(self, node):
        """A float island: ``node`` in float with the filter TF computes with: a quantized weight's fake-quantized
        values (q * scale: the same bits TF computes), a float constant as it is; a depthwise convolution as the
        standard lowering writes it, a grouped Conv. Its output is marked for :meth:`quantizes_float_island`."""
        self.float_results.add(node.output[0])
        w = self.weights.get(node.input[1])
        if w is not None:
            name = node.input[1] + "/fake_quantized"
            value = (w.q.astype(np.float32) * w.scale).astype(np.float32)
        else:
            name, value = node.input[1], self.constants[node.input[1]]
        if node.domain:
            # A depthwise filter [kh, kw, C, M] as a grouped Conv's [C*M, 1, kh, kw].
            kh, kw, c, m = value.shape
            name = self.initializer(name + "/grouped",
                                    np.ascontiguousarray(np.transpose(value, (2, 3, 0, 1)).reshape(c * m, 1, kh, kw)))
            self.emit_conv(node, [node.input[0], name], node.output[0], None)
            return
        if w is not None:
            self.initializer(name, value)
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[1] = name
        self.new_nodes.append(copy)

    def inference_batch_norm(self, node):
        """(k, mean, offset), float32 vectors per channel, of an inference batch norm: ``y = (x - mean) * k +
        offset`` with ``k = rsqrt(variance + epsilon) * scale``, the order of TF's kernel
        (ort_ops.reference._batch_norm). None where it is not one: training mode, statistics not constant, a layout
        other than NCHW and NHWC, or its statistics outputs read (nothing would compute them)."""
        attrs = _attrs(node)
        stats = [self.constants.get(t) for t in node.input[1:5]]
        if (attrs.get("is_training", 1) or any(v is None for v in stats)
                or self.layout(node) not in ("NCHW", "NHWC")
                or any(self.consumers.get(o) or o in self.graph_outputs for o in node.output[1:])):
            return None
        gamma, beta, mean, var = (v.astype(np.float32) for v in stats)
        eps = np.float32(attrs.get("epsilon", 1e-4))
        k = (np.float32(1) / np.sqrt(var + eps)).astype(np.float32) * gamma
        return k, mean, beta

    def float_batch_norm(self, node) -> bool:
        """An inference batch norm that no convolution absorbed, in float (:meth:`inference_batch_norm`'s
        arithmetic, constants shaped [C, 1, 1]), named as a float island. False where it is not one (in NHWC
        too: only a convolution's tail is taken in NHWC)."""
        norm = self.inference_batch_norm(node) if self.layout(node) == "NCHW" else None
        if norm is None:
            return False
        k, mean, beta = (v.reshape(-1, 1, 1) for v in norm)
        prefix = node.name + "/float"
        t = self.emit("Sub", [node.input[0], self.initializer(prefix + "/mean", mean)], [prefix + "/centred"],
                      prefix + "/Sub")
        t = self.emit("Mul", [t, self.initializer(prefix + "/factor", k)], [prefix + "/scaled"], prefix + "/Mul")
        self.emit("Add", [t, self.initializer(prefix + "/offset", beta)], [node.output[0]], prefix + "/Add")
        self.summary.float_ops.append(f"{node.name} ({node.op_type}): not after a convolution written in integer, "
                                      "so in float")
        return True

    # -- the pass --------------------------------------------------------------------------------------------
    def run(self) -> onnx.ModelProto:
        self.classify_quantizers()
        for node in self.graph.node:
            if node.name in self.absorbed:
                continue
            if node.output and node.output[0] in self.weights:
                continue  # a weight quantizer or a layout op on one: written where it is read
            if node.output and node.output[0] in self.inherited:
                moved = node.output[0] + "/on_grid"
                copy = onnx.NodeProto()
                copy.CopyFrom(node)
                copy.output[0] = moved
                self.new_nodes.append(copy)
                self.emit_activation_quantizer(node, self.activation_grids[node.output[0]], source=moved,
                                               output=node.output[0])
                continue
            if node.output and node.output[0] in self.activation_grids:
                self.emit_activation_quantizer(node, self.activation_grids[node.output[0]])
                continue
            if node.name in self.pre_quantized:
                grid = self.pre_quantized[node.name]
                moved = node.input[0] + "/integer_dq"
                self.emit_activation_quantizer(node, grid, source=node.input[0], output=moved)
                copy = onnx.NodeProto()
                copy.CopyFrom(node)
                copy.input[0] = moved
                self.new_nodes.append(copy)
                continue
            if (node.op_type in ("Conv", "MatMul") and not node.domain) or self.is_family(node, "DepthwiseConv2dNative"):
                if self.rewrite_compute(node):
                    continue
                if node.domain:
                    raise ConversionError(f"DepthwiseConv2dNative (node {node.name!r}): its filter is computed in the "
                                          "graph, not a constant; the integer lowering writes depthwise convolutions "
                                          "of a constant filter (quantized, or float as a float island); convert with "
                                          "lowering='custom' or 'standard'")
            if self.is_family(node, *BATCH_NORM_OPS) and self.float_batch_norm(node):
                continue
            if self.is_family(node):
                raise ConversionError(f"{node.op_type} (node {node.name!r}): not part of a pattern the integer lowering "
                                      "writes (an inference batch norm with constant statistics, folded into the "
                                      "convolution before it or in float); convert with lowering='custom' or "
                                      "'standard'")
            self.new_nodes.append(node)
        return self.finish()

    def steps_through_float_tails(self):
        """An output computed from a quantized tensor by a Softmax (or a layout op) has no grid of its own; it is
        judged in a step scaled by how far the op can move an error: a layout op not at all (the same step), a
        Softmax by at most half of the largest logit error (each row of its Jacobian sums to at most 1/2 in
        absolute value), so half the logits' step."""
        producer = {o: n for n in self.new_nodes for o in n.output}
        scales = {}
        for n in self.new_nodes:
            if n.op_type == "DequantizeLinear" and n.input[1] in {i.name for i in self.new_initializers}:
                scales[n.output[0]] = n.input[1]
        values = {i.name: numpy_helper.to_array(i) for i in self.new_initializers}
        for out in self.graph_outputs - set(self.output_steps):
            factor, tensor = 1.0, out
            for _ in range(8):
                node = producer.get(tensor)
                if node is None:
                    break
                if node.op_type == "DequantizeLinear" and node.output[0] in scales:
                    scale = values[scales[node.output[0]]]
                    if scale.size == 1:
                        self.output_steps[out] = float(scale) * factor
                    break
                if node.op_type == "Softmax":
                    factor *= 0.5
                elif node.op_type not in LAYOUT_OPS + ("Identity",):
                    break
                tensor = node.input[0]

    def finish(self) -> onnx.ModelProto:
        self.steps_through_float_tails()
        # Keep what the outputs need: the weight quantizers' float chains and absorbed nodes' constants go.
        needed = set(self.graph_outputs)
        kept = []
        for node in reversed(self.new_nodes):
            if any(o in needed for o in node.output):
                kept.append(node)
                needed.update(i for i in node.input if i)
        kept.reverse()
        initializers = [i for i in list(self.graph.initializer) + self.new_initializers if i.name in needed]
        del self.graph.node[:]
        self.graph.node.extend(kept)
        del self.graph.initializer[:]
        self.graph.initializer.extend(initializers)
        del self.graph.value_info[:]  # recomputed by whoever needs them; the integer tensors have new types
        return self.model


def rewrite(model: onnx.ModelProto, weights: str = "uint8"):
    """(the rewritten model, IntegerSummary, {graph output: its quantization step}); ``weights``: the stored type of
    the weight integers, "uint8" (zero point 128, right on every CPU) or "int8" (zero point 0, faster where ONNX
    Runtime's u8s8 kernels are exact: VNNI x86 CPUs, ARM)."""
    rewriter = _Rewriter(model, weights)
    out = rewriter.run()
    return out, rewriter.summary, rewriter.output_steps
