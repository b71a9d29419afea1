"""The runtimes the kit runs cases on. A backend takes a ``nodetest.Case`` and gives the outputs, or raises
``Rejected`` with the runtime's message when the implementation refuses the input.

* ``ort``: ONNX Runtime with the library (the installed one, or a user's own build) on one execution
  provider; ``placement`` says which provider ORT's profiler saw run the node, and a node that fell back
  from the provider asked for to the CPU fails its case.
* ``reference``: ``onnx.reference.ReferenceEvaluator`` with the NumPy kernels.
* ``extensions``: the NumPy kernels as onnxruntime-extensions Python ops inside ONNX Runtime
  (``ort_ops.conformance.extensions``).

A new backend implements ``run`` (and ``not_runnable`` for cases it cannot express) and is added to
``runner.make_backend``.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Optional

import numpy as np
import onnx
from onnx import TensorProto, helper

from ort_ops.spec import OpError

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"


class Rejected(Exception):
    """The implementation refused the input; ``str()`` is its message."""


class PlacementError(Exception):
    """The node did not run on the execution provider that was asked for (the case fails)."""


class Backend:
    name = "?"

    def describe(self) -> str:
        return self.name

    def not_runnable(self, case) -> Optional[str]:
        """Why this backend cannot run ``case`` at all (reported as skipped, never as passed), or None."""
        return None

    def run(self, case) -> list:
        raise NotImplementedError

    def placement(self) -> Optional[str]:
        """Where the last ``run`` really ran the node, when the backend can tell."""
        return None


class ReferenceBackend(Backend):
    name = "reference"

    def describe(self) -> str:
        return f"onnx {onnx.__version__} ReferenceEvaluator with the NumPy kernels"

    def run(self, case) -> list:
        from ort_ops.evaluator import reference_evaluator

        feeds = {i.name: x for i, x in zip(case.model.graph.input, case.inputs)}
        try:
            return [np.asarray(y) for y in reference_evaluator(case.model).run(None, feeds)]
        except OpError as e:
            raise Rejected(str(e)) from e


def bfloat16_as_float32(model: onnx.ModelProto) -> tuple:
    """onnxruntime's Python API cannot hand out bfloat16 arrays: a copy of ``model`` whose bfloat16 outputs
    are Cast (exactly) to float32, and the indices of those outputs."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph, node = model.graph, model.graph.node[0]
    cast = []
    for k, out in enumerate(graph.output):
        if out.type.tensor_type.elem_type == TensorProto.BFLOAT16:
            inner = out.name + "_bfloat16"
            node.output[list(node.output).index(out.name)] = inner
            graph.node.append(helper.make_node("Cast", [inner], [out.name], to=TensorProto.FLOAT))
            out.type.tensor_type.elem_type = TensorProto.FLOAT
            cast.append(k)
    return model, cast


def ort_value(x: np.ndarray):
    """An onnxruntime input (bfloat16 passes as its bits, typed BFLOAT16)."""
    import onnxruntime as ort

    x = np.require(x, requirements="C")
    if x.dtype.name == "bfloat16":
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(x.view(np.uint16), TensorProto.BFLOAT16)
    return ort.OrtValue.ortvalue_from_numpy(x)


def _is_ort_error(e: Exception) -> bool:
    return type(e).__module__.startswith("onnxruntime")


def _require_cuda_kernels(library: str) -> None:
    """A library without CUDA kernels would run every node on the CPU: say so before running anything."""
    from ort_ops.library import cuda_build_info

    try:
        info = cuda_build_info(library)
    except (OSError, AttributeError):  # not this project's build: its nodes' placement will tell
        return
    if not info["cuda_kernels"]:
        raise ValueError(f"--provider {CUDA_PROVIDER}: the library {library} has no CUDA kernels "
                         f"({info['reason'] or 'built without them'}); build it with TFOPS_CUDA=ON (docs/cuda.md)")


class OrtBackend(Backend):
    """ONNX Runtime with the custom-op library registered, on ``provider`` (CPU fallback for other nodes)."""

    name = "ort"

    def __init__(self, provider: str = CPU_PROVIDER, library: Optional[str] = None, threads: int = 1):
        import onnxruntime as ort

        from ort_ops.library import library_path

        self.library = str(Path(library).resolve()) if library else library_path()
        if not os.path.isfile(self.library):
            raise FileNotFoundError(f"--library {self.library}: no such file")
        if provider == CUDA_PROVIDER:
            _require_cuda_kernels(self.library)
        if provider == CUDA_PROVIDER and hasattr(ort, "preload_dlls"):
            # onnxruntime-gpu finds pip's nvidia-* CUDA libraries only after this; a missing one shows when
            # the first session falls back or fails, with ORT's own message.
            try:
                ort.preload_dlls()
            except Exception:  # noqa: BLE001
                pass
        if provider not in ort.get_available_providers():
            raise ValueError(f"execution provider {provider!r} is not in this onnxruntime "
                             f"({ort.__version__}): it has {ort.get_available_providers()}")
        self.provider = provider
        self.threads = threads
        self._profiles = tempfile.mkdtemp(prefix="tfops-conformance-")
        weakref.finalize(self, shutil.rmtree, self._profiles, True)
        self._last_placement = None

    def describe(self) -> str:
        import onnxruntime as ort

        return f"onnxruntime {ort.__version__}, {self.provider}, library {self.library}"

    def _session(self, model: onnx.ModelProto):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 4  # a rejection's message comes back in the exception; the log would repeat it
        so.intra_op_num_threads = self.threads
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(self._profiles, "case")
        so.register_custom_ops_library(self.library)
        providers = [self.provider] if self.provider == CPU_PROVIDER else [self.provider, CPU_PROVIDER]
        return ort.InferenceSession(model.SerializeToString(), so, providers=providers)

    def run(self, case) -> list:
        model, cast = bfloat16_as_float32(case.model)
        self._last_placement = None
        sess = None
        try:
            sess = self._session(model)
            feed = {i.name: ort_value(x) for i, x in zip(model.graph.input, case.inputs)}
            outs = [v.numpy() for v in sess.run_with_ort_values(None, feed)]
        except Exception as e:
            if _is_ort_error(e):
                raise Rejected(str(e)) from e
            raise
        finally:
            if sess is not None:
                self._last_placement = self._read_profile(sess, case.model.graph.node[0].name)
        if self.provider != CPU_PROVIDER and self._last_placement and self.provider not in self._last_placement:
            raise PlacementError(f"the node ran on {self._last_placement}, not on {self.provider}")
        if cast:
            import ml_dtypes

            for k in cast:
                outs[k] = outs[k].astype(ml_dtypes.bfloat16)  # exact: the values are bfloat16's
        return outs

    @staticmethod
    def _read_profile(sess, node_name: str) -> Optional[str]:
        path = Path(sess.end_profiling())
        try:
            events = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        finally:
            path.unlink(missing_ok=True)
        providers = {e.get("args", {}).get("provider") for e in events
                     if e.get("cat") == "Node" and e.get("name", "").startswith(node_name + "_")}
        providers.discard(None)
        return ",".join(sorted(providers)) or None

    def placement(self) -> Optional[str]:
        return self._last_placement
