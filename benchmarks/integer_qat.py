"""Issue-35 benchmark: a QAT MobileNetV2 as an integer model, against TF, the exact float lowering, tf2onnx and LiteRT.

    # from the repository root, in the test environment plus the bench extra (pip install ".[test,bench]"):
    PYTHONPATH=. python benchmarks/integer_qat.py [--models example 224] [--threads 2] [--batches 1 8]
                                                   [--repeat 20] [--passes 2] [--onednn default|on|off]

Models: ``example``, the trained QAT MobileNetV2 of models/ (alpha 0.35, 96x96, 97.5% on scikit-learn's held-out
digits), judged on those 360 digits; ``224``, tfmot's ``quantize_model`` of tf_keras' MobileNetV2 (alpha 1.0,
224x224, 1000 classes, benchmarks/qat_mobilenet.py's, one SGD step from random weights), judged on 32 crops of
scikit-learn's sample photographs. Runtimes, each in a process of its own, the same inputs and threads:

* TF: the SavedModel's signature (fake quantization simulated in float), TF's kernels as ``--onednn`` says;
* ours, custom: the exact float simulation (converters, lowering="custom", the domain's kernels);
* ours, integer: lowering="integer" on ONNX Runtime's CPU provider (its QDQ fusions);
* tf2onnx: tf2onnx 1.17's QDQ model of the same SavedModel on ONNX Runtime;
* LiteRT: TFLiteConverter with Optimize.DEFAULT on the same SavedModel (an int8 model), ai-edge-litert's
  interpreter with its default XNNPACK delegate.

Printed: the median ms per batch at each batch size (the fastest of ``--passes`` passes), after a 50 ms pause per
call and back to back, and the ratio to TF; how
many convolutions ONNX Runtime fused (QLinearConv in its optimized graph, against the Conv of the model); and the
logits against TF's, in TF's logits quantization steps: max, share identical, share within one step, top-1
agreement with TF, and accuracy where there are labels. benchmarks/RESULTS.md keeps the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
CACHE = os.path.join(REPO, "build", "bench", "integer")
RUNTIMES = ("TF", "ours, custom", "ours, integer", "tf2onnx", "LiteRT")
# Each batch is timed twice: after a 50 ms pause per call (a server between requests: the CPU and its caches
# cool, the worker threads sleep), and back to back (a steady stream), where this VM's timings are 2-3x lower.
BACK_TO_BACK = " back to back"
BACK_TO_BACK_CALLS = 5


def saved_model(which: str) -> str:
    if which == "example":
        return os.path.join(REPO, "models", "mobilenet_v2_qat", "saved_model")
    from qat_mobilenet import build_models

    return build_models()[0]


def judged_inputs(which: str):
    """(images, labels or None) the logits are judged on."""
    from models import data

    if which == "example":
        split = data.digits(96)
        return split.test_images, split.test_labels
    return data.photographs(32, 224), None


def timing_images(which: str, batch: int):
    import numpy as np

    size = 96 if which == "example" else 224
    return np.random.default_rng(1234 + batch).uniform(0, 1, (batch, size, size, 3)).astype(np.float32)


def build(which: str) -> dict:
    """{runtime: file} for the ONNX and LiteRT models of ``which`` (made on first use, under build/bench/integer)."""
    import onnx

    os.makedirs(CACHE, exist_ok=True)
    path = saved_model(which)
    files = {label: os.path.join(CACHE, f"{which}_{name}") for label, name in
             (("ours, custom", "custom.onnx"), ("ours, integer", "integer.onnx"), ("tf2onnx", "tf2onnx.onnx"),
              ("LiteRT", "litert.tflite"))}
    if all(os.path.exists(f) for f in files.values()):
        return files
    import tensorflow as tf
    import tf2onnx
    from tf2onnx import tf_loader

    import converters

    converters.from_saved_model(path, lowering="custom", output_path=files["ours, custom"])
    converters.from_saved_model(path, lowering="integer", output_path=files["ours, integer"])
    graph_def, ins, outs, renames = tf_loader.from_saved_model(path, None, None, "serve", ["serving_default"],
                                                              return_tensors_to_rename=True)
    model, _ = tf2onnx.convert.from_graph_def(graph_def, input_names=ins, output_names=outs, opset=17,
                                             tensors_to_rename=renames)
    onnx.save(model, files["tf2onnx"])
    converter = tf.lite.TFLiteConverter.from_saved_model(path)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    with open(files["LiteRT"], "wb") as f:
        f.write(converter.convert())
    return files


def runner(runtime: str, which: str, file: str, threads: int):
    """images -> logits, for one runtime."""
    if runtime == "TF":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        loaded = tf.saved_model.load(saved_model(which))
        serve = loaded.signatures["serving_default"]
        name = list(serve.structured_input_signature[1])[0]
        return lambda x: serve(**{name: tf.constant(x)})["logits"].numpy(), loaded
    if runtime == "LiteRT":
        from ai_edge_litert.interpreter import Interpreter

        interpreter = Interpreter(model_path=file, num_threads=threads)
        state = {"batch": None}
        index_in = interpreter.get_input_details()[0]["index"]

        def run(x):
            if state["batch"] != len(x):
                interpreter.resize_tensor_input(index_in, list(x.shape))
                interpreter.allocate_tensors()
                state["batch"] = len(x)
            interpreter.set_tensor(index_in, x)
            interpreter.invoke()
            return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])

        return run, interpreter
    import onnxruntime as ort

    import ort_ops

    options = ort_ops.session_options(intra_op_num_threads=threads, inter_op_num_threads=1)
    session = ort.InferenceSession(file, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x})[0], session


def child(args) -> None:
    """One runtime's work in its own process: times per batch, and the judged logits saved to --logits."""
    import numpy as np

    from bench_ops import median_ms
    from models import data

    run, keep = runner(args.child, args.models[0], args.file, args.threads)
    times = {}
    for batch in args.batches:
        x = timing_images(args.models[0], batch)
        times[batch] = median_ms(lambda: run(x), args.repeat)
        times[f"{batch}{BACK_TO_BACK}"] = median_ms(lambda: run(x), BACK_TO_BACK_CALLS * args.repeat, pause=0)
    if args.logits:
        images, _ = judged_inputs(args.models[0])
        # LiteRT's interpreter is resized per batch size; batches of 8 keep it to one size.
        np.save(args.logits, data.in_batches(run, images, batch=8))
    del keep
    print(json.dumps(times), flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["example", "224"], choices=("example", "224"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--onednn", choices=("default", "on", "off"), default="default")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--file", help=argparse.SUPPRESS)
    p.add_argument("--logits", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.onednn != "default":
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1" if args.onednn == "on" else "0"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.child:
        child(args)
        return 0
    import logging

    import numpy as np
    import onnx
    import onnxruntime as ort

    from bench_ops import fastest_in_children
    from converters.integer import read_summary
    from converters.integer.fusion import optimized_op_counts
    from converters.integer.steps import judge_steps

    logging.getLogger("tf2onnx").setLevel(logging.CRITICAL)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
               platform.processor())
    flags = open("/proc/cpuinfo").read()
    isa = ("AVX-512 VNNI" if "avx512_vnni" in flags else "AVX-512" if "avx512f" in flags
           else "AVX-VNNI" if "avx_vnni" in flags else "AVX2" if "avx2" in flags else "SSE")
    import tensorflow as tf

    print(f"CPU: {cpu} ({isa}), {os.cpu_count()} logical CPUs; threads: {args.threads}")
    print(f"TensorFlow {tf.__version__} (TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset: TF default')}), "
          f"onnxruntime {ort.__version__}; median of {args.repeat} runs per batch, each runtime in a process of its "
          f"own, fastest of {args.passes} passes")
    for which in args.models:
        files = build(which)
        integer = onnx.load(files["ours, integer"])
        step = read_summary(integer)[1]["logits"]
        convs = sum(n.op_type == "Conv" for n in integer.graph.node)
        fused = optimized_op_counts(integer)
        t2o = optimized_op_counts(onnx.load(files["tf2onnx"]))
        t2o_convs = sum(n.op_type == "Conv" for n in onnx.load(files["tf2onnx"]).graph.node)
        logits_dir = os.path.join(CACHE, f"{which}_logits")
        os.makedirs(logits_dir, exist_ok=True)
        commands = {}
        for runtime in RUNTIMES:
            commands[runtime] = [sys.executable, os.path.abspath(__file__), "--child", runtime, "--models", which,
                                 "--file", files.get(runtime, ""), "--threads", str(args.threads), "--repeat",
                                 str(args.repeat), "--onednn", args.onednn, "--batches", *map(str, args.batches),
                                 "--logits", os.path.join(logits_dir, runtime.replace(",", "").replace(" ", "_") + ".npy")]
        times = fastest_in_children(commands, args.passes, dict(os.environ, PYTHONPATH=REPO))
        _, labels = judged_inputs(which)
        logits = {r: np.load(os.path.join(logits_dir, r.replace(",", "").replace(" ", "_") + ".npy")) for r in RUNTIMES}
        print(f"\n{which}: {saved_model(which)}")
        print(f"  ONNX Runtime fused: ours, integer QLinearConv {fused.get('QLinearConv', 0)}/{convs}, float Conv "
              f"left {fused.get('Conv', 0) + fused.get('FusedConv', 0)}; tf2onnx QLinearConv "
              f"{t2o.get('QLinearConv', 0)}/{t2o_convs}, float Conv left {t2o.get('Conv', 0) + t2o.get('FusedConv', 0)}")
        columns = list(args.batches) + [f"{b}{BACK_TO_BACK}" for b in args.batches]
        header = "  " + f"{'runtime':15s}" + "".join(f" {'batch ' + str(b):>16s}" for b in args.batches)
        header += "".join(f" {'b2b ' + str(b):>16s}" for b in args.batches)
        header += "   logits vs TF (steps of TF's logits grid, " + f"{len(logits['TF'])} images)"
        print(header)
        for runtime in RUNTIMES:
            cells = "".join(f" {times[runtime][b]:8.2f} ms {times['TF'][b] / times[runtime][b]:5.1f}x"
                            for b in columns)
            if runtime == "TF":
                judged = "-"
                if labels is not None:
                    judged = f"accuracy {100 * np.mean(logits['TF'].argmax(1) == labels):.1f}%"
            else:
                c = judge_steps("logits", logits["TF"], logits[runtime], step)
                judged = (f"max {c.max_steps:g}, identical {100 * c.identical:.1f}%, within 1 {100 * c.within_one:.1f}%,"
                          f" top-1 as TF {100 * c.top1:.1f}%")
                if labels is not None:
                    judged += f", accuracy {100 * np.mean(logits[runtime].argmax(1) == labels):.1f}%"
            print(f"  {runtime:15s}{cells}   {judged}")
        print("  (Nx: TF's time over the runtime's: above 1 is faster than TF; batch N: after a 50 ms pause per call, "
              "b2b N: back to back)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, REPO)
    sys.exit(main())
