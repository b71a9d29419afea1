"""Export the golden cases (ort_ops/conformance/goldens/*.npz) to the plain format the GPU check program reads.

    python3 tools/gpu_check/export_cases.py [--golden ort_ops/conformance/goldens] --out DIR [--corrupt OP]

Needs NumPy only (no onnx, onnxruntime, ml_dtypes or TensorFlow): it reads the .npz files as
ort_ops/conformance/goldens.py writes them (a JSON list of cases in ``__meta__``, arrays ``c<i>_i<j>`` / ``c<i>_o<k>``,
bfloat16 stored as its uint16 bits) and writes one file per op, DIR/<op>.cases, which
cpp_ops/gpu_check/cases.cc reads:

    TFOPS-GPU-CHECK-CASES 1
    op <name> <number of cases>
    then per case:
      case <index>
      note <n>\\n<n bytes>
      attrs <count>, then per attribute one line:
        a <name> i <integer>            (ints and bools)
        a <name> f <float.hex()>        (floats, exactly; inf and nan as words)
        a <name> s <n>\\n<n bytes>       (strings)
        a <name> l <count> <integers>   (lists of ints)
      error <n>\\n<n bytes>              (TF's message; n = 0 when TF ran the case)
      inputs <count>, then per tensor: t <dtype> <rank> <dims...> <nbytes>\\n<raw little-endian bytes>
      outputs <count>, the same (dtype bool: an output TF leaves undefined, not compared)
      end

``--corrupt OP`` makes one expected value of OP wrong (its lowest bit flipped for the ops judged bit for bit, moved
by 1% for the others): the check program's CPU half must then fail (tests/test_gpu_check.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
MAGIC = "TFOPS-GPU-CHECK-CASES 1"
DTYPES = {"float32": "float32", "float64": "float64", "float16": "float16", "bfloat16": "bfloat16",
          "int32": "int32", "bool": "bool"}


def load(path: Path):
    """The cases of one .npz as (attrs, note, inputs, outputs or None, error or None), arrays as stored."""
    with np.load(path) as data:
        meta = json.loads(bytes(data["__meta__"]).decode())
        for i, entry in enumerate(meta):
            inputs = [(data[f"c{i}_i{j}"], dt) for j, dt in enumerate(entry["in"])]
            outputs = None
            if "error" not in entry:
                outputs = [(data[f"c{i}_o{k}"], dt) for k, dt in enumerate(entry["out"])]
            yield entry["attrs"], entry.get("note", ""), inputs, outputs, entry.get("error")


def _text(out, tag, s: str):
    b = s.encode()
    out.write(f"{tag} {len(b)}\n".encode())
    out.write(b + b"\n")


def _attr(out, name, value):
    if isinstance(value, bool) or isinstance(value, (int, np.integer)):
        out.write(f"a {name} i {int(value)}\n".encode())
    elif isinstance(value, float):
        out.write(f"a {name} f {value.hex() if np.isfinite(value) else repr(value)}\n".encode())
    elif isinstance(value, str):
        b = value.encode()
        out.write(f"a {name} s {len(b)}\n".encode() + b + b"\n")
    elif isinstance(value, (list, tuple)) and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                                  for v in value):
        out.write(f"a {name} l {len(value)}{''.join(f' {int(v)}' for v in value)}\n".encode())
    else:
        raise ValueError(f"attribute {name}={value!r}: no encoding for its type")


def _tensor(out, array: np.ndarray, dtype: str):
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype}: not one the check program reads")
    a = np.require(array, requirements="C")  # (ascontiguousarray would make a scalar shape [1])
    if dtype == "bfloat16":
        a = a.view(np.uint16)
    if a.dtype.byteorder == ">":
        a = a.byteswap().view(a.dtype.newbyteorder("<"))
    raw = a.tobytes()
    dims = "".join(f" {d}" for d in a.shape)
    out.write(f"t {dtype} {a.ndim}{dims} {len(raw)}\n".encode())
    out.write(raw + b"\n")


def bit_exact(op: str) -> bool:
    """The families judged bit for bit (tests/cuda_support.py BIT_EXACT_OPS)."""
    return op.startswith(("FakeQuant", "QuantizeAndDequantize")) or op == "FusedBatchNormClipFakeQuant"


def corrupt_first(op, cases):
    """Make one expected value wrong: in the first float32/float64 output that has a finite nonzero value, flip
    its lowest bit (ops judged bit for bit) or move it by 1% (ops judged to a tolerance). Returns where."""
    for index, (_, note, _, outputs, _) in enumerate(cases):
        for k, (y, dt) in enumerate(outputs or []):
            if dt not in ("float32", "float64") or y.size == 0:
                continue
            flat = y.reshape(-1)
            candidates = np.flatnonzero(np.isfinite(flat) & (flat != 0))
            if not candidates.size:
                continue
            at = int(candidates[0])
            if bit_exact(op):
                bits = flat.view(np.uint32 if dt == "float32" else np.uint64)
                bits[at] ^= 1
            else:
                flat[at] = flat[at] * flat.dtype.type(1.01) + np.copysign(flat.dtype.type(0.01), flat[at])
            return f"case {index} ({note}), output {k}, element {at}"
    raise ValueError(f"{op}: no finite nonzero float32/float64 expected value to corrupt")


def export(golden: Path, out_dir: Path, corrupt: str | None = None) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {}
    paths = sorted(golden.glob("*.npz"))
    if not paths:
        raise FileNotFoundError(f"no golden files in {golden}")
    if corrupt is not None and corrupt not in {p.stem for p in paths}:
        raise ValueError(f"--corrupt {corrupt}: no such golden op")
    for path in paths:
        op = path.stem
        cases = list(load(path))
        if op == corrupt:
            print(f"export_cases: corrupted {op} {corrupt_first(op, cases)}", file=sys.stderr)
        target = out_dir / f"{op}.cases"
        tmp = target.with_suffix(".tmp")
        with open(tmp, "wb") as out:
            out.write(f"{MAGIC}\nop {op} {len(cases)}\n".encode())
            for index, (attrs, note, inputs, outputs, error) in enumerate(cases):
                out.write(f"case {index}\n".encode())
                _text(out, "note", note)
                out.write(f"attrs {len(attrs)}\n".encode())
                for name in sorted(attrs):
                    _attr(out, name, attrs[name])
                _text(out, "error", error or "")
                out.write(f"inputs {len(inputs)}\n".encode())
                for array, dt in inputs:
                    _tensor(out, array, dt)
                out.write(f"outputs {len(outputs or [])}\n".encode())
                for array, dt in outputs or []:
                    _tensor(out, array, dt)
                out.write(b"end\n")
        tmp.replace(target)
        counts[op] = len(cases)
    return counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--golden", type=Path, default=ROOT / "ort_ops" / "conformance" / "goldens")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--corrupt", metavar="OP", help="make one expected value of OP wrong (self-test)")
    args = parser.parse_args(argv)
    counts = export(args.golden, args.out, args.corrupt)
    print(f"export_cases: {sum(counts.values())} golden cases of {len(counts)} ops -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
