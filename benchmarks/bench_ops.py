"""Time every op of the domain: TensorFlow's own kernel, ONNX Runtime with our library, and a memory floor.

    # from the repository root:
    PYTHONPATH=. python benchmarks/bench_ops.py [--threads 2] [--repeat 10] [--passes 2] [--onednn both|on|off|default]
                       [--isa avx512|avx2|sse2] [--ops FakeQuantWithMinMaxVars ...] [--shape 16,56,56,128]

One machine, one thread count for all three:
  * TF: a tf.function calling tf.raw_ops.<Op> on tensors already in TF, intra-op threads = --threads,
    inter-op threads = 1. TF has two kernel sets for batch norm and depthwise (docs/semantics.md 0.6),
    chosen by TF_ENABLE_ONEDNN_OPTS when TF is imported; its default depends on the CPU (on with
    AVX-512). --onednn on/off pins it; --onednn both (the default) times TF in a process per setting and
    shows both TF times side by side;
  * ORT: a one-node model of the domain (ort_ops.make_single_op_model) in an InferenceSession with the
    custom-op library (its CPU kernels on the vector ISA that --isa, i.e. TFOPS_ISA, caps; docs/cpu.md),
    intra_op_num_threads = --threads, inter_op_num_threads = 1. Integer shape inputs (input_sizes,
    filter_sizes, num_bits) are initializers, as a converter writes them;
  * floor: NumPy moving the same bytes with --threads threads: every output is written once by copying
    input bytes into it, and input bytes that no output needs are read once. No op can beat it by much,
    so ORT/floor says how far a kernel is from being memory bound.
Each runner times every case in a process of its own (the floor, ORT, TF with oneDNN on, TF with it
off), one after the other: thread pools of two runtimes in one process disturb each other on a small
machine (on a 2-vCPU VM the scheduler sometimes woke ORT's worker on the core its caller ran on and
doubled ORT's time; alone, the same session varied by a few percent). Each time is the median of
--repeat runs after two warm-up runs, with a short pause before each run so that the runtime's worker
threads have parked (an inference server rarely calls an op back to back). The runners' processes run
--passes times in turn, and each time shown is the fastest pass's median, so that a burst of background
load during one process cannot decide a ratio. The "check" column compares ORT's result with TF's
loosely (rtol 1e-3 relative to each output's largest value) to make sure both did the same work; the
conformance tests, not this script, hold the exact agreement.
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
    # TF's time is its chain's: FusedBatchNormV3 (inference), Relu6, FakeQuantWithMinMaxVars.
    cases.append(Case("FusedBatchNormClipFakeQuant", "inference, ReLU6, 8 bits", bn_in + [s_min, s_max],
                      {"epsilon": 0.001, "clip_min": 0.0, "clip_max": 6.0}))

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


def fastest_in_children(commands: dict, passes: int, env: dict) -> dict:
    """{label: {batch: ms}}: each command (a child process that prints its {batch: ms} as its last JSON line) run
    ``passes`` times in turn, keeping each label's fastest time per batch, so that a burst of background load
    during one process cannot decide a ratio."""
    best = {}
    for _ in range(passes):
        for label, cmd in commands.items():
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
            if proc.returncode != 0 or not lines:
                raise RuntimeError(f"timing {label} failed:\n{proc.stderr[-3000:]}")
            times = {int(k) if k.isdigit() else k: v for k, v in json.loads(lines[-1]).items()}
            best[label] = {b: min(t, best.get(label, {}).get(b, t)) for b, t in times.items()}
    return best


def median_ms(fn: Callable, repeat: int, pause: float = 0.05) -> float:
    """Median time of ``repeat`` calls of ``fn`` after two warm-up calls. The pause before each call
    lets the runtime's worker threads stop spinning, as they would between a server's requests
    (``pause=0``: back to back, as under a steady stream of requests)."""
    samples = []
    for i in range(repeat + 2):
        if pause:
            time.sleep(pause)
        t = time.perf_counter()
        fn()
        if i >= 2:
            samples.append(time.perf_counter() - t)
    return float(np.median(samples)) * 1e3


def tf_runner(case: Case):
    import tensorflow as tf

    from tools.goldens._fused_chain import tf_op  # a fused op: TF times the chain of ops it replaces

    attrs = dict(case.attrs)
    tensors = [tf.constant(a) for a in case.inputs]
    call = tf.function(lambda *args: tf_op(case.op, list(args), attrs))

    def run():
        return call(*tensors)

    def result():
        return [np.asarray(o) for o in run()]

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
BOTH_HEADER = ("op", "config", "TF on ms", "TF off ms", "ORT ms", "floor ms", "ORT/TF on", "ORT/TF off",
               "ORT/floor", "check")
BOTH_WIDTHS = [42, 31, 9, 9, 7, 8, 9, 10, 9, 5]


def emit(row, widths):
    print("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip(), flush=True)


def selected_cases(args, shape) -> list:
    return [c for c in make_cases(shape, np.random.default_rng(args.seed)) if not args.ops or c.op in args.ops]


def error_cell(e: Exception) -> str:
    """A failed ORT run in the check column: a missing library or kernel shows in the table."""
    return f"ERROR {type(e).__name__}: {str(e).splitlines()[0][:60]}"


def run_runner(args, shape) -> None:
    """A child's work: times one runner over every case and prints JSON lines (a header, then a row per
    case). The floor's child also computes TF's and ORT's results once, untimed, for the check column."""
    cases = selected_cases(args, shape)
    if args.runner in ("tf", "floor"):
        import tensorflow as tf

        # Must happen before TF runs anything.
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    if args.runner == "tf":
        print(json.dumps({"onednn": tf_onednn_setting()}), flush=True)
    elif args.runner == "floor":
        print(json.dumps({"header": machine_description(args.threads)}), flush=True)
    else:
        print(json.dumps({}), flush=True)
    with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
        for case in cases:
            row = {"op": case.op, "config": case.config}
            if args.runner == "tf":
                row["ms"] = median_ms(tf_runner(case)[0], args.repeat)
            elif args.runner == "ort":
                try:
                    row["ms"] = median_ms(ort_runner(case, args.threads)[0], args.repeat)
                except Exception as e:
                    row["ms"] = float("nan")
                    row["check"] = error_cell(e)
            else:
                expected = tf_runner(case)[1]()
                try:
                    row["check"] = check(case, expected, ort_runner(case, args.threads)[1]())
                except Exception as e:
                    row["check"] = error_cell(e)
                row["ms"] = median_ms(MemoryFloor(case.inputs, expected, pool).run, args.repeat)
            print(json.dumps(row), flush=True)


def run_child(argv, runner: str, onednn: str = "") -> tuple:
    """This script as one runner in a child process: (its header dict, its rows). TF's child gets the
    kernel set `onednn` (on, off, or TF's default); the floor's child checks against TF's Eigen kernels."""
    env = dict(os.environ)
    if runner != "tf":
        env["TF_ENABLE_ONEDNN_OPTS"] = "0"
    elif onednn in ("on", "off"):
        env["TF_ENABLE_ONEDNN_OPTS"] = "1" if onednn == "on" else "0"
    proc = subprocess.run([sys.executable, __file__, *argv, "--runner", runner], env=env, capture_output=True,
                          text=True)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the {runner} {onednn} child failed:\n{proc.stderr[-3000:]}")
    return lines[0], lines[1:]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads for TF and ORT, threads of the floor")
    parser.add_argument("--repeat", type=int, default=10, help="timed runs per measurement (median shown)")
    parser.add_argument("--ops", nargs="+", help="only these ops (default: all 19)")
    parser.add_argument("--shape", default="16,56,56,128", help="NHWC shape of the main input (default 16,56,56,128)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--onednn", choices=["both", "on", "off", "default"], default="both",
                        help="TF's kernel set: both (a process each, one table), on, off, or TF's default")
    parser.add_argument("--isa", choices=["avx512", "avx2", "sse2"],
                        help="cap the library's vector ISA (sets TFOPS_ISA; default: the CPU's best)")
    parser.add_argument("--passes", type=int, default=2,
                        help="times each runner's process runs, alternating; the fastest pass is shown")
    parser.add_argument("--runner", choices=["tf", "ort", "floor"], help=argparse.SUPPRESS)  # a child's job
    args = parser.parse_args(argv)
    if args.isa:
        os.environ["TFOPS_ISA"] = args.isa  # read by the library when its first kernel runs; children inherit it

    import ort_ops

    shape = tuple(int(v) for v in args.shape.split(","))
    if args.ops:
        unknown = sorted(set(args.ops) - set(ort_ops.OP_NAMES))
        if unknown:
            parser.error(f"unknown ops {unknown}; known: {', '.join(ort_ops.OP_NAMES)}")
    if args.runner:
        run_runner(args, shape)
        return 0

    child_argv = list(argv if argv is not None else sys.argv[1:])
    settings = ["on", "off"] if args.onednn == "both" else [args.onednn]
    # Pass after pass, each runner in turn; a row keeps each runner's fastest pass, so that a burst of
    # background load during one child's run cannot decide a ratio.
    runs = {}
    for _ in range(args.passes):
        for key in [("floor",), ("ort",)] + [("tf", s) for s in settings]:
            head_, rows = run_child(child_argv, *key)
            if key in runs:
                rows = [dict(r, ms=min(r["ms"], old["ms"])) for r, old in zip(rows, runs[key][1])]
            runs[key] = (head_, rows)
    header, floor_rows = runs[("floor",)]
    ort_rows = runs[("ort",)][1]
    tf_runs = [runs[("tf", s)] for s in settings]
    print(header["header"])
    print("TF kernels: " + " | ".join(h["onednn"] for h, _ in tf_runs) + "; TF, ORT and the floor each ran in a "
          "process of its own")
    print(f"main input NHWC {list(shape)} float32; median of {args.repeat} runs, fastest of {args.passes} passes\n",
          flush=True)
    head, widths = (BOTH_HEADER, BOTH_WIDTHS) if len(settings) == 2 else (HEADER, WIDTHS)
    emit(head, widths)
    emit(["-" * w for w in widths], widths)
    failures = 0
    for i, (floor, ort) in enumerate(zip(floor_rows, ort_rows)):
        status = ort.get("check", floor["check"])
        failures += status != "ok"
        tf_ms = [rows[i]["ms"] for _, rows in tf_runs]
        cells = [f"{t:.2f}" for t in tf_ms] + [f"{ort['ms']:.2f}", f"{floor['ms']:.2f}"]
        ratios = [f"{ort['ms'] / t:.2f}" for t in tf_ms] + [f"{ort['ms'] / floor['ms']:.2f}"]
        emit((floor["op"], floor["config"], *cells, *ratios, status), widths)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
