"""Builds a Triton model repository for custom-lowering models (and integer ones), with the inputs to send and the outputs Python
onnxruntime gives for them (scripts/triton.sh).

For each model (models/NAME/model.custom.onnx) the repository gets NAME/1/model.onnx and NAME/config.pbtxt,
docs/serving.md's configuration generated from the model's inputs and outputs: where every input and output has a
free first dim Triton batches it (max_batch_size, dims without that dim, dynamic_batching), else
max_batch_size 0 and the full dims (a scalar as dims [1], the backend's convention for scalars); instance_group KIND_CPU;
model_operations naming the library (only where the model has nodes of the domain: an integer model,
models/NAME/model.integer.onnx, serves as NAME_integer without it). One more entry, NAME_without_model_operations (fourbit_cnn's), has
the same configuration without model_operations and must fail to load.

The cases folder gets manifest.json and, per model and client, one .npz per request holding the inputs
(in/NAME) and Python onnxruntime's outputs (out/NAME), each request run alone with the library registered and
one intra-op thread (the backend is configured with one too).
"""
import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

DOMAIN = "ai.onnx.converters.tensorflow"
MAX_BATCH = 64   # as in docs/serving.md
TYPES = {  # ONNX element type -> (Triton data type, NumPy dtype)
    onnx.TensorProto.FLOAT: ("TYPE_FP32", np.float32),
    onnx.TensorProto.DOUBLE: ("TYPE_FP64", np.float64),
    onnx.TensorProto.FLOAT16: ("TYPE_FP16", np.float16),
    onnx.TensorProto.INT8: ("TYPE_INT8", np.int8),
    onnx.TensorProto.UINT8: ("TYPE_UINT8", np.uint8),
    onnx.TensorProto.INT16: ("TYPE_INT16", np.int16),
    onnx.TensorProto.INT32: ("TYPE_INT32", np.int32),
    onnx.TensorProto.INT64: ("TYPE_INT64", np.int64),
    onnx.TensorProto.BOOL: ("TYPE_BOOL", np.bool_),
}


def dims_of(value):
    """The dims of a graph input/output, None for a free one."""
    return [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]


def tensor_config(value, batched):
    dims = dims_of(value)[1:] if batched else dims_of(value)
    kind = value.type.tensor_type.elem_type
    if kind not in TYPES:
        raise SystemExit(f"make_repository: {value.name}: element type {kind} has no Triton type here")
    text = [f'    name: "{value.name}"', f"    data_type: {TYPES[kind][0]}"]
    if dims:
        text.append(f"    dims: [ {', '.join(str(-1 if d is None else d) for d in dims)} ]")
    elif batched:  # one value a batch row: Triton's dims cannot be empty
        text += ["    dims: [ 1 ]", "    reshape: { shape: [ ] }"]
    else:  # a scalar of a model Triton does not batch: dims [1], no reshape (the backend's convention)
        text.append("    dims: [ 1 ]")
    return "  {\n" + "\n".join(text) + "\n  }"


def config_text(name, model, library):
    graph = model.graph
    batched = all(dims_of(v) and dims_of(v)[0] is None for v in list(graph.input) + list(graph.output))
    parts = [
        f'name: "{name}"',
        'platform: "onnxruntime_onnx"',
        f"max_batch_size: {MAX_BATCH if batched else 0}",
        "input [\n" + ",\n".join(tensor_config(v, batched) for v in graph.input) + "\n]",
        "output [\n" + ",\n".join(tensor_config(v, batched) for v in graph.output) + "\n]",
        "instance_group [\n  {\n    count: 1\n    kind: KIND_CPU\n  }\n]",
    ]
    if batched:
        parts.append("dynamic_batching { }")
    if library:
        parts.append(f'model_operations {{\n  op_library_filename: "{library}"\n}}')
    # One intra-op thread, as the reference session: ORT's own Conv filter gradient changes its last bits
    # with the thread count.
    parts.append('parameters { key: "intra_op_thread_count" value: { string_value: "1" } }')
    return "\n".join(parts) + "\n", batched


def make_inputs(model, batched, batch, rng):
    feeds = {}
    for v in model.graph.input:
        dims = dims_of(v)
        if batched:
            dims = [batch] + dims[1:]
        if any(d is None for d in dims):
            raise SystemExit(f"make_repository: input {v.name} has a free dim past the first: {dims}")
        dtype = TYPES[v.type.tensor_type.elem_type][1]
        if np.issubdtype(dtype, np.integer):  # labels: every bundled training step has 10 classes
            feeds[v.name] = rng.integers(0, 10, size=dims).astype(dtype)
        else:
            feeds[v.name] = rng.normal(size=dims).astype(dtype)
    return feeds


def entry_name(path: Path) -> str:
    """models/NAME/model.custom.onnx serves as NAME; another lowering's file (model.integer.onnx) as NAME_integer."""
    lowering = path.name.split(".")[-2] if path.name.count(".") >= 2 else "custom"
    return path.parent.name if lowering == "custom" else f"{path.parent.name}_{lowering}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--library", required=True, help="absolute path of libort_tf_ops.so")
    parser.add_argument("--repository", required=True, type=Path)
    parser.add_argument("--cases", required=True, type=Path)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--without-model-operations", default="fourbit_cnn", metavar="NAME",
                        help="the model whose copy has no model_operations (default: fourbit_cnn, else the first)")
    parser.add_argument("models", nargs="+", type=Path)
    args = parser.parse_args()
    library = str(Path(args.library).resolve())
    manifest = {"library": library, "clients": args.clients, "models": []}
    names = [entry_name(path) for path in args.models]
    bare_of = args.without_model_operations if args.without_model_operations in names else names[0]
    for index, path in enumerate(args.models):
        name = entry_name(path)
        model = onnx.load(str(path))
        uses_library = any(n.domain == DOMAIN for n in model.graph.node)
        config, batched = config_text(name, model, library if uses_library else None)
        (args.repository / name / "1").mkdir(parents=True)
        shutil.copyfile(path, args.repository / name / "1" / "model.onnx")
        (args.repository / name / "config.pbtxt").write_text(config)
        if name == bare_of:
            bare = f"{name}_without_model_operations"
            (args.repository / bare / "1").mkdir(parents=True)
            shutil.copyfile(path, args.repository / bare / "1" / "model.onnx")
            (args.repository / bare / "config.pbtxt").write_text(config_text(bare, model, None)[0])
            manifest["must_fail"] = {
                "name": bare,
                "domain": DOMAIN,
                "ops": sorted({n.op_type for n in model.graph.node if n.domain == DOMAIN}),
            }

        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        if uses_library:
            so.register_custom_ops_library(library)
        session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        outputs = [o.name for o in session.get_outputs()]
        # Three requests a client (batches of 1, 2 and 3 where Triton batches).
        per_client = 3
        rng = np.random.default_rng(27 + index)
        requests = []
        for client in range(args.clients):
            for r in range(per_client):
                feeds = make_inputs(model, batched, 1 + (client + r) % 3, rng)
                expected = session.run(outputs, feeds)
                file = args.cases / name / f"client{client}_request{r}.npz"
                file.parent.mkdir(parents=True, exist_ok=True)
                np.savez(file, **{f"in/{k}": v for k, v in feeds.items()},
                         **{f"out/{k}": v for k, v in zip(outputs, expected)})
                requests.append({"client": client, "file": str(file)})
        manifest["models"].append({"name": name, "batched": batched, "inputs": [i.name for i in model.graph.input],
                                   "outputs": outputs, "requests": requests})
        print(f"make_repository: {name}: {'batched by Triton' if batched else 'max_batch_size 0'}, "
              f"{len(model.graph.input)} inputs, {len(outputs)} outputs, {len(requests)} requests")
    (args.cases / "manifest.json").write_text(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    main()
