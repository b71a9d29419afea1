"""SpaceToBatchND / BatchToSpaceND reading one output of a node with several: an Identity in between.

tf2onnx's handlers for SpaceToBatchND and BatchToSpaceND (a 3-D or 4-D input with a square block, the case
every dilated convolution Keras writes takes) start from the producer node, not from the tensor they read:
the 4-D case writes ``make_node("Transpose", node.inputs[0].output, ...)``, a Transpose of *every* output of
that node, and the 3-D case reads ``node.inputs[0].output[0]``, the producer's first output whatever output
the op reads. Behind a node with one output that is the same tensor. Behind a node with several it is an
invalid model (a Transpose with one input per output of the producer, which ONNX Runtime refuses) or, in the
3-D case, a read of the wrong tensor.

The custom lowering keeps TF's multi-output ops of the family as single domain nodes, and a training step
puts one right before a SpaceToBatchND: TF runs a dilated ``DepthwiseConv2D`` as ``SpaceToBatchND ->
DepthwiseConv2dNative -> BatchToSpaceND``, whose gradient applies SpaceToBatchND (BatchToSpaceND's gradient)
to the gradient arriving from the layer after it, in a tfmot model ``FakeQuantWithMinMaxVarsGradient``'s dx
(output 0 of 3: dx, d min, d max). In the forward pass a training-mode ``FusedBatchNormV3`` (6 outputs)
before a dilated depthwise convolution is the same case. (tf2onnx's dilation rewrite removes the pair around
a dilated Conv2D, and the depthwise convolution is shielded from it, converters.family.)

Here, right after tf2onnx parses the TF graph, every such op whose data input is an output of a node with
several outputs reads it through a new Identity, whose only output is that tensor. The handlers then build
from the Identity, and tf2onnx's identity optimizer removes it afterwards: the model is the one tf2onnx
writes behind a single-output node, with the Transpose reading the right tensor.
"""
from __future__ import annotations

SPACE_BATCH_OPS = ("SpaceToBatchND", "BatchToSpaceND")


def isolate_space_to_batch_inputs(g) -> int:
    """Give every SpaceToBatchND / BatchToSpaceND of the freshly parsed tf2onnx graph ``g`` that reads an
    output of a multi-output node an Identity of that output to read instead (see the module docstring);
    returns how many were given one."""
    from tf2onnx import utils  # here, not at import: importing converters must not import TensorFlow

    count = 0
    for node in list(g.get_nodes()):
        if node.type not in SPACE_BATCH_OPS or not node.input:
            continue
        producer = node.inputs[0]
        if producer is None or len(producer.output) < 2:
            continue
        tensor = node.input[0]
        identity = g.make_node("Identity", [tensor], name=utils.make_name(node.name + "/input"))
        g.set_shape(identity.output[0], g.get_shape(tensor))
        g.set_dtype(identity.output[0], g.get_dtype(tensor))
        g.replace_input(node, tensor, identity.output[0], 0)
        count += 1
    return count
