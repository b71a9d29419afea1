"""PyTorch's own CUDA kernels on the GPU check's timing cases, for the table of scripts/gpu_check.sh.

    python3 tools/gpu_check/torch_times.py RESULTS.json [--repeat 25]

Reads the timing cases gpu_check wrote into RESULTS.json (op, attributes, input shapes and small inputs' values),
builds the same inputs (random values for the large ones), runs PyTorch's equivalent where it has one
(benchmarks/bench_cuda.py torch_equivalent: fake_quantize_per_tensor_affine, fake_quantize_per_channel_affine and
their backward kernels, batch_norm forward and backward, conv2d with groups=C and its two gradients,
channels_last) and times it the way gpu_check times the library's kernels: CUDA events around each call, the L2
cache flushed before each, three warm-up calls, the median of --repeat. Writes "torch_us" and "torch_what" into
each timing entry of RESULTS.json (null where PyTorch has no equivalent, for types other than float32 and for
channels-first layouts). Needs
PyTorch with CUDA and NumPy; not onnxruntime or onnx.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def _bench_cuda():
    """benchmarks/bench_cuda.py as a module (its torch_equivalent and BenchCase; importing it needs NumPy only)."""
    spec = importlib.util.spec_from_file_location("bench_cuda", ROOT / "benchmarks" / "bench_cuda.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def make_inputs(case: dict, rng) -> list:
    inputs = []
    for spec in case["inputs"]:
        dtype = np.dtype(spec["dtype"])
        shape = tuple(spec["shape"])
        if "values" in spec:
            inputs.append(np.array(spec["values"], dtype=dtype).reshape(shape))
        else:
            inputs.append((rng.standard_normal(shape) * 3).astype(dtype))
    return inputs


def time_us(torch, fn, repeat: int) -> float:
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(3 + repeat):
        flush.fill_(0x5A)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(stop) * 1000.0)
    return float(np.median(times))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--repeat", type=int, default=25)
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text())
    import torch

    if not torch.cuda.is_available():
        print("torch_times: PyTorch sees no GPU", file=sys.stderr)
        return 2
    torch.backends.cudnn.benchmark = True
    bench = _bench_cuda()
    rng = np.random.default_rng(7)
    timed = 0
    for row in results.get("rows", []):
        for entry in row.get("timings", []):
            entry["torch_us"], entry["torch_what"] = None, None
            case = entry.get("case") or {}
            if row["dtype"] != "float32" or not case or str(case["attrs"].get("data_format", "")).startswith("NC"):
                continue  # bench_cuda's equivalents take float32 channels-last data
            inputs = make_inputs(case, rng)
            bench_case = bench.BenchCase(case["op"], entry["config"], inputs, case["attrs"], ())
            try:
                what, fn = bench.torch_equivalent(bench_case)
                if fn is None:
                    continue
                entry["torch_us"], entry["torch_what"] = time_us(torch, fn, args.repeat), what
                timed += 1
            except Exception as e:  # noqa: BLE001  a missing PyTorch kernel is reported, not fatal
                entry["torch_what"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            finally:
                torch.cuda.synchronize()
    results["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda,
                        "device": torch.cuda.get_device_name(0), "timed": timed}
    args.results.write_text(json.dumps(results, indent=1))
    print(f"torch_times: PyTorch {torch.__version__} timed {timed} equivalents on {torch.cuda.get_device_name(0)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
