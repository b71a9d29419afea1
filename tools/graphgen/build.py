"""The TF side of a GraphSpec: the model in its family, trained a few steps, written as one SavedModel whose
signatures are its inference, training step and saliency map (``models.graphs.ClassifierGraphs``; the raw family's
module has the same three). ``build_saved_model(spec, directory)`` returns what the graph reaches (the family's TF
ops with their attribute values, per signature), or raises InvalidGraph where TF, Keras or tfmot reject the graph.
"""
from __future__ import annotations

import random

import numpy as np
import tensorflow as tf

from tools.graphgen.spec import (
    CLASSES, FAMILY_OPS, INFERENCE, KERAS3, KERAS3_FAKE_QUANT, KERAS3_QUANTIZE, RAW, SALIENCY, TF_KERAS_FAMILIES,
    TFMOT, TFMOT_4BIT, TFMOT_PARTIAL, TRAIN_STEP, GraphSpec, InvalidGraph, op_features,
)

TRAIN_LEARNING_RATE = 0.05


def _loss(labels, logits):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


# ----------------------------------------------------------------------------------------------------------------
# Keras models.

def _keras3_quant_layers():
    """Keras 3 layers that fake-quantize an activation or a kernel with keras.quantizers (TF's FakeQuant ops)."""
    import keras
    from keras import ops

    def fake_quant(layer, x, axis):
        return keras.quantizers.fake_quant_with_min_max_vars(x, layer.q_min, layer.q_max, num_bits=layer.q_bits,
                                                             narrow_range=layer.q_narrow, axis=axis)

    def add_range(layer, channels, init):
        shape = (channels,) if channels else ()
        layer.q_min = layer.add_weight(name="q_min", shape=shape, initializer=keras.initializers.Constant(-init))
        layer.q_max = layer.add_weight(name="q_max", shape=shape, initializer=keras.initializers.Constant(init))

    class FakeQuant(keras.layers.Layer):
        def __init__(self, lo, hi, bits, narrow, per_channel, **kw):
            super().__init__(**kw)
            self.lo, self.hi, self.q_bits, self.q_narrow, self.per_channel = lo, hi, bits, narrow, per_channel

        def build(self, shape):
            channels = shape[-1] if self.per_channel else None
            s = (channels,) if channels else ()
            self.q_min = self.add_weight(name="q_min", shape=s, initializer=keras.initializers.Constant(self.lo))
            self.q_max = self.add_weight(name="q_max", shape=s, initializer=keras.initializers.Constant(self.hi))

        def call(self, x):
            return fake_quant(self, x, -1 if self.per_channel else None)

    class KernelQuant:
        """Mixed in before a Keras layer: its kernel goes through a fake-quant with trainable per-tensor or
        per-output-channel range variables, made when the layer is built."""

        def __init__(self, q, **kw):
            super().__init__(**kw)
            self.q_bits, self.q_narrow, self.q_per_channel = q["bits"], q["narrow"], q["per_channel"]

        def build(self, shape):
            super().build(shape)
            self._quantized(self.kernel)

        def _quantized(self, kernel):
            if not hasattr(self, "q_min"):
                add_range(self, kernel.shape[-1] if self.q_per_channel else None, 0.5)
            return fake_quant(self, kernel, -1 if self.q_per_channel else None)

    class QConv2D(KernelQuant, keras.layers.Conv2D):
        def convolution_op(self, inputs, kernel):
            return super().convolution_op(inputs, self._quantized(kernel))

    class QDepthwiseConv2D(KernelQuant, keras.layers.DepthwiseConv2D):
        def call(self, inputs):
            out = ops.depthwise_conv(inputs, self._quantized(self.kernel), strides=self.strides, padding=self.padding,
                                     dilation_rate=self.dilation_rate, data_format=self.data_format)
            if self.use_bias:
                out = out + self.bias
            return self.activation(out) if self.activation is not None else out

    class QDense(KernelQuant, keras.layers.Dense):
        def call(self, inputs):
            out = ops.matmul(inputs, self._quantized(self.kernel))
            return out + self.bias if self.use_bias else out

    return FakeQuant, QConv2D, QDepthwiseConv2D, QDense


class _KerasBuilder:
    def __init__(self, spec: GraphSpec):
        self.spec = spec
        self.rng = random.Random(f"build-{spec.seed}-{spec.index}")
        if spec.family in TF_KERAS_FAMILIES:
            import tf_keras

            self.keras, self.L = tf_keras, tf_keras.layers
        else:
            import keras

            self.keras, self.L = keras, keras.layers
        self.quant = _keras3_quant_layers() if spec.family == KERAS3_FAKE_QUANT else None
        self.annotate = self._annotation()

    def _annotation(self):
        """The layer wrapper of tfmot's 4-bit and partial schemes (identity elsewhere)."""
        if self.spec.family not in (TFMOT_4BIT, TFMOT_PARTIAL):
            return lambda layer: layer
        import tensorflow_model_optimization as tfmot

        annotate = tfmot.quantization.keras.quantize_annotate_layer
        if self.spec.family == TFMOT_4BIT:
            from models.tfmot_models import FourBitWeightsConfig

            def four_bit(layer):
                if isinstance(layer, (self.L.Conv2D, self.L.Dense)) and not isinstance(layer, self.L.SeparableConv2D):
                    return annotate(layer, quantize_config=FourBitWeightsConfig())
                return annotate(layer)
            return four_bit
        annotated = []

        def part(layer):  # the first layer always (tfmot refuses a model with none annotated), the others by chance
            if not annotated or self.rng.random() < 0.5:
                annotated.append(layer)
                return annotate(layer)
            return layer
        return part

    def _apply(self, layer, x):
        return self.annotate(layer)(x)

    def layer(self, op: dict, x):
        L, kind = self.L, op["op"]
        if kind == "conv":
            kw = dict(filters=op["filters"], kernel_size=op["kernel"], strides=op.get("strides", 1),
                      padding=op["padding"], dilation_rate=op.get("dilation", 1), groups=op.get("groups", 1),
                      use_bias=op["use_bias"], activation=op.get("activation"))
            if self.quant and "kernel_fq" in op:
                return self.quant[1](op["kernel_fq"], **kw)(x)
            return self._apply(L.Conv2D(**kw), x)
        if kind == "dwconv":
            kw = dict(kernel_size=op["kernel"], strides=op.get("strides", 1), padding=op["padding"],
                      depth_multiplier=op.get("multiplier", 1), dilation_rate=op.get("dilation", 1),
                      use_bias=op["use_bias"], activation=op.get("activation"))
            if self.quant and "kernel_fq" in op:
                return self.quant[2](op["kernel_fq"], **kw)(x)
            return self._apply(L.DepthwiseConv2D(**kw), x)
        if kind == "sepconv":
            return self._apply(L.SeparableConv2D(
                op["filters"], op["kernel"], strides=op.get("strides", 1), padding=op["padding"],
                depth_multiplier=op.get("multiplier", 1), dilation_rate=op.get("dilation", 1), use_bias=op["use_bias"],
                activation=op.get("activation")), x)
        if kind == "bn":
            return self._apply(L.BatchNormalization(momentum=op["momentum"], epsilon=op["epsilon"], center=op["center"],
                                                    scale=op["scale"]), x)
        if kind == "act":
            fn = op["fn"]
            if op["layer"] == "ReLU" and fn in ("relu", "relu6"):
                return self._apply(L.ReLU(max_value=6.0 if fn == "relu6" else None), x)
            if fn == "leaky_relu":
                return self._apply(L.LeakyReLU(), x)
            return self._apply(L.Activation(fn), x)
        if kind == "pool":
            cls = L.MaxPooling2D if op["kind"] == "max" else L.AveragePooling2D
            return self._apply(cls(op["size"], strides=op["strides"], padding=op["padding"]), x)
        if kind == "zeropad":
            return self._apply(L.ZeroPadding2D(tuple(tuple(p) for p in op["pad"])), x)
        if kind == "upsample":
            return self._apply(L.UpSampling2D(op["factor"], interpolation=op["interpolation"]), x)
        if kind == "fq":
            return self.quant[0](op["min"], op["max"], op["bits"], op["narrow"], op["per_channel"])(x)
        if kind == "residual":
            y = x
            for inner in op["branch"]:
                y = self.layer(inner, y)
            out = self._apply(L.Add(), [x, y])
            return self._apply(L.ReLU(), out) if op.get("after") == "relu" else out
        if kind == "concat":
            outs = []
            for branch in op["branches"]:
                y = x
                for inner in branch:
                    y = self.layer(inner, y)
                outs.append(y)
            return self._apply(L.Concatenate(), outs)
        raise InvalidGraph(f"unknown layer {kind!r}")

    def model(self):
        spec, L = self.spec, self.L
        inputs = L.Input(tuple(spec.input))
        x = inputs
        for op in spec.layers:
            x = self.layer(op, x)
        x = self._apply(L.Flatten() if spec.head == "flatten" else L.GlobalAveragePooling2D(), x)
        if self.quant and self.rng.random() < 0.5:
            logits = self.quant[3]({"bits": 8, "narrow": True, "per_channel": False}, units=CLASSES)(x)
        else:
            logits = self._apply(L.Dense(CLASSES), x)
        model = self.keras.Model(inputs, logits)
        if spec.family == TFMOT:
            import tensorflow_model_optimization as tfmot

            model = tfmot.quantization.keras.quantize_model(model)
        elif spec.family in (TFMOT_4BIT, TFMOT_PARTIAL):
            import tensorflow_model_optimization as tfmot

            from models.tfmot_models import FourBitWeightsConfig

            with tfmot.quantization.keras.quantize_scope({"FourBitWeightsConfig": FourBitWeightsConfig}):
                model = tfmot.quantization.keras.quantize_apply(model)
        return model

    def optimizer(self, name, learning_rate):
        if name is None:
            return None
        opts = self.keras.optimizers
        return (opts.SGD if name == "sgd" else opts.Adam)(learning_rate=learning_rate)


def _keras_graphs(spec: GraphSpec):
    from models.graphs import ClassifierGraphs

    if spec.family in TF_KERAS_FAMILIES:
        import tf_keras

        tf_keras.utils.set_random_seed(spec.seed * 100003 + spec.index)
    else:
        import keras

        keras.utils.set_random_seed(spec.seed * 100003 + spec.index)
    builder = _KerasBuilder(spec)
    try:
        model = builder.model()
    except (ValueError, TypeError, RuntimeError, NotImplementedError, KeyError) as e:
        raise InvalidGraph(f"{spec.family} builds no model: {type(e).__name__}: {_first_line(e)}") from e
    _train(model, spec, builder.optimizer("sgd", TRAIN_LEARNING_RATE))
    if spec.family == KERAS3_QUANTIZE:
        # After training, for every mode: Keras 3's float8 layers train only inside a tf.function (their custom
        # gradient fails under an eager tape), which the saved training step is.
        model.quantize(spec.quantize_mode)
    return ClassifierGraphs(model, spec.input, _loss, builder.optimizer(spec.optimizer, 0.01), train_batch=spec.batch)


def _train(model, spec: GraphSpec, optimizer) -> None:
    """A few SGD steps on seeded random images, so that weights, batch-norm statistics and quantizer ranges move."""
    rng = np.random.default_rng(spec.seed * 7919 + spec.index)
    for _ in range(spec.train_steps):
        images = tf.constant(rng.standard_normal((max(spec.batch, 2),) + tuple(spec.input)).astype(np.float32))
        labels = tf.constant(rng.integers(0, CLASSES, max(spec.batch, 2)).astype(np.int32))
        with tf.GradientTape() as tape:
            loss = _loss(labels, model(images, training=True))
        variables = model.trainable_variables
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients([(g, v) for g, v in zip(grads, variables) if g is not None])


# ----------------------------------------------------------------------------------------------------------------
# The raw family.

class RawGraphs(tf.Module):
    """The raw family's three signatures over one chain of the family's ops (tools.graphgen.raw_ops)."""

    def __init__(self, spec: GraphSpec):
        super().__init__()
        self.spec = spec
        rng = np.random.default_rng(spec.seed * 31337 + spec.index)
        self.params = []
        channels = spec.input[2]
        for op in spec.raw:
            p = {}
            if op["op"] == "fq_vars":
                p = {"min": tf.Variable(op["min"], dtype=tf.float32), "max": tf.Variable(op["max"], dtype=tf.float32)}
            elif op["op"] == "fq_vars_pc":
                p = {"min": tf.Variable(np.float32(op["min"])), "max": tf.Variable(np.float32(op["max"]))}
            elif op["op"] == "bn":
                p = {"scale": tf.Variable(rng.uniform(0.5, 1.5, channels).astype(np.float32)),
                     "offset": tf.Variable(rng.uniform(-0.5, 0.5, channels).astype(np.float32)),
                     "mean": tf.Variable(rng.uniform(-0.3, 0.3, channels).astype(np.float32), trainable=False),
                     "variance": tf.Variable(rng.uniform(0.5, 2.0, channels).astype(np.float32), trainable=False)}
            elif op["op"] == "dw":
                k = op["kernel"]
                p = {"filter": tf.Variable(rng.standard_normal((k, k, channels, op["multiplier"])).astype(np.float32)
                                           * 0.5)}
                channels *= op["multiplier"]
            self.params.append(p)
        self.readout = tf.constant(rng.standard_normal(64).astype(np.float32))
        # A static batch for every signature: a per-axis QuantizeAndDequantize along axis 0 needs its size.
        images = tf.TensorSpec((spec.batch,) + tuple(spec.input), tf.float32, name="images")
        self.serve = tf.function(self._serve, input_signature=[images])
        self.train_step = tf.function(self._train_step, input_signature=[images])
        self.saliency = tf.function(self._saliency, input_signature=[images])

    def _forward(self, x, training_outputs: dict):
        for i, (op, p) in enumerate(zip(self.spec.raw, self.params)):
            x = _raw_op(op, p, x, training_outputs, i)
        return x

    def _score(self, y):
        """A fixed linear readout of each image's features (the loss and the saliency score read it)."""
        n = int(np.prod(y.shape[1:]))  # static: only the batch is unknown
        flat = tf.reshape(y, (-1, n))
        return tf.reduce_sum(flat * tf.tile(self.readout, [n // 64 + 1])[:n], axis=1)

    def _serve(self, images):
        extra = {}
        y = self._forward(images, extra)
        return {"y": y, **extra}

    def _train_step(self, images):
        variables = [v for p in self.params for v in p.values() if v.trainable]
        with tf.GradientTape() as tape:
            y = self._forward(images, {})
            loss = tf.reduce_mean(tf.square(self._score(y)))
        grads = tape.gradient(loss, variables)
        out = {"loss": loss}
        for i, g in enumerate(grads):
            if g is not None:
                out[f"grad_{i}"] = g
        return out

    def _saliency(self, images):
        with tf.GradientTape() as tape:
            tape.watch(images)
            y = self._forward(images, {})
            score = tf.reduce_sum(self._score(y))
        return {"y": y, "saliency": tape.gradient(score, images)}

    def signatures(self):
        return {INFERENCE: self.serve, TRAIN_STEP: self.train_step, SALIENCY: self.saliency}


def _raw_op(op: dict, p: dict, x, training_outputs: dict, i: int):
    kind = op["op"]
    if kind == "relu":
        return tf.nn.relu(x)
    if kind == "fq_args":
        return tf.raw_ops.FakeQuantWithMinMaxArgs(inputs=x, min=op["min"], max=op["max"], num_bits=op["num_bits"],
                                                  narrow_range=op["narrow_range"])
    if kind == "fq_vars":
        return tf.raw_ops.FakeQuantWithMinMaxVars(inputs=x, min=p["min"], max=p["max"], num_bits=op["num_bits"],
                                                  narrow_range=op["narrow_range"])
    if kind == "fq_vars_pc":
        return tf.raw_ops.FakeQuantWithMinMaxVarsPerChannel(inputs=x, min=p["min"], max=p["max"],
                                                            num_bits=op["num_bits"], narrow_range=op["narrow_range"])
    if kind == "qdq":
        axis = op["axis"]
        depth = 1 if axis == -1 else int(x.shape[axis])
        lo = tf.constant(np.full(depth, op["input_min"], np.float32) if axis != -1 else np.float32(op["input_min"]))
        hi = tf.constant(np.full(depth, op["input_max"], np.float32) if axis != -1 else np.float32(op["input_max"]))
        common = dict(input=x, input_min=lo, input_max=hi, signed_input=op["signed_input"],
                      range_given=op["range_given"], narrow_range=op["narrow_range"], axis=axis)
        if op["version"] == 3:
            return tf.raw_ops.QuantizeAndDequantizeV3(num_bits=tf.constant(op["num_bits"]), **common)
        fn = tf.raw_ops.QuantizeAndDequantizeV2 if op["version"] == 2 else tf.raw_ops.QuantizeAndDequantizeV4
        return fn(num_bits=op["num_bits"], round_mode=op["round_mode"], **common)
    if kind == "bn":
        nchw = op["data_format"] == "NCHW"
        if nchw:
            x = tf.transpose(x, (0, 3, 1, 2))
        fn = {1: tf.raw_ops.FusedBatchNorm, 2: tf.raw_ops.FusedBatchNormV2, 3: tf.raw_ops.FusedBatchNormV3}[op["version"]]
        training, factor = op["is_training"], op["exponential_avg_factor"]
        running = not training or factor != 1.0
        empty = tf.zeros([0], tf.float32)
        out = fn(x=x, scale=p["scale"], offset=p["offset"],
                 mean=p["mean"] if running else empty, variance=p["variance"] if running else empty,
                 epsilon=op["epsilon"], exponential_avg_factor=factor, data_format=op["data_format"],
                 is_training=training)
        y = out[0]
        if training:
            training_outputs[f"bn{i}_mean"] = out[1]
            training_outputs[f"bn{i}_variance"] = out[2]
        return tf.transpose(y, (0, 2, 3, 1)) if nchw else y
    if kind == "dw":
        nchw = op["data_format"] == "NCHW"
        s, d = op["strides"], op["dilations"]
        strides = [1, 1, s, s] if nchw else [1, s, s, 1]
        dilations = [1, 1, d, d] if nchw else [1, d, d, 1]
        explicit = []
        if op["padding"] == "EXPLICIT":
            (t, b), (left, right) = op["explicit"]
            explicit = [0, 0, 0, 0, t, b, left, right] if nchw else [0, 0, t, b, left, right, 0, 0]
        if nchw:
            x = tf.transpose(x, (0, 3, 1, 2))
        y = tf.raw_ops.DepthwiseConv2dNative(input=x, filter=p["filter"], strides=strides, padding=op["padding"],
                                             explicit_paddings=explicit, data_format=op["data_format"],
                                             dilations=dilations)
        return tf.transpose(y, (0, 2, 3, 1)) if nchw else y
    raise InvalidGraph(f"unknown raw op {kind!r}")


# ----------------------------------------------------------------------------------------------------------------
# What a signature reaches, and the SavedModel.

def _attr_value(key, value, node):
    if key in ("strides", "dilations"):
        return value.list.i[2] if node.attr["data_format"].s == b"NCHW" else value.list.i[1]
    if value.HasField("b") or key in ("narrow_range", "signed_input", "range_given", "is_training"):
        return bool(value.b)
    if value.HasField("s"):
        return value.s.decode()
    if value.HasField("f"):
        return round(float(value.f), 6)
    return int(value.i)


def _graph_ops(graph) -> list:
    """Every op of a traced graph and of the function graphs it calls."""
    ops = list(graph.get_operations())
    for function in getattr(graph, "_functions", {}).values():
        inner = getattr(function, "graph", None)
        if inner is not None and inner is not graph:
            ops += _graph_ops(inner)
    return ops


def reached_features(concrete) -> list:
    """Sorted ``OpType`` / ``OpType attr=value`` features of the family's nodes in a traced function."""
    features = set()
    for op in _graph_ops(concrete.graph):
        if op.type not in FAMILY_OPS:
            continue
        node = op.node_def
        attrs = {k: _attr_value(k, v, node) for k, v in node.attr.items() if k not in ("T", "U", "Tidx", "explicit_paddings")}
        if op.type.startswith("FusedBatchNorm"):
            attrs["exponential_avg_factor_set"] = attrs.get("exponential_avg_factor", 1.0) != 1.0
        if op.type.startswith("DepthwiseConv2dNative"):
            # [kh, kw, in, multiplier]: the filter is input 1, but the filter backprop's input 1 is its shape
            filter_shape = op.outputs[0].shape if op.type.endswith("Filter") else op.inputs[1].shape
            attrs["multiplier"] = filter_shape[-1] if filter_shape.rank == 4 else "?"
        features.update(op_features(op.type, attrs))
    return sorted(features)


def _first_line(e: BaseException) -> str:
    """The line of an error that says what is wrong (TF's "in user code:" tracebacks end with it)."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if not lines:
        return ""
    return (lines[-1] if lines[0].startswith("in user code") or "Graph execution error" in lines[0] else lines[0])[:200]


def build_saved_model(spec: GraphSpec, directory: str) -> dict:
    """Writes ``spec``'s SavedModel into ``directory``; returns {signature: [features reached]}."""
    graphs = RawGraphs(spec) if spec.family == RAW else _keras_graphs(spec)
    signatures = graphs.signatures()
    features = {}
    rng = np.random.default_rng(0)
    for key, fn in signatures.items():
        specs = fn.input_signature
        args = []
        for s in specs:
            shape = [d if d is not None else 2 for d in s.shape]
            if s.dtype == tf.int32:
                args.append(tf.constant(rng.integers(0, CLASSES, shape).astype(np.int32)))
            else:
                args.append(tf.constant(rng.standard_normal(shape).astype(np.float32)))
        try:
            concrete = fn.get_concrete_function()
            if key != TRAIN_STEP:  # the step assigns variables: TF runs it in the verifier, on the saved copy
                fn(*args)
        except (tf.errors.OpError, ValueError, TypeError) as e:
            raise InvalidGraph(f"TF rejects its {key}: {type(e).__name__}: {_first_line(e)}") from e
        features[key] = reached_features(concrete)
    try:
        tf.saved_model.save(graphs, directory, signatures=signatures)
    except (ValueError, TypeError) as e:
        raise InvalidGraph(f"TF cannot save it: {type(e).__name__}: {_first_line(e)}") from e
    return features
