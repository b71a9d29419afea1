"""Run TensorFlow and ONNX Runtime on the same seeded inputs and compare every output.

Tolerances. Outputs produced by a quantization op (FakeQuant*, QuantizeAndDequantize*) and integer
outputs must be bit-identical (NaN matches any NaN, +0 and -0 differ). Other float outputs pass
where ``|ort - tf| <= rtol*|tf| + atol``. The default rtol is a few ulps of the element type
(float32 1e-5, float64 1e-12, float16 1e-3, bfloat16 1e-2): batch norm and depthwise convolution
are sums of products, and TF's default oneDNN kernels sum in a different order than a plain loop,
which moves each result by a few ulps. The default atol is rtol times the largest |tf| of that
output: gradients are sums whose terms cancel, so an element near zero can carry the rounding
error of its large terms. Non-finite values must match exactly (inf by sign, NaN by position).

``compare_output`` also judges normwise (``||ort - tf|| <= c * ||tf||`` over the elements finite in
both, with a noise floor for outputs that vanish in exact arithmetic), for graphs where elementwise
agreement cannot hold (models/run_all.py says which and why).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import onnx

from converters.exact_outputs import producer_type, recorded_exact_outputs
from converters.family import QUANTIZATION_OPS
from ort_ops.schemas import DOMAIN

DEFAULT_RTOL = {"float32": 1e-5, "float64": 1e-12, "float16": 1e-3, "bfloat16": 1e-2}


@dataclasses.dataclass
class OutputCheck:
    """How one ONNX output compares to TensorFlow's."""

    name: str
    shape: tuple
    dtype: str
    exact: bool  # bit-exactness was required
    rtol: float
    atol: float
    max_abs_err: float
    max_rel_err: float
    n_differing: int  # elements not bit-identical (NaNs count as identical)
    n_outside: int  # elements outside the tolerance (== n_differing when exact; normwise: non-finite misplaced)
    ok: bool
    note: str = ""
    same_type: bool = True  # ORT gave TF's shape and dtype (nothing else is compared otherwise)
    nonfinite_match: bool = True  # every inf and NaN of either side sits where the other has the same one
    normwise: Optional[float] = None  # judged normwise with this c
    normwise_err: float = 0.0  # ||ort - tf|| / max(||tf||, noise floor) when judged normwise

    @property
    def tolerance(self) -> str:
        if self.exact:
            return "bit-exact"
        if self.normwise is not None:
            return f"normwise {self.normwise:g} (got {self.normwise_err:.1e})"
        return f"rtol={self.rtol:.0e} atol={self.atol:.2e}"


@dataclasses.dataclass
class VerifyReport:
    outputs: list
    inputs: dict

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.outputs)

    def table(self) -> str:
        header = ("output", "shape", "dtype", "max abs err", "max rel err", "#differing", "#outside", "tolerance", "ok")
        rows = [
            (
                c.name,
                "x".join(map(str, c.shape)) or "scalar",
                c.dtype,
                f"{c.max_abs_err:.3e}",
                f"{c.max_rel_err:.3e}",
                str(c.n_differing),
                str(c.n_outside),
                c.tolerance,
                ("ok" if c.ok else "FAIL") + (f" ({c.note})" if c.note else ""),
            )
            for c in self.outputs
        ]
        widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
        lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
        lines.append("  ".join("-" * w for w in widths))
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
        lines.append("verification " + ("passed" if self.ok else "FAILED"))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def same_bits(a, b, nan_payloads: bool = False) -> np.ndarray:
    """Element-wise bit identity of two arrays of one dtype and shape (+0 and -0 differ).

    A NaN equals every NaN, or with ``nan_payloads`` only a NaN of the same bits (sign and payload):
    which NaN a sum keeps depends on its order, so only some comparisons can demand the payload.
    Integers and booleans compare by value.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
        width = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
        same = a.view(width) == b.view(width)
        if nan_payloads:
            return same
        both_nan = np.isnan(a.astype(np.float64)) & np.isnan(b.astype(np.float64))
        return same | both_nan
    return a == b


def error_stats(expected, actual):
    """(element-wise |actual - expected|, max abs error, max rel error), over the elements finite in both
    (the others count 0). Same shapes."""
    e64, a64 = np.asarray(expected).astype(np.float64), np.asarray(actual).astype(np.float64)
    finite = np.isfinite(e64) & np.isfinite(a64)
    with np.errstate(invalid="ignore"):  # inf - inf where both are infinite; masked out by `finite`
        err = np.where(finite, np.abs(a64 - e64), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(finite & (e64 != 0), err / np.abs(e64), 0.0)
    return err, float(err.max(initial=0.0)), float(rel.max(initial=0.0))


def _norms(expected, actual, noise_floor=0.0):
    """(||actual - expected||, max(||expected||, noise_floor * sqrt(n))) over the n elements finite in both."""
    e, a = np.asarray(expected).astype(np.float64), np.asarray(actual).astype(np.float64)
    finite = np.isfinite(e) & np.isfinite(a)
    ref = max(float(np.linalg.norm(e[finite])), noise_floor * float(np.sqrt(max(int(finite.sum()), 1))))
    return float(np.linalg.norm((a - e)[finite])), ref


def normwise_error(expected, actual, noise_floor=0.0) -> float:
    """``||actual - expected|| / max(||expected||, noise_floor * sqrt(n))`` over the n elements finite in both
    (0 where that reference is 0). The floor keeps an output that vanishes in exact arithmetic, and is
    rounding noise in both runs, from being judged against its own (noise) norm."""
    dist, ref = _norms(expected, actual, noise_floor)
    return dist / ref if ref else 0.0


def compare_output(name, expected, actual, exact=False, rtol=None, atol=None, atol_factor=None, normwise=None,
                   noise_floor=0.0) -> OutputCheck:
    """Compare one output (``expected`` from TF, ``actual`` from ORT).

    ``exact`` (and any non-float output): bit for bit, NaN matching any NaN. Otherwise ``normwise``: judged
    by :func:`normwise_error` (with ``noise_floor``) against ``normwise``; else element-wise,
    ``|ort - tf| <= rtol*|tf| + atol`` with atol given, or ``atol_factor`` (default: rtol) times max|tf|.
    Non-float outputs and non-finite values must match exactly in every mode.
    """
    expected, actual = np.asarray(expected), np.asarray(actual)
    dtype = expected.dtype.name
    is_float = expected.dtype.kind == "f" or dtype == "bfloat16"
    exact = exact or not is_float
    rtol = 0.0 if exact else (DEFAULT_RTOL.get(dtype, 1e-5) if rtol is None else rtol)
    if expected.shape != actual.shape or expected.dtype != actual.dtype:
        note = f"ORT gave {actual.dtype.name}{list(actual.shape)}, TF {dtype}{list(expected.shape)}"
        return OutputCheck(name, expected.shape, dtype, exact, rtol, 0.0, np.inf, np.inf, expected.size, expected.size,
                           False, note, same_type=False, nonfinite_match=False)
    same = same_bits(expected, actual)
    n_differing = int(np.count_nonzero(~same))
    err, max_abs, max_rel = error_stats(expected, actual)
    e64, a64 = expected.astype(np.float64), actual.astype(np.float64)
    finite = np.isfinite(e64) & np.isfinite(a64)
    nonfinite_match = bool(np.all(same | finite))
    if exact:
        atol, normwise = 0.0, None
        n_outside = n_differing
        ok = n_outside == 0
    elif normwise is not None:
        atol = 0.0
        n_outside = int(np.count_nonzero(~(same | finite)))
        dist, ref = _norms(expected, actual, noise_floor)
        ok = n_outside == 0 and dist <= normwise * ref
        return OutputCheck(name, expected.shape, dtype, exact, rtol, atol, max_abs, max_rel, n_differing, n_outside,
                           ok, nonfinite_match=nonfinite_match, normwise=normwise,
                           normwise_err=dist / ref if ref else 0.0)
    else:
        if atol is None:
            scale = np.abs(e64[np.isfinite(e64)]).max() if np.isfinite(e64).any() else 0.0
            atol = float((rtol if atol_factor is None else atol_factor) * scale)
        value_equal = (a64 == e64) | (np.isnan(a64) & np.isnan(e64))
        n_outside = int(np.count_nonzero(~(value_equal | (finite & (err <= rtol * np.abs(e64) + atol)))))
        ok = n_outside == 0
    return OutputCheck(name, expected.shape, dtype, exact, rtol, atol, max_abs, max_rel, n_differing, n_outside, ok,
                       nonfinite_match=nonfinite_match)


def _random_value(rng, elem_type, dims):
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 2 for d in dims]
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 4, shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    raise TypeError(f"cannot make a random input of type {dtype}")


def random_inputs(onnx_model, seed=0) -> dict:
    """Seeded standard-normal floats (small non-negative ints, random bools) for every graph input;
    unknown dims are 2."""
    rng = np.random.default_rng(seed)
    initializers = {t.name for t in onnx_model.graph.initializer}
    out = {}
    for vi in onnx_model.graph.input:
        if vi.name in initializers:
            continue
        tt = vi.type.tensor_type
        out[vi.name] = _random_value(rng, tt.elem_type, tt.shape.dim)
    return out


def session(onnx_model, threads: Optional[int] = None, log_severity_level: Optional[int] = None):
    """An ONNX Runtime CPU session of the model, with the custom-op library when the model uses the domain
    (a standard-lowered model runs in plain ONNX Runtime)."""
    import onnxruntime as ort

    import ort_ops

    uses_domain = any(imp.domain == DOMAIN for imp in onnx_model.opset_import)
    so = ort_ops.session_options() if uses_domain else ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    if log_severity_level is not None:
        so.log_severity_level = log_severity_level
    return ort.InferenceSession(onnx_model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def run_onnx(onnx_model, inputs: dict, threads: Optional[int] = None) -> dict:
    """Run the model in ONNX Runtime's CPU provider (see :func:`session`); outputs by name."""
    sess = session(onnx_model, threads)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, inputs)))


def _concrete_function(tf_fn, inputs: dict):
    """A ConcreteFunction for ``tf_fn`` (tf.function, ConcreteFunction or Keras model) at these inputs."""
    import tensorflow as tf
    from tensorflow.python.eager.polymorphic_function.concrete_function import ConcreteFunction

    if isinstance(tf_fn, ConcreteFunction):
        return tf_fn
    if hasattr(tf_fn, "get_concrete_function"):
        specs = [tf.TensorSpec(v.shape, tf.as_dtype(v.dtype)) for v in inputs.values()]
        return tf_fn.get_concrete_function(*specs)
    if hasattr(tf_fn, "layers") and hasattr(tf_fn, "inputs"):
        from converters.frontends import keras_concrete_function

        specs = [tf.TensorSpec(v.shape, tf.as_dtype(v.dtype)) for v in inputs.values()]
        return keras_concrete_function(tf_fn, specs)
    raise TypeError(f"verify needs a tf.function, a ConcreteFunction or a Keras model, got {type(tf_fn).__name__}")


def _run_tf(cf, inputs: dict):
    """Call ``cf``; keyword-only signatures (SavedModel signatures) get the inputs by name."""
    import tensorflow as tf

    args, kwargs = cf.structured_input_signature or ((), {})  # None for pruned (GraphDef) functions
    values = [tf.constant(v) for v in inputs.values()]
    if not args and kwargs:
        result = cf(**dict(zip(inputs.keys(), values)))
    else:
        result = cf(*values)
    return result


def verify(
    onnx_model,
    tf_fn,
    inputs=None,
    seed: int = 0,
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
    exact_outputs=None,
    threads: Optional[int] = None,
    print_table: bool = True,
) -> VerifyReport:
    """Run ``tf_fn`` and ``onnx_model`` on the same inputs and compare each output.

    ``inputs``: a dict by ONNX input name, a list in ONNX input order, or None for
    :func:`random_inputs` with ``seed``. ``exact_outputs``: names to hold bit-exact in addition to
    the outputs of quantization ops (found by tracing the TF graph). Prints the table unless
    ``print_table`` is false; ``report.ok`` says whether every output is within tolerance.
    """
    import tensorflow as tf

    graph_inputs = [vi.name for vi in onnx_model.graph.input if vi.name not in {t.name for t in onnx_model.graph.initializer}]
    if inputs is None:
        inputs = random_inputs(onnx_model, seed)
    elif not isinstance(inputs, dict):
        inputs = dict(zip(graph_inputs, inputs))
    inputs = {name: np.asarray(inputs[name]) for name in graph_inputs}

    cf = _concrete_function(tf_fn, inputs)
    result = _run_tf(cf, inputs)
    onnx_names = [o.name for o in onnx_model.graph.output]
    # cf.outputs are the graph tensors of the flattened structured outputs, in the same order.
    graph_outputs = [t for t in cf.outputs if t.dtype != tf.dtypes.resource]
    if isinstance(result, dict):
        keys = tf.nest.flatten({k: k for k in result})
        tf_values = {k: np.asarray(v) for k, v in result.items()}
        producers = dict(zip(keys, (producer_type(t) for t in graph_outputs)))
    else:
        flat_values = [np.asarray(v) for v in tf.nest.flatten(result)]
        if len(flat_values) != len(onnx_names):
            raise ValueError(f"TF returned {len(flat_values)} outputs, the ONNX model has {len(onnx_names)}")
        tf_values = dict(zip(onnx_names, flat_values))
        producers = dict(zip(onnx_names, (producer_type(t) for t in graph_outputs)))

    ort_values = run_onnx(onnx_model, inputs, threads)
    # Quantization outputs: those the converter recorded (it traced the frozen graph, which sees
    # through SavedModel call wrappers) and those traced here in the TF function's own graph.
    exact_names = set(exact_outputs or ()) | recorded_exact_outputs(onnx_model)
    checks = []
    for name in onnx_names:
        if name not in tf_values:
            raise ValueError(f"ONNX output {name!r} has no TF counterpart (TF outputs: {sorted(tf_values)})")
        exact = name in exact_names or producers.get(name) in QUANTIZATION_OPS
        checks.append(compare_output(name, tf_values[name], ort_values[name], exact, rtol, atol))
    report = VerifyReport(checks, inputs)
    if print_table:
        print(report.table())
    return report


def verify_saved_model(path, onnx_model, signature_key="serving_default", tags=None, **kw) -> VerifyReport:
    """verify() against one signature of a SavedModel (outputs matched by name)."""
    import tensorflow as tf

    loaded = tf.saved_model.load(str(path), tags=tags)
    try:
        return verify(onnx_model, loaded.signatures[signature_key], **kw)
    finally:
        del loaded  # the signature function needs the loaded object alive until here


def graph_def_function(graph_def, input_names, output_names):
    """A ConcreteFunction running ``graph_def`` from ``input_names`` to ``output_names`` (tensor names)."""
    import tensorflow as tf

    def _import():
        tf.compat.v1.import_graph_def(graph_def, name="")

    wrapped = tf.compat.v1.wrap_function(_import, [])
    g = wrapped.graph
    return wrapped.prune([g.as_graph_element(n) for n in input_names], [g.as_graph_element(n) for n in output_names])


def verify_graph_def(graph_def, input_names, output_names, onnx_model, **kw) -> VerifyReport:
    """verify() against a GraphDef (a proto or a .pb path)."""
    if not hasattr(graph_def, "node"):
        from converters.frontends import load_graph_def

        graph_def = load_graph_def(graph_def)
    return verify(onnx_model, graph_def_function(graph_def, input_names, output_names), **kw)


def verify_keras(model, onnx_model, **kw) -> VerifyReport:
    """verify() against a Keras model called with training=False."""
    return verify(onnx_model, model, **kw)
