"""A zoo of real architectures, through the CLI in both lowerings, verified and timed against tf2onnx and TF.

    # from the repository root (pip install ".[test,zoo]" first; scripts/setup.sh does):
    PYTHONPATH=. python benchmarks/zoo.py [--models NAME ...] [--size 96] [--graphs inference train]
                                          [--lowerings custom standard] [--no-timing] [--threads 2] [--repeat 10]
                                          [--passes 2] [--tf-onednn 0|1] [--per-node] [--markdown docs/zoo.md] [--work build/zoo]

The models are built from the libraries users have, with ``weights=None`` and seeded: keras.applications
(Keras 3: MobileNetV2, MobileNetV3Small, EfficientNetB0, ConvNeXtTiny), keras_hub (``MobileNetBackbone`` from
arguments, MobileNetV3-Small's stacks, no preset, under a pooling + Dense head), tf_keras.applications
(MobileNetV2) and tfmot's ``quantize_model`` of it, of MobileNet and of ResNet50 (these three also in the integer
lowering, judged in quantization steps end to end and per quantized tensor). Their batch-norm statistics are calibrated on crops of
scikit-learn's two sample photographs (one training-mode pass with momentum 0, so each moving statistic is its
layer's batch statistic: the outputs neither vanish nor explode), and a QAT model's ranges move with them.

For each model, graph (inference; a training step with sparse categorical cross-entropy) and lowering, the CLI
converts the saved file (``python -m converters --keras FILE``) with ``--verify`` (end to end against TF's Eigen
kernels, TF's oneDNN spread beside it; ``--per-node`` adds ``--verify-nodes``); the table gives its
conversion time, node and Transpose counts and verdict. tf2onnx alone (``tf2onnx.convert.from_keras``'s route,
from the same frozen function) converts the inference graph as the baseline. With timing on, TF (a
tf.function of the model, its kernels pinned by --tf-onednn: by default what TF 2.21 picks on this CPU, oneDNN
with AVX-512 and Eigen without, named in the machine line), and ONNX Runtime running each
inference model, are timed at batches 1 and 8 with the same thread count, each runtime in a process of its
own, --passes passes in turn, the fastest pass's median kept (benchmarks/bench_ops.py's loop). Timings hold
for the machine printed above the table only.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = 1234
CLASSES = 10
EXIT_VERIFY_FAILED = 3


# ----------------------------------------------------------------------------------------------- the models

def _mobilenet_v3_small_stacks(size):
    """keras_hub's MobileNetBackbone arguments for MobileNetV3-Small's inverted-residual stacks (the paper's
    table 2, grouped as keras_hub groups them)."""
    return dict(
        stackwise_expansion=[[72, 88], [96, 240, 240], [120, 144], [288, 576, 576]],
        stackwise_num_blocks=[2, 3, 2, 3],
        stackwise_num_filters=[[24, 24], [40, 40, 40], [48, 48], [96, 96, 96]],
        stackwise_kernel_size=[[3, 3], [5, 5, 5], [5, 5], [5, 5, 5]],
        stackwise_num_strides=[[2, 1], [2, 1, 1], [1, 1], [2, 1, 1]],
        stackwise_se_ratio=[[None, None], [0.25] * 3, [0.25] * 2, [0.25] * 3],
        stackwise_activation=[["relu", "relu"], ["hard_swish"] * 3, ["hard_swish"] * 2, ["hard_swish"] * 3,
                              ["hard_swish"]],
        stackwise_padding=[[1, 1], [2, 2, 2], [2, 2], [2, 2, 2]],
        output_num_filters=1024, input_activation="hard_swish", output_activation="hard_swish",
        input_num_filters=16, image_shape=(size, size, 3), depthwise_filters=16, depthwise_stride=2,
        depthwise_residual=False, squeeze_and_excite=0.5, last_layer_filter=576,
    )


def build(name: str, size: int):
    """(model, file suffix) of zoo model ``name`` at ``size`` x ``size`` x 3, ``CLASSES`` logits."""
    shape = (size, size, 3)
    if name.startswith("keras."):
        import keras

        keras.utils.set_random_seed(SEED)
        arch = getattr(keras.applications, name.split(".", 1)[1])
        # No preprocessing layer where the architecture lets it go (the images come scaled).
        extra = {"include_preprocessing": False} if "MobileNetV3" in name or "ConvNeXt" in name else {}
        return arch(weights=None, input_shape=shape, classes=CLASSES, classifier_activation=None, **extra), ".keras"
    if name == "keras_hub.MobileNetBackbone":
        import keras
        import keras_hub

        keras.utils.set_random_seed(SEED)
        backbone = keras_hub.models.MobileNetBackbone(**_mobilenet_v3_small_stacks(size))
        inputs = keras.Input(shape, name="images")
        x = keras.layers.GlobalAveragePooling2D()(backbone(inputs))
        return keras.Model(inputs, keras.layers.Dense(CLASSES, name="logits")(x), name="hub_mobilenet"), ".keras"
    if name.startswith("tf_keras.") or name.startswith("tfmot."):
        import tf_keras

        tf_keras.utils.set_random_seed(SEED)
        arch = getattr(tf_keras.applications, name.split(".", 1)[1])
        model = arch(weights=None, input_shape=shape, classes=CLASSES, classifier_activation=None)
        if name.startswith("tfmot."):
            import tensorflow_model_optimization as tfmot

            model = tfmot.quantization.keras.quantize_model(model)
        return model, ".h5"
    raise ValueError(f"unknown zoo model {name!r} (one of {', '.join(MODELS)})")


# Sizes capped per model: ConvNeXtTiny's training step, verified per node, holds every activation of 28M
# parameters' network twice (TF's and ORT's), 15 GB at 64x64.
SIZE_CAP = {"keras.ConvNeXtTiny": 64}
MODELS = ("keras.MobileNetV2", "keras.MobileNetV3Small", "keras.EfficientNetB0", "keras.ConvNeXtTiny",
          "keras_hub.MobileNetBackbone", "tf_keras.MobileNetV2", "tfmot.MobileNetV2", "tfmot.MobileNet",
          "tfmot.ResNet50")


def images(batch: int, size: int, seed: int = SEED):
    """Crops of scikit-learn's two sample photographs (models/data.py), scaled as keras.applications' MobileNet
    preprocessing does ([-1, 1])."""
    from models.data import photographs

    return photographs(batch, size, seed) * 2.0 - 1.0


def calibrate(model, size: int) -> None:
    """One training-mode pass with every batch norm's momentum at 0: each moving mean and variance becomes its
    layer's statistics on the photographs (and a QAT model's ranges move toward the activations')."""
    import numpy as np

    norms = [layer for layer in _all_layers(model) if hasattr(layer, "moving_mean") and hasattr(layer, "momentum")]
    saved = [layer.momentum for layer in norms]
    for layer in norms:
        layer.momentum = 0.0
    try:
        model(images(16, size, seed=SEED + 1), training=True)
    finally:
        for layer, momentum in zip(norms, saved):
            layer.momentum = momentum
    logits = np.asarray(model(images(4, size), training=False))
    if not np.isfinite(logits).all() or np.abs(logits).max() < 1e-3 or np.ptp(logits, axis=0).max() == 0:
        raise RuntimeError(f"{model.name}: logits vanish, blow up or ignore the input after calibration: {logits}")


def _all_layers(model):
    seen, stack = [], [model]
    while stack:
        layer = stack.pop()
        if any(layer is s for s in seen):
            continue
        seen.append(layer)
        stack.extend(getattr(layer, "layers", []) or [])
        inner = getattr(layer, "layer", None)  # tfmot's QuantizeWrapper
        if inner is not None:
            stack.append(inner)
    return seen


def make(name: str, size: int, work: str) -> dict:
    """Build, calibrate and save zoo model ``name``; its tf2onnx conversion beside it. Runs in a child."""
    import numpy as np

    model, suffix = build(name, size)
    for layer in _all_layers(model):
        # Dropout (and EfficientNet's drop-connect, a Dropout too) off: a training step's random masks cannot agree
        # between two runtimes, and the converter refuses the random op, saying so.
        if type(layer).__name__ == "Dropout":
            layer.rate = 0.0
    calibrate(model, size)
    stem = os.path.join(work, re.sub(r"\W+", "_", name))
    path = stem + suffix
    model.save(path)
    info = {"file": path, "params": int(sum(np.prod(w.shape) for w in model.weights))}
    try:
        info["tf2onnx"] = _tf2onnx(path, stem + ".tf2onnx.onnx")
    except Exception as e:  # noqa: BLE001 - the baseline's failure is a result, shown in the table
        info["tf2onnx_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    return info


def _tf2onnx(path: str, out: str) -> dict:
    """tf2onnx alone on the model's inference function (its own freezing, handlers and optimizers)."""
    import logging

    import tf2onnx

    logging.getLogger("tf2onnx").setLevel(logging.CRITICAL)
    function, signature = _inference(path)
    t = time.perf_counter()
    onnx_model, _ = tf2onnx.convert.from_function(function, input_signature=signature, opset=17, output_path=out)
    seconds = time.perf_counter() - t
    extra = [i.name for i in onnx_model.graph.input][len(signature):]
    if extra:
        # (EfficientNet's Normalization layer: tf2onnx leaves its mean and variance as graph inputs)
        raise ValueError(f"its model asks for {len(extra)} input(s) beyond the image, values TF held: "
                         + ", ".join(extra[:3]))
    import onnxruntime as ort

    try:
        ort.InferenceSession(out, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - ORT's message, shortened, is the finding
        # (ConvNeXt, keras_hub: tf2onnx leaves Keras 3's grouped convolutions as StatefulPartitionedCall nodes)
        missing = re.search(r"No Op registered for (\w+)", str(e))
        what = f"no ONNX op {missing.group(1)} (a TF op tf2onnx left as it was)" if missing else str(e)[-200:]
        raise ValueError(f"ONNX Runtime cannot load its model: {what}") from None
    return {"onnx": out, "seconds": seconds, **_graph_counts(onnx_model)}


def _inference(path: str):
    """(tf.function of the saved model in inference mode, its input signature)."""
    import tensorflow as tf

    from converters.keras_models import call_model, keras_input_signature, load_keras_file

    model, _ = load_keras_file(path)
    signature = keras_input_signature(model)
    return tf.function(lambda *args: call_model(model, args, training=False), input_signature=signature), signature


def _graph_counts(model) -> dict:
    types = [n.op_type for n in model.graph.node]
    return {"nodes": len(types), "transposes": types.count("Transpose")}


def graph_signature(model) -> str:
    """A digest of what ONNX Runtime computes from ``model``: every node's op, domain and attributes in order, with
    the graph's wiring by position and the initializers' bytes; node and value names left out."""
    import hashlib

    digest, ids = hashlib.sha256(), {}

    def value(name):
        return ids.setdefault(name, len(ids)) if name else -1

    for tensor in model.graph.initializer:
        value(tensor.name)
        digest.update(tensor.raw_data or tensor.SerializeToString())
    for i in model.graph.input:
        value(i.name)
    for node in model.graph.node:
        attributes = sorted((a.name, a.SerializeToString()) for a in node.attribute)
        digest.update(repr((node.domain, node.op_type, [value(x) for x in node.input], attributes)).encode())
        for out in node.output:
            value(out)
    digest.update(repr([value(o.name) for o in model.graph.output]).encode())
    return digest.hexdigest()


# ----------------------------------------------------------------------------------------------- the CLI

def convert(info: dict, graph: str, lowering: str, per_node: bool, work: str) -> dict:
    import onnx

    out = os.path.join(work, f"{os.path.basename(info['file']).rsplit('.', 1)[0]}.{graph}.{lowering}.onnx")
    # A training step is judged per node: end to end, a deep float step's last-bit differences flip ReLU masks and
    # spread through its training-mode batch norms (docs/verification.md); its end-to-end result is shown too.
    per_node = per_node or graph == "train"
    args = [sys.executable, "-m", "converters", "--keras", info["file"], "--lowering", lowering, "--output", out,
            "--verify"] + (["--verify-nodes"] if per_node else [])
    if graph == "train":
        args += ["--train-step", "--loss", "sparse_categorical_crossentropy", "--from-logits"]
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    t = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO)
    seconds = time.perf_counter() - t
    result = {"seconds": seconds, "returncode": proc.returncode, "traceback": "Traceback" in proc.stderr}
    if proc.returncode in (0, EXIT_VERIFY_FAILED) and os.path.exists(out):
        model = onnx.load(out)
        result.update(onnx=out, signature=graph_signature(model), **_graph_counts(model))
        before_nodes = proc.stdout.split("per-node verification")[0]
        end_to_end = any(line.strip() == "verification passed" for line in before_nodes.splitlines())
        if lowering == "integer":
            result["per_tensor"] = "passed" if "per-tensor verification passed" in proc.stdout else "FAILED"
            result["steps"] = _step_rows(proc.stdout)
        if per_node:
            result["per_node"] = "passed" if "per-node verification passed" in proc.stdout else "FAILED"
        if graph == "train":
            result["verdict"] = result["per_node"]
            if not end_to_end:
                failing = re.findall(r"FAIL: (\d+) of (\d+) outside", proc.stdout)
                result["end_to_end"] = f"{len(failing)} output(s) outside their bound end to end"
        else:
            result["verdict"] = "passed" if end_to_end else "FAILED"
    else:
        error = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
        result["verdict"] = "conversion failed: " + (error[0][len("error: "):][:160] if error else "see log")
    result["log_tail"] = (proc.stdout + proc.stderr)[-4000:]
    return result


def _step_rows(stdout: str) -> list:
    """The integer model's end-to-end step table rows: [(output, max steps, TF spread in steps, bound)]."""
    rows, inside = [], False
    for line in stdout.splitlines():
        if line.startswith("integer model: quantized outputs judged"):
            inside = True
            continue
        if inside and line.startswith("TF reference"):
            break
        cells = line.split()
        if inside and len(cells) >= 9 and cells[0] != "output":
            rows.append((cells[0], cells[2], cells[6], cells[7]))
    return rows


# ----------------------------------------------------------------------------------------------- timing

def time_runner(args) -> None:
    """A child's work: one runtime (TF with the saved model, or one ONNX file), every batch; prints JSON (ms)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_ops import median_ms

    result = {}
    if args.time_runner.endswith(".onnx"):
        import onnx
        import onnxruntime as ort

        import ort_ops

        so = ort_ops.session_options(intra_op_num_threads=args.threads, inter_op_num_threads=1)
        sess = ort.InferenceSession(onnx.load(args.time_runner).SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        for batch in args.batches:
            feed = {sess.get_inputs()[0].name: images(batch, args.size)}
            result[batch] = median_ms(lambda: sess.run(None, feed), args.repeat)
    else:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        run, _ = _inference(args.time_runner)
        for batch in args.batches:
            x = tf.constant(images(batch, args.size))
            result[batch] = median_ms(lambda: run(x), args.repeat)
    print(json.dumps(result), flush=True)


def timed(runners: dict, args, size: int) -> dict:
    """{label: {batch: ms}}, each runner in a process of its own, --passes passes in turn, fastest kept."""
    from bench_ops import fastest_in_children

    commands = {label: [sys.executable, os.path.abspath(__file__), "--time-runner", runner, "--threads",
                        str(args.threads), "--repeat", str(args.repeat), "--size", str(size),
                        "--batches", *map(str, args.batches)]
                for label, runner in runners.items()}
    return fastest_in_children(commands, args.passes,
                               dict(os.environ, PYTHONPATH=REPO, TF_ENABLE_ONEDNN_OPTS=args.tf_onednn))


# ----------------------------------------------------------------------------------------------- report

def _cpu() -> tuple:
    """(model name, /proc/cpuinfo's text or "")."""
    if not os.path.exists("/proc/cpuinfo"):
        return platform.processor(), ""
    text = open("/proc/cpuinfo").read()
    name = next((l.split(":", 1)[1].strip() for l in text.splitlines() if l.startswith("model name")), "")
    return name or platform.processor(), text


def default_onednn() -> str:
    """TF_ENABLE_ONEDNN_OPTS as TF 2.21 decides it when unset: oneDNN on CPUs with AVX-512, Eigen elsewhere."""
    return "1" if "avx512f" in _cpu()[1] else "0"


def machine(onednn: str) -> str:
    import onnxruntime as ort

    cpu, flags = _cpu()
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE"
    vnni = " VNNI" if "avx512_vnni" in flags else ""
    import tensorflow as tf

    kernels = "oneDNN" if onednn == "1" else "Eigen"
    return (f"{cpu} ({isa}{vnni}), {os.cpu_count()} logical CPUs; TensorFlow {tf.__version__} timed with its "
            f"{kernels} kernels (TF_ENABLE_ONEDNN_OPTS={onednn}), onnxruntime {ort.__version__}")


def table(rows: list, timing: dict, args) -> str:
    same_as = {(r["model"], r["graph"]): r.get("signature") for r in rows if r["label"] == "standard"}
    lines = ["| model | input | graph | lowering | convert s | nodes | Transposes | verify | "
             + " | ".join(f"ms batch {b}" for b in args.batches) + " |",
             "|---|---|---|---|---|---|---|---|" + "---|" * len(args.batches)]
    for r in rows:
        times = timing.get((r["model"], r["label"]), {})
        cells = []
        for b in args.batches:
            if b not in times:
                cells.append("-")
                continue
            tf_ms = timing.get((r["model"], "TF"), {}).get(b)
            ratio = f" ({times[b] / tf_ms:.2f}x TF)" if tf_ms and r["label"] != "TF" else ""
            cells.append(f"{times[b]:.2f}{ratio}")
        verdict = r.get("verdict", "-")
        if r["graph"] == "train" and "per_node" in r:
            verdict = f"per node {r['per_node']}" + (f" ({r['end_to_end']})" if "end_to_end" in r else ", end to end passed")
        elif "per_node" in r:
            verdict += f", per node {r['per_node']}"
        if "per_tensor" in r:
            steps = "; ".join(f"max {m} steps (TF spread {sp}, bound {b})" for _, m, sp, b in r.get("steps", []))
            verdict += f" end to end ({steps}), per quantized tensor {r['per_tensor']}"
        if r.get("traceback"):
            verdict += ", traceback printed"
        if r["label"] == "custom" and r.get("signature") and r["signature"] == same_as.get((r["model"], r["graph"])):
            verdict += " (the standard lowering's graph: names aside, the same nodes)"
        lines.append(f"| {r['model']} | {r.get('size', '-')} | {r['graph']} | {r['label']} | {r.get('seconds', 0):.1f} "
                     f"| {r.get('nodes', '-')} "
                     f"| {r.get('transposes', '-')} | {verdict} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--size", type=int, default=96)
    p.add_argument("--graphs", nargs="+", default=["inference", "train"], choices=("inference", "train"))
    p.add_argument("--lowerings", nargs="+", default=["custom", "standard", "integer"],
                   choices=("custom", "standard", "integer"), help="integer: the QAT (tfmot.*) models' inference only")
    p.add_argument("--per-node", action="store_true", help="also --verify-nodes (slower)")
    p.add_argument("--no-timing", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--tf-onednn", choices=("0", "1"), default=None,
                   help="TF's kernels when timed: 1 oneDNN, 0 Eigen (default: what TF picks on this CPU)")
    p.add_argument("--work", default=os.path.join(REPO, "build", "zoo"))
    p.add_argument("--markdown", help="write the table (with the machine line) to this file")
    p.add_argument("--json", help="write every result to this file")
    p.add_argument("--make", help=argparse.SUPPRESS)  # a child's job: build and save one model
    p.add_argument("--time-runner", help=argparse.SUPPRESS)  # a child's job: time one runtime
    args = p.parse_args(argv)
    if args.tf_onednn is None:
        args.tf_onednn = default_onednn()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.time_runner:
        time_runner(args)
        return 0
    os.makedirs(args.work, exist_ok=True)
    if args.make:
        print(json.dumps(make(args.make, args.size, args.work)), flush=True)
        return 0

    rows, timing, failed = [], {}, False
    for name in args.models:
        size = min(args.size, SIZE_CAP.get(name, args.size))
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--make", name, "--size", str(size),
                               "--work", args.work], capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=REPO))
        lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
        if proc.returncode != 0 or not lines:
            print(f"{name}: building failed\n{proc.stderr[-3000:]}", file=sys.stderr)
            rows.append({"model": name, "size": size, "graph": "-", "label": "-", "verdict": "build failed"})
            failed = True
            continue
        info = json.loads(lines[-1])
        runners = {"TF": info["file"]}
        for graph in args.graphs:
            for lowering in args.lowerings:
                if lowering == "integer" and (graph != "inference" or not name.startswith("tfmot.")):
                    continue  # an integer model is a QAT network's inference graph
                result = convert(info, graph, lowering, args.per_node, args.work)
                row = {"model": name, "size": size, "graph": graph, "label": lowering, **result}
                rows.append(row)
                failed |= result["verdict"] != "passed" or result.get("per_node", "passed") != "passed"
                failed |= result.get("per_tensor", "passed") != "passed"
                failed |= result["traceback"]
                print(f"{name} {graph} {lowering}: {result['verdict']} ({result['seconds']:.0f} s)", flush=True)
                if result["verdict"] != "passed":
                    print(result["log_tail"][-1500:], file=sys.stderr)
                if graph == "inference" and "onnx" in result:
                    runners[lowering] = result["onnx"]
        if "inference" in args.graphs:
            base = info.get("tf2onnx")
            rows.append({"model": name, "size": size, "graph": "inference", "label": "tf2onnx",
                         "verdict": "baseline" if base else "tf2onnx failed: " + info.get("tf2onnx_error", "")[:160],
                         **(base or {})})
            if base:
                runners["tf2onnx"] = base["onnx"]
        rows.append({"model": name, "size": size, "graph": "inference", "label": "TF", "verdict": "reference"})
        if not args.no_timing and "inference" in args.graphs:
            for label, ms in timed(runners, args, size).items():
                timing[name, label] = ms
                print(f"  {label}: " + ", ".join(f"batch {b} {v:.2f} ms" for b, v in ms.items()), flush=True)
    text = (f"Machine: {machine(args.tf_onednn)}; {args.threads} threads; input: the image size (square, 3 channels).\n\n"
            + table(rows, timing, args))
    print("\n" + text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "timing": {f"{k[0]}|{k[1]}": v for k, v in timing.items()}}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
