"""Gradients of ResizeNearestNeighbor and ResizeBilinear (NHWC) in standard ONNX, both lowerings.

The source position of each gradient pixel is computed at conversion time in float32, as TF's
kernels compute it (the scale in float32, legacy or half-pixel scaler, align_corners rounding).
ResizeNearestNeighborGrad is bit-exact: ScatterElements with reduction "add" sums each original
pixel's contributions in the gradient's row-major order, as TF's loop does. ResizeBilinearGrad is two
matrix products with the per-axis interpolation weights, so its sums run in another order than TF's
and agree within a float tolerance.
"""
from __future__ import annotations

import numpy as np

from converters.gradients._common import daz, float_type
from converters.gradients.registry import gradient_op
from converters.standard._builder import Lowering

f32 = np.float32


def _scale(in_size: int, out_size: int, align_corners: bool):
    """TF's CalculateResizeScale from the gradient's size ``out_size`` to the original ``in_size``."""
    if align_corners and out_size > 1:
        return f32(in_size - 1) / f32(out_size - 1)
    return f32(in_size) / f32(out_size)


def nearest_sources(in_size: int, out_size: int, align_corners: bool, half_pixel_centers: bool) -> np.ndarray:
    scale = _scale(in_size, out_size, align_corners)
    pos = np.arange(out_size, dtype=f32)
    scaled = ((pos + f32(0.5)) * scale) if half_pixel_centers else pos * scale
    if align_corners:
        index = np.floor(np.abs(scaled) + f32(0.5)) * np.sign(scaled)  # roundf: halves away from zero
    else:
        index = np.floor(scaled)
    index = np.minimum(index.astype(np.int64), in_size - 1)
    return np.maximum(index, 0) if half_pixel_centers else index


def bilinear_weights(in_size: int, out_size: int, align_corners: bool, half_pixel_centers: bool) -> np.ndarray:
    """[out_size, in_size] float32: row o holds the weights TF gives pixel o's gradient."""
    scale = _scale(in_size, out_size, align_corners)
    pos = np.arange(out_size, dtype=f32)
    source = ((pos + f32(0.5)) * scale - f32(0.5)) if half_pixel_centers else pos * scale
    floor = np.floor(source)
    top = np.maximum(floor, 0).astype(np.int64)
    bottom = np.minimum(np.ceil(source), in_size - 1).astype(np.int64)
    lerp = (source - floor).astype(f32)
    weights = np.zeros((out_size, in_size), np.float64)
    np.add.at(weights, (np.arange(out_size), top), (f32(1) - lerp).astype(np.float64))
    np.add.at(weights, (np.arange(out_size), bottom), lerp.astype(np.float64))
    return weights.astype(f32)


def _geometry(b: Lowering, grads_index: int, forward: str, original=None, in_hw=None):
    """The gradient's (H, W) and whether they were read off the forward resize rather than the grads' shape.

    The grads have the forward resize's output shape. When tf2onnx does not know their H and W (e.g. they come
    out of a Pad's gradient, a Slice whose size is computed), they are taken from the forward op ``forward`` of
    the same graph: the one whose input 0 is ``original`` (ResizeBilinearGrad's original_image is the forward
    op's own input, as TF's gradient passes it), else every one whose input has H, W ``in_hw``
    (ResizeNearestNeighborGrad gets only the size). Each candidate's output H, W is its static output shape;
    they must all agree, else the graph does not determine them and the node is refused. By the time this
    handler runs tf2onnx may have converted the forward op already, to Transpose -> Resize -> Transpose.
    """
    shape = b.shape(grads_index)
    if shape is not None and len(shape) == 4 and min(shape[1:3]) >= 0:
        return shape[1], shape[2], False
    found = _forward_output_hw(b.ctx, forward, original, in_hw) if shape is None or len(shape) == 4 else set()
    if len(found) == 1 and None not in found:
        out_h, out_w = found.pop()
        return out_h, out_w, True
    more = f" (the forward {forward} ops give {sorted(found, key=str)})" if found else ""
    b.fail(f"input grads ({b.inputs[grads_index]!r}) must be 4-D NHWC with known H and W, got {shape}{more}")


_ONNX_MODES = {"ResizeBilinear": "linear", "ResizeNearestNeighbor": "nearest"}


def _known_hw(shape, h: int, w: int):
    if shape is None or len(shape) != 4 or min(shape[h], shape[w]) < 0:
        return None
    return int(shape[h]), int(shape[w])


def _forward_output_hw(ctx, forward: str, original, in_hw) -> set:
    """The output (H, W) of each forward resize op that matches (see _geometry); None where one is unknown."""
    def takes(tensor, nchw: bool) -> bool:
        if original is not None:
            return tensor == original
        return _known_hw(ctx.get_shape(tensor), *((2, 3) if nchw else (1, 2))) == tuple(in_hw)

    found = set()
    for node in ctx.get_nodes():
        if node.type == forward and takes(node.input[0], False):  # not converted yet: TF's NHWC op
            found.add(_known_hw(ctx.get_shape(node.output[0]), 1, 2))
        elif node.type == "Resize" and node.get_attr_value("mode", b"nearest") in (
                _ONNX_MODES[forward], _ONNX_MODES[forward].encode()):
            # tf2onnx's conversion: Transpose(perm 0,3,1,2) -> Resize (NCHW) -> Transpose(perm 0,2,3,1)
            into = ctx.get_node_by_output(node.input[0])
            if into is None or into.type != "Transpose" or list(into.get_attr_value("perm", [])) != [0, 3, 1, 2]:
                continue
            if takes(into.input[0], False):
                found.add(_known_hw(ctx.get_shape(node.output[0]), 2, 3))
    return found


def _flags(b: Lowering):
    return bool(b.attr("align_corners", False)), bool(b.attr("half_pixel_centers", False))


@gradient_op("ResizeNearestNeighborGrad")
def resize_nearest_neighbor_grad(ctx, node, lowering):
    b = Lowering(ctx, node)
    t = float_type(b, 0)
    size = b.constant_value(1)
    if size is None or size.size != 2:
        b.fail(f"input size ({b.inputs[1]!r}) must be a constant of 2 ints")
    height, width = (int(v) for v in size)
    out_h, out_w, inferred = _geometry(b, 0, "ResizeNearestNeighbor", in_hw=(height, width))
    align, half = _flags(b)
    if ctx.opset < 16:
        b.fail(f"needs opset 16 or later (ScatterElements with reduction), got {ctx.opset}")
    rows = nearest_sources(height, out_h, align, half)
    cols = nearest_sources(width, out_w, align, half)
    targets = (rows[:, None] * width + cols[None, :]).reshape(1, 1, -1)
    grads_shape = b.shape(0)
    channels = grads_shape[3] if grads_shape is not None and grads_shape[3] >= 0 else None
    b.take_over()
    grads = b.op("Transpose", daz(b, b.inputs[0], t), perm=[0, 3, 1, 2])
    # H, W read off the forward op: the batch is copied from the grads' shape rather than written -1, so that
    # grads of another size fail in Reshape at run time instead of being folded into the batch.
    grads = b.reshape(grads, [None, channels, out_h * out_w], like=grads if inferred else None)
    indices = b.op("Expand", b.const(targets, np.int64), b.op("Shape", grads))
    batch_channels = b.dims_of(grads, [0, 1])
    zeros_shape = b.op("Concat", batch_channels, b.const([height * width], np.int64), axis=0)
    zeros = b.op("ConstantOfShape", zeros_shape, value=_zero(t))
    summed = b.op("ScatterElements", zeros, indices, grads, axis=2, reduction="add")
    summed = b.reshape(daz(b, summed, t), [None, channels, height, width], like=summed)
    b.emit(0, b.op("Transpose", summed, perm=[0, 2, 3, 1]))


@gradient_op("ResizeBilinearGrad")
def resize_bilinear_grad(ctx, node, lowering):
    b = Lowering(ctx, node)
    t = float_type(b, 0)
    if t != np.float32:
        b.fail("only float32 grads are converted")
    out_h, out_w, _ = _geometry(b, 0, "ResizeBilinear", original=b.inputs[1])  # its MatMuls check H, W at run time
    original = b.shape(1)
    if original is None or len(original) != 4 or min(original[1:3]) < 0:
        b.fail(f"input original_image ({b.inputs[1]!r}) must be 4-D NHWC with known H and W, got {original}")
    height, width = original[1], original[2]
    if b.dtype(1) != b.dtype(0):
        b.fail("original_image must have the gradient's element type")
    align, half = _flags(b)
    rows = bilinear_weights(height, out_h, align, half)  # [out_h, height]
    cols = bilinear_weights(width, out_w, align, half)  # [out_w, width]
    b.take_over()
    grads = b.op("Transpose", b.inputs[0], perm=[0, 3, 1, 2])  # N, C, out_h, out_w
    spread = b.op("MatMul", b.const(rows.T, t), grads)  # N, C, height, out_w
    spread = b.op("MatMul", spread, b.const(cols, t))  # N, C, height, width
    b.emit(0, b.op("Transpose", spread, perm=[0, 2, 3, 1]))


def _zero(np_type):
    from onnx import helper

    return helper.make_tensor("value", helper.np_dtype_to_tensor_dtype(np.dtype(np_type)), [1], [0])
