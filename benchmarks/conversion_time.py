"""Conversion time and graph size of the example models, per lowering, against tf2onnx alone.

    # from the repository root (the SavedModels come from ``python -m models.make_models``):
    PYTHONPATH=. python benchmarks/conversion_time.py [--models NAME ...] [--lowerings custom standard]
                                                      [--no-tf2onnx]

For each example and lowering it prints the total conversion time (converters.from_saved_model, as
models.run_all measures it), the part spent in tf2onnx's handlers (process_graphs, our lowerings
included) and in tf2onnx's optimizer (optimize_graph), the ONNX node count, the most frequent node
types and the serialized size. The "tf2onnx" row is tf2onnx 1.17 alone on the same signature
(its own loader and handlers, opset 17), the baseline that conversion time is judged against.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


@contextlib.contextmanager
def phase_timer(totals: dict):
    """Accumulate the time spent in tf2onnx's process_graphs and optimize_graph (as the pipeline calls them)."""
    import tf2onnx.optimizer
    import tf2onnx.tfonnx

    originals = {"process_graphs": tf2onnx.tfonnx.process_graphs, "optimize_graph": tf2onnx.optimizer.optimize_graph}

    def timed(name):
        def call(*a, **kw):
            t = time.perf_counter()
            try:
                return originals[name](*a, **kw)
            finally:
                totals[name] = totals.get(name, 0.0) + time.perf_counter() - t

        return call

    tf2onnx.tfonnx.process_graphs = timed("process_graphs")
    tf2onnx.optimizer.optimize_graph = timed("optimize_graph")
    try:
        yield totals
    finally:
        tf2onnx.tfonnx.process_graphs = originals["process_graphs"]
        tf2onnx.optimizer.optimize_graph = originals["optimize_graph"]


def describe(model) -> str:
    counts = collections.Counter(n.op_type for n in model.graph.node)
    top = ", ".join(f"{k} {v}" for k, v in counts.most_common(6))
    return f"{len(model.graph.node)} nodes ({top}); {model.ByteSize() / 1e6:.1f} MB"


def main(argv=None) -> int:
    import logging

    from models.run_all import EXAMPLES, LOWERINGS

    names = [e.name for e in EXAMPLES]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=names, default=names)
    parser.add_argument("--lowerings", nargs="+", choices=LOWERINGS, default=list(LOWERINGS))
    parser.add_argument("--no-tf2onnx", action="store_true", help="skip the tf2onnx-alone baseline")
    args = parser.parse_args(argv)
    logging.getLogger("tf2onnx").setLevel(logging.CRITICAL)

    import converters

    for example in (e for e in EXAMPLES if e.name in args.models):
        for lowering in args.lowerings:
            totals: dict = {}
            with phase_timer(totals):
                t = time.perf_counter()
                try:
                    model = converters.from_saved_model(
                        str(example.saved_model), signature_key=example.signature, lowering=lowering,
                        variable_updates=example.variable_updates,
                    )
                    what = describe(model)
                except Exception as e:  # report and go on with the next row
                    what = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
                total = time.perf_counter() - t
            print(
                f"{example.name:32s} {lowering:9s} {total:8.1f} s  (handlers {totals.get('process_graphs', 0):6.1f} s,"
                f" optimizer {totals.get('optimize_graph', 0):6.1f} s)  {what}",
                flush=True,
            )
        if not args.no_tf2onnx:
            import tf2onnx
            from tf2onnx import tf_loader

            t = time.perf_counter()
            try:
                graph_def, in_names, out_names, renames = tf_loader.from_saved_model(
                    str(example.saved_model), None, None, "serve", [example.signature], return_tensors_to_rename=True
                )
                model, _ = tf2onnx.convert.from_graph_def(
                    graph_def, input_names=in_names, output_names=out_names, opset=17, tensors_to_rename=renames
                )
                what = describe(model)
            except Exception as e:
                what = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            print(f"{example.name:32s} {'tf2onnx':9s} {time.perf_counter() - t:8.1f} s  {what}", flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
