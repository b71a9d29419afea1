"""Running one op of the domain on a backend: the NumPy kernels or ONNX Runtime with the library.

Both raise :class:`BackendError` for input the op rejects, so tests can treat them alike.
"""
from __future__ import annotations

import functools

import numpy as np

import ort_ops
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
def _ort_session_options(threads):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    so.register_custom_ops_library(ort_ops.library_path())
    return so


def ort_session(op, inputs, attrs, threads=2):
    import onnxruntime as ort

    # Untyped outputs: the library, not the Python shape function, must judge every input.
    model = ort_ops.make_single_op_model(op, [np.asarray(x) for x in inputs], attrs, typed_outputs=False)
    return ort.InferenceSession(
        model.SerializeToString(), _ort_session_options(threads), providers=["CPUExecutionProvider"]
    )


def run_ort(op, inputs, attrs, threads=2):
    spec = ort_ops.get_spec(op)
    try:
        sess = ort_session(op, inputs, attrs, threads)
        feed = {p.name: np.asarray(x) for p, x in zip(spec.inputs, inputs)}
        return tuple(sess.run(None, feed))
    except OpError as e:
        raise BackendError(str(e)) from e
    except Exception as e:  # onnxruntime raises its own exception classes
        if type(e).__module__.startswith("onnxruntime"):
            raise BackendError(str(e)) from e
        raise


def run(backend, op, inputs, attrs):
    return {"numpy": run_numpy, "ort": run_ort}[backend](op, inputs, attrs)
