"""Running one op of the domain on ONNX Runtime's CUDAExecutionProvider and judging it against the CPU kernels.

Used by tests/test_cuda_kernels.py. Every function works for any execution provider: the self-tests there run
this very code with the CPU EP on both sides (and with doctored results), so it is exercised on machines
without a GPU too.

* ``unavailable_reason()``: why CUDA runs cannot happen here, or None.
* ``Target``: an execution provider, the device its bound inputs and outputs live on, and the I/O mode:
  ``"device"`` binds OrtValues on that device through io_binding (the inputs are copied there once,
  before the run; outputs stay there until copied back), ``"host"`` feeds host OrtValues to
  ``run_with_ort_values`` (ORT copies them across itself).
* ``run(target, op, inputs, attrs)`` -> ``Outcome``: the outputs, or the rejection message, and which
  provider ORT's profiler says ran each node.
* ``judge(...)``: the comparison rules (test_cuda_kernels.py's docstring), as a list of problems.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np

import ort_ops
from backends import decode_outputs, single_op_model
from comparison import bits_mismatch
from ort_ops.conformance import judge as kit_judge
from ort_ops.conformance import rules as kit_rules
from ort_ops.spec import OpError

CUDA_EP = "CUDAExecutionProvider"
CPU_EP = "CPUExecutionProvider"

FAKE_QUANT_OPS = tuple(s.name for s in ort_ops.OP_SPECS if s.family == "fake_quant")
QDQ_OPS = tuple(s.name for s in ort_ops.OP_SPECS if s.family == "quantize_dequantize")
BATCH_NORM_OPS = tuple(s.name for s in ort_ops.OP_SPECS if s.family == "batch_norm")
DEPTHWISE_OPS = tuple(s.name for s in ort_ops.OP_SPECS if s.family == "depthwise")
FUSED_OPS = tuple(s.name for s in ort_ops.OP_SPECS if s.family == "fused")
QUANT_OPS = FAKE_QUANT_OPS + QDQ_OPS
# Judged bit for bit, NaN payloads included, against the CPU kernels and TF's goldens: the quantization ops and
# the fused ops (FusedBatchNormClipFakeQuant ends in a FakeQuant; its CUDA kernel recomputes a NaN result with
# x86's rules, as the FakeQuant kernels do).
BIT_EXACT_OPS = QUANT_OPS + FUSED_OPS
DW_FWD, DW_BPI, DW_BPF = "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter"
# Forward and input gradient: every output element is the CPU kernel's own tap sequence (same order, no FMA).
DW_BIT_EXACT = (DW_FWD, DW_BPI)

# ORT fails session creation when a node would fall back to the CPU EP: a CUDA kernel that ORT does not
# pick (wrong type, missing registration) is an error, not a silent CPU run.
DISABLE_CPU_FALLBACK = "session.disable_cpu_ep_fallback"


@dataclasses.dataclass(frozen=True)
class Target:
    provider: str
    device: str  # "cuda" or "cpu": where io="device" binds inputs and outputs
    io: str = "device"  # "device" (io_binding) or "host" (run_with_ort_values with host arrays)
    cuda_graph: bool = False  # CUDA EP option enable_cuda_graph (needs io="device" and preallocated outputs)

    def __str__(self):
        return f"{self.provider}/{self.io} I/O" + (" + CUDA graph" if self.cuda_graph else "")


CUDA = Target(CUDA_EP, "cuda")
CUDA_HOST_IO = Target(CUDA_EP, "cuda", io="host")
CUDA_GRAPH = Target(CUDA_EP, "cuda", cuda_graph=True)
CPU = Target(CPU_EP, "cpu", io="host")  # the reference: the CPU kernels, as backends.run_ort runs them
CPU_BOUND = Target(CPU_EP, "cpu")  # the CPU kernels through the io_binding path (self-tests)


@dataclasses.dataclass
class Outcome:
    outputs: Optional[tuple]  # None when the op rejected its input
    error: Optional[str] = None
    providers: dict = dataclasses.field(default_factory=dict)  # op name -> set of providers that ran it


# ------------------------------------------------------------------------------------------ availability


def _preload(ort):
    """onnxruntime-gpu finds the CUDA and cuDNN libraries of the environment (pip's nvidia-* packages, as
    PyTorch installs them) only after preload_dlls(); older builds have no such function."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        try:
            preload()
        except Exception:  # noqa: BLE001  the session probe below says what is missing
            pass


@functools.lru_cache(maxsize=None)
def unavailable_reason() -> Optional[str]:
    return probe()


def probe() -> Optional[str]:
    """Why CUDA runs cannot happen here (None when they can). Uncached: unavailable_reason() caches it."""
    try:
        import onnxruntime as ort
    except ImportError:
        return "onnxruntime is not installed"
    if CUDA_EP not in ort.get_available_providers():
        return "no CUDAExecutionProvider in this onnxruntime"
    _preload(ort)
    try:
        built = ort_ops.cuda_kernels_built()
    except (OSError, AttributeError) as e:  # AttributeError: a library older than the CUDA build
        return f"library built without CUDA kernels (cannot read it: {e})"
    if not built:
        return "library built without CUDA kernels"
    # The provider is compiled in; can a session start it (a GPU, a driver, the CUDA libraries)?
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = ort_ops.model.set_lowest_ir_version(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=[CUDA_EP])
    except Exception as e:  # noqa: BLE001
        return f"CUDAExecutionProvider is in this onnxruntime but cannot start: {str(e).splitlines()[0]}"
    if CUDA_EP not in sess.get_providers():
        return "CUDAExecutionProvider is in this onnxruntime but cannot start (no GPU, driver or CUDA libraries)"
    return None


# ----------------------------------------------------------------------------------------------- sessions


@functools.lru_cache(maxsize=None)
def _profile_dir() -> str:
    return tempfile.mkdtemp(prefix="tfops-cuda-profile-")


def open_session(target: Target, model, profile: bool = True):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4  # rejections come back as exceptions; ORT's own error log would repeat them
    so.intra_op_num_threads = 2
    if target.provider != CPU_EP:
        so.add_session_config_entry(DISABLE_CPU_FALLBACK, "1")
    if profile:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(_profile_dir(), "run")
    so.register_custom_ops_library(ort_ops.library_path())
    return ort.InferenceSession(model.SerializeToString(), so, providers=session_providers(target))


def session_providers(target: Target) -> list:
    """The providers list of ``target``'s sessions. Beside a GPU provider the CPU EP is not listed: its
    fallback is disabled, and onnxruntime 1.31 (seen on an H200) refuses a session that lists the CPU EP with
    the fallback off ("Conflicting session configuration"), where older versions accepted it."""
    if target.provider == CPU_EP:
        return [CPU_EP]
    options = {}
    if target.provider == CUDA_EP:
        options["device_id"] = "0"
        if target.cuda_graph:
            options["enable_cuda_graph"] = "1"
    return [(target.provider, options)]


def to_ortvalue(x, device: str):
    """An OrtValue on ``device`` holding a copy of ``x`` (bfloat16 goes as its bits)."""
    import onnxruntime as ort
    from onnx import TensorProto

    x = np.require(np.asarray(x), requirements="C")  # (ascontiguousarray would make a scalar shape [1])
    if x.dtype.name == "bfloat16" or x.size == 0:
        # bfloat16: numpy cannot say the type, so allocate by ONNX type and copy the bits in; empty: no copy.
        elem = TensorProto.BFLOAT16 if x.dtype.name == "bfloat16" else x.dtype.type
        value = ort.OrtValue.ortvalue_from_shape_and_type(list(x.shape), elem, device, 0)
        update_ortvalue(value, x)
        return value
    if device == "cpu":
        return ort.OrtValue.ortvalue_from_numpy(x.copy())  # owns its copy: callers may reuse x
    return ort.OrtValue.ortvalue_from_numpy(x, device, 0)


def update_ortvalue(value, x):
    """Overwrite a bound OrtValue's contents in place (its address stays: what a CUDA graph replays)."""
    x = np.require(np.asarray(x), requirements="C")
    if x.size:
        value.update_inplace(x.view(np.uint16) if x.dtype.name == "bfloat16" else x)


def empty_ortvalue(shape, dtype, device: str):
    import onnxruntime as ort

    return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), np.dtype(dtype).type, device, 0)


class Bound:
    """One session with its inputs (and optionally preallocated outputs) bound through io_binding."""

    def __init__(self, sess, target: Target, names, inputs, output_like=None):
        self.sess, self.target = sess, target
        self.binding = sess.io_binding()
        self.values = {}
        for name, x in zip(names, inputs):
            self.values[name] = to_ortvalue(x, target.device)
            self.binding.bind_ortvalue_input(name, self.values[name])
        self.outputs = None
        out_names = [o.name for o in sess.get_outputs()]
        if output_like is not None:  # fixed output buffers (a CUDA graph writes to the addresses it captured)
            self.outputs = [empty_ortvalue(np.shape(y), np.asarray(y).dtype, target.device) for y in output_like]
            for name, value in zip(out_names, self.outputs):
                self.binding.bind_ortvalue_output(name, value)
        else:
            for name in out_names:
                self.binding.bind_output(name, target.device)

    def update(self, name, x):
        update_ortvalue(self.values[name], x)

    def run(self):
        self.sess.run_with_iobinding(self.binding)
        if self.outputs is not None:  # copies: on the CPU numpy() shares the buffer the next run overwrites
            return [np.array(v.numpy(), copy=True) for v in self.outputs]
        return list(self.binding.copy_outputs_to_cpu())


def _feed_names(op, constant_inputs=()):
    spec = ort_ops.get_spec(op)
    return [p.name for i, p in enumerate(spec.inputs) if i not in constant_inputs]


def _run_once(sess, target, op, inputs, constant_inputs=()):
    names = _feed_names(op, constant_inputs)
    fed = [x for i, x in enumerate(inputs) if i not in constant_inputs]
    if target.io == "host":
        feed = {name: to_ortvalue(x, "cpu") for name, x in zip(names, fed)}
        outs = [v.numpy() for v in sess.run_with_ort_values(None, feed)]
    else:
        outs = Bound(sess, target, names, fed).run()
    return decode_outputs(op, inputs, outs)


def _is_rejection(e) -> bool:
    """An error from ORT or the library (not from this module): run_with_iobinding re-raises the status of a
    failed run as a plain RuntimeError("Error in execution: ...")."""
    if isinstance(e, OpError) or type(e).__module__.startswith("onnxruntime"):
        return True
    return type(e) is RuntimeError and str(e).startswith("Error in execution")


def read_profile(sess) -> dict:
    """op name -> set of providers over the profile's node events (the profile file is removed)."""
    path = Path(sess.end_profiling())
    try:
        events = json.loads(path.read_text())
    finally:
        path.unlink(missing_ok=True)
    return providers_of(events)


def providers_of(events) -> dict:
    providers = {}
    for e in events:
        if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time"):
            args = e.get("args", {})
            providers.setdefault(args.get("op_name", "?"), set()).add(args.get("provider", "?"))
    return providers


def run(target: Target, op, inputs, attrs, repeat: int = 1, constant_inputs=()) -> Outcome:
    """Run ``op`` once (or ``repeat`` times in one session: ``outputs`` is then a list of tuples)."""
    inputs = [np.asarray(x) for x in inputs]
    sess = None
    try:
        sess = open_session(target, single_op_model(op, inputs, attrs, constant_inputs))
        results = [_run_once(sess, target, op, inputs, constant_inputs) for _ in range(repeat)]
    except Exception as e:  # noqa: BLE001  onnxruntime raises its own classes
        if not _is_rejection(e):
            raise
        return Outcome(None, str(e), read_profile(sess) if sess is not None else {})
    return Outcome(results[0] if repeat == 1 else results, None, read_profile(sess))


def run_bound_sequence(target: Target, op, input_sets, attrs, variable, output_like, profile=False) -> Outcome:
    """One session; the inputs not in ``variable`` (indices) are initializers of the model, the variable ones
    are bound once as OrtValues on the target's device and every output to a preallocated buffer there
    (shapes and types of ``output_like``). For each input set the variable inputs are overwritten in place
    and the session runs: what a CUDA graph needs (it replays the captured addresses). ``outputs`` is the
    list of per-run output tuples."""
    input_sets = [[np.asarray(x) for x in inputs] for inputs in input_sets]
    variable = sorted(variable)
    first = input_sets[0]
    constant = tuple(i for i in range(len(first)) if i not in variable)
    names = _feed_names(op, constant)
    sess = None
    try:
        sess = open_session(target, single_op_model(op, first, attrs, constant), profile=profile)
        bound = Bound(sess, target, names, [first[i] for i in variable], output_like=output_like)
        results = []
        for inputs in input_sets:
            for name, i in zip(names, variable):
                bound.update(name, inputs[i])
            results.append(decode_outputs(op, inputs, bound.run()))
    except Exception as e:  # noqa: BLE001
        if not _is_rejection(e):
            raise
        return Outcome(None, str(e), read_profile(sess) if (sess is not None and profile) else {})
    return Outcome(results, None, read_profile(sess) if profile else {})


# ------------------------------------------------------------------------------------------------ judging


def placement_problem(outcome: Outcome, target: Target, op) -> Optional[str]:
    """None when ORT's profiler saw ``op`` run, and every node run, on the target's provider."""
    if op not in outcome.providers:
        return f"the profile has no kernel event for {op} (seen: {sorted(outcome.providers)})"
    wrong = {name: sorted(p) for name, p in outcome.providers.items() if p != {target.provider}}
    if wrong:
        return f"nodes ran on other providers than {target.provider}: {wrong}"
    return None


def normalized_message(message: str) -> str:
    """The rejection without what may legitimately differ between providers: ORT's status prefix and the
    provider's name."""
    text = re.split(r"Status Message: |Exception during initialization: ", message)[-1]
    return re.sub(r"\b(CPU|CUDA)ExecutionProvider\b", "<EP>", text).strip()


def outputs_mismatch(op, inputs, attrs, want, got) -> Optional[str]:
    """The provider-against-CPU rule for ``op`` (test_cuda_kernels.py's docstring); None when it holds."""
    if len(want) != len(got):
        return f"{len(got)} outputs, expected {len(want)}"
    problems = []
    for k, (w, g) in enumerate(zip(want, got)):
        why = None
        if op in BIT_EXACT_OPS:
            why = bits_mismatch(w, g)
        elif op in DW_BIT_EXACT:
            why = bits_mismatch(w, g, nan_payloads=False)
        elif op == DW_BPF:
            why = _assertion(lambda: _depthwise_checks().assert_close(op, g, w, inputs, attrs, f"output {k}"))
        else:  # batch norm: the kit's bound (its summed gradient outputs against the size of their terms)
            why = kit_judge.bounded_mismatch(w, g, kit_rules.batch_norm_output_bound(op, inputs, attrs, k, w))
        if why:
            problems.append(f"output {k}: {why}")
    return "; ".join(problems) or None


def golden_mismatch(op, case, got: Outcome) -> Optional[str]:
    """The conformance kit's rules against TF's golden case (ort_ops/conformance/rules.py)."""
    if "error" in case:
        if got.error is None:
            return f"no error, TF says {case['error']!r}"
        return kit_judge.rejection_mismatch(kit_rules.rejection_phrases(op, case["error"]), got.error)
    if got.error is not None:
        return f"unexpected error {got.error}"
    want = case["outputs"]
    return kit_judge.outputs_mismatch(kit_rules.output_rules(op, case["inputs"], case["attrs"], want), want, got.outputs)


def judge(op, inputs, attrs, target: Target, want: Outcome, got: Outcome, case=None) -> list:
    """Every problem with ``got`` (run on ``target``) against ``want`` (the CPU kernels) and, for a golden
    ``case``, against TF. Empty when all is well."""
    problems = []
    if want.error is not None or got.error is not None:
        if want.error is None:
            problems.append(f"{target} rejects what the CPU kernels accept: {got.error}")
        elif got.error is None:
            problems.append(f"{target} accepts what the CPU kernels reject ({want.error})")
        elif normalized_message(got.error) != normalized_message(want.error):
            problems.append(f"messages differ: {normalized_message(got.error)!r} != CPU's {normalized_message(want.error)!r}")
    else:
        why = outputs_mismatch(op, inputs, attrs, want.outputs, got.outputs)
        if why:
            problems.append(f"against the CPU kernels: {why}")
    if got.error is None:
        why = placement_problem(got, target, op)
        if why:
            problems.append(why)
    if case is not None:
        why = golden_mismatch(op, case, got)
        if why:
            problems.append(f"against TF's golden: {why}")
    return problems


def _assertion(check) -> Optional[str]:
    try:
        check()
    except AssertionError as e:
        return str(e).splitlines()[0] if str(e) else "assertion failed"
    return None


# The suite's comparison modules (imported lazily: they are test modules with their own imports).
def _depthwise_checks():
    import test_depthwise

    return test_depthwise
