"""Command line: convert a SavedModel, a GraphDef or a Keras file to ONNX, optionally verifying it.

  python -m converters --saved-model DIR [--signature-key K] [--tag T] --output OUT.onnx
  python -m converters --graphdef FILE.pb --inputs a:0,b:0 --outputs y:0 --output OUT.onnx
  python -m converters --keras FILE.keras --output OUT.onnx
  common: --opset N (17) --lowering custom|standard --verify [--seed S]
  state (SavedModel and Keras sources): --variable-update-outputs --trainable-inputs

Exit status: 0 on success; 1 when conversion fails (unconverted ops are listed one per line);
2 for bad arguments; 3 when --verify finds an output outside its tolerance.
"""
from __future__ import annotations

import argparse
import os
import sys

EXIT_CONVERSION_FAILED = 1
EXIT_VERIFY_FAILED = 3


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m converters", description=__doc__.split("\n\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--saved-model", metavar="DIR", help="SavedModel directory")
    source.add_argument("--graphdef", metavar="FILE.pb", help="frozen or unfrozen GraphDef; needs --inputs/--outputs")
    source.add_argument("--keras", metavar="FILE", help="Keras model file (.keras or .h5), loaded with tf_keras")
    p.add_argument("--signature-key", default="serving_default", help="SavedModel signature (default serving_default)")
    p.add_argument("--tag", default=None, help="SavedModel tag set, comma separated (default: serve)")
    p.add_argument("--inputs", help="GraphDef input tensor names, comma separated (a:0,b:0)")
    p.add_argument("--outputs", help="GraphDef output tensor names, comma separated")
    p.add_argument("--output", required=True, metavar="OUT.onnx", help="where to write the ONNX model")
    p.add_argument("--opset", type=int, default=17, help="ONNX opset (default 17)")
    p.add_argument("--lowering", choices=("custom", "standard"), default="custom")
    p.add_argument(
        "--variable-update-outputs", action="store_true",
        help="add each variable the function assigns (batch-norm moving statistics, quantization ranges) as an extra "
        "output holding its new value, named after the variable (default: leave the updates out, with a warning)",
    )
    p.add_argument(
        "--trainable-inputs", action="store_true",
        help="keep the trainable variables as graph inputs named after them, with their current values as "
        "same-name initializers (feed new weights step after step)",
    )
    p.add_argument(
        "--fold-batch-norm", action="store_true",
        help="fold inference-mode batch norms with constant statistics into the preceding convolution (custom "
        "lowering): faster, but not bit-exact (quantized outputs may move by a grid step)",
    )
    p.add_argument("--verify", action="store_true", help="run TF and ONNX Runtime on seeded random inputs and compare")
    p.add_argument("--seed", type=int, default=0, help="seed of the --verify inputs")
    args = p.parse_args(argv)
    if args.graphdef and not (args.inputs and args.outputs):
        p.error("--graphdef needs --inputs and --outputs")
    if args.graphdef and (args.variable_update_outputs or args.trainable_inputs):
        p.error("--variable-update-outputs and --trainable-inputs need a SavedModel or Keras source (a GraphDef has no variables)")
    return args


def _split(names):
    return [n.strip() for n in names.split(",") if n.strip()]


def _load_keras(path):
    import tf_keras

    return tf_keras.models.load_model(path, compile=False)


def _variable_update_names(model):
    from converters.variable_state import VARIABLE_UPDATES_KEY

    props = {p.key: p.value for p in model.metadata_props}
    return [n for n in props.get(VARIABLE_UPDATES_KEY, "").split(",") if n]


def _without_extra_outputs(model, names):
    import onnx

    trimmed = onnx.ModelProto()
    trimmed.CopyFrom(model)
    keep = [o for o in trimmed.graph.output if o.name not in set(names)]
    del trimmed.graph.output[:]
    trimmed.graph.output.extend(keep)
    if names:
        print(f"--verify compares the function's outputs; the {len(names)} variable-update outputs are left out")
    return trimmed


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import converters
    from converters.errors import ConversionError, UnconvertedOpsError

    common = dict(lowering=args.lowering, opset=args.opset, output_path=args.output)
    if args.fold_batch_norm:
        common["fold_batch_norm"] = True
    state = dict(variable_updates="outputs" if args.variable_update_outputs else "warn", trainable_inputs=args.trainable_inputs)
    keras_model = None
    try:
        if args.saved_model:
            model = converters.from_saved_model(
                args.saved_model, signature_key=args.signature_key, tags=args.tag, **common, **state
            )
        elif args.graphdef:
            model = converters.from_graph_def(args.graphdef, _split(args.inputs), _split(args.outputs), **common)
        else:
            keras_model = _load_keras(args.keras)
            model = converters.from_keras(keras_model, **common, **state)
    except UnconvertedOpsError as e:
        print(f"error: {len(e.ops)} TensorFlow op(s) could not be converted:", file=sys.stderr)
        for op_type, name in e.ops:
            print(f"  {op_type}: {name}", file=sys.stderr)
        return EXIT_CONVERSION_FAILED
    except ConversionError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONVERSION_FAILED
    print(f"wrote {args.output} (lowering={args.lowering}, opset={args.opset}, {len(model.graph.node)} nodes)")

    if not args.verify:
        return 0
    if args.variable_update_outputs:
        # TF's function returns only its own outputs; the new variable values are checked by the tests
        # (tests/test_state_outputs.py), --verify compares the function's outputs.
        model = _without_extra_outputs(model, _variable_update_names(model))
    if args.saved_model:
        tags = None if args.tag is None else _split(args.tag)
        report = converters.verify_saved_model(args.saved_model, model, args.signature_key, tags, seed=args.seed)
    elif args.graphdef:
        report = converters.verify_graph_def(args.graphdef, _split(args.inputs), _split(args.outputs), model, seed=args.seed)
    else:
        report = converters.verify_keras(keras_model, model, seed=args.seed)
    return 0 if report.ok else EXIT_VERIFY_FAILED


if __name__ == "__main__":
    sys.exit(main())
