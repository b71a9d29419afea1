"""GPU benchmark: every op of the domain on ONNX Runtime's CUDAExecutionProvider with this library, against the
device-to-device copy bandwidth measured in the same run and against PyTorch's own CUDA kernels.

    # from the repository root, on a machine with a GPU (scripts/gpu.sh runs it):
    PYTHONPATH=.:$PYTHONPATH python benchmarks/bench_cuda.py [--suite main|mobilenet|all] [--repeat 30]
                                                            [--ops FakeQuantWithMinMaxVars ...] [--no-torch]

Needs a CUDA GPU, onnxruntime-gpu (CUDAExecutionProvider; onnxruntime.preload_dlls() is called), PyTorch with
CUDA, and the library built with CUDA kernels (ORT_OPS_LIBRARY, or the installed package). Without a GPU only
`--help` and importing this file work: run there, it says what is missing and exits with status 2.

Configs (float32):
  * main: NHWC 16x56x56x128, the cases of benchmarks/bench_ops.py (every op; depthwise 3x3, stride 1 and 2,
    multiplier 1 and 2);
  * mobilenet: MobileNetV2-like layers (224x224 input, width 1.0: the depthwise inputs 112x112x32 stride 1,
    56x56x144 stride 2, 14x14x576 stride 1, 7x7x960 stride 1) at batch 1, 8 and 64: the depthwise op and its
    two gradients, FusedBatchNormV3 inference and training, FusedBatchNormGradV3, FusedBatchNormClipFakeQuant
    (batch norm, ReLU6 and quantizer fused), FakeQuantWithMinMaxVars
    and its gradient on the layer's activations.
Inputs that are parameters (ranges, scale/offset/statistics, shape inputs, small filters) are initializers
of the one-node model, as a converter writes them; the large tensors are bound on the GPU through io_binding,
outputs too (preallocated), so no host copy is timed.

What is measured per config:
  * kernel us: the GPU time of the kernels the node launches, read from CUPTI through torch.profiler (each
    kernel's device duration, summed per run; median over --repeat runs). ORT's per-call overhead is not in
    it. Should CUPTI not see ORT's kernels, the column falls back to CUDA events around --repeat back-to-back
    runs on ORT's compute stream (a torch stream handed to ORT as user_compute_stream, run option
    disable_synchronize_execution_providers), marked "events": an upper bound (it includes launch gaps);
  * GB/s: bytes moved / kernel time, bytes moved = every input read once + every output written once (the
    minimum traffic; an op that reads its input twice, e.g. for a data range, is charged once);
  * copy us: torch copy_ of half those bytes (one read + one write of the same number of bytes), the same way
    (CUPTI); "% copy" = copy time / kernel time, the fraction of the copy bandwidth the op reaches;
  * torch us: PyTorch's equivalent on the same shapes (channels_last where it has a layout), the same way;
    "ours/torch" < 1 means faster. cudnn.benchmark is on (PyTorch picks its fastest algorithms);
  * ORT call us: wall time of one synchronous run_with_iobinding (for reference: what a caller waits);
  * check: the CUDA result against the CPU kernels of the same library (loosely, as bench_ops.py checks TF;
    tests/test_cuda_kernels.py holds the exact comparison);
  * goal: issue 10's: memory-bound ops (FakeQuant*, QuantizeAndDequantize*, batch-norm inference forward)
    >= 85% of the copy bandwidth and not slower than PyTorch; batch-norm training and the depthwise ops not
    slower than PyTorch.
Prints a markdown table headed by the GPU's name, the driver, CUDA, onnxruntime and PyTorch versions.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

MAIN_SHAPE = (16, 56, 56, 128)
QUICK_SHAPE = (2, 8, 8, 16)
MOBILENET_LAYERS = [(112, 112, 32, 1), (56, 56, 144, 2), (14, 14, 576, 1), (7, 7, 960, 1)]  # H, W, C, stride
MOBILENET_BATCHES = (1, 8, 64)
MEMORY_BOUND = ("FakeQuant", "QuantizeAndDequantize", "FusedBatchNormClipFakeQuant")  # op name prefixes


@dataclasses.dataclass
class BenchCase:
    op: str
    config: str
    inputs: list
    attrs: dict
    constant_inputs: tuple  # parameter inputs: initializers of the model
    bytes_moved: int = 0

    @property
    def goal(self) -> str:
        """'bandwidth' (>= 85% of copy and not slower than PyTorch) or 'torch' (not slower than PyTorch)."""
        if self.op.startswith(MEMORY_BOUND):
            return "bandwidth"
        if self.op.startswith("FusedBatchNorm") and "Grad" not in self.op and not self.attrs.get("is_training", True):
            return "bandwidth"
        return "torch"


def output_bytes(op, inputs, attrs, constant_inputs) -> int:
    import ort_ops
    from onnx import helper

    from ort_ops.model import elem_type_of
    from ort_ops.schemas import output_elem_types

    spec = ort_ops.get_spec(op)
    values = [np.asarray(x) if i in constant_inputs else None for i, x in enumerate(inputs)]
    shapes = spec.shape_fn([np.shape(x) for x in inputs], values, spec.with_defaults(attrs))
    types = output_elem_types(spec, [elem_type_of(np.asarray(x).dtype) for x in inputs])
    total = 0
    for shape, t in zip(shapes, types):
        size = int(np.prod([d or 0 for d in shape])) if shape is not None else 0
        total += size * np.dtype(helper.tensor_dtype_to_np_dtype(t)).itemsize
    return total


def _finish(op, config, inputs, attrs) -> BenchCase:
    """Parameters (every input at most 1/8 of the largest, and int32 shape inputs) become initializers."""
    sizes = [np.asarray(x).size for x in inputs]
    largest = max(sizes)
    constant = tuple(i for i, x in enumerate(inputs)
                     if np.asarray(x).dtype == np.int32 or np.asarray(x).size * 8 <= largest)
    moved = sum(np.asarray(x).nbytes for x in inputs if np.asarray(x).dtype != np.int32)
    moved += output_bytes(op, inputs, attrs, constant)
    return BenchCase(op, config, [np.asarray(x) for x in inputs], dict(attrs), constant, moved)


def main_cases(shape, seed=0):
    from bench_ops import make_cases as cpu_bench_cases  # the CPU benchmark's cases: same ops and configs

    shape_text = "x".join(map(str, shape))
    for c in cpu_bench_cases(shape, np.random.default_rng(seed)):
        yield _finish(c.op, f"{shape_text} {c.config}", c.inputs, c.attrs)


def mobilenet_cases(batches=MOBILENET_BATCHES, layers=MOBILENET_LAYERS, seed=1):
    f32 = np.float32
    for n in batches:
        for h, w, c, stride in layers:
            rng = np.random.default_rng([seed, n, h, c])
            config = f"MobileNetV2 b{n} {h}x{w}x{c} s{stride}"
            x = (rng.standard_normal((n, h, w, c)) * 2).astype(f32)
            g = rng.standard_normal(x.shape).astype(f32)
            filt = (rng.standard_normal((3, 3, c, 1)) / 3).astype(f32)
            attrs = {"strides": [1, stride, stride, 1], "padding": "SAME"}
            ho, wo = -(-h // stride), -(-w // stride)
            dy = rng.standard_normal((n, ho, wo, c)).astype(f32)
            yield _finish("DepthwiseConv2dNative", config, [x, filt], attrs)
            yield _finish("DepthwiseConv2dNativeBackpropInput", config, [np.array(x.shape, np.int32), filt, dy], attrs)
            yield _finish("DepthwiseConv2dNativeBackpropFilter", config, [x, np.array(filt.shape, np.int32), dy], attrs)
            scale, offset = rng.uniform(0.5, 1.5, c).astype(f32), rng.standard_normal(c).astype(f32)
            mean, var = x.mean(axis=(0, 1, 2)).astype(f32), x.var(axis=(0, 1, 2)).astype(f32)
            yield _finish("FusedBatchNormV3", config + " inference", [x, scale, offset, mean, var],
                          {"is_training": False, "epsilon": 0.001})
            yield _finish("FusedBatchNormV3", config + " training", [x, scale, offset, mean, var],
                          {"is_training": True, "epsilon": 0.001})
            yield _finish("FusedBatchNormGradV3", config + " training", [g, x, scale, mean, var, np.zeros((), f32)],
                          {"is_training": True, "epsilon": 0.001})
            yield _finish("FusedBatchNormClipFakeQuant", config + " relu6", [x, scale, offset, mean, var, np.float32(-0.5),
                          np.float32(5.75)], {"epsilon": 0.001, "clip_min": 0.0, "clip_max": 6.0})
            yield _finish("FakeQuantWithMinMaxVars", config, [x, np.float32(-6), np.float32(6)], {})
            yield _finish("FakeQuantWithMinMaxVarsGradient", config, [g, x, np.float32(-6), np.float32(6)], {})


def iter_cases(suite="all", quick=False, ops=None):
    shape = QUICK_SHAPE if quick else MAIN_SHAPE
    gens = []
    if suite in ("main", "all"):
        gens.append(main_cases(shape))
    if suite in ("mobilenet", "all"):
        gens.append(mobilenet_cases(batches=(1,), layers=[(8, 8, 16, 2)]) if quick else mobilenet_cases())
    for gen in gens:
        for case in gen:
            if not ops or case.op in ops:
                yield case


def make_cases(suite="all", quick=False, ops=None):
    return list(iter_cases(suite, quick, ops))


# ----------------------------------------------------------------------------------------------- the table


@dataclasses.dataclass
class Row:
    case: BenchCase
    kernel_us: Optional[float]
    copy_us: Optional[float]
    ort_call_us: Optional[float]
    torch_us: Optional[float] = None
    torch_what: Optional[str] = None
    timing: str = "cupti"
    check: str = ""

    @property
    def gbps(self):
        return self.case.bytes_moved / self.kernel_us / 1e3 if self.kernel_us else None

    @property
    def copy_fraction(self):
        return self.copy_us / self.kernel_us if self.kernel_us and self.copy_us else None

    @property
    def vs_torch(self):
        return self.kernel_us / self.torch_us if self.kernel_us and self.torch_us else None

    @property
    def goal(self) -> str:
        misses = []
        if self.case.goal == "bandwidth" and self.copy_fraction is not None and self.copy_fraction < 0.85:
            misses.append(f"{self.copy_fraction:.0%} < 85% copy")
        if self.vs_torch is not None and self.vs_torch > 1.0:
            misses.append(f"{self.vs_torch:.2f}x torch")
        if self.kernel_us is None:
            return "n/a"
        return "MISSED: " + ", ".join(misses) if misses else "met"


def _fmt(v, spec=".1f"):
    return "n/a" if v is None else format(v, spec)


HEADER = ("op", "config", "MB", "kernel us", "GB/s", "copy us", "% copy", "PyTorch equivalent", "torch us",
          "ours/torch", "ORT call us", "timing", "check", "goal")


def markdown_table(rows) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in rows:
        cells = (r.case.op, r.case.config, f"{r.case.bytes_moved / 1e6:.2f}", _fmt(r.kernel_us), _fmt(r.gbps, ".0f"),
                 _fmt(r.copy_us), _fmt(None if r.copy_fraction is None else 100 * r.copy_fraction, ".0f"),
                 r.torch_what or "none", _fmt(r.torch_us), _fmt(r.vs_torch, ".2f"), _fmt(r.ort_call_us),
                 r.timing, r.check, r.goal)
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ the GPU


def missing_requirements() -> Optional[str]:
    """None when this machine can run the benchmark, else what is missing."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "PyTorch sees no CUDA GPU"
    try:
        import onnxruntime as ort
    except ImportError:
        return "onnxruntime is not installed"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return "no CUDAExecutionProvider in this onnxruntime (install onnxruntime-gpu)"
    import ort_ops

    try:
        if not ort_ops.cuda_kernels_built():
            return f"library built without CUDA kernels: {ort_ops.library_path()}"
    except (OSError, AttributeError) as e:
        return f"cannot read the library: {e}"
    return None


def machine_header() -> str:
    import onnxruntime as ort
    import torch

    import ort_ops

    props = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        driver = "unknown (no nvidia-smi)"
    return (f"GPU: {props.name} ({props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB), "
            f"driver {driver}, CUDA {torch.version.cuda} (PyTorch's), cuDNN {torch.backends.cudnn.version()}\n"
            f"onnxruntime {ort.__version__} ({', '.join(ort.get_available_providers())}), PyTorch {torch.__version__}, "
            f"NumPy {np.__version__}\nlibrary: {ort_ops.library_path()} ({ort_ops.cuda_kernel_count()} CUDA kernels)")


class GpuTimer:
    """Kernel time of a callable from CUPTI (torch.profiler): summed device time of the kernels, copies and
    memsets it launches, per call, median over ``repeat`` calls."""

    def __init__(self, repeat: int, warmup: int = 3):
        self.repeat, self.warmup = repeat, warmup
        self.cupti_ok = True

    def _trace_events(self, fn, calls):
        import torch
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            trace = json.loads(Path(path).read_text())
        events = trace["traceEvents"] if isinstance(trace, dict) else trace
        gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        return sorted(gpu, key=lambda e: e["ts"])

    def kernel_us(self, fn) -> Optional[float]:
        import torch

        for _ in range(self.warmup):
            fn()
        torch.cuda.synchronize()
        one = self._trace_events(fn, 1)
        if not one:
            return None
        many = self._trace_events(fn, self.repeat)
        per_call = len(one)
        if len(many) == per_call * self.repeat:
            sums = [sum(e["dur"] for e in many[k * per_call:(k + 1) * per_call]) for k in range(self.repeat)]
            return float(statistics.median(sums))
        return sum(e["dur"] for e in many) / self.repeat  # the launch count varies: the mean

    @staticmethod
    def events_us(fn, repeat, stream) -> float:
        """CUDA events on ``stream`` around ``repeat`` back-to-back calls: GPU time per call, gaps included."""
        import torch

        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(repeat):
            fn()
        end.record(stream)
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / repeat


def wall_us(fn, repeat) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(statistics.median(times)) * 1e6


class OrtCudaRunner:
    """One session of the case's model on the CUDA EP (ORT's compute stream: ``stream``), I/O bound on the GPU."""

    def __init__(self, case: BenchCase, stream):
        import onnxruntime as ort

        import ort_ops

        model = ort_ops.make_single_op_model(case.op, case.inputs, case.attrs, constant_inputs=case.constant_inputs)
        so = ort_ops.session_options(log_severity_level=3)
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        options = {"device_id": "0", "user_compute_stream": str(stream.cuda_stream)}
        self.sess = ort.InferenceSession(model.SerializeToString(), so,
                                         providers=[("CUDAExecutionProvider", options)])  # no CPU EP: fallback is off
        spec = ort_ops.get_spec(case.op)
        self.binding = self.sess.io_binding()
        self.keep = []
        for i, (p, x) in enumerate(zip(spec.inputs, case.inputs)):
            if i not in case.constant_inputs:
                v = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(x), "cuda", 0)
                self.keep.append(v)
                self.binding.bind_ortvalue_input(p.name, v)
        for o in self.sess.get_outputs():
            self.binding.bind_output(o.name, "cuda")
        self.sess.run_with_iobinding(self.binding)  # first run: the output shapes
        self.outputs = self.binding.get_outputs()
        self.result = [v.numpy() for v in self.outputs]
        for o, v in zip(self.sess.get_outputs(), self.outputs):
            self.binding.bind_ortvalue_output(o.name, v)  # the same buffers from now on
        self.async_options = ort.RunOptions()
        self.async_options.add_run_config_entry("disable_synchronize_execution_providers", "1")

    def run(self):
        self.sess.run_with_iobinding(self.binding)

    def run_async(self):
        self.sess.run_with_iobinding(self.binding, self.async_options)


def cpu_result(case: BenchCase):
    import onnxruntime as ort

    import ort_ops

    model = ort_ops.make_single_op_model(case.op, case.inputs, case.attrs, constant_inputs=case.constant_inputs)
    sess = ort.InferenceSession(model.SerializeToString(), ort_ops.session_options(log_severity_level=3),
                                providers=["CPUExecutionProvider"])
    spec = ort_ops.get_spec(case.op)
    feed = {p.name: x for i, (p, x) in enumerate(zip(spec.inputs, case.inputs)) if i not in case.constant_inputs}
    return sess.run(None, feed)


# ------------------------------------------------------------------------------------ PyTorch's equivalents


def torch_equivalent(case: BenchCase):
    """(what, callable) running PyTorch's own CUDA kernels for the same work, or (None, None)."""
    import torch
    import torch.nn.functional as F

    dev = "cuda"
    op, attrs = case.op, case.attrs
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dev)  # noqa: E731
    cl = lambda a: t(np.transpose(a, (0, 3, 1, 2))).contiguous(memory_format=torch.channels_last) \
        if np.ndim(a) == 4 else t(a)  # noqa: E731  NHWC data as an NCHW tensor in channels_last memory

    def per_tensor(lo, hi, bits=8):
        scale = (hi - lo) / (2**bits - 1)
        return scale, int(round(-lo / scale)), 0, 2**bits - 1

    if op == "FusedBatchNormClipFakeQuant":  # PyTorch has no fused op: its three kernels in turn
        x, w, b, mean, var = (cl(a) for a in case.inputs[:5])
        scale, zp, qmin, qmax = per_tensor(float(case.inputs[5]), float(case.inputs[6]))
        eps = float(attrs.get("epsilon", 1e-4))
        return ("batch_norm inference + clamp + fake_quantize_per_tensor_affine",
                lambda: torch.fake_quantize_per_tensor_affine(
                    F.batch_norm(x, mean, var, w, b, training=False, eps=eps).clamp_(0.0, 6.0), scale, zp, qmin, qmax))
    if op.startswith("FakeQuant") or op.startswith("QuantizeAndDequantize"):
        grad = op.endswith("Gradient") or op.endswith("Grad")
        x = t(case.inputs[1] if grad else case.inputs[0])
        g = t(case.inputs[0]) if grad else None
        if op.startswith("FakeQuantWithMinMaxArgs"):
            lo, hi = attrs.get("min", -6.0), attrs.get("max", 6.0)
        elif op.startswith("QuantizeAndDequantize") and np.ndim(case.inputs[2 if grad else 1]) == 0:
            lo, hi = float(case.inputs[2 if grad else 1]), float(case.inputs[3 if grad else 2])
            lo, hi = (lo, hi) if hi > lo else (-6.0, 6.0)
        elif "PerChannel" not in op and np.ndim(case.inputs[-1]) == 0:
            lo, hi = float(case.inputs[-2]), float(case.inputs[-1])
        else:
            lo, hi = -6.0, 6.0
        scale, zp, qmin, qmax = per_tensor(lo, hi, attrs.get("num_bits", 8))
        per_axis = "PerChannel" in op or attrs.get("axis", -1) != -1
        c = x.shape[-1]
        if op in ("QuantizeAndDequantizeV2", "QuantizeAndDequantizeV4") and not attrs.get("range_given", False):
            if per_axis:
                def fn():
                    mn, mx = torch.aminmax(x.view(-1, c), dim=0)
                    s = (mx - mn).clamp_min(1e-8) / 255
                    z = (-mn / s).round().to(torch.int32)
                    return torch.fake_quantize_per_channel_affine(x, s, z, x.dim() - 1, 0, 255)
                return "aminmax(dim) + fake_quantize_per_channel_affine", fn

            def fn():
                mn, mx = torch.aminmax(x)
                s = ((mx - mn).clamp_min(1e-8) / 255).reshape(1)
                z = (-mn / s).round().to(torch.int32).reshape(1)
                return torch.fake_quantize_per_tensor_affine(x, s, z, 0, 255)
            return "aminmax + fake_quantize_per_tensor_affine", fn
        if per_axis:
            s_c = torch.full((c,), scale, device=dev)
            if grad:
                z_f = torch.full((c,), float(zp), device=dev)
                return ("_fake_quantize_learnable_per_channel_affine_backward",
                        lambda: torch._fake_quantize_learnable_per_channel_affine_backward(
                            g, x, s_c, z_f, x.dim() - 1, qmin, qmax, 1.0))
            z_i = torch.full((c,), zp, device=dev, dtype=torch.int32)
            return ("fake_quantize_per_channel_affine",
                    lambda: torch.fake_quantize_per_channel_affine(x, s_c, z_i, x.dim() - 1, qmin, qmax))
        if grad and op == "FakeQuantWithMinMaxVarsGradient":
            s1, z1 = torch.tensor([scale], device=dev), torch.tensor([float(zp)], device=dev)
            return ("_fake_quantize_learnable_per_tensor_affine_backward",
                    lambda: torch._fake_quantize_learnable_per_tensor_affine_backward(g, x, s1, z1, qmin, qmax, 1.0))
        if grad:  # the STE backward PyTorch runs for fake_quantize_per_tensor_affine: dY * mask
            _, mask = torch.ops.aten.fake_quantize_per_tensor_affine_cachemask(x, scale, zp, qmin, qmax)
            return ("fake_quantize_per_tensor_affine backward (dY*mask)",
                    lambda: torch.ops.aten.fake_quantize_per_tensor_affine_cachemask_backward(g, mask))
        return ("fake_quantize_per_tensor_affine",
                lambda: torch.fake_quantize_per_tensor_affine(x, scale, zp, qmin, qmax))

    if op.startswith("FusedBatchNorm"):
        training = bool(attrs.get("is_training", True))
        eps = float(attrs.get("epsilon", 1e-4))
        if "Grad" not in op:
            x, w, b, mean, var = (cl(a) for a in case.inputs[:5])
            mean, var = mean.clone(), var.clone()
            return (f"batch_norm {'training' if training else 'inference'} forward, channels_last",
                    lambda: F.batch_norm(x, mean, var, w, b, training=training, momentum=0.1, eps=eps))
        dy, x, w, mean, var = (cl(a) for a in case.inputs[:5])
        x = x.detach().requires_grad_(True)
        w = w.detach().requires_grad_(True)
        b = torch.zeros_like(w, requires_grad=True)
        y = F.batch_norm(x, mean.clone(), var.clone(), w, b, training=training, momentum=0.1, eps=eps)
        return (f"batch_norm {'training' if training else 'inference'} backward (x, w, b), channels_last",
                lambda: torch.autograd.grad(y, (x, w, b), dy, retain_graph=True))

    if op.startswith("DepthwiseConv2dNative"):
        strides = attrs["strides"]
        stride = strides[1]
        if op == "DepthwiseConv2dNativeBackpropInput":
            filt, dy = case.inputs[1], case.inputs[2]
            x_np = np.zeros(tuple(case.inputs[0]), np.float32)
        elif op == "DepthwiseConv2dNativeBackpropFilter":
            x_np, dy = case.inputs[0], case.inputs[2]
            filt = np.zeros(tuple(case.inputs[1]), np.float32)
        else:
            x_np, filt = case.inputs
            dy = None
        kh, kw, c, m = filt.shape
        weight = t(np.transpose(filt, (2, 3, 0, 1)).reshape(c * m, 1, kh, kw)).contiguous(
            memory_format=torch.channels_last)
        x = cl(x_np)
        pad = ((kh - 1) // 2, (kw - 1) // 2)  # symmetric: TF's SAME at stride 2 pads (0, 1); same output size
        if op == "DepthwiseConv2dNative":
            return ("conv2d groups=C, channels_last",
                    lambda: F.conv2d(x, weight, stride=stride, padding=pad, groups=c))
        dy_t = cl(dy)
        mask = [True, False, False] if op == "DepthwiseConv2dNativeBackpropInput" else [False, True, False]
        what = "input" if mask[0] else "weight"
        return (f"convolution_backward ({what}) groups=C, channels_last",
                lambda: torch.ops.aten.convolution_backward(dy_t, x, weight, None, [stride, stride], list(pad),
                                                            [1, 1], False, [0, 0], c, mask))
    return None, None


# --------------------------------------------------------------------------------------------------- main


def check(case, expected, actual) -> str:
    from bench_ops import Case, check as loose_check

    return loose_check(Case(case.op, case.config, case.inputs, case.attrs), expected, actual)


def copy_us(bytes_moved, timer: GpuTimer, stream, timing) -> float:
    """Device-to-device copy of half the bytes: one read and one write, the same bytes moved."""
    import torch

    src = torch.empty(max(bytes_moved // 2, 1), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)

    def copy():
        dst.copy_(src)

    return timer.kernel_us(copy) if timing == "cupti" else GpuTimer.events_us(copy, timer.repeat, stream)


def measure(case: BenchCase, timer: GpuTimer, stream, with_torch: bool) -> Row:
    import torch

    with torch.cuda.stream(stream):
        runner = OrtCudaRunner(case, stream)
        status = check(case, cpu_result(case), runner.result)
        kernel = timer.kernel_us(runner.run_async) if timer.cupti_ok else None
        timing = "cupti"
        if kernel is None:
            timer.cupti_ok = False  # CUPTI does not see ORT's launches here: CUDA events from now on
            kernel, timing = GpuTimer.events_us(runner.run_async, timer.repeat, stream), "events"
        ort_call = wall_us(runner.run, timer.repeat)
        del runner
        copy = copy_us(case.bytes_moved, timer, stream, timing)
        torch_us, what = None, None
        if with_torch:
            try:
                what, fn = torch_equivalent(case)
                if fn is not None:
                    torch_us = (timer.kernel_us(fn) if timing == "cupti"
                                else GpuTimer.events_us(fn, timer.repeat, stream))
            except Exception as e:  # noqa: BLE001  an equivalent PyTorch lacks shows in the table
                what = f"error: {type(e).__name__}: {str(e).splitlines()[0][:60]}"
        torch.cuda.synchronize()
    return Row(case, kernel, copy, ort_call, torch_us, what, timing, status)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=("main", "mobilenet", "all"), default="all",
                        help="main: NHWC 16x56x56x128; mobilenet: MobileNetV2-like layers at batch 1/8/64")
    parser.add_argument("--repeat", type=int, default=30, help="timed runs per measurement (median shown)")
    parser.add_argument("--ops", nargs="+", help="only these ops (default: all)")
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch's equivalents")
    parser.add_argument("--quick", action="store_true", help="tiny shapes: a smoke test of the script itself")
    args = parser.parse_args(argv)

    missing = missing_requirements()
    if missing:
        print(f"bench_cuda.py: cannot run here: {missing}. It needs a CUDA GPU, onnxruntime-gpu, PyTorch with CUDA "
              "and the library built with CUDA kernels; without a GPU only --help and importing it work.",
              file=sys.stderr)
        return 2
    import onnxruntime as ort
    import torch

    import ort_ops

    if args.ops:
        unknown = sorted(set(args.ops) - set(ort_ops.OP_NAMES))
        if unknown:
            parser.error(f"unknown ops {unknown}; known: {', '.join(ort_ops.OP_NAMES)}")
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    torch.backends.cudnn.benchmark = True
    print(machine_header())
    print(f"float32; kernel/copy/torch times: GPU time per run (CUPTI), median of {args.repeat}; "
          "bytes moved: inputs read once + outputs written once\n", flush=True)
    stream = torch.cuda.Stream()
    timer = GpuTimer(args.repeat)
    rows, failures = [], 0
    for case in iter_cases(args.suite, args.quick, args.ops):
        try:
            row = measure(case, timer, stream, not args.no_torch)
        except Exception as e:  # noqa: BLE001  one broken config must not hide the others
            row = Row(case, None, None, None, check=f"ERROR {type(e).__name__}: {str(e).splitlines()[0][:80]}")
        failures += row.check != "ok"
        rows.append(row)
        print(markdown_table([row]).splitlines()[-1], flush=True)  # progress, one line per config
    print("\n" + markdown_table(rows))
    missed = [r for r in rows if r.goal.startswith("MISSED")]
    print(f"\n{len(rows)} configs, {failures} with a failed check or error, {len(missed)} missing issue 10's goal "
          f"(timing: {'CUPTI kernel time' if timer.cupti_ok else 'CUDA events on the compute stream, gaps included'})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
