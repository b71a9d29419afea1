"""ONNX Runtime with the library as an ``onnx.backend.base.Backend``: the worked example of running the kit's
directories the way a third-party runtime runs ONNX's own node tests (``onnx.backend.test``).

    from onnx.backend.test.loader import load_model_tests
    from onnx.backend.test.runner import Runner
    from ort_ops.conformance.onnx_backend import OrtLibraryBackend

    for test in load_model_tests(DIR, "cases"):            # DIR: written by `python -m ort_ops.conformance export`
        model = onnx.load(os.path.join(test.model_dir, "model.onnx"))
        inputs, expected = read_data_set(test.model_dir)   # test_data_set_0/input_K.pb, output_K.pb
        got = OrtLibraryBackend.prepare(model).run(inputs)
        Runner.assert_similar_outputs(expected, got, test.rtol, test.atol)

onnx's runner judges a whole case with one rtol/atol (data.json); the kit's own runner judges each output by
its rule (``python -m ort_ops.conformance run``).
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from ort_ops.conformance.backends import CPU_PROVIDER, CUDA_PROVIDER, OrtBackend


class OrtLibraryRep(BackendRep):
    def __init__(self, model: onnx.ModelProto, runtime: OrtBackend):
        self.model, self.runtime = model, runtime

    def run(self, inputs, **kwargs):
        case = SimpleNamespace(model=self.model, inputs=[np.asarray(x) for x in inputs])  # what OrtBackend.run reads
        return tuple(self.runtime.run(case))


class OrtLibraryBackend(Backend):
    """``prepare(model, device)``: a session of ONNX Runtime with the library registered ("CPU" or "CUDA")."""

    library: Optional[str] = None  # a custom-op library to use instead of the installed one

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs):
        provider = CPU_PROVIDER if device == "CPU" else CUDA_PROVIDER
        return OrtLibraryRep(model, OrtBackend(provider, cls.library))

    @classmethod
    def supports_device(cls, device: str) -> bool:
        import onnxruntime as ort

        return device == "CPU" or (device == "CUDA" and CUDA_PROVIDER in ort.get_available_providers())


def read_data_set(case_dir) -> tuple:
    """(inputs, expected outputs) of a node-test directory's test_data_set_0, as numpy arrays."""
    from onnx import numpy_helper

    data = Path(case_dir) / "test_data_set_0"

    def read(pattern):
        paths = sorted(data.glob(pattern), key=lambda p: int(p.stem.split("_")[1]))
        return [numpy_helper.to_array(onnx.load_tensor(str(p))) for p in paths]

    return read("input_*.pb"), read("output_*.pb")
