"""The golden cases as shipped: one compressed .npz per op in ``goldens/``, written by tools/goldens/gen_*.py.

A case is ``{"attrs": {...}, "inputs": [arrays], "outputs": [arrays]}`` or, for input TF rejects,
``{"attrs": ..., "inputs": ..., "error": "TF's message"}``. ``"note"`` says what the case covers. An output TF
leaves undefined is stored as an empty bool array. Arrays keep their dtype (bfloat16 is stored as its uint16
bits with a marker). ``nodetest.export`` turns them into ONNX node tests.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

GOLDEN_DIR = Path(__file__).resolve().parent / "goldens"


def _pack(arr):
    arr = np.asarray(arr)
    if arr.dtype.name == "bfloat16":
        return arr.view(np.uint16), "bfloat16"
    return arr, arr.dtype.name


def _unpack(arr, dtype):
    if dtype == "bfloat16":
        import ml_dtypes

        return arr.view(ml_dtypes.bfloat16)
    return arr


def save_cases(op: str, cases: list, directory: Path = GOLDEN_DIR) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    arrays, meta = {}, []
    for i, case in enumerate(cases):
        entry = {"attrs": case.get("attrs", {}), "note": case.get("note", ""), "in": [], "out": []}
        for j, x in enumerate(case["inputs"]):
            arrays[f"c{i}_i{j}"], dt = _pack(x)
            entry["in"].append(dt)
        if "error" in case:
            entry["error"] = case["error"]
        else:
            for k, y in enumerate(case["outputs"]):
                arrays[f"c{i}_o{k}"], dt = _pack(y)
                entry["out"].append(dt)
        meta.append(entry)
    path = directory / f"{op}.npz"
    np.savez_compressed(path, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
    return path


def load_cases(op: str, directory: Path = GOLDEN_DIR) -> list:
    path = directory / f"{op}.npz"
    with np.load(path) as data:
        meta = json.loads(bytes(data["__meta__"]).decode())
        cases = []
        for i, entry in enumerate(meta):
            case = {
                "attrs": entry["attrs"],
                "note": entry["note"],
                "inputs": [_unpack(data[f"c{i}_i{j}"], dt) for j, dt in enumerate(entry["in"])],
            }
            if "error" in entry:
                case["error"] = entry["error"]
            else:
                case["outputs"] = [_unpack(data[f"c{i}_o{k}"], dt) for k, dt in enumerate(entry["out"])]
            cases.append(case)
    return cases


def golden_ops(directory: Path = GOLDEN_DIR) -> list:
    return sorted(p.stem for p in directory.glob("*.npz"))
