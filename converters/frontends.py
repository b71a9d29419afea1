"""The four ways in: a tf.function, a Keras model, a SavedModel, a GraphDef.

Each one freezes its graph with tf2onnx's loaders (variables become constants, grappler's
constant folding runs) and hands the frozen GraphDef to converters.pipeline.
"""
from __future__ import annotations

import os
import tempfile
from typing import Optional, Sequence

import onnx

from converters.pipeline import DEFAULT_OPSET, convert_frozen_graph


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
            frozen_state = freeze(concrete_func, input_names, output_names, variable_updates, trainable_inputs)
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


def keras_concrete_function(model, input_signature=None):
    """The inference-mode (training=False) concrete function of a Keras model."""
    import tensorflow as tf

    if input_signature is None:
        input_signature = [tf.TensorSpec(t.shape, t.dtype, name=t.name.split(":")[0]) for t in model.inputs]

    @tf.function(input_signature=input_signature)
    def keras_inference(*args):
        return model(args[0] if len(args) == 1 else list(args), training=False)

    return keras_inference.get_concrete_function()


def from_keras(model, input_signature=None, lowering="custom", opset=DEFAULT_OPSET, output_path=None, **kw) -> onnx.ModelProto:
    """Convert a Keras model in inference mode (tf_keras's fused BatchNormalization -> FusedBatchNormV3)."""
    concrete = keras_concrete_function(model, input_signature)
    return from_concrete_function(concrete, lowering=lowering, opset=opset, output_path=output_path, trackable=model, **kw)


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


def from_graph_def(
    graph_def, input_names: Sequence[str], output_names: Sequence[str], lowering="custom", opset=DEFAULT_OPSET,
    output_path: Optional[str] = None, **kw
) -> onnx.ModelProto:
    """Convert a GraphDef (a proto or a path to a .pb); names are tensor names such as ``x:0``."""
    from tf2onnx import tf_loader

    if isinstance(graph_def, (str, os.PathLike)):
        path = str(graph_def)
        frozen, inputs, outputs = tf_loader.from_graphdef(path, list(input_names), list(output_names))
    else:
        # tf2onnx's loader reads a file; hand it one rather than re-implementing its freezing steps.
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "graph.pb")
            with open(path, "wb") as f:
                f.write(graph_def.SerializeToString())
            frozen, inputs, outputs = tf_loader.from_graphdef(path, list(input_names), list(output_names))
    return convert_frozen_graph(
        frozen, inputs, outputs, lowering=lowering, opset=opset, name="graph_def", output_path=output_path, **kw
    )
