"""Seeded random inputs for an example model from its input declarations alone: ``images`` uniform in [0, 1)
(the range of the digits the examples were trained on, models/data.py), integer inputs (labels) in [0, 10),
anything else (the qdq model's ``x``) standard normal clipped to [-2.5, 2.5]; dimensions the model leaves free get
``free_dim``. Used where a model is run without its run_all entry, which feeds real images instead
(tests/test_concurrency.py, benchmarks/soak.py)."""
from __future__ import annotations

import numpy as np
import onnx

_NUMPY = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.DOUBLE: np.float64,
          onnx.TensorProto.INT32: np.int32, onnx.TensorProto.INT64: np.int64}


def declared_inputs(model: onnx.ModelProto, seed: int, free_dim: int) -> dict:
    rng = np.random.default_rng(seed)
    feed = {}
    for value in model.graph.input:
        tensor = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else free_dim for d in tensor.shape.dim]
        dtype = _NUMPY[tensor.elem_type]
        if np.dtype(dtype).kind == "i":
            feed[value.name] = rng.integers(0, 10, shape).astype(dtype)
        elif value.name == "images":
            feed[value.name] = rng.uniform(0.0, 1.0, shape).astype(dtype)
        else:
            feed[value.name] = np.clip(rng.standard_normal(shape), -2.5, 2.5).astype(dtype)
    return feed
