"""The integer lowering on a convolution, depthwise convolution or Dense whose kernel TF does not quantize.

tfmot's quantize_model gives a Conv2D, DepthwiseConv2D or Dense followed directly by a ReLU layer (``layers.ReLU()``,
``Activation("relu")``) no weight quantizer (its LayerReLUQuantize transform, meant for Add -> ReLU, sets the
layer's config to NoOpQuantizeConfig: docs/integer.md, "Float kernels"): TF computes that layer with its float
kernel. The integer model must compute the same float layer (a float island, named in the summary) and ONNX
Runtime must not quantize its float kernel itself (its WeightBiasQuantization does, at every optimization level,
for a Conv or Gemm between a DequantizeLinear and a QuantizeLinear), which put tensors 10-26 steps from TF.
"""
import numpy as np
import pytest
from integer_models import run_ort

pytestmark = pytest.mark.tensorflow

SIZE = 8
# (name, layers: what comes between the input and the quantized 1x1 head, input channels)
CASES = {
    "conv_relu_layer": ("conv", "relu_layer", 3),
    "conv_relu_activation": ("conv", "relu_activation", 3),
    "depthwise_x1": ("depthwise1", "relu_layer", 3),
    "depthwise_x2": ("depthwise2", "relu_layer", 3),
    "depthwise_x2_first_layer": ("depthwise2_first", "relu_activation", 2),  # left in NHWC by the layout optimizer
    "dense_relu_layer": ("dense", "relu_layer", 6),
}
FLOAT_KINDS = {"conv": "Conv", "dense": "MatMul"}


def _build(case):
    """The tfmot QAT model of ``case``, trained a few steps on random data so its ranges move."""
    import tensorflow as tf
    import tensorflow_model_optimization as tfmot
    import tf_keras

    body, relu, channels = CASES[case]
    tf.keras.utils.set_random_seed(5)
    layers = tf_keras.layers
    dense = body == "dense"
    x = inputs = tf_keras.Input((channels,) if dense else (SIZE, SIZE, channels), name="images")
    if body == "conv":
        x = layers.Conv2D(8, 3, padding="same")(x)
    elif body == "dense":
        x = layers.Dense(8)(x)
    else:
        if not body.endswith("_first"):
            x = layers.Conv2D(4, 1)(x)  # gives the depthwise layer an NCHW input, as in MobileNet's blocks
        x = layers.DepthwiseConv2D(3, padding="same", depth_multiplier=int(body[len("depthwise")]))(x)
    x = layers.ReLU()(x) if relu == "relu_layer" else layers.Activation("relu")(x)
    x = layers.Dense(4)(x) if dense else layers.Conv2D(3, 1)(x)
    model = tfmot.quantization.keras.quantize_model(tf_keras.Model(inputs, x))
    rng = np.random.default_rng(6)
    model.compile(tf_keras.optimizers.Adam(0.01), "mse")
    model.fit(_inputs(model, 64, rng), rng.normal(size=(64,) + tuple(model.output.shape[1:])).astype(np.float32),
              batch_size=16, epochs=2, verbose=0)
    return model


def _inputs(model, n, rng):
    return rng.uniform(-1, 1, (n,) + tuple(model.input.shape[1:])).astype(np.float32)


def _filter_sources(model):
    """{TF op name: the op its filter comes from} for each convolution and matmul of the traced inference graph."""
    import tensorflow as tf

    spec = tf.TensorSpec((1,) + tuple(model.input.shape[1:]), tf.float32)
    graph = tf.function(lambda x: model(x, training=False)).get_concrete_function(spec).graph
    sources = {}
    for op in graph.get_operations():
        if op.type in ("Conv2D", "DepthwiseConv2dNative", "MatMul"):
            source = op.inputs[1].op
            while source.type == "Identity":
                source = source.inputs[0].op
            sources[op.name] = source.type
    return sources


def _float_kernel_nodes(optimized):
    """Nodes of an ONNX Runtime optimized graph that compute a convolution or matmul with a float constant kernel."""
    floats = {i.name for i in optimized.graph.initializer if i.data_type == 1}
    kinds = ("Conv", "FusedConv", "Gemm", "FusedGemm", "MatMul", "FusedMatMul")
    return [n for n in optimized.graph.node if n.op_type in kinds and n.input[1] in floats]


@pytest.mark.parametrize("case", list(CASES))
def test_a_float_kernel_stays_float_named_and_unquantizable(case):
    import tensorflow as tf

    import converters
    from converters.integer import read_summary
    from converters.integer.fusion import LEVELS, optimized_graph, optimized_op_counts
    from converters.integer.per_tensor import verify_quantized_tensors
    from converters.integer.steps import judge_steps

    model = _build(case)
    # TF itself computes the layer before the ReLU with its float kernel (a variable read, no quantizer).
    sources = _filter_sources(model)
    assert [s for s in sources.values() if not s.startswith("FakeQuant")] == ["ReadVariableOp"], sources
    quantized = len(sources) - 1

    onnx_model = converters.from_keras(model, lowering="integer")
    lines, steps = read_summary(onnx_model)
    kind = FLOAT_KINDS.get(CASES[case][0], "DepthwiseConv2dNative")
    islands = [line for line in lines if "float island" in line]
    assert len(islands) == 1 and islands[0].startswith("1 float island(s)") and f"({kind})" in islands[0], lines
    assert "not quantized in TF" in islands[0], islands
    integer = sum(int(line.split(": ")[1].split("/")[0]) for line in lines if " in integer: " in line)
    # ONNX Runtime runs every quantized layer in integer and leaves the island's float kernel alone at every level.
    for level in LEVELS:
        assert len(_float_kernel_nodes(optimized_graph(onnx_model, level))) == 1, level
    for level in ("extended", "all"):
        counts = optimized_op_counts(onnx_model, level)
        assert counts["QLinearConv"] + counts["QGemm"] == integer == quantized, (level, counts)

    rng = np.random.default_rng(7)
    images = _inputs(model, 16, rng)
    fn = tf.function(lambda images: model(images, training=False))
    per_tensor = verify_quantized_tensors(onnx_model, fn, {"images": images})
    assert per_tensor.ok, per_tensor.table()
    # the island's own quantizer (the ReLU layer's) is judged, on TF's values of its input
    assert any("/quant_re_lu" in c.name or "/quant_activation" in c.name for c in per_tensor.checks), per_tensor.table()
    end_to_end = judge_steps("output", fn(images).numpy(), run_ort(onnx_model, {"images": images})[0],
                             next(iter(steps.values())))
    assert end_to_end.max_steps <= 1, end_to_end


def test_a_depthwise_filter_computed_in_the_graph_is_refused_by_name():
    """What stays refused: a depthwise filter that is no constant (here a graph input) has no float island."""
    import tensorflow as tf

    import converters

    @tf.function(input_signature=[tf.TensorSpec([1, 6, 6, 2], tf.float32, name="x"),
                                  tf.TensorSpec([3, 3, 2, 1], tf.float32, name="w")])
    def f(x, w):
        xq = tf.quantization.fake_quant_with_min_max_args(x, -1.0, 1.0)
        y = tf.nn.depthwise_conv2d(xq, w, [1, 1, 1, 1], "SAME")
        return tf.quantization.fake_quant_with_min_max_args(y, -4.0, 4.0)

    with pytest.raises(converters.ConversionError, match="DepthwiseConv2dNative.*filter is computed in the graph"):
        converters.from_function(f, f.input_signature, lowering="integer")
