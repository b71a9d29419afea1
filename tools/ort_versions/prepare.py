"""Writes the cases scripts/test_ort_versions.sh runs on every onnxruntime version (run in the project's
.venv, which has onnx and ort_ops; the versions' own environments need only onnxruntime and NumPy).

    python tools/ort_versions/prepare.py OUT_DIR [--per-op N] [--errors-per-op N]

OUT_DIR/manifest.json lists the cases (absolute paths); each has an .onnx model and an .npz of its inputs:
  * every bundled model, in both lowerings (models/*/model.{custom,standard}.onnx, used in place; a standard
    model's bits may differ between versions only where onnxruntime's own ops changed), on the seeded inputs its entry in
    models/run_all.py makes (seed 0), or, for a model run_all does not list, seeded inputs of its shapes
    (free dims 2). Every version runs the shipped file as it is (the converters write the lowest IR version
    its opsets need: 8 at opset 17; onnxruntime 1.17 reads up to 9). Each model also has a probe copy
    (probe_model) that outputs every value its nodes compute;
  * a sample of the golden cases (ort_ops/conformance/goldens/*.npz): per op, N cases spread evenly over the file and a few
    of the cases TF rejects, each as the one-node model the golden tests build (tests/backends.py: untyped
    outputs, so that the library's shape inference declares them, and bfloat16 outputs Cast to float32),
    with bfloat16 inputs Cast from float32 in the graph as well (onnxruntime 1.17's Python API cannot feed
    bfloat16; the values are bfloat16's, so the Cast is exact; cases with NaN bfloat16 inputs are left out,
    since a Cast need not keep a NaN's bits). Opset 17, at the lowest IR version it needs (8).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import ort_ops  # noqa: E402
from ort_ops.conformance.goldens import golden_ops, load_cases  # noqa: E402

SEED = 0


def seeded_inputs(model: onnx.ModelProto, rng) -> dict:
    """Inputs of the model's declared shapes (free dims 2): floats uniform in [0, 1), integers in [0, 10)."""
    feeds = {}
    initializers = {i.name for i in model.graph.initializer}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 2 for d in tensor.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if np.issubdtype(dtype, np.integer):
            feeds[value.name] = rng.integers(0, 10, shape).astype(dtype)
        else:
            feeds[value.name] = rng.uniform(0.0, 1.0, shape).astype(dtype)
    return feeds


def model_cases(out: Path) -> list:
    try:
        from models.run_all import EXAMPLES_BY_NAME
    except Exception as e:  # the converters' imports broke: the shapes still give inputs
        print(f"prepare: models.run_all not importable ({type(e).__name__}: {e}); seeded inputs of the models' shapes")
        EXAMPLES_BY_NAME = {}
    cases = []
    for path in sorted((ROOT / "models").glob("*/model.*.onnx")):
        name, lowering = path.parent.name, path.name.split(".")[1]
        model = onnx.load(str(path))
        rng = np.random.default_rng(SEED)
        example = EXAMPLES_BY_NAME.get(name)
        feeds = example.make_inputs(rng) if example is not None else seeded_inputs(model, rng)
        inputs = out / "models" / f"{name}.{lowering}.inputs.npz"
        inputs.parent.mkdir(parents=True, exist_ok=True)
        np.savez(inputs, **feeds)
        case = {"id": f"model {name} ({lowering})", "model": str(path), "inputs": str(inputs),
                "inputs_from": "models/run_all.py" if example is not None else "seeded shapes"}
        # The shipped file runs as it is: the converters write the lowest IR version its opsets need.
        probe, nodes = probe_model(model)
        probe_path = out / "models" / f"{name}.{lowering}.probe.onnx"
        onnx.save(probe, str(probe_path))
        case["probe"] = {"model": str(probe_path), "nodes": nodes}
        cases.append(case)
    return cases


def probe_model(model: onnx.ModelProto) -> tuple:
    """The model with every value a node computes as an (untyped) graph output, and its nodes as
    [op_type, domain, inputs, outputs] in graph order. run_cases.py compares the values' bits between versions
    to tell the library's nodes from onnxruntime's own where a model's outputs differ."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    outputs = {o.name for o in probe.graph.output}
    for node in probe.graph.node:
        for name in node.output:
            if name and name not in outputs:
                probe.graph.output.append(helper.make_empty_tensor_value_info(name))
                outputs.add(name)
    nodes = [[n.op_type, n.domain, list(n.input), list(n.output)] for n in probe.graph.node]
    return probe, nodes


def spread(indices: list, n: int) -> list:
    if len(indices) <= n:
        return indices
    return [indices[round(k * (len(indices) - 1) / (n - 1))] for k in range(n)] if n > 1 else indices[:1]


def golden_model(op: str, inputs: list, attrs: dict) -> tuple:
    """The golden tests' one-node model (tests/backends.single_op_model) with bfloat16 inputs Cast from float32;
    returns the model and the inputs to feed."""
    import backends

    model = backends.single_op_model(op, inputs, attrs)
    feeds = {}
    graph = model.graph
    for value, x in zip(list(graph.input), inputs):
        x = np.asarray(x)
        if x.dtype.name == "bfloat16":
            name = value.name
            value.name = name + "_float32"
            value.type.tensor_type.elem_type = TensorProto.FLOAT
            graph.node.insert(0, helper.make_node("Cast", [value.name], [name], to=TensorProto.BFLOAT16))
            feeds[value.name] = x.astype(np.float32)
        else:
            feeds[value.name] = x
    return model, feeds


def golden_cases(out: Path, per_op: int, errors_per_op: int) -> list:
    cases = []
    for op in golden_ops():
        loaded = load_cases(op)

        def usable(i):
            bf16 = [np.asarray(x) for x in loaded[i]["inputs"] if np.asarray(x).dtype.name == "bfloat16"]
            return not any(np.isnan(x.astype(np.float32)).any() for x in bf16)

        ok = [i for i, c in enumerate(loaded) if "error" not in c and usable(i)]
        bad = [i for i, c in enumerate(loaded) if "error" in c and usable(i)]
        for i in spread(ok, per_op) + spread(bad, errors_per_op):
            case = loaded[i]
            model, feeds = golden_model(op, case["inputs"], case["attrs"])
            stem = out / "golden" / f"{op}.{i}"
            stem.parent.mkdir(parents=True, exist_ok=True)
            onnx.save(model, str(stem) + ".onnx")
            np.savez(str(stem) + ".inputs.npz", **feeds)
            cases.append({"id": f"golden {op} #{i}", "op": op, "model": str(stem) + ".onnx",
                          "inputs": str(stem) + ".inputs.npz", "tf_rejects": "error" in case,
                          "dtypes": sorted({np.asarray(x).dtype.name for x in case["inputs"]})})
    return cases


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--per-op", type=int, default=8, help="golden cases TF computes, per op (default 8)")
    parser.add_argument("--errors-per-op", type=int, default=2, help="golden cases TF rejects, per op (default 2)")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    cases = model_cases(out) + golden_cases(out, args.per_op, args.errors_per_op)
    (out / "manifest.json").write_text(json.dumps({"cases": cases}, indent=1))
    models = sum(c["id"].startswith("model ") for c in cases)
    print(f"prepare: {models} bundled models (every committed lowering) and {len(cases) - models} golden cases in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
