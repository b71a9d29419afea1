"""Converts real networks beyond the bundled examples and compares them with TensorFlow: tf_keras.applications
models, wrapped by tfmot's ``quantize_model`` where tfmot supports them (and as float models), through both
lowerings. Not part of the suite (it takes 10-30 minutes); docs/applications.md records a run.

    # from the repository root:
    PYTHONPATH=. python -m tools.probe_applications [--models MobileNet ResNet50 ...] [--graphs inference train saliency]

For each model: seeded weights, one SGD step in TF (so that batch-norm statistics and quantization ranges
move off their initial values), then for each graph and lowering: the conversion time and node count, and
against TF (Eigen kernels, pinned here):
* inference (``training=False``): ``converters.verify``'s judgement (bit-exact quantization outputs, a float
  tolerance otherwise) and the number of differing outputs;
* train: one training step (``models.graphs.ClassifierGraphs``), converted before TF runs it (the step
  assigns variables), its loss in both runtimes and the median normwise error of the gradients;
* saliency: d(top class score)/d(images), normwise.
Dropout is off (rate 0): a training step's random masks cannot agree between two runtimes.

How to read the training steps: a quantized network's training step amplifies the last-bit differences of the
convolutions (ORT's and TF's sum in different orders) into whole grid steps wherever a value sits on a
quantizer's rounding boundary, and its training-mode batch norms spread each such flip over a channel. Deep
quantized networks at their initial ranges are chaotic under this: ``--tf-spread`` also runs TF with its oneDNN
kernels and prints how far TF's two kernel sets are apart, which is the yardstick for ORT's distance.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # noqa: E402

SHAPE = (64, 64, 3)
CLASSES = 10
BATCH = 4


def _builders():
    import tf_keras
    from tf_keras.src.applications import efficientnet

    apps = tf_keras.applications
    common = dict(weights=None, classes=CLASSES, classifier_activation=None)
    return {
        "MobileNet": lambda: apps.MobileNet(input_shape=SHAPE, alpha=0.25, dropout=0.0, **common),
        "MobileNetV2": lambda: apps.MobileNetV2(input_shape=SHAPE, alpha=0.35, **common),
        "MobileNetV3Small": lambda: apps.MobileNetV3Small(input_shape=SHAPE, dropout_rate=0.0, **common),
        "ResNet50": lambda: apps.ResNet50(input_shape=SHAPE, **common),
        "ResNet50V2": lambda: apps.ResNet50V2(input_shape=SHAPE, **common),
        "DenseNet121": lambda: apps.DenseNet121(input_shape=SHAPE, **common),
        # EfficientNetB0 passes its own dropout rates: the builder it wraps takes them.
        "EfficientNetB0": lambda: efficientnet.EfficientNet(1.0, 1.0, 224, 0.0, drop_connect_rate=0.0,
                                                            model_name="efficientnetb0", input_shape=SHAPE, **common),
        "NASNetMobile": lambda: apps.NASNetMobile(input_shape=SHAPE, **common),
        "Xception": lambda: apps.Xception(input_shape=(71, 71, 3), **common),
        "InceptionV3": lambda: apps.InceptionV3(input_shape=(75, 75, 3), **common),
    }


def build(name: str, quantized: bool, seed: int = 0):
    """The model, one SGD step taken; None (with the reason) when tfmot cannot quantize it."""
    import tensorflow as tf
    import tf_keras
    import tensorflow_model_optimization as tfmot

    tf_keras.utils.set_random_seed(seed)
    model = _builders()[name]()
    if quantized:
        try:
            model = tfmot.quantization.keras.quantize_model(model)
        except Exception as e:  # tfmot's own limits (unsupported layers), not ours
            return None, f"tfmot cannot quantize it: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
    images, labels = inputs(model, seed)
    optimizer = tf_keras.optimizers.SGD(0.01)
    loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(images, training=True))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return model, ""


def inputs(model, seed: int = 0):
    rng = np.random.default_rng(seed)
    images = rng.uniform(0.0, 1.0, (BATCH,) + tuple(model.input_shape[1:])).astype(np.float32)
    return images, (np.arange(BATCH) % CLASSES).astype(np.int32)


def _feed(onnx_model, values):
    initialized = {t.name for t in onnx_model.graph.initializer}
    names = [i.name for i in onnx_model.graph.input if i.name not in initialized]
    return dict(zip(names, values))


def probe_inference(name, quantized, model, lowerings):
    import converters
    from converters.verification import verify_keras

    images, _ = inputs(model)
    for lowering in lowerings:
        start = time.perf_counter()
        try:
            onnx_model = converters.from_keras(model, lowering=lowering)
            seconds = time.perf_counter() - start
            report = verify_keras(model, onnx_model, inputs=[images], print_table=False)
        except Exception as e:
            yield f"{name:16s} {_kind(quantized):9s} inference {lowering:8s} FAILED {type(e).__name__}: {str(e)[:400]}"
            continue
        differing = sum(c.n_differing for c in report.outputs)
        worst = max(c.max_abs_err for c in report.outputs)
        yield (f"{name:16s} {_kind(quantized):9s} inference {lowering:8s} {len(onnx_model.graph.node):6d} nodes "
               f"{seconds:5.1f} s  {'ok' if report.ok else 'OUTSIDE TOLERANCE'}: {differing} outputs differ, "
               f"max |err| {worst:.2g}")


def probe_gradients(name, quantized, model, lowerings, graphs):
    import tensorflow as tf

    import converters
    from converters.verification import normwise_error, run_onnx
    from models.graphs import ClassifierGraphs
    from models.tfmot_models import loss_fn

    functions = ClassifierGraphs(model, tuple(model.input_shape[1:]), loss_fn, train_batch=BATCH)
    images, labels = inputs(model)
    chosen = [g for g in (("train", functions.train_step, [images, labels]),
                          ("saliency", functions.saliency, [images])) if g[0] in graphs]
    for graph, fn, args in chosen:
        concrete = fn.get_concrete_function()
        converted = {}
        for lowering in lowerings:  # before TF runs the step: it assigns the variables the conversion freezes
            start = time.perf_counter()
            try:
                converted[lowering] = (converters.from_concrete_function(concrete, lowering=lowering),
                                       time.perf_counter() - start)
            except Exception as e:
                yield f"{name:16s} {_kind(quantized):9s} {graph:9s} {lowering:8s} FAILED {type(e).__name__}: {str(e)[:400]}"
        expected = {k: v.numpy() for k, v in concrete(*[tf.constant(a) for a in args]).items()}
        for lowering, (onnx_model, seconds) in converted.items():
            got = run_onnx(onnx_model, _feed(onnx_model, args))
            errors = {k: normwise_error(expected[k], got[k]) for k in expected if k.startswith("grad_") or k == "saliency"}
            head = f"{name:16s} {_kind(quantized):9s} {graph:9s} {lowering:8s} {len(onnx_model.graph.node):6d} nodes {seconds:5.1f} s "
            if graph == "train":
                yield (head + f" loss TF {expected['loss']:.6f} ORT {got['loss']:.6f}; gradients normwise: median "
                       f"{np.median(list(errors.values())):.1e}, max {max(errors.values()):.1e}")
            else:
                yield head + f" saliency normwise {errors['saliency']:.1e}, logits bit-identical: " \
                             f"{np.array_equal(expected['logits'], got['logits'])}"


def tf_spread(name: str, quantized: bool) -> str:
    """The training step's loss and gradients in TF with Eigen against TF with oneDNN (two processes)."""
    import tempfile

    outputs = {}
    for onednn in ("0", "1"):
        path = os.path.join(tempfile.gettempdir(), f"probe_applications_{os.getpid()}_{onednn}.npz")
        env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=onednn)
        code = ("import sys, numpy as np, tensorflow as tf; from tools.probe_applications import build, inputs; "
                "from models.graphs import ClassifierGraphs; from models.tfmot_models import loss_fn; "
                f"m, _ = build({name!r}, {quantized}); i, l = inputs(m); "
                "f = ClassifierGraphs(m, tuple(m.input_shape[1:]), loss_fn, train_batch=len(i)).train_step; "
                "r = f(tf.constant(i), tf.constant(l)); np.savez(sys.argv[1], **{k: v.numpy() for k, v in r.items()})")
        subprocess.run([sys.executable, "-c", code, path], env=env, check=True, capture_output=True)
        outputs[onednn] = dict(np.load(path))
        os.remove(path)
    from converters.verification import normwise_error

    eigen, onednn = outputs["0"], outputs["1"]
    errors = [normwise_error(eigen[k], onednn[k]) for k in eigen if k.startswith("grad_")]
    return (f"{name:16s} {_kind(quantized):9s} train     TF Eigen vs TF oneDNN: loss {eigen['loss']:.6f} vs "
            f"{onednn['loss']:.6f}; gradients normwise: median {np.median(errors):.1e}, max {max(errors):.1e}")


def _kind(quantized: bool) -> str:
    return "quantized" if quantized else "float"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(_builders()), choices=list(_builders()))
    parser.add_argument("--graphs", nargs="+", default=["inference"], choices=["inference", "train", "saliency"])
    parser.add_argument("--lowerings", nargs="+", default=["custom", "standard"], choices=["custom", "standard"])
    parser.add_argument("--float-only", action="store_true")
    parser.add_argument("--quantized-only", action="store_true")
    parser.add_argument("--tf-spread", action="store_true", help="also TF Eigen against TF oneDNN (train graphs)")
    args = parser.parse_args(argv)
    failed = False
    for name in args.models:
        for quantized in (True, False):
            if (quantized and args.float_only) or (not quantized and args.quantized_only):
                continue
            model, why = build(name, quantized)
            if model is None:
                print(f"{name:16s} {_kind(quantized):9s} {why}", flush=True)
                continue
            lines = []
            if "inference" in args.graphs:
                lines += probe_inference(name, quantized, model, args.lowerings)
            lines += probe_gradients(name, quantized, model, args.lowerings, args.graphs)
            for line in lines:
                failed |= "FAILED" in line or "OUTSIDE" in line
                print(line, flush=True)
            if args.tf_spread and "train" in args.graphs:
                print(tf_spread(name, quantized), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
