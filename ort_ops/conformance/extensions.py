"""The ``extensions`` backend: each case's model in an ONNX Runtime CPU session whose domain ops are
onnxruntime-extensions Python ops (``onnx_op``) running the NumPy kernels (``OpSpec.run_reference``).

What a Python op can carry (measured with onnxruntime-extensions 0.15.2, onnxruntime 1.32), and what follows:

* Registration is process-global and append-only. One op type may be registered for several type
  signatures (ORT picks by input types), but registering the same types twice makes every later session of
  the process fail ("Conflicting with a registered kernel"). So each (op, input types) signature is
  registered once, on first use; its output types follow from the spec.
* The registered ops of a domain live in a C++ vector that each registration may move, and a session
  that registered the extensions library holds pointers into it: a session still alive at the next
  registration crashes the process (segfault) when it next runs or is freed. ``run`` therefore registers
  and runs under one lock and frees its session before it returns or raises.
* Side effect: once registered, the domain's Python ops make any session of this process that registers
  both this project's library and onnxruntime-extensions' fail ("Domain already set in registry", or
  "Conflicting with a registered kernel" for an op both define; ``enable_py_op(False)`` does not help).
  Use a fresh process for that combination.
* Attributes: int64, float and string only (bools travel as 0/1 ints). A declared attribute must be on the
  node (else: "Unable to find attribute"); undeclared ones never reach Python. The declaration is fixed per
  signature, so every attribute of the op is declared and ``run`` writes the spec's default (what
  ``run_reference`` would fill in) on a copy of the node for each one the node leaves out. List attributes
  cannot be declared: the depthwise ops are not runnable. Float attributes reach Python as text with 6
  significant digits (``std::stringstream``): a value that does not survive that is not runnable.
* Tensors: float32, float64 and int32 pass both ways (float32 outputs go through Python floats, which
  quiets signalling NaNs). float16 and bfloat16 inputs or outputs pass session creation but abort the
  process when the node runs (std::terminate: "Type float16 not supported by python customops api",
  "Unsupported ONNX Tensor type: 16"), so such cases are not runnable.
* Errors: an exception leaving an op's body aborts the process too (std::terminate on
  ``pybind11::error_already_set``); ORT never sees it. So the body catches it, returns empty outputs of the
  registered types, and ``run`` raises it once the session is done: the op's ``OpError`` as ``Rejected``
  (its message, which starts with the op name), anything else as a RuntimeError with the traceback.
"""
from __future__ import annotations

import threading
import traceback
from typing import Optional

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper

from ort_ops.conformance.backends import Backend, Rejected, ort_value
from ort_ops.model import elem_type_of, node_attributes
from ort_ops.schemas import DOMAIN, output_elem_types
from ort_ops.spec import OpError
from ort_ops.specs import get_spec

_ATTR_TYPES = {"int": AttributeProto.INT, "bool": AttributeProto.INT, "float": AttributeProto.FLOAT,
               "string": AttributeProto.STRING, "ints": AttributeProto.INTS}
_NO_NUMPY = {TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16"}
_registered = set()  # (op, input element types) registered in this process
_caught = []  # (is the op's OpError, text) for what the bodies caught during the current run
_lock = threading.Lock()  # registration and runs one at a time (see the module docstring)


def _extensions():
    try:
        import onnxruntime_extensions
    except ImportError as e:
        raise ImportError("the extensions backend needs the onnxruntime-extensions package "
                          "(pip install onnxruntime-extensions)") from e
    return onnxruntime_extensions


def _register(op: str, in_types: tuple) -> None:
    if (op, in_types) in _registered:
        return
    ox, spec = _extensions(), get_spec(op)
    dt = ox.PyCustomOpDef
    kinds = {"int": dt.dt_int64, "bool": dt.dt_int64, "float": dt.dt_float, "string": dt.dt_string}
    out_types = output_elem_types(spec, in_types)
    out_dtypes = [helper.tensor_dtype_to_np_dtype(t) for t in out_types]

    def body(*inputs, **attrs):
        try:
            outputs = tuple(spec.run_reference(inputs, attrs))
            got = [np.asarray(y).dtype for y in outputs]
            if got != out_dtypes:  # the bridge would convert silently: say so instead
                raise TypeError(f"{op}: the NumPy kernel gave {[d.name for d in got]}, "
                                f"the registered outputs are {[d.name for d in out_dtypes]}")
            return outputs
        except BaseException as e:  # nothing may leave the body (see the module docstring)
            # Text only: an exception object would keep the session alive through its traceback's frames.
            _caught.append((True, str(e)) if isinstance(e, OpError) else (False, traceback.format_exc()))
            return tuple(np.zeros((0,), d) for d in out_dtypes)

    ox.onnx_op(op_type=f"{DOMAIN}::{op}", inputs=list(in_types), outputs=list(out_types),
               attrs={a.name: kinds[a.kind] for a in spec.attrs})(body)
    _registered.add((op, in_types))


def _survives_text(value: float) -> bool:
    """Whether a float32 attribute comes back equal from C++'s ``stream << value`` (6 significant digits)."""
    back = np.float32(float(format(value, ".6g")))
    return bool(np.isnan(back) and np.isnan(value)) or back.tobytes() == np.float32(value).tobytes()


def _attr_problem(op: str, a, kinds: dict) -> Optional[str]:
    if a.name not in kinds:
        return f"attribute '{a.name}' is not one of {op}'s: a Python op never sees undeclared attributes"
    if a.type != _ATTR_TYPES[kinds[a.name]]:
        return (f"attribute '{a.name}' is {AttributeProto.AttributeType.Name(a.type)} on the node, "
                f"{kinds[a.name]} in the spec: the Python op's session creation fails")
    if a.type == AttributeProto.FLOAT and not _survives_text(a.f):
        return (f"float attribute '{a.name}' = {np.float32(a.f)!r}: onnxruntime-extensions passes float "
                "attributes to Python as text with 6 significant digits, which changes this value")
    if a.type == AttributeProto.STRING:
        try:
            a.s.decode("utf-8")
        except UnicodeDecodeError:
            return f"string attribute '{a.name}' is not UTF-8: a Python op cannot receive it"
    return None


class ExtensionsBackend(Backend):
    name = "extensions"

    def __init__(self):
        self._ox = _extensions()  # fail here, naming the package, when it is missing

    def describe(self) -> str:
        import onnxruntime as ort

        return (f"onnxruntime {ort.__version__} (CPU) with onnxruntime-extensions {self._ox.__version__} "
                "Python ops running the NumPy kernels")

    def not_runnable(self, case) -> Optional[str]:
        spec = get_spec(case.op)
        lists = [a.name for a in spec.attrs if a.kind == "ints"]
        if lists:
            return (f"list attribute '{lists[0]}': onnxruntime-extensions Python ops carry only int64, float "
                    "and string attributes")
        in_types = [elem_type_of(x.dtype) for x in case.inputs]
        for where, params, types in (("input", spec.inputs, in_types),
                                     ("output", spec.outputs, output_elem_types(spec, in_types))):
            for param, t in zip(params, types):
                if t in _NO_NUMPY:
                    return (f"{_NO_NUMPY[t]} {where} '{param.name}': onnxruntime-extensions Python ops cannot "
                            f"pass {_NO_NUMPY[t]} tensors to or from NumPy, and running the node aborts the process")
        node = case.model.graph.node[0]
        kinds = {a.name: a.kind for a in spec.attrs}
        for a in node.attribute:
            problem = _attr_problem(case.op, a, kinds)
            if problem:
                return problem
        present = {a.name for a in node.attribute}
        missing = [a.name for a in spec.attrs if a.required and a.name not in present]
        if missing:
            return (f"required attribute '{missing[0]}' is absent: a Python op needs every declared attribute "
                    "on the node")
        return None

    @staticmethod
    def _with_defaults(model: onnx.ModelProto) -> onnx.ModelProto:
        """A copy of ``model`` whose node carries every attribute (the spec's default where it had none)."""
        model = onnx.ModelProto.FromString(model.SerializeToString())
        node = model.graph.node[0]
        present = {a.name for a in node.attribute}
        absent = {a.name: a.default for a in get_spec(node.op_type).attrs if a.name not in present}
        for name, value in node_attributes(node.op_type, absent).items():
            node.attribute.append(helper.make_attribute(name, value))
        return model

    def run(self, case) -> list:
        import onnxruntime as ort

        model = self._with_defaults(case.model).SerializeToString()
        feeds = {i.name: ort_value(x) for i, x in zip(case.model.graph.input, case.inputs)}
        outputs, failure = None, None
        with _lock:
            _register(case.op, tuple(elem_type_of(x.dtype) for x in case.inputs))
            del _caught[:]
            so = ort.SessionOptions()
            so.log_severity_level = 3
            so.intra_op_num_threads = 1
            so.register_custom_ops_library(self._ox.get_library_path())
            sess = None
            try:
                sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
                outputs = [v.numpy() for v in sess.run_with_ort_values(None, feeds)]
            except Exception as e:  # kept as text: the exception's frames would keep the session alive
                from_ort = type(e).__module__.startswith("onnxruntime")
                failure = (from_ort, str(e) if from_ort else traceback.format_exc())
            finally:
                del sess, so  # before the next registration can move what they point into
            failure = failure or (_caught[0] if _caught else None)
        if failure is not None:
            is_refusal, text = failure
            if is_refusal:
                raise Rejected(text)
            raise RuntimeError(f"{case.op} on onnxruntime-extensions: {text}")
        return outputs
