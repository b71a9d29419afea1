"""A zero Pad before a convolution that pads as well: fold the Pad in before tf2onnx's rewriters see it.

tf2onnx's ``rewrite_conv2d_with_pad`` turns ``Pad -> Conv2D`` into one ONNX Conv whose ``pads`` are the Pad's
paddings. That is right for a VALID Conv2D, and it leaves a SAME one alone, but a Conv2D that pads by
itself (EXPLICIT padding) loses its own padding: the Conv gets the Pad's amounts instead of their sum. Every
dilated convolution Keras writes ends up there: TF runs ``Conv2D(dilation_rate=d)`` (tf_keras and Keras 3,
grouped or not) as ``SpaceToBatchND -> Conv2D(VALID) -> BatchToSpaceND``, which tf2onnx's
``rewrite_conv_dilations`` (it runs first) makes one dilated Conv2D with EXPLICIT paddings, those of the
SpaceToBatchND less the BatchToSpaceND's crops. After a ``ZeroPadding2D`` the padded layer's Conv then has
the ZeroPadding's pads alone: wrong values, an output of the wrong shape, or, where the output comes out
smaller than ONNX Runtime's Conv expects, an abort inside ONNX Runtime. docs/layout.md has the reproducer.

Here, right after tf2onnx parses the TF graph and before its rewriters run, such a Pad is folded into the
padding of the op after it, which computes the same tensor:

* ``Pad -> SpaceToBatchND`` with constant paddings: SpaceToBatchND pads the block dimensions with zeros
  before it reshapes, so the Pad's amounts add to its paddings, before and after (the padded size, and so
  its divisibility by the block, is unchanged). tf2onnx's dilation rewrite then writes the summed pads.
* ``Pad -> Conv2D(padding=EXPLICIT)``: the Pad's amounts add to ``explicit_paddings``.

Only a Pad whose amounts are constant, non-negative and zero outside the spatial dimensions folds; TF's
Pad pads with +0, as the convolution's own padding does, so the folded graph computes the same values
(the convolution adds w * 0 = +-0 for a padded tap either way). A Pad that other ops read stays for them.
(The depthwise convolution is shielded from tf2onnx's rewriters; converters.fusions.PadIntoDepthwise adds a
Pad to its explicit padding the same way.)
"""
from __future__ import annotations

import numpy as np

from converters.fusions import constant_value

SPACE_TO_BATCH = "SpaceToBatchND"


def _data_format(node) -> str:
    value = node.get_attr_value("data_format", b"NHWC")
    return value.decode() if isinstance(value, bytes) else value


def _pad_amounts(pad):
    """The Pad's constant paddings as an int64 [rank, 2] array, or None where they are not foldable."""
    if pad is None or pad.type != "Pad" or len(pad.input) != 2:
        return None
    amounts = constant_value(pad.inputs[1])
    if amounts is None or amounts.ndim != 2 or amounts.shape[1] != 2 or np.any(amounts < 0):
        return None
    return amounts.astype(np.int64)


def _only_on(amounts, axes) -> bool:
    return not any(np.any(amounts[a]) for a in range(len(amounts)) if a not in axes)


def _fold_into_space_to_batch(g, node) -> bool:
    pad = node.inputs[0]
    amounts = _pad_amounts(pad)
    paddings = constant_value(node.inputs[2])
    if amounts is None or paddings is None or paddings.ndim != 2 or paddings.shape[1] != 2:
        return False
    block_axes = range(1, 1 + paddings.shape[0])  # SpaceToBatchND pads the dimensions after the batch
    if len(amounts) < 1 + paddings.shape[0] or not _only_on(amounts, block_axes):
        return False
    summed = (paddings.astype(np.int64) + amounts[1:1 + paddings.shape[0]]).astype(paddings.dtype)
    from tf2onnx import utils  # here, not at import: importing converters must not import TensorFlow (the CLI
    # sets TF's kernel mode before TF's import)

    new_paddings = g.make_const(utils.make_name(node.name + "/paddings_with_pad"), summed)
    g.replace_input(node, node.input[2], new_paddings.output[0], 2)
    g.replace_input(node, node.input[0], pad.input[0], 0)
    return True


def _fold_into_explicit_conv(g, node) -> bool:
    pad = node.inputs[0]
    amounts = _pad_amounts(pad)
    explicit = list(node.get_attr_value("explicit_paddings", []) or [])
    if amounts is None or len(amounts) != 4 or len(explicit) != 8:
        return False
    spatial = (2, 3) if _data_format(node) == "NCHW" else (1, 2)
    if not _only_on(amounts, spatial):
        return False
    for axis in spatial:
        explicit[2 * axis] += int(amounts[axis][0])
        explicit[2 * axis + 1] += int(amounts[axis][1])
    node.set_attr("explicit_paddings", explicit)
    g.replace_input(node, node.input[0], pad.input[0], 0)
    return True


def _explicit(node) -> bool:
    value = node.get_attr_value("padding", b"")
    return (value.decode() if isinstance(value, bytes) else value) == "EXPLICIT"


def fold_pads_before_padding_convs(g) -> int:
    """Fold every foldable zero Pad into the SpaceToBatchND or EXPLICIT Conv2D after it (see the module
    docstring) in the freshly parsed tf2onnx graph ``g``; returns how many were folded."""
    folded = 0
    for node in list(g.get_nodes()):
        pad = node.inputs[0] if node.input else None
        if node.type == SPACE_TO_BATCH and len(node.input) == 3:
            done = _fold_into_space_to_batch(g, node)
        elif node.type == "Conv2D" and _explicit(node):
            done = _fold_into_explicit_conv(g, node)
        else:
            continue
        if done:
            folded += 1
            if not g.find_output_consumers(pad.output[0]) and pad.output[0] not in g.outputs:
                g.remove_node(pad.name)
    return folded
