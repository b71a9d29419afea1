"""Keras models as conversion sources: both Kerases, their files, their inputs and their training steps.

TensorFlow 2.21 ships two Kerases, and a model or file belongs to exactly one of them:

* Keras 3 (``import keras``, TF's default): ``keras.Model``; files written by ``model.save`` (``.keras``,
  or legacy ``.h5``) record ``keras_version`` 3.x; ``model.export(dir)`` writes a SavedModel whose
  ``serve`` / ``serving_default`` signature is the inference function.
* tf_keras (``import tf_keras``, Keras 2, what tfmot builds on): ``tf_keras.Model``; its files record
  ``keras_version`` 2.x, and its SavedModels carry a ``keras_metadata.pb``.

Loading a file with the wrong Keras fails deep inside it (``Could not deserialize class 'Functional'``,
``Unrecognized keyword arguments: ['batch_shape']``), so :func:`load_keras_file` reads the version the file
records and picks the Keras that wrote it. Every failure here is a :class:`ConversionError` that says what to do.

A model's inputs come from ``model.inputs`` (a Functional model, or a Sequential that starts with an
``Input``), with the batch dimension left free unless a batch size is asked for: a Sequential built by
calling it once on a batch records that batch's size, which is not a property of the model. A model whose
inputs are unknown (a Sequential never called, a subclassed model) needs an ``input_signature``.
"""
from __future__ import annotations

import json
import os
import re
import zipfile
from typing import Optional

from converters.errors import ConversionError

KERAS_3, TF_KERAS = "keras", "tf_keras"
# Names Keras gives inputs nobody named (Keras 3: keras_tensor_7; tf_keras: input_1 is kept, it is stable).
_AUTO_INPUT_NAME = re.compile(r"^keras_tensor(_\d+)?$")
SIGNATURE_EXAMPLE = "input_signature=[tf.TensorSpec([None, 32, 32, 3], tf.float32, name='images')]"


def keras_of_model(model) -> Optional[str]:
    """KERAS_3 or TF_KERAS for a Keras model object, None for anything else."""
    for cls in type(model).__mro__:
        module = cls.__module__ or ""
        if cls.__name__ in ("Model", "Layer"):
            if module.startswith("tf_keras."):
                return TF_KERAS
            if module.startswith("keras."):
                return KERAS_3
    return None


def keras_version(flavour: str) -> str:
    if flavour == KERAS_3:
        import keras

        return keras.__version__
    import tf_keras

    return tf_keras.__version__


def describe_keras(flavour: str) -> str:
    return f"Keras {keras_version(flavour)} ({'keras' if flavour == KERAS_3 else 'tf_keras'})"


def file_keras_version(path) -> Optional[str]:
    """The ``keras_version`` a ``.keras`` or ``.h5`` file records (None if it records none)."""
    path = str(path)
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                if "metadata.json" not in archive.namelist():
                    return None
                return json.loads(archive.read("metadata.json")).get("keras_version")
        import h5py

        with h5py.File(path, "r") as f:
            version = f.attrs.get("keras_version")
    except (OSError, ValueError, KeyError) as e:
        raise ConversionError(f"{path} is not a Keras file that can be read ({type(e).__name__}: {e})") from e
    if isinstance(version, bytes):
        version = version.decode()
    return version


def file_keras(path) -> str:
    """KERAS_3 or TF_KERAS: the Keras that wrote a ``.keras`` / ``.h5`` file."""
    version = file_keras_version(path)
    if version is None:
        raise ConversionError(
            f"{path} records no keras_version: it was not written by Keras's model.save "
            "(convert a SavedModel with --saved-model, or save the model again with model.save('model.keras'))"
        )
    return KERAS_3 if int(version.split(".")[0]) >= 3 else TF_KERAS


def is_tf_keras_saved_model(path) -> bool:
    return os.path.isfile(os.path.join(str(path), "keras_metadata.pb"))


def load_keras_file(path, custom_objects=None):
    """(model, KERAS_3 or TF_KERAS): a ``.keras`` or ``.h5`` file loaded, without its training config, by the
    Keras that wrote it."""
    path = str(path)
    if not os.path.isfile(path):
        raise ConversionError(f"Keras file {path} does not exist")
    flavour = file_keras(path)
    try:
        if flavour == KERAS_3:
            import keras

            model = keras.saving.load_model(path, custom_objects=custom_objects, compile=False)
        else:
            import tf_keras

            with _tfmot_scope():
                model = tf_keras.models.load_model(path, custom_objects=custom_objects, compile=False)
    except Exception as e:  # Keras raises TypeError, ValueError, KeyError... for one and the same cause
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = ""
        if re.search(r"[Uu]nknown|Could not locate|could not be deserialized|deserialize", str(e)):
            hint = (
                "; a custom layer must be importable: register it with keras.saving.register_keras_serializable "
                "(tf_keras: tf_keras.saving.register_keras_serializable) in a module and pass --import MODULE "
                "(Python: import it, or pass custom_objects)"
            )
        raise ConversionError(
            f"cannot load {path} with {describe_keras(flavour)}, the Keras that wrote it: {message}{hint}"
        ) from e
    return model, flavour


def _tfmot_scope():
    """tfmot's quantize_scope where tfmot is installed: a tf_keras file of a quantization-aware model (tfmot's
    quantize_model) names tfmot's wrapper layers, which tf_keras loads only inside it. A no-op context elsewhere."""
    import contextlib

    try:
        from tensorflow_model_optimization.quantization.keras import quantize_scope
    except Exception:  # noqa: BLE001 - tfmot is optional; absent or broken, files without its layers still load
        return contextlib.nullcontext()
    return quantize_scope()


def _reason(e: Exception) -> str:
    """The line of an exception's message that says what went wrong (tf.function prefixes "in user code:" and
    a traceback; the cause is the last line)."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[-1][:300] if lines else ''}"


def _declared_inputs(model):
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        inputs = None
    return list(inputs) if inputs else None


def keras_input_signature(model, input_signature=None, batch_size: Optional[int] = None) -> list:
    """The TensorSpecs a Keras model is converted with: ``input_signature`` when given, else ``model.inputs``
    with the batch dimension free (or ``batch_size``) and unnamed Keras 3 inputs named ``input`` / ``input_K``."""
    import tensorflow as tf

    if input_signature is not None:
        return list(input_signature)
    inputs = _declared_inputs(model)
    if inputs is None:
        kind = type(model).__name__
        raise ConversionError(
            f"the inputs of Keras model {getattr(model, 'name', kind)!r} ({kind}) are not known: a Sequential "
            "model that starts without keras.Input(...) and was never built, or a subclassed model, has none. "
            f"Pass from_keras(model, {SIGNATURE_EXAMPLE}), or start the model with keras.Input(shape, name=...)"
        )
    specs = []
    for k, t in enumerate(inputs):
        name = (t.name or "").split(":")[0]
        if not name or _AUTO_INPUT_NAME.match(name):
            name = "input" if len(inputs) == 1 else f"input_{k}"
        shape = list(tf.TensorShape(t.shape).as_list()) if t.shape is not None else None
        if shape:
            shape[0] = batch_size
        specs.append(tf.TensorSpec(shape, tf.as_dtype(t.dtype), name=name))
    return specs


def output_names(model, count: int) -> list:
    """The names of a model's outputs: Keras's ``output_names`` (the output layers' names) where it has them,
    else ``output`` / ``output_K``, as Keras 3's model.export names them."""
    names = list(getattr(model, "output_names", None) or [])
    if len(names) == count and len(set(names)) == count and all(names):
        return [re.sub(r"[^0-9A-Za-z_./-]+", "_", n) for n in names]
    return ["output"] if count == 1 else [f"output_{k}" for k in range(count)]


def call_model(model, args, training: bool):
    """``model`` called on the flat list ``args`` in the structure it was built with (one tensor, a list, a dict)."""
    import tensorflow as tf

    structure = getattr(model, "_inputs_struct", None)  # Keras 3 Functional: the nest of its inputs
    if structure is not None:
        try:
            return model(tf.nest.pack_sequence_as(structure, list(args)), training=training)
        except (TypeError, ValueError):
            pass
    return model(args[0] if len(args) == 1 else list(args), training=training)


def inference_function(model, input_signature=None, batch_size: Optional[int] = None):
    """The inference-mode (training=False) ConcreteFunction of a Keras model of either Keras."""
    import tensorflow as tf

    signature = keras_input_signature(model, input_signature, batch_size)

    @tf.function(input_signature=signature)
    def keras_inference(*args):
        outputs = call_model(model, args, training=False)
        flat = tf.nest.flatten(outputs)
        names = output_names(model, len(flat))
        # A dict names the graph outputs (a bare tensor would be "Identity:0"); one output keeps its place, and
        # several come out in the dict's (sorted) order, which is why their names are what to fetch them by.
        return dict(zip(names, flat))

    try:
        return keras_inference.get_concrete_function()
    except Exception as e:
        raise ConversionError(
            f"calling Keras model {model.name!r} on {signature} failed: {_reason(e)}; "
            f"pass an input_signature that matches the model ({SIGNATURE_EXAMPLE})"
        ) from e


def _keras_module(flavour: str):
    if flavour == KERAS_3:
        import keras

        return keras
    import tf_keras

    return tf_keras


def resolve_loss(flavour: str, loss, from_logits: bool = False):
    """A callable ``(labels, predictions) -> scalar loss`` from a Keras loss name, object or function."""
    import tensorflow as tf

    if loss is None:
        raise ConversionError(
            "a training step needs a loss: pass loss='sparse_categorical_crossentropy' (CLI: --loss NAME, with "
            "--from-logits when the model outputs logits), or a compiled model's loss"
        )
    if isinstance(loss, str):
        try:
            resolved = _keras_module(flavour).losses.get(loss)
        except Exception as e:
            raise ConversionError(f"{describe_keras(flavour)} has no loss named {loss!r} ({e})") from e
    else:
        resolved = loss
    if not callable(resolved):
        raise ConversionError(f"loss {loss!r} is not callable")
    is_object = not isinstance(resolved, type(resolve_loss)) and hasattr(resolved, "get_config")
    if is_object:
        if from_logits and not getattr(resolved, "from_logits", getattr(resolved, "_fn_kwargs", {}).get("from_logits")):
            config = resolved.get_config()
            if "from_logits" not in config:
                raise ConversionError(f"loss {loss!r} takes no from_logits")
            config["from_logits"] = True
            resolved = type(resolved).from_config(config)
        return resolved

    def mean_loss(labels, predictions):
        extra = {"from_logits": True} if from_logits else {}
        return tf.reduce_mean(resolved(labels, predictions, **extra))

    return mean_loss


def _loss_name(loss) -> str:
    if isinstance(loss, str):
        return loss
    return type(loss).__name__ if hasattr(loss, "get_config") else getattr(loss, "__name__", "")


def resolve_optimizer(flavour: str, optimizer, learning_rate: Optional[float] = None):
    if optimizer is None or not isinstance(optimizer, str):
        return optimizer
    module = _keras_module(flavour)
    try:
        resolved = module.optimizers.get(optimizer)
    except Exception as e:
        raise ConversionError(f"{describe_keras(flavour)} has no optimizer named {optimizer!r} ({e})") from e
    if learning_rate is not None:
        resolved.learning_rate = learning_rate
    return resolved


def gradient_output_name(variable, taken: set) -> str:
    """``grad_<variable path>`` with every run of other characters as one ``_``, unique within ``taken``."""
    path = getattr(variable, "path", None) or variable.name.split(":")[0]
    base = "grad_" + re.sub(r"[^0-9A-Za-z]+", "_", path).strip("_")
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


def _labels_signature(model, loss, batch_size, labels_signature):
    import tensorflow as tf

    if labels_signature is not None:
        return labels_signature
    if "sparse" in _loss_name(loss).lower():
        return tf.TensorSpec([batch_size], tf.int32, name="labels")
    outputs = getattr(model, "outputs", None)
    if not outputs or len(outputs) != 1:
        raise ConversionError(
            f"cannot tell the labels' shape of a training step of {model.name!r}: pass "
            "labels_signature=tf.TensorSpec([None, ...], tf.float32, name='labels')"
        )
    shape = tf.TensorShape(outputs[0].shape).as_list()
    shape[0] = batch_size
    return tf.TensorSpec(shape, tf.as_dtype(outputs[0].dtype), name="labels")


class _TrainingStep:
    """One training step as a tf.function: forward with training=True, the loss, the gradient of every
    trainable variable and, with an optimizer, its update of the variables (held in ``self`` so that its
    variables live as long as the function)."""

    def __init__(self, model, flavour, loss_fn, optimizer, signature):
        import tensorflow as tf

        self.model, self.loss_fn, self.optimizer = model, loss_fn, optimizer
        variables = list(model.trainable_variables)
        taken = {"loss"}
        self.names = [gradient_output_name(v, taken) for v in variables]
        if optimizer is not None and flavour == KERAS_3:
            optimizer.build(variables)
        n_inputs = len(signature) - 1

        @tf.function(input_signature=signature)
        def train_step(*args):
            inputs, labels = args[:n_inputs], args[n_inputs]
            with tf.GradientTape() as tape:
                predictions = call_model(self.model, inputs, training=True)
                loss = self.loss_fn(labels, predictions)
            grads = tape.gradient(loss, variables)
            missing = [v.name for v, g in zip(variables, grads) if g is None]
            if missing:
                raise ConversionError(f"the loss does not depend on trainable variable(s) {missing}")
            if self.optimizer is not None:
                self.optimizer.apply_gradients(zip(grads, variables))
            return {"loss": loss, **dict(zip(self.names, grads))}

        self.function = train_step


def training_step_function(model, loss, optimizer=None, learning_rate=None, from_logits=False, input_signature=None,
                           labels_signature=None, batch_size: Optional[int] = None):
    """(ConcreteFunction, holder) of one training step of a Keras model of either Keras: inputs then
    ``labels`` -> ``loss`` and ``grad_<variable>`` for every trainable variable. The model runs with
    training=True (batch statistics; the moving statistics are assigned), and with ``optimizer`` (a Keras
    optimizer or its name) the step applies the gradients. Keep ``holder`` alive while the function is used."""
    flavour = keras_of_model(model)
    if flavour is None:
        raise ConversionError(f"expected a Keras model, got {type(model).__name__}")
    loss_fn = resolve_loss(flavour, loss, from_logits)
    optimizer = resolve_optimizer(flavour, optimizer, learning_rate)
    signature = keras_input_signature(model, input_signature, batch_size)
    signature = signature + [_labels_signature(model, loss, batch_size, labels_signature)]
    holder = _TrainingStep(model, flavour, loss_fn, optimizer, signature)
    try:
        return holder.function.get_concrete_function(), holder
    except ConversionError:
        raise
    except Exception as e:
        raise ConversionError(
            f"tracing the training step of {model.name!r} failed: {_reason(e)}"
        ) from e

