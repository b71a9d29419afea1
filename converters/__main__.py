"""Command line: convert a SavedModel, a GraphDef or a Keras file to ONNX, optionally verifying it.

  python -m converters --saved-model DIR [--signature-key K] [--tag T] --output OUT.onnx
  python -m converters --graphdef FILE.pb --inputs a:0,b:0 --outputs y:0 --output OUT.onnx
  python -m converters --keras FILE.keras|FILE.h5|EXPORT_DIR --output OUT.onnx [--batch-size N] [--import MODULE]
  python -m converters --keras FILE.keras --train-step --loss NAME [--from-logits]
                       [--optimizer NAME --learning-rate LR] --output STEP.onnx
  common: --opset N (17) --lowering custom|standard|integer --debug
  verification: --verify [--verify-nodes] [--seed S] [--verify-rtol R] [--verify-sum-rtol R] [--verify-json FILE]
                [--no-tf-spread] [--verify-steps N]
  python -m converters SOURCE OPTIONS --verify-model FILE.onnx [--verify] [--verify-nodes]   (no --output)
  state (SavedModel and Keras sources): --variable-update-outputs --trainable-inputs

Keras files are loaded by the Keras that wrote them (Keras 3, TF's default ``keras``, or tf_keras), which the
output names; a directory is a SavedModel (Keras 3's model.export, tf_keras's SavedModel format).

--verify runs TF with its Eigen kernels (it sets TF_ENABLE_ONEDNN_OPTS=0 before importing TF) and ONNX Runtime
on seeded random inputs, and prints one row per output: identical bits, max error, the bound it was judged against
(bit for bit for quantization and integer outputs; rtol*|tf| for floats; rtol*|tf| + max(sum_rtol,
2(n+1)u)*Σ|terms| for sums of n terms, gradients and convolutions, converters.verification), TF's own spread
(max |Eigen - oneDNN|, from TF's oneDNN kernels in a child process; --no-tf-spread skips it) and the verdict. --verify-json FILE writes the same report
as JSON.

--lowering integer writes a quantization-aware inference graph as the integer model it was trained to become
(converters.integer, docs/integer.md) and prints what runs in integer (``QLinearConv 52/52``, from ONNX Runtime's
own optimized graph) and what stays float; --verify then judges each quantized output in quantization steps
(max error against --verify-steps, shares identical and within one step, top-1 agreement, TF's own spread).

--verify-nodes judges every converted op on TF's own input values (converters.node_verification): TF runs the frozen
function once, every tensor the ONNX graph also holds is fetched, and ONNX Runtime runs each node (each group of
nodes a TF op became) on TF's values of its inputs; bits for quantization and integer values (a quantized
gradient included), rtol and the sum bound for the others. Errors do not accumulate from node to node, so the
verdict does not depend on a deep step's chaos. It prints a table per TF op type and the first failing node.

--verify-model FILE.onnx verifies a model you already have (after your own edits or optimizations, or converted
elsewhere) against the TF source given by the same source options, without converting: end to end and per node
(or what --verify / --verify-nodes ask for).

Errors are one line on stderr (``error: ...``, saying what failed and what to do); --debug adds the traceback.
Exit status: 0 on success; 1 when conversion fails (the model cannot be loaded or converted; unconverted ops
are listed one per line; an unexpected error is reported as a bug); 2 for bad arguments; 3 when --verify
or --verify-nodes finds a value outside its tolerance.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

EXIT_CONVERSION_FAILED = 1
EXIT_VERIFY_FAILED = 3


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m converters", description=__doc__.split("\n\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--saved-model", metavar="DIR", help="SavedModel directory")
    source.add_argument("--graphdef", metavar="FILE.pb", help="frozen or unfrozen GraphDef; needs --inputs/--outputs")
    source.add_argument(
        "--keras", metavar="FILE",
        help="Keras model file (.keras or .h5, Keras 3 or tf_keras: loaded by the Keras that wrote it), or the "
        "directory of Keras 3's model.export / tf_keras's SavedModel",
    )
    p.add_argument("--signature-key", default="serving_default", help="SavedModel signature (default serving_default)")
    p.add_argument("--tag", default=None, help="SavedModel tag set, comma separated (default: serve)")
    p.add_argument("--inputs", help="GraphDef input tensor names, comma separated (a:0,b:0)")
    p.add_argument("--outputs", help="GraphDef output tensor names, comma separated")
    p.add_argument("--output", metavar="OUT.onnx", help="where to write the ONNX model (required unless --verify-model)")
    p.add_argument("--opset", type=int, default=17, help="ONNX opset (default 17)")
    p.add_argument("--lowering", choices=("custom", "standard", "integer"), default="custom",
                   help="custom: the domain's TF-exact nodes (default); standard: standard ONNX only, where exact; "
                   "integer: a quantization-aware inference graph as QDQ that ONNX Runtime runs with its int8 "
                   "kernels (docs/integer.md)")
    p.add_argument("--integer-weights", choices=("uint8", "int8"), default=None,
                   help="--lowering integer: store the weight integers as uint8 with zero point 128 (default: exact "
                   "on every CPU) or int8 (faster where ONNX Runtime's u8s8 kernels are exact: x86 with VNNI, ARM; "
                   "on AVX2 without VNNI they saturate, docs/integer.md)")
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
        "--fold-batch-norm", action="store_true", default=None,
        help="fold inference-mode batch norms with constant statistics into the preceding convolution (custom "
        "lowering): faster, but not bit-exact (quantized outputs may move by a grid step). Default: folded in a "
        "float inference graph (no quantizer, no gradient of the family), where no output is bit-exact anyway",
    )
    p.add_argument("--no-fold-batch-norm", dest="fold_batch_norm", action="store_false",
                   help="never fold batch norms (keep the domain's TF-exact batch-norm node)")
    keras = p.add_argument_group("Keras sources")
    keras.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                       help="import MODULE first (it registers the model's custom layers); may be repeated")
    keras.add_argument("--batch-size", type=int, default=None,
                       help="fix the batch dimension (default: left free, whatever the model was built with)")
    keras.add_argument("--train-step", action="store_true",
                       help="convert one training step (inputs, labels -> loss and grad_<variable> for every "
                       "trainable variable, training=True) instead of inference; needs --loss")
    keras.add_argument("--loss", help="Keras loss name for --train-step, e.g. sparse_categorical_crossentropy")
    keras.add_argument("--from-logits", action="store_true", help="the model outputs logits (for --loss)")
    keras.add_argument("--optimizer", help="Keras optimizer name (sgd, adam, ...): the step also applies it")
    keras.add_argument("--learning-rate", type=float, default=None, help="the optimizer's learning rate")
    p.add_argument("--debug", action="store_true", help="print the traceback of an error")
    verify = p.add_argument_group("verification")
    verify.add_argument("--verify", action="store_true",
                        help="run TF (its Eigen kernels) and ONNX Runtime on seeded random inputs and judge every "
                        "output")
    verify.add_argument("--verify-nodes", action="store_true",
                        help="judge every converted op on TF's own input values (per node: errors do not accumulate)")
    verify.add_argument("--verify-model", metavar="FILE.onnx", default=None,
                        help="verify this existing ONNX file against the source instead of converting (end to end "
                        "and per node, unless --verify or --verify-nodes narrows it)")
    verify.add_argument("--seed", type=int, default=0, help="seed of the --verify inputs")
    verify.add_argument("--verify-rtol", type=float, default=None, metavar="R",
                        help="relative tolerance of float outputs (default: a few ulps of the type, 1e-5 for float32)")
    verify.add_argument("--verify-sum-rtol", type=float, default=None, metavar="R",
                        help="tolerance of sums, times the magnitude of what was summed (default: the larger of 1e-5 and "
                        "the summation-order bound 2(n+1)*2^-24 for a float32 sum of n terms; R given here is used "
                        "as it is)")
    verify.add_argument("--verify-steps", type=float, default=None, metavar="N",
                        help="an integer model's bound, in quantization steps, on each quantized output's largest "
                        "error (default converters.integer.steps.DEFAULT_STEP_BOUND; docs/integer.md)")
    verify.add_argument("--verify-json", metavar="FILE", default=None, help="also write the --verify report as JSON")
    verify.add_argument("--no-tf-spread", action="store_true",
                        help="skip TF's oneDNN run (a child process) that measures TF's own spread for --verify")
    args = p.parse_args(argv)
    if args.verify_model:
        if args.output:
            p.error("--verify-model verifies an existing file: leave out --output")
        if args.fold_batch_norm is not None:
            p.error("--fold-batch-norm / --no-fold-batch-norm are conversion options; --verify-model does not convert")
        if not (args.verify or args.verify_nodes):
            args.verify = args.verify_nodes = True
    elif not args.output:
        p.error("--output is required (or --verify-model FILE.onnx to verify a file without converting)")
    verify_only = [flag for flag, value in (("--verify-rtol", args.verify_rtol is not None),
                                            ("--verify-sum-rtol", args.verify_sum_rtol is not None),
                                            ("--verify-json", args.verify_json), ("--no-tf-spread", args.no_tf_spread),
                                            ("--verify-steps", args.verify_steps is not None))
                   if value]
    if verify_only and not (args.verify or args.verify_nodes):
        p.error(f"{', '.join(verify_only)} apply to --verify and --verify-nodes")
    if args.integer_weights and args.lowering != "integer":
        p.error("--integer-weights applies to --lowering integer")
    if args.graphdef and not (args.inputs and args.outputs):
        p.error("--graphdef needs --inputs and --outputs")
    if args.graphdef and (args.variable_update_outputs or args.trainable_inputs):
        p.error("--variable-update-outputs and --trainable-inputs need a SavedModel or Keras source (a GraphDef has no variables)")
    keras_only = [flag for flag, value in (("--batch-size", args.batch_size), ("--train-step", args.train_step),
                                           ("--loss", args.loss), ("--optimizer", args.optimizer)) if value]
    if keras_only and not args.keras:
        p.error(f"{', '.join(keras_only)} apply to a --keras source")
    if args.train_step and not args.loss:
        p.error("--train-step needs --loss (a Keras loss name, e.g. sparse_categorical_crossentropy --from-logits)")
    if (args.loss or args.optimizer) and not args.train_step:
        p.error("--loss and --optimizer apply to --train-step")
    return args


def _split(names):
    return [n.strip() for n in names.split(",") if n.strip()]


def _convert_keras(args, common, state, convert=True):
    """(ONNX model, the TF function --verify runs, what keeps it alive) for a --keras source (no model: None,
    when ``convert`` is false)."""
    import converters
    from converters.keras_models import describe_keras, load_keras_file, training_step_function

    for module in args.imports:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise converters.ConversionError(f"--import {module}: {e}") from e
    if os.path.isdir(args.keras):
        if args.train_step:
            raise converters.ConversionError(
                f"{args.keras} is a SavedModel directory, which keeps no Keras model to train: use the .keras file, "
                "or --saved-model with --signature-key of a training-step signature")
        if not convert:
            return None, None, None
        print(f"{args.keras} is a SavedModel directory: converting its serving_default signature")
        return converters.from_saved_model(args.keras, **common, **state), None, None
    keras_model, flavour = load_keras_file(args.keras)
    print(f"loaded {args.keras} with {describe_keras(flavour)}: model {keras_model.name!r}")
    if not args.train_step:
        model = converters.from_keras(keras_model, batch_size=args.batch_size, **common, **state) if convert else None
        return model, keras_model, None
    concrete, holder = training_step_function(keras_model, args.loss, args.optimizer, args.learning_rate,
                                              args.from_logits, batch_size=args.batch_size)
    return (converters.from_concrete_function(concrete, **common, **state) if convert else None), concrete, holder


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


def _training_step_inputs(step, onnx_model, seed: int = 0) -> dict:
    """Seeded inputs for verifying a converted training step (``step``: what training_step_function returned
    as its holder): the verifier's random inputs, with integer ``labels`` drawn from the model's classes
    (TF rejects a sparse label outside them; the verifier's generic integers are 0-3)."""
    import numpy as np

    from converters.verification import random_inputs

    inputs = random_inputs(onnx_model, seed)
    labels = inputs.get("labels")
    outputs = getattr(step.model, "outputs", None)
    if labels is not None and labels.dtype.kind in "iu" and outputs:
        classes = outputs[0].shape[-1]
        if classes:
            inputs["labels"] = np.random.default_rng(seed + 1).integers(0, classes, labels.shape).astype(labels.dtype)
    return inputs


def _load_model(path):
    import onnx

    from converters.errors import ConversionError

    try:
        return onnx.load(path)
    except Exception as e:  # noqa: BLE001 - a file we cannot read is the user's to fix
        raise ConversionError(f"--verify-model {path}: cannot read it as an ONNX model ({type(e).__name__}: {e})") from e


def _per_node_source(args, keras_model, keep_alive):
    """(the function per-node verification freezes, or None; a frozen GraphDef for a --graphdef source, or None;
    what keeps the function alive)."""
    from converters.frontends import keras_concrete_function, load_signature

    if args.graphdef:
        from converters.node_verification import freeze_graph_def

        return None, freeze_graph_def(args.graphdef, _split(args.inputs), _split(args.outputs)), None
    if args.saved_model or keras_model is None:  # a SavedModel, or a SavedModel directory given as --keras
        path = args.saved_model or args.keras
        key = args.signature_key if args.saved_model else "serving_default"
        tags = None if args.tag is None else _split(args.tag)
        loaded, signature = load_signature(path, key, tags)
        return signature, None, loaded
    if keep_alive is not None:  # a training step: its ConcreteFunction, as converted
        return keras_model, None, None
    return keras_concrete_function(keras_model, None, args.batch_size), None, None


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.verify or args.verify_nodes:  # before TF's import: both judge against TF's Eigen kernels
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # TF's Eigen kernels, which the project's exactness claims are made against (TF's default turns oneDNN on
    # for AVX-512 CPUs); TF reads this once, at import. --verify reports the kernel set it ran.
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    from converters.quiet_tf import import_tensorflow_quietly

    import_tensorflow_quietly()
    import converters
    from converters.errors import ConversionError, UnconvertedOpsError

    common = dict(lowering=args.lowering, opset=args.opset, output_path=args.output)
    if args.fold_batch_norm is not None:
        common["fold_batch_norm"] = args.fold_batch_norm
    if args.integer_weights is not None:
        common["integer_weights"] = args.integer_weights
    state = dict(variable_updates="outputs" if args.variable_update_outputs else "warn", trainable_inputs=args.trainable_inputs)
    keras_model = keep_alive = None
    try:
        if args.verify_model:
            model = _load_model(args.verify_model)
            if args.keras:
                _, keras_model, keep_alive = _convert_keras(args, common, state, convert=False)
        elif args.saved_model:
            model = converters.from_saved_model(
                args.saved_model, signature_key=args.signature_key, tags=args.tag, **common, **state
            )
        elif args.graphdef:
            model = converters.from_graph_def(args.graphdef, _split(args.inputs), _split(args.outputs), **common)
        else:
            model, keras_model, keep_alive = _convert_keras(args, common, state)
    except UnconvertedOpsError as e:
        if args.debug:
            traceback.print_exc()
        print(f"error: {len(e.ops)} TensorFlow op(s) could not be converted:", file=sys.stderr)
        for op_type, name in e.ops:
            print(f"  {op_type}: {name}", file=sys.stderr)
        return EXIT_CONVERSION_FAILED
    except ConversionError as e:
        if args.debug:
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONVERSION_FAILED
    except Exception as e:  # a bug of ours or of a library under us: one line, the traceback on request
        if args.debug:
            traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0][:300]
        print(f"error: unexpected {type(e).__name__} while converting: {first} (a bug in converters: rerun with "
              "--debug and report the traceback)", file=sys.stderr)
        return EXIT_CONVERSION_FAILED
    if args.verify_model:
        print(f"verifying {args.verify_model} ({len(model.graph.node)} nodes) without converting")
    else:
        print(f"wrote {args.output} (lowering={args.lowering}, opset={args.opset}, {len(model.graph.node)} nodes)")
    _print_integer_summary(model)

    if not (args.verify or args.verify_nodes):
        return 0
    options = dict(seed=args.seed, rtol=args.verify_rtol, sum_rtol=args.verify_sum_rtol)
    if keep_alive is not None:  # a Keras training step: labels must be valid class indices
        options["inputs"] = _training_step_inputs(keep_alive, model, args.seed)
    what = "the ONNX model was written; " if not args.verify_model else ""
    reports = {}
    try:
        frozen = None
        if args.verify_nodes:
            # Frozen before the end-to-end run: a training step assigns its variables.
            from converters.node_verification import freeze_like_converter

            nodes_fn, frozen, nodes_alive = _per_node_source(args, keras_model, keep_alive)
            if frozen is None:
                from converters.verify_tf import concrete_function
                from converters.verification import random_inputs

                sample = options.get("inputs") or random_inputs(model, args.seed)
                frozen = freeze_like_converter(concrete_function(nodes_fn, sample), model)
        if args.verify:
            reports["end_to_end"] = _verify_end_to_end(args, converters, model, keras_model, options)
            if _is_integer(model):
                reports["per_tensor"] = _verify_integer_tensors(args, model, keras_model, keep_alive, options)
        if args.verify_nodes:
            from converters.node_verification import verify_nodes

            if args.verify:
                print()
            reports["per_node"] = verify_nodes(model, None, frozen=frozen, **options)
            del nodes_alive
    except Exception as e:  # the model was written; running it (or TF) failed
        if args.debug:
            traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[-1][:300]
        print(f"error: verification could not run the models: {type(e).__name__}: {first} ({what}rerun with --debug "
              "for the traceback)", file=sys.stderr)
        return EXIT_CONVERSION_FAILED
    del keep_alive
    if "per_tensor" in reports and reports["per_tensor"].ok and not reports["end_to_end"].ok:
        print("\nnote: every quantized tensor is within one step of TF's given TF's values of the tensors before it, "
              "so each layer computes what TF computes; the end-to-end error is rounding flips at near-ties "
              "propagating through the network, as they do between TF's own kernel sets (the step table's TF spread). "
              "If that drift is acceptable for this model, judge it with a larger --verify-steps")
    if args.verify_json:
        _write_json(args.verify_json, reports)
        print(f"wrote the verification report to {args.verify_json}")
    return 0 if all(r.ok for r in reports.values()) else EXIT_VERIFY_FAILED


def _is_integer(model) -> bool:
    from converters.integer import read_summary

    return read_summary(model) is not None


def _verify_integer_tensors(args, model, keras_model, keep_alive, options):
    """An integer model's quantized tensors, each on TF's values of the ones before it (converters.integer.
    per_tensor): the sharp check, where the end-to-end steps carry a deep network's drift."""
    from converters.integer.per_tensor import verify_quantized_tensors
    from converters.node_verification import freeze_like_converter
    from converters.verification import random_inputs
    from converters.verify_tf import concrete_function

    inputs = options.get("inputs") or random_inputs(model, args.seed)
    fn, frozen, alive = _per_node_source(args, keras_model, keep_alive)
    if frozen is None:
        frozen = freeze_like_converter(concrete_function(fn, inputs), model)
    report = verify_quantized_tensors(model, inputs=inputs, frozen=frozen)
    del alive
    print()
    print(report.table())
    return report


def _print_integer_summary(model) -> None:
    """An integer model's summary (what runs in integer, what stays float) and ONNX Runtime's fusion counts."""
    from converters.integer import read_summary
    from converters.integer.fusion import fusion_lines

    recorded = read_summary(model)
    if recorded is None:
        return
    for line in recorded[0]:
        print("integer: " + line)
    try:
        for line in fusion_lines(model):
            print("integer: " + line)
    except Exception as e:  # noqa: BLE001 - the counts are a report; an old onnxruntime may lack a kernel
        print(f"integer: ONNX Runtime could not load the model to count its fusions: {type(e).__name__}: {e}")


def _verify_end_to_end(args, converters, model, keras_model, options):
    if args.variable_update_outputs or _variable_update_names(model):
        # TF's function returns only its own outputs; the new variable values are checked per node
        # (--verify-nodes) and by the tests (tests/test_state_outputs.py).
        model = _without_extra_outputs(model, _variable_update_names(model))
    options = dict(options, spread=not args.no_tf_spread, step_bound=args.verify_steps)
    if args.saved_model:
        tags = None if args.tag is None else _split(args.tag)
        return converters.verify_saved_model(args.saved_model, model, args.signature_key, tags, **options)
    if args.graphdef:
        return converters.verify_graph_def(args.graphdef, _split(args.inputs), _split(args.outputs), model, **options)
    if keras_model is None:  # a SavedModel directory given as --keras
        return converters.verify_saved_model(args.keras, model, **options)
    # The Keras model (inference) or the training step's ConcreteFunction (frozen for TF's oneDNN child).
    return converters.verify_keras(keras_model, model, **options)


def _write_json(path, reports):
    """The end-to-end report's JSON (with the per-node report under "per_node"), or the per-node report's alone."""
    from converters.verification import report_json

    if "end_to_end" in reports:
        data = reports["end_to_end"].to_dict()
        for key in ("per_node", "per_tensor"):
            if key in reports:
                data[key] = reports[key].to_dict()
    else:
        data = reports["per_node"].to_dict()
    report_json(data, path)


if __name__ == "__main__":
    sys.exit(main())
