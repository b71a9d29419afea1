"""Running one op of the domain on a backend: the NumPy kernels or ONNX Runtime with the library.

Both raise :class:`BackendError` for input the op rejects, so tests can treat them alike. The ORT
sessions of the suite come from here too: ``library_session_options`` / ``library_session`` (CPU
provider, the library registered).
"""
from __future__ import annotations

import functools

import numpy as np

import ort_ops
from ort_ops.conformance.backends import ort_value  # noqa: F401 (the suite's runners use it from here)
from ort_ops.spec import OpError

BACKENDS = ("numpy", "ort")


class BackendError(Exception):
    """The op rejected its input; ``str()`` is the backend's message."""


def run_numpy(op, inputs, attrs):
    try:
        return ort_ops.get_spec(op).run_reference([np.asarray(x) for x in inputs], attrs)
    except OpError as e:
        raise BackendError(str(e)) from e


@functools.lru_cache(maxsize=None)
def library_session_options(threads=None, log_severity_level=3):
    """Session options with the library registered; ``threads`` intra-op threads (None: ORT's default).
    Cached, one per setting: callers must not change them."""
    settings = {"log_severity_level": log_severity_level}
    if threads is not None:
        settings["intra_op_num_threads"] = threads
    return ort_ops.session_options(**settings)


def cpu_session(model, options=None):
    """An ORT session (CPU provider) of an onnx ``model`` as it is: a standard-domain model needs no
    options; under scripts/test_ortgpu.sh such sessions run in the assertion-enabled build (isolated_ort)."""
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def library_session(model, threads=None, log_severity_level=3):
    """An ORT session (CPU provider) of an onnx ``model`` with the library registered."""
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), library_session_options(threads, log_severity_level),
                                providers=["CPUExecutionProvider"])


def _bfloat16_outputs(op, inputs):
    """Indices of the outputs that are bfloat16 for these inputs."""
    from onnx import TensorProto

    from ort_ops.model import elem_type_of
    from ort_ops.schemas import output_elem_types

    types = output_elem_types(ort_ops.get_spec(op), [elem_type_of(np.asarray(x).dtype) for x in inputs])
    return [i for i, t in enumerate(types) if t == TensorProto.BFLOAT16]


def single_op_model(op, inputs, attrs, constant_inputs=()):
    """The one-node model every ORT runner here uses (``constant_inputs``: indices that become initializers)."""
    from onnx import TensorProto, helper

    # Untyped outputs: the library, not the Python shape function, must judge every input.
    model = ort_ops.make_single_op_model(op, [np.asarray(x) for x in inputs], attrs, constant_inputs=constant_inputs,
                                         typed_outputs=False)
    # onnxruntime's Python API cannot hand out bfloat16 arrays: such outputs get an exact Cast to
    # float32 in the graph (decode_outputs casts them back).
    node = model.graph.node[0]
    for i in _bfloat16_outputs(op, inputs):
        name = node.output[i]
        node.output[i] = name + "_bfloat16"
        model.graph.node.append(helper.make_node("Cast", [name + "_bfloat16"], [name], to=TensorProto.FLOAT))
    return model


def ort_session(op, inputs, attrs, threads=2):
    return library_session(single_op_model(op, inputs, attrs), threads)


def run_ort(op, inputs, attrs, threads=2):
    spec = ort_ops.get_spec(op)
    try:
        sess = ort_session(op, inputs, attrs, threads)
        feed = {p.name: ort_value(np.asarray(x)) for p, x in zip(spec.inputs, inputs)}
        return decode_outputs(op, inputs, [v.numpy() for v in sess.run_with_ort_values(None, feed)])
    except OpError as e:
        raise BackendError(str(e)) from e
    except Exception as e:  # onnxruntime raises its own exception classes
        if type(e).__module__.startswith("onnxruntime"):
            raise BackendError(str(e)) from e
        raise


def decode_outputs(op, inputs, outs):
    """The op's outputs from a single_op_model's: bfloat16 ones come back from their float32 Cast."""
    outs = list(outs)
    if _bfloat16_outputs(op, inputs):
        import ml_dtypes

        for i in _bfloat16_outputs(op, inputs):
            outs[i] = outs[i].astype(ml_dtypes.bfloat16)  # exact: the values are bfloat16's
    return tuple(outs)


def run_cuda(op, inputs, attrs):
    """ONNX Runtime's CUDAExecutionProvider with the library (device-resident inputs and outputs; the node
    must run on CUDA, no CPU fallback). Not in BACKENDS: it needs a GPU (tests/cuda_support.py)."""
    import cuda_support

    outcome = cuda_support.run(cuda_support.CUDA, op, inputs, attrs)
    if outcome.error is not None:
        raise BackendError(outcome.error)
    placement = cuda_support.placement_problem(outcome, cuda_support.CUDA, op)
    if placement:
        raise AssertionError(placement)
    return outcome.outputs


def run(backend, op, inputs, attrs):
    return {"numpy": run_numpy, "ort": run_ort, "cuda": run_cuda}[backend](op, inputs, attrs)
