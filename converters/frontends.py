"""The four ways in: a tf.function, a Keras model (Keras 3 or tf_keras; converters.keras_models), a SavedModel, a GraphDef.

Each one freezes its graph with tf2onnx's loaders (variables become constants, grappler's
constant folding runs) and hands the frozen GraphDef to converters.pipeline.
"""
from __future__ import annotations

import os
import tempfile
from typing import Optional, Sequence

import logging

import onnx

from converters.errors import ConversionError
from converters.pipeline import DEFAULT_OPSET, convert_frozen_graph

logger = logging.getLogger(__name__)


def _structured_renames(concrete_func, input_names, output_names) -> dict:
    """Graph tensor names -> the user-visible names (argument names, dict output keys)."""
    import tensorflow as tf

    renames = {}
    specs = [t for t in tf.nest.flatten(concrete_func.structured_input_signature) if isinstance(t, tf.TensorSpec)]
    renames.update(zip(input_names, [s.name for s in specs]))
    if isinstance(concrete_func.structured_outputs, dict):
        # The function's outputs are its dict flattened, i.e. in sorted key order (tf.nest's order).
        renames.update(zip(output_names, sorted(concrete_func.structured_outputs)))
    return renames


def _io_names(concrete_func):
    import tensorflow as tf

    # Captured tensors (variables, constants from the enclosing scope) are frozen, not inputs.
    captured = {t.name for t in concrete_func.graph.internal_captures}
    inputs = [t.name for t in concrete_func.inputs if t.dtype != tf.dtypes.resource and t.name not in captured]
    outputs = [t.name for t in concrete_func.outputs if t.dtype != tf.dtypes.resource]
    return inputs, outputs


def _has_non_variable_resources(concrete_func) -> bool:
    """Captured resources that are not variables (hash tables): tf2onnx's loader knows how to freeze those."""
    import tensorflow as tf

    variable_handles = {id(v.handle) for v in concrete_func.graph.variables}
    return any(t.dtype == tf.dtypes.resource and id(t) not in variable_handles for t in concrete_func.captured_inputs)


def from_concrete_function(
    concrete_func, lowering="custom", opset=DEFAULT_OPSET, output_path=None, trackable=None,
    variable_updates="warn", trainable_inputs=False, **kw
):
    """Convert a ConcreteFunction (variables are frozen to constants).

    ``variable_updates``: what happens to the variables the function assigns (batch-norm moving statistics,
    tfmot's quantization ranges in a training step). ``"warn"`` (default): the model has exactly the function's
    outputs and a warning names every update left out; ``"outputs"``: each updated variable's new value is an
    extra output named after the variable. ``trainable_inputs=True``: the trainable variables stay graph inputs
    (named after the variable) with their current values as same-name initializers, so a caller can feed new
    weights step after step. See converters.variable_state.
    """
    import tensorflow as tf
    from tf2onnx import tf_loader

    from converters.variable_state import add_variable_initializers, freeze, record_state

    input_names, output_names = _io_names(concrete_func)
    renames = _structured_renames(concrete_func, input_names, output_names)
    tables = None
    frozen_state = None
    with tf.device("/cpu:0"):
        if trackable is not None and _has_non_variable_resources(concrete_func):
            if variable_updates != "warn" or trainable_inputs:
                raise ValueError("variable_updates and trainable_inputs are not supported for functions that use tables")
            frozen, tables = tf_loader.from_trackable(trackable, concrete_func, input_names, output_names, False)
        else:
            frozen_state = freeze(concrete_func, input_names, output_names, variable_updates, trainable_inputs,
                                  keep_quantized_constants=lowering == "integer")
            frozen, input_names, output_names = frozen_state.graph_def, frozen_state.input_names, frozen_state.output_names
            renames.update(frozen_state.renames)
    model = convert_frozen_graph(
        frozen,
        input_names,
        output_names,
        lowering=lowering,
        opset=opset,
        name=kw.pop("name", concrete_func.name),
        tensors_to_rename=renames,
        initialized_tables=tables,
        output_path=None,
        **kw,
    )
    if frozen_state is not None:
        add_variable_initializers(model, frozen_state.trainable_values)
        record_state(model, frozen_state, variable_updates)
    if output_path:
        onnx.save_model(model, output_path)
    return model


def from_function(fn, input_signature, lowering="custom", opset=DEFAULT_OPSET, output_path=None, **kw) -> onnx.ModelProto:
    """Convert a tf.function traced with ``input_signature`` (a list of tf.TensorSpec)."""
    if input_signature is None:
        raise ValueError("from_function needs an input_signature (a list of tf.TensorSpec)")
    concrete = fn.get_concrete_function(*input_signature)
    return from_concrete_function(concrete, lowering=lowering, opset=opset, output_path=output_path, **kw)


def keras_concrete_function(model, input_signature=None, batch_size=None):
    """The inference-mode (training=False) concrete function of a Keras model (Keras 3 or tf_keras)."""
    from converters.keras_models import inference_function

    return inference_function(model, input_signature, batch_size)


def from_keras(model, input_signature=None, lowering="custom", opset=DEFAULT_OPSET, output_path=None, batch_size=None,
               custom_objects=None, **kw) -> onnx.ModelProto:
    """Convert a Keras model in inference mode (``training=False``).

    ``model``: a Keras 3 model (``import keras``, TF's default Keras) or a tf_keras model, or the path of a file
    either Keras wrote with ``model.save`` (``.keras``, ``.h5``: loaded by the Keras that wrote it, with
    ``custom_objects``), or a SavedModel directory (``model.export(dir)`` of Keras 3, tf_keras's SavedModel
    format: its ``serving_default`` signature is converted).

    Inputs: ``input_signature`` (a list of tf.TensorSpec) when given, else ``model.inputs`` with the batch
    dimension free (``batch_size=N`` fixes it); a model whose inputs are unknown (a Sequential never built, a
    subclassed model) raises ConversionError asking for ``input_signature``. Keras 3's unnamed inputs are
    called ``input`` (``input_K`` for several).

    What the layers become: tf_keras's BatchNormalization is TF's FusedBatchNormV3 (one batch-norm node);
    Keras 3's is plain arithmetic (Mul/Add/Rsqrt), which tf2onnx converts as it is. Both Kerases'
    DepthwiseConv2D are DepthwiseConv2dNative, and fake quantization (tfmot, ``keras.quantizers``) is
    TF's FakeQuant ops. Takes from_concrete_function's ``variable_updates`` and ``trainable_inputs``.
    """
    from converters.keras_models import describe_keras, keras_of_model, load_keras_file

    if isinstance(model, (str, os.PathLike)):
        path = str(model)
        if os.path.isdir(path):
            if input_signature is not None or batch_size is not None:
                raise ConversionError("a SavedModel directory keeps its own signature: input_signature and batch_size "
                                      "apply to a Keras model or file")
            return from_saved_model(path, lowering=lowering, opset=opset, output_path=output_path, **kw)
        model, flavour = load_keras_file(path, custom_objects)
    else:
        flavour = keras_of_model(model)
        if flavour is None:
            raise ConversionError(f"from_keras expects a Keras model or a Keras file, got {type(model).__name__}")
    logger.info("converting %s model %r", describe_keras(flavour), model.name)
    concrete = keras_concrete_function(model, input_signature, batch_size)
    kw.setdefault("name", model.name)
    return from_concrete_function(concrete, lowering=lowering, opset=opset, output_path=output_path, trackable=model, **kw)


def from_keras_train_step(model, loss, optimizer=None, learning_rate=None, from_logits=False, input_signature=None,
                          labels_signature=None, batch_size=None, lowering="custom", opset=DEFAULT_OPSET,
                          output_path=None, custom_objects=None, **kw) -> onnx.ModelProto:
    """Convert one training step of a Keras model (either Keras, or a ``.keras`` / ``.h5`` file): inputs and
    ``labels`` -> ``loss`` and ``grad_<variable>`` for every trainable variable, with ``training=True``.

    ``loss``: a Keras loss name (``"sparse_categorical_crossentropy"``, with ``from_logits=True`` for a model
    that outputs logits), object or function. ``optimizer`` (a name with ``learning_rate``, or a Keras
    optimizer): the step also applies the gradients; pass ``variable_updates="outputs"`` to get every
    variable it assigns (weights, optimizer slots and iterations, batch-norm moving statistics, trainable
    ranges) as an extra output. Labels: ``[batch]`` int32 for a sparse loss, else the model output's shape,
    or ``labels_signature``.
    """
    from converters.keras_models import load_keras_file, training_step_function

    if isinstance(model, (str, os.PathLike)):
        if os.path.isdir(str(model)):
            raise ConversionError(f"{model} is a SavedModel directory, which keeps no Keras model to train: convert "
                                  "a training step from the .keras/.h5 file, or from a SavedModel signature that "
                                  "is one (from_saved_model(path, signature_key=...))")
        model, _ = load_keras_file(model, custom_objects)
    concrete, holder = training_step_function(model, loss, optimizer, learning_rate, from_logits, input_signature,
                                              labels_signature, batch_size)
    kw.setdefault("name", f"{model.name}_train_step")
    onnx_model = from_concrete_function(concrete, lowering=lowering, opset=opset, output_path=output_path, **kw)
    del holder
    return onnx_model


def load_signature(path, signature_key="serving_default", tags=None):
    """(loaded SavedModel, the signature's ConcreteFunction)."""
    import tensorflow as tf

    tags = ["serve"] if tags is None else ([tags] if isinstance(tags, str) else list(tags))
    with tf.device("/cpu:0"):
        loaded = tf.saved_model.load(str(path), tags=tags)
    signatures = {k: v for k, v in loaded.signatures.items() if not k.startswith("_")}
    if signature_key not in signatures:
        raise ValueError(f"SavedModel {path} has no signature {signature_key!r} (it has {sorted(signatures)})")
    return loaded, signatures[signature_key]


def from_saved_model(
    path, signature_key="serving_default", tags=None, lowering="custom", opset=DEFAULT_OPSET, output_path=None, **kw
) -> onnx.ModelProto:
    """Convert one signature of a SavedModel; inputs and outputs keep the signature's names.
    Takes from_concrete_function's ``variable_updates`` and ``trainable_inputs``."""
    loaded, concrete = load_signature(path, signature_key, tags)
    kw.setdefault("name", os.path.basename(str(path).rstrip("/")))
    return from_concrete_function(concrete, lowering=lowering, opset=opset, output_path=output_path, trackable=loaded, **kw)


def load_graph_def(path):
    import tensorflow as tf

    graph_def = tf.compat.v1.GraphDef()
    with open(path, "rb") as f:
        graph_def.ParseFromString(f.read())
    return graph_def


def freeze_graph_def(graph_def, input_names: Sequence[str], output_names: Sequence[str]):
    """(frozen GraphDef, input names, output names) of a GraphDef (a proto or a .pb path), by tf2onnx's loader."""
    from tf2onnx import tf_loader

    if isinstance(graph_def, (str, os.PathLike)):
        return tf_loader.from_graphdef(str(graph_def), list(input_names), list(output_names))
    # tf2onnx's loader reads a file; hand it one rather than re-implementing its freezing steps.
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "graph.pb")
        with open(path, "wb") as f:
            f.write(graph_def.SerializeToString())
        return tf_loader.from_graphdef(path, list(input_names), list(output_names))


def from_graph_def(
    graph_def, input_names: Sequence[str], output_names: Sequence[str], lowering="custom", opset=DEFAULT_OPSET,
    output_path: Optional[str] = None, **kw
) -> onnx.ModelProto:
    """Convert a GraphDef (a proto or a path to a .pb); names are tensor names such as ``x:0``."""
    frozen, inputs, outputs = freeze_graph_def(graph_def, input_names, output_names)
    return convert_frozen_graph(
        frozen, inputs, outputs, lowering=lowering, opset=opset, name="graph_def", output_path=output_path, **kw
    )
