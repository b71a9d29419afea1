"""Per-node verification on the hard cases: real training steps whose end-to-end verdict is chaos (issue 32).

    # from the repository root:
    PYTHONPATH=. python -m tools.verify_nodes_cases [--cases NAME ...] [--seeds 0 1 2] [--lowerings custom standard]

Each case goes through the CLI as a user would (``python -m converters ... --verify-nodes --no-tf-spread``), one
process per run, and the table gives the exit status, the values checked, those held bit for bit, the failures
and the wall time. The cases:

* ``tfmot_mobilenet``, ``tfmot_resnet``: tfmot ``quantize_model`` of tf_keras MobileNet (alpha 0.25, 64x64) and of
  a small Conv-BN-ReLU ResNet, saved as ``.h5``: ``--keras FILE --train-step`` (and ``_sgd``: with
  ``--optimizer sgd``);
* ``keras3_qat_cnn``: the Keras 3 CNN quantized with ``keras.quantizers.fake_quant_with_min_max_vars``
  (models/keras3_qat.py, ``--import models.keras3_qat``), ``--train-step`` with and without SGD;
* ``keras3_mobilenet``, ``keras3_mobilenet_v2``: Keras 3 MobileNet / MobileNetV2 float (64x64), ``--train-step``;
* the bundled SavedModels' signatures: the QAT and float MobileNetV2 steps, the saliency graphs, the Keras 3 step.

Not part of the suite (about 30 minutes for everything at three seeds); docs/verification.md records a run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"
STEP = ["--train-step", "--loss", "sparse_categorical_crossentropy", "--from-logits"]
SGD = ["--optimizer", "sgd", "--learning-rate", "0.01"]

_BUILD = r'''
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
kind, path = sys.argv[1], sys.argv[2]
if kind.startswith("tfmot"):
    import tf_keras
    import tensorflow_model_optimization as tfmot
    tf_keras.utils.set_random_seed(0)
    L = tf_keras.layers
    if kind == "tfmot_mobilenet":
        base = tf_keras.applications.MobileNet(input_shape=(64, 64, 3), alpha=0.25, dropout=0.0, weights=None,
                                               classes=10, classifier_activation=None)
    else:
        def block(x, f, stride=1):
            y = L.Conv2D(f, 3, strides=stride, padding="same", use_bias=False)(x)
            y = L.ReLU()(L.BatchNormalization()(y))
            y = L.BatchNormalization()(L.Conv2D(f, 3, padding="same", use_bias=False)(y))
            if stride != 1 or x.shape[-1] != f:
                x = L.BatchNormalization()(L.Conv2D(f, 1, strides=stride, use_bias=False)(x))
            return L.ReLU()(L.Add()([x, y]))
        inputs = tf_keras.Input((32, 32, 3))
        x = L.ReLU()(L.BatchNormalization()(L.Conv2D(16, 3, padding="same", use_bias=False)(inputs)))
        x = block(block(block(x, 16), 32, 2), 64, 2)
        base = tf_keras.Model(inputs, L.Dense(10)(L.GlobalAveragePooling2D()(x)))
    tfmot.quantization.keras.quantize_model(base).save(path)
elif kind == "keras3_qat_cnn":
    from models.keras3_qat import build_model
    build_model().save(path)
else:
    import keras
    keras.utils.set_random_seed(0)
    app = {"keras3_mobilenet": keras.applications.MobileNet, "keras3_mobilenet_v2": keras.applications.MobileNetV2}[kind]
    extra = {"alpha": 0.25, "dropout": 0.0} if kind == "keras3_mobilenet" else {"alpha": 0.35}
    app(input_shape=(64, 64, 3), weights=None, classes=10, classifier_activation=None, **extra).save(path)
'''


def _keras_cases(tmp: Path) -> dict:
    """name -> (builder kind, file, extra CLI arguments)."""
    files = {"tfmot_mobilenet": "h5", "tfmot_resnet": "h5", "keras3_qat_cnn": "keras", "keras3_mobilenet": "keras",
             "keras3_mobilenet_v2": "keras"}
    cases = {}
    for kind, ext in files.items():
        path = tmp / f"{kind}.{ext}"
        extra = ["--import", "models.keras3_qat"] if kind == "keras3_qat_cnn" else []
        cases[kind] = (kind, path, ["--keras", str(path), *extra, *STEP])
        if kind in ("tfmot_mobilenet", "tfmot_resnet", "keras3_qat_cnn"):
            cases[kind + "_sgd"] = (kind, path, ["--keras", str(path), *extra, *STEP, *SGD])
    return cases


def _saved_model_cases() -> dict:
    def sm(name, key):
        return (None, None, ["--saved-model", str(MODELS / name / "saved_model"), "--signature-key", key])

    return {
        "mobilenet_v2_qat_train_step": sm("mobilenet_v2_qat", "train_step"),
        "mobilenet_v2_float_train_step": sm("mobilenet_v2_float", "train_step"),
        "mobilenet_v2_qat_saliency": sm("mobilenet_v2_qat", "saliency"),
        "keras3_qat_train_step": sm("keras3_qat", "train_step"),
        "keras3_qat_saliency": sm("keras3_qat", "saliency"),
    }


def _env():
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_ENABLE_ONEDNN_OPTS", None)  # the CLI pins Eigen for verification itself
    return env


def run_case(args, lowering, seed, tmp: Path) -> dict:
    report = tmp / "report.json"
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "converters", *args, "--lowering", lowering, "--seed", str(seed),
           "--output", str(tmp / "model.onnx"), "--verify-nodes", "--no-tf-spread", "--verify-json", str(report)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1800)
    row = {"rc": proc.returncode, "seconds": time.perf_counter() - start}
    if report.exists():
        data = json.loads(report.read_text())
        row.update(checked=data["checked"], exact=sum(1 for c in data["checks"] if c["judged_as"] == "bits"),
                   failed=sum(1 for c in data["checks"] if not c["ok"]), nodes=data["nodes"])
        first = data.get("first_failure")
        if first:
            row["first"] = f"{first['tf_op']} ({first['tf_type']})"
    else:
        row["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
    return row


def main(argv=None) -> int:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        cases = {**_keras_cases(tmp), **_saved_model_cases()}
        p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        p.add_argument("--cases", nargs="+", choices=sorted(cases), default=list(cases))
        p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
        p.add_argument("--lowerings", nargs="+", choices=("custom", "standard"), default=["custom", "standard"])
        args = p.parse_args(argv)
        built = set()
        rows = []
        print("case | lowering | seed | exit | nodes | values checked | bit for bit | failed | s")
        print("---|---|---|---|---|---|---|---|---")
        for name in args.cases:
            kind, path, cli = cases[name]
            if kind and kind not in built:
                subprocess.run([sys.executable, "-c", _BUILD, kind, str(path)], cwd=ROOT, env=_env(), check=True,
                               capture_output=True)
                built.add(kind)
            for lowering in args.lowerings:
                for seed in args.seeds:
                    row = run_case(cli, lowering, seed, tmp)
                    rows.append((name, lowering, seed, row))
                    detail = row.get("error") or row.get("first", "")
                    print(f"{name} | {lowering} | {seed} | {row['rc']} | {row.get('nodes', '-')} | "
                          f"{row.get('checked', '-')} | {row.get('exact', '-')} | {row.get('failed', '-')} | "
                          f"{row['seconds']:.0f}" + (f" | {detail}" if detail else ""), flush=True)
        failed = [r for r in rows if r[3]["rc"] != 0]
        print(f"\n{len(rows) - len(failed)} of {len(rows)} runs exit 0")
        return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
