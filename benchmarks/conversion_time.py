"""Conversion time and graph size of the example models, per lowering, against tf2onnx alone.

    # from the repository root (the SavedModels come from ``python -m models.make_models``):
    PYTHONPATH=. python benchmarks/conversion_time.py [--models NAME ...] [--lowerings custom standard]
                                                      [--no-tf2onnx]
    PYTHONPATH=. python benchmarks/conversion_time.py --scaling [--blocks 8 16 32 64] [--kinds step inference]

For each example and lowering it prints the total conversion time (converters.from_saved_model, as
models.run_all measures it), the part spent in tf2onnx's handlers (process_graphs, our lowerings
included) and in tf2onnx's optimizer (optimize_graph), the ONNX node count, the most frequent node
types and the serialized size. The "tf2onnx" row is tf2onnx 1.17 alone on the same signature
(its own loader and handlers, opset 17), the baseline that conversion time is judged against.

``--scaling`` converts a synthetic chain of N blocks (FakeQuant per channel on the kernel -> Conv2D ->
depthwise -> FusedBatchNorm -> ReLU6 -> FakeQuant on the activation) for each N, as a GradientTape
training step (loss, every gradient, the moving statistics as extra outputs) and as inference, and
prints seconds and milliseconds per ONNX node for each lowering and for tf2onnx alone (which converts
the inference chain; it has no handler for the gradient ops). Conversion is linear in the graph when
the time per node stays flat as N grows (issue 12).
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


def make_chain(n_blocks: int, train_step: bool, channels: int = 8, size: int = 8, batch: int = 2):
    """The synthetic chain of ``--scaling`` as a tf.function (see the module docstring) and its input spec."""
    import tensorflow as tf

    rng = tf.random.Generator.from_seed(n_blocks)
    blocks = []
    for i in range(n_blocks):
        blocks.append(dict(
            kernel=tf.Variable(rng.normal([3, 3, channels, channels]) * 0.2, name=f"b{i}/kernel"),
            kmin=tf.Variable(-tf.ones([channels]), name=f"b{i}/kmin"),
            kmax=tf.Variable(tf.ones([channels]), name=f"b{i}/kmax"),
            dw=tf.Variable(rng.normal([3, 3, channels, 1]) * 0.3, name=f"b{i}/dw"),
            gamma=tf.Variable(tf.ones([channels]), name=f"b{i}/gamma"),
            beta=tf.Variable(tf.zeros([channels]), name=f"b{i}/beta"),
            mean=tf.Variable(tf.zeros([channels]), trainable=False, name=f"b{i}/mean"),
            var=tf.Variable(tf.ones([channels]), trainable=False, name=f"b{i}/var"),
            amin=tf.Variable(-6.0, name=f"b{i}/amin"),
            amax=tf.Variable(6.0, name=f"b{i}/amax"),
        ))
    trainable = [v for b in blocks for k, v in b.items() if k not in ("mean", "var")]

    def forward(x, training):
        for b in blocks:
            k = tf.quantization.fake_quant_with_min_max_vars_per_channel(b["kernel"], b["kmin"], b["kmax"])
            y = tf.nn.depthwise_conv2d(tf.nn.conv2d(x, k, 1, "SAME"), b["dw"], [1, 1, 1, 1], "SAME")
            if training:
                y, m, v = tf.compat.v1.nn.fused_batch_norm(y, b["gamma"], b["beta"], is_training=True)
                b["mean"].assign(0.9 * b["mean"] + 0.1 * m)
                b["var"].assign(0.9 * b["var"] + 0.1 * v)
            else:
                y, _, _ = tf.compat.v1.nn.fused_batch_norm(y, b["gamma"], b["beta"], b["mean"], b["var"], is_training=False)
            x = tf.quantization.fake_quant_with_min_max_vars(tf.nn.relu6(y), b["amin"], b["amax"])
        return x

    spec = tf.TensorSpec([batch, size, size, channels], tf.float32, name="x")
    if train_step:
        @tf.function(input_signature=[spec])
        def chain(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(forward(x, True)))
            grads = tape.gradient(loss, trainable)
            return {"loss": loss, **{f"grad_{i:04d}": g for i, g in enumerate(grads)}}
    else:
        @tf.function(input_signature=[spec])
        def chain(x):
            return {"y": forward(x, False)}
    chain.keep_alive = blocks  # the variables must outlive tracing
    return chain, [spec]


def scaling(blocks, kinds, lowerings, with_tf2onnx: bool) -> None:
    import onnx
    import tf2onnx

    import converters

    print(f"{'kind':9s} {'N':>4s} {'lowering':9s} {'seconds':>8s} {'nodes':>6s} {'ms/node':>8s}", flush=True)
    for kind in kinds:
        for n in blocks:
            rows = [(lowering, None) for lowering in lowerings] + ([("tf2onnx", None)] if with_tf2onnx else [])
            for what, _ in rows:
                fn, signature = make_chain(n, kind == "step")
                t = time.perf_counter()
                try:
                    if what == "tf2onnx":
                        model, _ = tf2onnx.convert.from_function(fn, input_signature=signature, opset=17)
                    else:
                        model = converters.from_function(
                            fn, signature, lowering=what, variable_updates="outputs" if kind == "step" else "warn"
                        )
                    seconds = time.perf_counter() - t
                    nodes = len(model.graph.node)
                    # tf2onnx leaves an op it has no handler for in the graph (logged, not raised).
                    left = sum(1 for node in model.graph.node if not onnx.defs.has(node.op_type, node.domain))
                    note = f"  ({left} TF ops left unconverted)" if left and what == "tf2onnx" else ""
                    print(f"{kind:9s} {n:4d} {what:9s} {seconds:8.2f} {nodes:6d} {seconds / nodes * 1e3:8.3f}{note}",
                          flush=True)
                except Exception as e:  # tf2onnx alone has no handler for the gradient ops
                    print(f"{kind:9s} {n:4d} {what:9s} failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}",
                          flush=True)


def main(argv=None) -> int:
    import logging

    from models.run_all import EXAMPLES, LOWERINGS

    names = [e.name for e in EXAMPLES]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=names, default=names)
    parser.add_argument("--lowerings", nargs="+", choices=LOWERINGS, default=list(LOWERINGS))
    parser.add_argument("--no-tf2onnx", action="store_true", help="skip the tf2onnx-alone baseline")
    parser.add_argument("--scaling", action="store_true", help="convert the synthetic chain for each --blocks")
    parser.add_argument("--blocks", nargs="+", type=int, default=[8, 16, 32, 64])
    parser.add_argument("--kinds", nargs="+", choices=("step", "inference"), default=["step", "inference"])
    args = parser.parse_args(argv)
    logging.getLogger("tf2onnx").setLevel(logging.CRITICAL)
    logging.getLogger("converters").setLevel(logging.ERROR)
    if args.scaling:
        scaling(args.blocks, args.kinds, args.lowerings, not args.no_tf2onnx)
        return 0

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
