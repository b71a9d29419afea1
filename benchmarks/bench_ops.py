"""Time every op of the domain: TensorFlow's own kernel, ONNX Runtime with our library, and a memory floor.

    # from the repository root:
    PYTHONPATH=. python benchmarks/bench_ops.py [--threads 2] [--repeat 10] [--onednn both|on|off|default]
                       [--isa avx512|avx2|sse2] [--ops FakeQuantWithMinMaxVars ...] [--shape 16,56,56,128]

One machine, one thread count for all three:
  * TF: a tf.function calling tf.raw_ops.<Op> on tensors already in TF, intra-op threads = --threads,
    inter-op threads = 1. TF has two kernel sets for batch norm and depthwise (docs/semantics.md 0.6),
    chosen by TF_ENABLE_ONEDNN_OPTS when TF is imported; its default depends on the CPU (on with
    AVX-512). --onednn on/off pins it; --onednn both (the default) runs the whole measurement twice,
    in a child process per setting, and shows both TF times side by side, each ratio against the ORT
    time measured in the same child (interleaved with that TF);
  * ORT: a one-node model of the domain (ort_ops.make_single_op_model) in an InferenceSession with the
    custom-op library (its CPU kernels on the vector ISA that --isa, i.e. TFOPS_ISA, caps; docs/cpu.md), intra_op_num_threads = --threads, inter_op_num_threads = 1. Integer shape inputs
    (input_sizes, filter_sizes, num_bits) are initializers, as a converter writes them;
  * floor: NumPy moving the same bytes with --threads threads: every output is written once by copying
    input bytes into it, and input bytes that no output needs are read once. No op can beat it by much,
    so ORT/floor says how far a kernel is from being memory bound.
Each time is the median of --repeat rounds after two warm-up rounds; a round runs TF, ORT and the
floor once each, in turn, so that all three see the same background load. The "check" column compares ORT's
result with TF's loosely (rtol 1e-3 relative to each output's largest value) to make sure both did the
same work; the conformance tests, not this script, hold the exact agreement.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


@dataclasses.dataclass
class Case:
    op: str
    config: str
    inputs: list  # numpy arrays in the op's input order
    attrs: dict
    constant_inputs: tuple = ()  # indices of integer shape inputs that become initializers


# ----------------------------------------------------------------------------------------------
# The cases: mid-size NHWC tensors (default 16x56x56x128 float32).


def make_cases(shape, rng):
    n, h, w, c = shape
    f32 = np.float32
    x = (rng.standard_normal(shape) * 3).astype(f32)  # some values fall outside [-6, 6]
    g = rng.standard_normal(shape).astype(f32)
    s_min, s_max = np.array(-6.0, f32), np.array(6.0, f32)
    c_min = np.linspace(-6, -1, c).astype(f32)
    c_max = np.linspace(1, 6, c).astype(f32)
    cases = []
    args = {"min": -6.0, "max": 6.0, "num_bits": 8, "narrow_range": False}
    cases.append(Case("FakeQuantWithMinMaxArgs", "8 bits", [x], args))
    cases.append(Case("FakeQuantWithMinMaxArgsGradient", "8 bits", [g, x], args))
    cases.append(Case("FakeQuantWithMinMaxVars", "8 bits", [x, s_min, s_max], {"num_bits": 8}))
    cases.append(Case("FakeQuantWithMinMaxVarsGradient", "8 bits", [g, x, s_min, s_max], {"num_bits": 8}))
    cases.append(Case("FakeQuantWithMinMaxVarsPerChannel", "8 bits narrow", [x, c_min, c_max], {"narrow_range": True}))
    cases.append(
        Case("FakeQuantWithMinMaxVarsPerChannelGradient", "8 bits narrow", [g, x, c_min, c_max], {"narrow_range": True})
    )

    cases.append(
        Case("QuantizeAndDequantizeV2", "data range, half-to-even", [x, s_min, s_max], {"range_given": False})
    )
    cases.append(
        Case("QuantizeAndDequantizeV3", "given range, 8 bits", [x, s_min, s_max, np.array(8, np.int32)], {}, (3,))
    )
    zeros_c = np.zeros(c, f32)
    cases.append(
        Case("QuantizeAndDequantizeV4", "per axis 3, data range, half-up", [x, zeros_c, zeros_c],
             {"range_given": False, "axis": 3, "round_mode": "HALF_UP"})
    )
    cases.append(Case("QuantizeAndDequantizeV4Grad", "per tensor", [g, x, s_min, s_max], {}))

    scale = rng.uniform(0.5, 1.5, c).astype(f32)
    offset = rng.standard_normal(c).astype(f32)
    mean = x.mean(axis=(0, 1, 2), dtype=np.float64).astype(f32)
    var = x.var(axis=(0, 1, 2), dtype=np.float64).astype(f32)
    bn_in = [x, scale, offset, mean, var]
    train = {"is_training": True, "epsilon": 0.001}
    infer = {"is_training": False, "epsilon": 0.001}
    cases.append(Case("FusedBatchNorm", "training", bn_in, train))
    cases.append(Case("FusedBatchNormV2", "inference", bn_in, infer))
    cases.append(Case("FusedBatchNormV3", "training", bn_in, train))
    grad_in = [g, x, scale, mean, var]
    cases.append(Case("FusedBatchNormGrad", "training", grad_in, train))
    cases.append(Case("FusedBatchNormGradV2", "inference", grad_in, infer))
    cases.append(Case("FusedBatchNormGradV3", "training", grad_in + [np.zeros(0, f32)], train))

    for stride in (1, 2):
        for mult in (1, 2):
            config = f"3x3 stride {stride} x{mult}"
            attrs = {"strides": [1, stride, stride, 1], "padding": "SAME"}
            filt = (rng.standard_normal((3, 3, c, mult)) / 3).astype(f32)
            ho, wo = -(-h // stride), -(-w // stride)
            dy = rng.standard_normal((n, ho, wo, c * mult)).astype(f32)
            cases.append(Case("DepthwiseConv2dNative", config, [x, filt], attrs))
            cases.append(
                Case("DepthwiseConv2dNativeBackpropInput", config, [np.array(shape, np.int32), filt, dy], attrs, (0,))
            )
            cases.append(
                Case("DepthwiseConv2dNativeBackpropFilter", config, [x, np.array(filt.shape, np.int32), dy], attrs, (1,))
            )
    return cases


# ----------------------------------------------------------------------------------------------
# The three runners.


def interleaved_median_ms(fns: list, repeat: int) -> list:
    """Median time of each callable over ``repeat`` rounds after two warm-up rounds. Each round runs
    every callable once, in turn, so that all of them see the same background load. A pause before
    each call lets the previous runtime's worker threads stop spinning (TF's and ORT's pools both
    spin for a while after a run) so they do not steal the cores from the next one."""
    times = [[] for _ in fns]
    for round_ in range(repeat + 2):
        for fn, samples in zip(fns, times):
            if fn is None:
                continue
            time.sleep(0.05)
            t = time.perf_counter()
            fn()
            if round_ >= 2:
                samples.append(time.perf_counter() - t)
    return [float(np.median(t)) * 1e3 if t else float("nan") for t in times]


def tf_runner(case: Case):
    import tensorflow as tf

    import ort_ops

    spec = ort_ops.get_spec(case.op)
    names = [p.name for p in spec.inputs]
    raw_op = getattr(tf.raw_ops, case.op)
    attrs = dict(case.attrs)
    tensors = [tf.constant(a) for a in case.inputs]

    @tf.function
    def call(*args):
        return raw_op(**dict(zip(names, args)), **attrs)

    def run():
        return call(*tensors)

    def result():
        out = run()
        return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]

    return run, result


def ort_runner(case: Case, threads: int):
    import onnxruntime as ort

    import ort_ops

    model = ort_ops.make_single_op_model(case.op, case.inputs, case.attrs, constant_inputs=case.constant_inputs)
    so = ort_ops.session_options(intra_op_num_threads=threads, inter_op_num_threads=1, log_severity_level=3)
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    spec = ort_ops.get_spec(case.op)
    feed = {p.name: a for i, (p, a) in enumerate(zip(spec.inputs, case.inputs)) if i not in case.constant_inputs}

    def run():
        return sess.run(None, feed)

    return run, run


class MemoryFloor:
    """Copies input bytes into every output once and reads the input bytes left over, in chunks
    spread over ``threads`` threads (NumPy releases the GIL while copying)."""

    CHUNK = 1 << 20

    def __init__(self, inputs, outputs, pool):
        self.pool = pool
        src = [np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in inputs if a.nbytes]
        dst = [np.empty(o.nbytes, np.uint8) for o in outputs if o.nbytes]
        self.tasks = []
        si = soff = 0
        for d in dst:
            doff = 0
            while doff < d.size:
                s = src[si]
                k = min(d.size - doff, s.size - soff, self.CHUNK)
                self.tasks.append((d[doff : doff + k], s[soff : soff + k]))
                doff += k
                soff += k
                if soff == s.size:
                    si, soff = (si + 1) % len(src), 0
        consumed = sum(d.size for d in dst)
        if consumed < sum(s.size for s in src):  # the rest of the inputs is only read
            for s in src[si:]:
                for start in range(soff, s.size, self.CHUNK):
                    self.tasks.append((None, s[start : start + self.CHUNK]))
                soff = 0

    @staticmethod
    def _do(task):
        d, s = task
        if d is not None:
            np.copyto(d, s)
        else:
            s.max()

    def run(self):
        list(self.pool.map(self._do, self.tasks))


def check(case: Case, expected, actual) -> str:
    import ort_ops

    if len(expected) != len(actual):
        return f"DIFF ({len(actual)} vs {len(expected)} outputs)"
    names = [p.name for p in ort_ops.get_spec(case.op).outputs]
    for name, e, a in zip(names, expected, actual):
        if name.startswith("reserve_space"):
            continue  # scratch outputs; their inference-mode values are a documented deviation from TF

        e, a = np.asarray(e, np.float64), np.asarray(a, np.float64)
        if e.size == 0 and a.size == 0:
            continue
        if e.shape != a.shape:
            return f"DIFF shape {a.shape} vs {e.shape}"
        scale = max(float(np.nanmax(np.abs(e))) if e.size else 0.0, 1e-30)
        if not np.allclose(a, e, rtol=1e-3, atol=1e-3 * scale, equal_nan=True):
            return "DIFF"
    return "ok"


# ----------------------------------------------------------------------------------------------


def tf_onednn_setting() -> str:
    """TF's kernel set in this process: TF_ENABLE_ONEDNN_OPTS as given, and what TF reports."""
    import tensorflow as tf  # noqa: F401

    try:
        from tensorflow.python.util import _pywrap_util_port

        active = "on" if _pywrap_util_port.IsMklEnabled() else "off"
    except (ImportError, AttributeError):
        active = "unknown"
    given = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    return f"oneDNN {active} (TF_ENABLE_ONEDNN_OPTS={given if given is not None else 'unset, TF default'})"


def cpu_vector_isa() -> str:
    """The CPU's vector extensions (from /proc/cpuinfo) and the path the library's kernels run."""
    flags = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    wanted = ["sse2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni",
              "avx512_bf16"]
    have = " ".join(f for f in wanted if f in flags) or "unknown"
    try:
        from ort_ops.library import cpu_isa

        path = cpu_isa()
    except Exception as e:  # a missing library shows in the table too
        path = f"unknown ({type(e).__name__})"
    return f"CPU vector ISA: {have}; library kernels run the {path} path (TFOPS_ISA={os.environ.get('TFOPS_ISA', 'unset')})"


def machine_description(threads: int) -> str:
    model = platform.processor() or "unknown CPU"
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
        model = fields.get("Model name", model).strip()
        cpus = fields.get("CPU(s)", "?").strip()
        per_core = fields.get("Thread(s) per core", "?").strip()
    except (OSError, subprocess.CalledProcessError):
        cpus = per_core = "?"
    import onnxruntime
    import tensorflow as tf

    return (
        f"CPU: {model}; {cpus} logical CPUs ({per_core} threads per core), os.cpu_count()={os.cpu_count()}; "
        f"threads used: {threads}\n{cpu_vector_isa()}\n"
        f"TensorFlow {tf.__version__}, onnxruntime {onnxruntime.__version__}, NumPy {np.__version__}, "
        f"Python {platform.python_version()}"
    )


HEADER = ("op", "config", "TF ms", "ORT ms", "floor ms", "ORT/TF", "ORT/floor", "check")
WIDTHS = [42, 31, 9, 9, 9, 7, 9, 5]
BOTH_HEADER = ("op", "config", "TF on ms", "ORT ms", "TF off ms", "ORT ms", "floor ms", "ORT/TF on",
               "ORT/TF off", "ORT/floor", "check")
BOTH_WIDTHS = [42, 31, 9, 7, 9, 7, 8, 9, 10, 9, 5]


def emit(row, widths):
    print("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip(), flush=True)


def measure(args, shape, json_rows: bool) -> int:
    """Times every case in this process (one TF kernel set); prints a table, or JSON lines."""
    import tensorflow as tf

    # Must happen before TF runs anything.
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)

    cases = [c for c in make_cases(shape, np.random.default_rng(args.seed)) if not args.ops or c.op in args.ops]
    if json_rows:
        print(json.dumps({"header": machine_description(args.threads), "onednn": tf_onednn_setting()}), flush=True)
    else:
        print(machine_description(args.threads))
        print(f"TF kernels: {tf_onednn_setting()}")
        print(f"main input NHWC {list(shape)} float32; median of {args.repeat} runs\n", flush=True)
        emit(HEADER, WIDTHS)
        emit(["-" * w for w in WIDTHS], WIDTHS)
    failures = 0
    with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
        for case in cases:
            tf_run, tf_result = tf_runner(case)
            expected = tf_result()
            try:
                ort_run, ort_result = ort_runner(case, args.threads)
                status = check(case, expected, ort_result())
            except Exception as e:  # a missing library or kernel shows in the table
                status, ort_run = f"ERROR {type(e).__name__}: {str(e).splitlines()[0][:60]}", None
            floor = MemoryFloor(case.inputs, expected, pool)
            tf_ms, ort_ms, floor_ms = interleaved_median_ms([tf_run, ort_run, floor.run], args.repeat)
            failures += status != "ok"
            if json_rows:
                print(json.dumps({"op": case.op, "config": case.config, "tf": tf_ms, "ort": ort_ms,
                                  "floor": floor_ms, "check": status}), flush=True)
            else:
                emit((case.op, case.config, f"{tf_ms:.2f}", f"{ort_ms:.2f}", f"{floor_ms:.2f}",
                      f"{ort_ms / tf_ms:.2f}", f"{ort_ms / floor_ms:.2f}", status), WIDTHS)
    return 1 if failures else 0


def run_child(argv, onednn: str) -> tuple:
    """This script with --onednn <on|off> --json-rows in a child process: (header, setting, rows)."""
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1" if onednn == "on" else "0")
    proc = subprocess.run([sys.executable, __file__, *argv, "--onednn", onednn, "--json-rows"], env=env,
                          capture_output=True, text=True)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"the oneDNN {onednn} child printed nothing:\n{proc.stderr[-3000:]}")
    return lines[0]["header"], lines[0]["onednn"], lines[1:]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads for TF and ORT, threads of the floor")
    parser.add_argument("--repeat", type=int, default=10, help="timed runs per measurement (median shown)")
    parser.add_argument("--ops", nargs="+", help="only these ops (default: all 19)")
    parser.add_argument("--shape", default="16,56,56,128", help="NHWC shape of the main input (default 16,56,56,128)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--onednn", choices=["both", "on", "off", "default"], default="both",
                        help="TF's kernel set: both (a child process each, one table), on, off, or TF's default")
    parser.add_argument("--isa", choices=["avx512", "avx2", "sse2"],
                        help="cap the library's vector ISA (sets TFOPS_ISA; default: the CPU's best)")
    parser.add_argument("--json-rows", action="store_true", help=argparse.SUPPRESS)  # the children's output
    args = parser.parse_args(argv)
    if args.isa:
        os.environ["TFOPS_ISA"] = args.isa  # read by the library when its first kernel runs

    import ort_ops

    shape = tuple(int(v) for v in args.shape.split(","))
    if args.ops:
        unknown = sorted(set(args.ops) - set(ort_ops.OP_NAMES))
        if unknown:
            parser.error(f"unknown ops {unknown}; known: {', '.join(ort_ops.OP_NAMES)}")

    if args.onednn in ("on", "off") and not args.json_rows:
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1" if args.onednn == "on" else "0"  # before TF is imported
    if args.onednn != "both":
        return measure(args, shape, args.json_rows)

    child_argv = [a for a in (argv if argv is not None else sys.argv[1:])]
    i = 0
    while i < len(child_argv):  # drop --onednn <value>; the children get their own
        if child_argv[i] == "--onednn":
            del child_argv[i:i + 2]
        elif child_argv[i].startswith("--onednn="):
            del child_argv[i]
        else:
            i += 1
    header, on_setting, on_rows = run_child(child_argv, "on")
    _, off_setting, off_rows = run_child(child_argv, "off")
    print(header)
    print(f"TF kernels: {on_setting} | {off_setting}; each ORT/TF ratio is against the ORT time of the same child")
    print(f"main input NHWC {list(shape)} float32; median of {args.repeat} runs\n", flush=True)
    emit(BOTH_HEADER, BOTH_WIDTHS)
    emit(["-" * w for w in BOTH_WIDTHS], BOTH_WIDTHS)
    failures = 0
    for a, b in zip(on_rows, off_rows):
        status = a["check"] if a["check"] != "ok" else b["check"]
        failures += status != "ok"
        floor = min(a["floor"], b["floor"])
        emit((a["op"], a["config"], f"{a['tf']:.2f}", f"{a['ort']:.2f}", f"{b['tf']:.2f}", f"{b['ort']:.2f}",
              f"{floor:.2f}", f"{a['ort'] / a['tf']:.2f}", f"{b['ort'] / b['tf']:.2f}",
              f"{min(a['ort'], b['ort']) / floor:.2f}", status), BOTH_WIDTHS)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
