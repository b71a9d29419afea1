"""Issue-12 benchmark: tfmot's QAT MobileNetV2 (224x224) through both lowerings, against tf2onnx and TF.

    # from the repository root:
    PYTHONPATH=. python benchmarks/qat_mobilenet.py [--threads 2] [--batches 1 8] [--repeat 20] [--passes 2]
                                                    [--onednn default|on|off] [--fold-batch-norm]

The model is tfmot's ``quantize_model`` (default 8-bit scheme) of tf_keras' MobileNetV2 (alpha 1.0,
224x224x3, 1000 classes, ``weights=None``, seeded, one SGD step so that the ranges and moving statistics
are not their initial values), saved once under ``build/bench/`` and reused. For each of "ours, standard",
"ours, custom" (and, with ``--fold-batch-norm``, "ours, custom, BN folded") and "tf2onnx alone" it prints:
conversion time, ONNX node count, Transposes (and how many touch a node of our domain), the domain's
nodes, the largest |ORT - TF| of the logits and whether they are bit-identical; then the median time per
batch for TF (the SavedModel's signature in a tf.function) and for ONNX Runtime at the same thread count,
with each runtime's ratio to TF. Each runtime is timed in a process of its own (two runtimes' thread pools
in one process disturb each other on a small machine), the processes run --passes times in turn, and each
time shown is the fastest pass's median, so that a burst of background load cannot decide a ratio. Where
onnxruntime has the CUDA execution
provider it also times batches 1, 8 and 64 there, with the float model (the same MobileNetV2 without
quantization, converted by tf2onnx) as the reference the issue's goal is stated against.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(REPO, "build", "bench")
SHAPE = (224, 224, 3)
SEED = 1234


def _set_onednn(mode: str) -> None:
    if mode != "default":
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1" if mode == "on" else "0"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def build_models():
    """(quantized SavedModel dir, float SavedModel dir), made on first use."""
    import numpy as np
    import tensorflow as tf
    import tf_keras
    import tensorflow_model_optimization as tfmot

    qat_dir = os.path.join(CACHE, "qat_mobilenet_v2_224")
    float_dir = os.path.join(CACHE, "float_mobilenet_v2_224")
    if os.path.isdir(qat_dir) and os.path.isdir(float_dir):
        return qat_dir, float_dir
    spec = tf.TensorSpec((None,) + SHAPE, tf.float32, name="images")

    def save(model, path):
        @tf.function(input_signature=[spec])
        def serve(images):
            return {"logits": model(images, training=False)}

        tf.saved_model.save(model, path, signatures={"serving_default": serve})

    tf_keras.utils.set_random_seed(SEED)
    float_model = tf_keras.applications.MobileNetV2(input_shape=SHAPE, weights=None)
    save(float_model, float_dir)
    qat = tfmot.quantization.keras.quantize_model(float_model)
    rng = np.random.default_rng(SEED)
    images = rng.uniform(0, 1, (4,) + SHAPE).astype(np.float32)
    labels = rng.integers(0, 1000, 4).astype(np.int32)
    optimizer = tf_keras.optimizers.SGD(learning_rate=0.01)
    with tf.GradientTape() as tape:
        loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=False)(labels, qat(images, training=True))
    optimizer.apply_gradients(zip(tape.gradient(loss, qat.trainable_variables), qat.trainable_variables))
    save(qat, qat_dir)
    return qat_dir, float_dir


def convert_all(qat_dir: str, fold: bool):
    """[(label, model or error string, seconds)] for our lowerings and tf2onnx alone."""
    import converters
    import tf2onnx
    from tf2onnx import tf_loader

    rows = []
    variants = [("ours, standard", {"lowering": "standard"}), ("ours, custom", {"lowering": "custom"})]
    if fold:
        variants.append(("ours, custom, BN folded", {"lowering": "custom", "fold_batch_norm": True}))
    for label, kw in variants:
        t = time.perf_counter()
        try:
            model = converters.from_saved_model(qat_dir, **kw)
        except Exception as e:  # report and go on
            model = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        rows.append((label, model, time.perf_counter() - t))
    t = time.perf_counter()
    graph_def, ins, outs, renames = tf_loader.from_saved_model(
        qat_dir, None, None, "serve", ["serving_default"], return_tensors_to_rename=True
    )
    model, _ = tf2onnx.convert.from_graph_def(graph_def, input_names=ins, output_names=outs, opset=17,
                                             tensors_to_rename=renames)
    rows.append(("tf2onnx alone (QDQ)", model, time.perf_counter() - t))
    return rows


def describe(model) -> str:
    from ort_ops.schemas import DOMAIN

    nodes = list(model.graph.node)
    producers = {o: n for n in nodes for o in n.output}
    domain = [n for n in nodes if n.domain == DOMAIN]
    transposes = [n for n in nodes if n.op_type == "Transpose"]
    consumers = {}
    for n in nodes:
        for i in n.input:
            consumers.setdefault(i, []).append(n)

    boundary = {i.name for i in model.graph.input} | {o.name for o in model.graph.output}

    def touches_domain(t):
        if t.input[0] in boundary or t.output[0] in boundary:
            return False  # the NHWC graph input or output: a graph of NCHW convolutions needs it somewhere
        before = producers.get(t.input[0])
        after = consumers.get(t.output[0], [])
        return (before is not None and before.domain == DOMAIN) or any(c.domain == DOMAIN for c in after)

    kinds = {}
    for n in domain:
        kinds[n.op_type] = kinds.get(n.op_type, 0) + 1
    dom = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "none"
    return (f"{len(nodes)} nodes, {len(transposes)} Transpose ({sum(map(touches_domain, transposes))} inside the graph "
            f"next to a domain node); domain nodes: {dom}")


def session(model, providers, threads):
    import onnxruntime as ort
    import ort_ops

    so = ort_ops.session_options(intra_op_num_threads=threads, inter_op_num_threads=1)
    return ort.InferenceSession(model.SerializeToString(), so, providers=providers)


def timed_rounds(runners: dict, repeat: int) -> dict:
    """Median seconds per call of each runner, calls interleaved round by round after two warm-ups. A pause
    before each call lets the previous runtime's spinning worker threads go idle (TF's and ORT's thread
    pools spin after a call; on 2 cores they would take the next runtime's CPU)."""
    for fn in runners.values():
        fn()
        fn()
    times = {k: [] for k in runners}
    for _ in range(repeat):
        for k, fn in runners.items():
            time.sleep(0.05)
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def images(batch: int):
    """The input batch every process times: the same values in each."""
    import numpy as np

    return np.random.default_rng(SEED + batch).uniform(0, 1, (batch,) + SHAPE).astype(np.float32)


def time_runner(args) -> None:
    """A child's work: times one runtime (TF's SavedModel, or one ONNX file) per batch; prints JSON (ms)."""
    from bench_ops import median_ms  # the operator benchmark's timing loop, pauses and warm-ups included

    result = {}
    if args.time_runner == "TF":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        serve = tf.saved_model.load(build_models()[0]).signatures["serving_default"]
        for batch in args.batches:
            x = tf.constant(images(batch))
            result[batch] = median_ms(lambda: serve(images=x), args.repeat)
    else:
        import onnx

        sess = session(onnx.load(args.time_runner), ["CPUExecutionProvider"], args.threads)
        for batch in args.batches:
            feed = {sess.get_inputs()[0].name: images(batch)}
            result[batch] = median_ms(lambda: sess.run(None, feed), args.repeat)
    print(json.dumps(result), flush=True)


def timed_in_children(runners: dict, args) -> dict:
    """{label: {batch: ms}}: each runner ("TF", or an ONNX file) timed in a child process of its own,
    --passes times in turn, keeping each runner's fastest pass per batch."""
    from bench_ops import fastest_in_children

    commands = {label: [sys.executable, os.path.abspath(__file__), "--time-runner", runner, "--threads",
                        str(args.threads), "--repeat", str(args.repeat), "--onednn", args.onednn,
                        "--batches", *map(str, args.batches)]
                for label, runner in runners.items()}
    return fastest_in_children(commands, args.passes, dict(os.environ, PYTHONPATH=REPO))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--gpu-batches", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--onednn", choices=("default", "on", "off"), default="default")
    p.add_argument("--passes", type=int, default=2, help="timing passes over the runtimes; the fastest is shown")
    p.add_argument("--fold-batch-norm", action="store_true", help="also convert with fold_batch_norm=True")
    p.add_argument("--time-runner", help=argparse.SUPPRESS)  # a child's job: "TF" or an ONNX file to time
    args = p.parse_args(argv)
    _set_onednn(args.onednn)
    if args.time_runner:
        time_runner(args)
        return 0

    import logging

    import numpy as np
    import onnxruntime as ort
    import tensorflow as tf

    logging.getLogger("tf2onnx").setLevel(logging.CRITICAL)
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
    flags = open("/proc/cpuinfo").read()
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE"
    print(f"CPU: {cpu} ({isa}), {os.cpu_count()} logical CPUs; threads used: {args.threads}")
    print(f"TensorFlow {tf.__version__} (TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset: TF default')}), "
          f"onnxruntime {ort.__version__}; median of {args.repeat} runs, each runtime in a process of its own, "
          f"fastest of {args.passes} passes\n")

    qat_dir, float_dir = build_models()
    rows = convert_all(qat_dir, args.fold_batch_norm)
    loaded = tf.saved_model.load(qat_dir)
    serve = loaded.signatures["serving_default"]
    rng = np.random.default_rng(SEED)
    print(f"{'model':26s} {'convert s':>9s}  graph")
    for label, model, secs in rows:
        print(f"{label:26s} {secs:9.1f}  {model if isinstance(model, str) else describe(model)}")
    models = [(label, m) for label, m, _ in rows if not isinstance(m, str)]

    from converters.verification import same_bits

    print(f"\nCPU: ms per batch (ratio to TF); logits against TF")
    import onnx

    files = {}
    for label, model in models:
        files[label] = os.path.join(CACHE, re.sub(r"\W+", "_", label).strip("_") + ".onnx")
        onnx.save(model, files[label])
    checks = {}
    for batch in args.batches:
        x = images(batch)
        ref = serve(images=tf.constant(x))["logits"].numpy()
        for label, model in models:
            sess = session(model, ["CPUExecutionProvider"], args.threads)
            out = sess.run(None, {sess.get_inputs()[0].name: x})[0]
            checks[label, batch] = (float(np.max(np.abs(out - ref))), bool(same_bits(ref, out, nan_payloads=True).all()))
    med = timed_in_children({"TF": "TF", **files}, args)
    for batch in args.batches:
        for k in med:
            v, tf_v = med[k][batch], med["TF"][batch]
            err, exact = checks.get((k, batch), (0.0, True))
            extra = "" if k == "TF" else f"  ({v / tf_v:.2f}x TF)  max|err| {err:.3g}{', bit-identical' if exact else ''}"
            print(f"  batch {batch:3d}  {k:26s} {v:9.2f} ms{extra}")

    if "CUDAExecutionProvider" in ort.get_available_providers():
        import tf2onnx
        from tf2onnx import tf_loader

        gd, ins, outs, ren = tf_loader.from_saved_model(float_dir, None, None, "serve", ["serving_default"],
                                                        return_tensors_to_rename=True)
        float_model, _ = tf2onnx.convert.from_graph_def(gd, input_names=ins, output_names=outs, opset=17,
                                                       tensors_to_rename=ren)
        print("\nCUDA EP: ms per batch (ratio to the float model)")
        gpu_models = [("float model (tf2onnx)", float_model)] + models
        for batch in args.gpu_batches:
            x = rng.uniform(0, 1, (batch,) + SHAPE).astype(np.float32)
            runners = {}
            for label, model in gpu_models:
                sess = session(model, ["CUDAExecutionProvider", "CPUExecutionProvider"], args.threads)
                feed = {sess.get_inputs()[0].name: x}
                runners[label] = (lambda s, f: lambda: s.run(None, f))(sess, feed)
            med = timed_rounds(runners, args.repeat)
            base = med["float model (tf2onnx)"]
            for k, v in med.items():
                print(f"  batch {batch:3d}  {k:26s} {v * 1e3:9.2f} ms  ({v / base:.2f}x float)")
    else:
        print("\nCUDA EP: not available in this onnxruntime (no GPU figures)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, REPO)
    sys.exit(main())
