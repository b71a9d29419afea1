"""Running a TF function the way the verifier does, in its own process and in TF's other kernel mode
(converters.verify_tf_child): a ConcreteFunction for a tf.function, ConcreteFunction or Keras model at given
inputs, a call by position or (SavedModel signatures) by name, and a GraphDef as a function. TF is imported
inside the functions.
"""
from __future__ import annotations


def concrete_function(tf_fn, inputs: dict):
    """A ConcreteFunction for ``tf_fn`` (tf.function, ConcreteFunction or Keras model) at these inputs."""
    import tensorflow as tf
    from tensorflow.python.eager.polymorphic_function.concrete_function import ConcreteFunction

    if isinstance(tf_fn, ConcreteFunction):
        return tf_fn
    if hasattr(tf_fn, "get_concrete_function"):
        specs = [tf.TensorSpec(v.shape, tf.as_dtype(v.dtype)) for v in inputs.values()]
        return tf_fn.get_concrete_function(*specs)
    if hasattr(tf_fn, "layers") and hasattr(tf_fn, "inputs"):
        from converters.frontends import keras_concrete_function

        specs = [tf.TensorSpec(v.shape, tf.as_dtype(v.dtype)) for v in inputs.values()]
        return keras_concrete_function(tf_fn, specs)
    raise TypeError(f"verify needs a tf.function, a ConcreteFunction or a Keras model, got {type(tf_fn).__name__}")


def run_tf(cf, inputs: dict):
    """Call ``cf``; keyword-only signatures (SavedModel signatures) get the inputs by name."""
    import tensorflow as tf

    args, kwargs = cf.structured_input_signature or ((), {})  # None for pruned (GraphDef) functions
    values = [tf.constant(v) for v in inputs.values()]
    if not args and kwargs:
        result = cf(**dict(zip(inputs.keys(), values)))
    else:
        result = cf(*values)
    return result


def graph_def_function(graph_def, input_names, output_names):
    """A ConcreteFunction running ``graph_def`` from ``input_names`` to ``output_names`` (tensor names)."""
    import tensorflow as tf

    def _import():
        tf.compat.v1.import_graph_def(graph_def, name="")

    wrapped = tf.compat.v1.wrap_function(_import, [])
    g = wrapped.graph
    return wrapped.prune([g.as_graph_element(n) for n in input_names], [g.as_graph_element(n) for n in output_names])
