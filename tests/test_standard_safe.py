"""Issue 12, "safe everywhere": degenerate geometries through every standard lowering that builds a
Conv, ConvTranspose, MaxPool, Slice or Pad from shapes, converted by the real pipeline
(converters.from_function, tf2onnx's optimizers included).

ONNX Runtime builds with C++ library assertions (onnxruntime-gpu 1.31.1, whose CPU provider needs no
GPU, and also the CPU wheel 1.32.0) abort the whole process on a node with an empty or inverted range,
e.g. ``std::clamp ... Assertion '!(__hi < __lo)' failed`` for a Slice of a negative-size dim. The
reported case (DepthwiseConv2dNativeBackpropFilter, input (2,9,9,1), filter_sizes (5,5,1,3),
out_backprop (2,5,5,3), stride 2, SAME) came from the pipeline, not the lowering alone: tf2onnx's
optimizer turns the 1-channel NHWC -> CNHW Transpose into a Reshape and folds it into the next Reshape,
whose 0 ("copy this dim") then read the input's dims, so the Conv's dilated kernel outgrew its padded
input. Each test here

* converts a group of degenerate cases (kernel larger than the input, stride larger than the input,
  output size 1 and 0, dilation spanning more than the input, explicit padding beyond every window,
  empty inputs, one channel) as one model,
* checks the graph statically (``assert_safe_graph``: after ONNX shape inference no Conv/ConvTranspose/
  pool whose window outgrows its padded input, no Slice bound that ONNX Runtime would clamp or a negative
  step over an empty dim, no negative Pad, no empty or negative-size float intermediate),
* runs it (in onnxruntime-gpu's CPU provider under scripts/test_ortgpu.sh, see tests/isolated_ort.py)
  and compares it with a float64 NumPy reference from the ops' definitions (the depthwise and Conv2D
  gradients: TF's own kernels leave the gradient of an empty output uninitialized) or with TF.
"""
from __future__ import annotations

import subprocess
import sys
import zlib

import numpy as np
import onnx
import pytest

import ort_ops
import tensorflow as tf
from onnx import numpy_helper

import converters
from converters.gradients._conv import output_size
from comparison import bits_mismatch
from converters.verification import run_onnx
from ort_ops.checks.depthwise import output_size as dw_output_size

pytestmark = pytest.mark.tensorflow

raw = tf.raw_ops
f32 = np.float32
RTOL = 1e-5
FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}


# ---------------------------------------------------------------- the static check

def _constants(model):
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
    return values


_INFER = """
import sys
import onnx
from onnx import shape_inference
model = onnx.load_from_string(sys.stdin.buffer.read())
sys.stdout.buffer.write(shape_inference.infer_shapes(model, data_prop=True).SerializeToString())
"""


def _infer(model):
    """ONNX shape inference in a child process: the onnx wheel is built with assertions too, and its
    Slice inference aborts on a negative-size input (the issue 12 graph)."""
    done = subprocess.run([sys.executable, "-c", _INFER], input=model.SerializeToString(), capture_output=True)
    if done.returncode != 0:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise AssertionError(f"ONNX shape inference died (status {done.returncode}) on the graph: " + " | ".join(tail))
    return onnx.load_from_string(done.stdout)


def _shapes(model):
    inferred = _infer(model)
    shapes, types = {}, {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        tt = vi.type.tensor_type
        types[vi.name] = tt.elem_type
        if tt.HasField("shape"):
            shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    return shapes, types


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _window_problem(node, shapes, consts):
    """A Conv/ConvTranspose/pool whose (dilated) window is larger than its padded input, or whose padding
    reaches a whole window, else None."""
    x = shapes.get(node.input[0])
    if x is None or len(x) < 3 or _attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    spatial = x[2:]
    rank = len(spatial)
    if node.op_type in ("Conv", "ConvTranspose"):
        w = shapes.get(node.input[1])
        if w is None and node.input[1] in consts:
            w = list(consts[node.input[1]].shape)
        kernel = _attr(node, "kernel_shape") or (w[2:] if w else None)
    else:
        kernel = _attr(node, "kernel_shape")
    if kernel is None or any(k is None for k in kernel):
        return None
    pads = _attr(node, "pads") or [0] * (2 * rank)
    dilations = _attr(node, "dilations") or [1] * rank
    strides = _attr(node, "strides") or [1] * rank
    if any(p < 0 for p in pads):
        return f"negative pads {pads}"
    for i, (n, k, d) in enumerate(zip(spatial, kernel, dilations)):
        if n is None:
            continue
        if n == 0:
            return f"empty spatial input {x}"
        span = (k - 1) * d + 1
        if node.op_type == "ConvTranspose":
            out_pad = (_attr(node, "output_padding") or [0] * rank)[i]
            full = (n - 1) * strides[i] + span + out_pad
            if full - pads[i] - pads[i + rank] <= 0:
                return f"output size {full - pads[i] - pads[i + rank]} on axis {i}"
            if out_pad >= max(strides[i], d):
                return f"output_padding {out_pad} >= stride and dilation"
        else:
            if n + pads[i] + pads[i + rank] < span:
                return f"window span {span} > padded input {n}+{pads[i]}+{pads[i + rank]} on axis {i}"
            if node.op_type in ("MaxPool", "AveragePool") and max(pads[i], pads[i + rank]) >= k:
                return f"padding {pads[i]},{pads[i + rank]} >= window {k} on axis {i}"
    return None


def _slice_problem(node, shapes, consts):
    data = shapes.get(node.input[0])
    if data is None or any(name not in consts for name in node.input[1:3]):
        return None
    starts, ends = (consts[n].reshape(-1).tolist() for n in node.input[1:3])
    axes = consts[node.input[3]].reshape(-1).tolist() if len(node.input) > 3 and node.input[3] else list(range(len(starts)))
    steps = consts[node.input[4]].reshape(-1).tolist() if len(node.input) > 4 and node.input[4] else [1] * len(starts)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        dim = data[axis]
        if dim is None:
            continue
        if dim == 0:
            return f"slices the empty axis {axis}"
        if not (-dim <= start <= dim and -dim <= end <= dim):
            return f"bounds [{start}, {end}) on axis {axis} of size {dim} are clamped by ONNX Runtime"
    return None


def assert_safe_graph(model, allow_empty=()):
    """No node of ``model`` has an empty or inverted range (see the module docstring)."""
    shapes, types = _shapes(model)
    consts = _constants(model)
    outputs = {o.name for o in model.graph.output} | set(allow_empty)
    problems = []
    for node in model.graph.node:
        problem = None
        if node.op_type in ("Conv", "ConvTranspose", "MaxPool", "AveragePool"):
            problem = _window_problem(node, shapes, consts)
        elif node.op_type == "Slice":
            problem = _slice_problem(node, shapes, consts)
        elif node.op_type == "Pad" and len(node.input) > 1 and node.input[1] in consts:
            if (consts[node.input[1]] < 0).any():
                problem = f"negative pads {consts[node.input[1]].tolist()}"
        for out in node.output:
            shape = shapes.get(out)
            if problem is None and shape is not None and types.get(out) in FLOAT_TYPES:
                if any(d is not None and d < 0 for d in shape):
                    problem = f"output {out!r} has a negative dim {shape}"
                elif out not in outputs and any(d == 0 for d in shape):
                    problem = f"output {out!r} is an empty intermediate {shape}"
        if problem:
            problems.append(f"{node.op_type} {node.name!r}: {problem}")
    assert not problems, "unsafe nodes:\n  " + "\n  ".join(problems)


def _convert_check_run(cases, none_batch=False):
    """Convert ``cases`` ((label, fn, inputs, expected, indices of the inputs with a batch dim)) as one
    model (with a None batch if asked), check it, run it; returns the outputs."""
    specs, feeds = [], []
    for _, _, inputs, _, batched in cases:
        for i, a in enumerate(inputs):
            shape = list(a.shape)
            if none_batch and i in batched:
                shape[0] = None
            specs.append(tf.TensorSpec(shape, tf.as_dtype(a.dtype)))
            feeds.append(a)

    def many(*args):
        outs, i = [], 0
        for _, fn, inputs, _, _ in cases:
            outs.append(fn(*args[i:i + len(inputs)]))
            i += len(inputs)
        return outs

    model = converters.from_function(tf.function(many), specs, lowering="standard")
    assert_safe_graph(model)
    got = run_onnx(model, dict(zip([i.name for i in model.graph.input], feeds)))
    return [got[o.name] for o in model.graph.output]


def _compare(cases, got, exact=False):
    bad = []
    for (label, _, _, expected, *_), value in zip(cases, got):
        if value.shape != expected.shape:
            bad.append(f"{label}: shape {value.shape}, want {expected.shape}")
        elif exact:
            why = bits_mismatch(expected, value)
            if why:
                bad.append(f"{label}: {why}")
        elif expected.size:
            scale = max(float(np.abs(expected).max()), 1.0)
            err = float(np.abs(value.astype(np.float64) - expected).max())
            if not err <= RTOL * scale:
                bad.append(f"{label}: max error {err:.3g} (scale {scale:.3g})")
    assert not bad, "\n".join(bad)


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


# ---------------------------------------------------------------- references

def _taps(pads, strides, dilations, kernel, out):
    """For each tap (i, j): the padded-input rows and columns its outputs read."""
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            yield i, j, i * dilations[0] + np.arange(out[0]) * strides[0], j * dilations[1] + np.arange(out[1]) * strides[1]


def _pad(x, pads):
    return np.pad(x.astype(np.float64), [(0, 0), pads[0], pads[1], (0, 0)])


def depthwise_reference(op, x, f, dy, stride, dilation, pads, out):
    """float64 NHWC DepthwiseConv2dNative (op "fwd"), its input gradient ("bi") or filter gradient ("bf")."""
    kh, kw, c, m = f.shape
    xp = _pad(x, pads)
    f64 = f.astype(np.float64)
    if op == "fwd":
        y = np.zeros((x.shape[0], *out, c, m))
        for i, j, rows, cols in _taps(pads, (stride, stride), (dilation, dilation), (kh, kw), out):
            y += xp[:, rows][:, :, cols][..., None] * f64[i, j]
        return y.reshape(x.shape[0], *out, c * m)
    g = dy.astype(np.float64).reshape(dy.shape[0], *out, c, m)
    if op == "bf":
        df = np.zeros((kh, kw, c, m))
        for i, j, rows, cols in _taps(pads, (stride, stride), (dilation, dilation), (kh, kw), out):
            df[i, j] = np.einsum("nhwc,nhwcm->cm", xp[:, rows][:, :, cols], g)
        return df
    dxp = np.zeros_like(xp)
    for i, j, rows, cols in _taps(pads, (stride, stride), (dilation, dilation), (kh, kw), out):
        np.add.at(dxp, (slice(None), rows[:, None], cols[None, :]), np.einsum("nhwcm,cm->nhwc", g, f64[i, j]))
    return dxp[:, pads[0][0]:pads[0][0] + x.shape[1], pads[1][0]:pads[1][0] + x.shape[2]]


def conv2d_reference(op, x, w, dy, strides, dilations, pads, out):
    """float64 NHWC Conv2D filter gradient ("cbf") or input gradient ("cbi")."""
    xp = _pad(x, pads)
    w64, g = w.astype(np.float64), dy.astype(np.float64)
    if op == "cbf":
        dw = np.zeros(w.shape)
        for i, j, rows, cols in _taps(pads, strides, dilations, w.shape[:2], out):
            dw[i, j] = np.einsum("nhwc,nhwo->co", xp[:, rows][:, :, cols], g)
        return dw
    dxp = np.zeros_like(xp)
    for i, j, rows, cols in _taps(pads, strides, dilations, w.shape[:2], out):
        np.add.at(dxp, (slice(None), rows[:, None], cols[None, :]), np.einsum("nhwo,co->nhwc", g, w64[i, j]))
    return dxp[:, pads[0][0]:pads[0][0] + x.shape[1], pads[1][0]:pads[1][0] + x.shape[2]]


# ---------------------------------------------------------------- depthwise

# (label, input NHWC shape, (kh, kw), M, stride, dilation, padding, explicit (top, bottom, left, right))
DEPTHWISE = [
    ("issue 12: 1 channel, 5x5 kernel, stride 2, SAME on 9x9", (2, 9, 9, 1), (5, 5), 3, 2, 1, "SAME", None),
    ("kernel larger than the input, SAME", (2, 2, 3, 2), (5, 4), 1, 1, 1, "SAME", None),
    ("kernel larger than a 1x1 input, 1 channel", (1, 1, 1, 1), (3, 3), 2, 1, 1, "SAME", None),
    ("stride larger than the input, SAME", (2, 3, 2, 1), (2, 2), 2, 5, 1, "SAME", None),
    ("stride larger than the input, VALID", (1, 3, 4, 2), (2, 3), 1, 5, 1, "VALID", None),
    ("output 1x1, VALID, kernel = input", (2, 4, 3, 1), (4, 3), 2, 1, 1, "VALID", None),
    ("dilation spanning more than the input", (2, 3, 3, 1), (3, 3), 1, 1, 2, "SAME", None),
    ("dilation spanning more than the input, 2 channels", (1, 2, 5, 2), (2, 3), 2, 1, 3, "SAME", None),
    ("explicit padding beyond every window", (1, 3, 4, 2), (1, 1), 2, 5, 1, "EXPLICIT", (3, 0, 0, 2)),
    ("explicit padding larger than the kernel", (2, 1, 3, 1), (2, 3), 1, 2, 1, "EXPLICIT", (1, 1, 4, 0)),
    ("empty input, explicit padding makes it non-empty", (2, 0, 3, 2), (2, 2), 1, 1, 1, "EXPLICIT", (2, 1, 0, 0)),
    ("empty input and output, SAME", (2, 0, 3, 2), (3, 3), 1, 1, 1, "SAME", None),
    ("empty batch", (0, 4, 4, 2), (3, 3), 1, 2, 1, "SAME", None),
]


def _depthwise_case(op, label, shape, kernel, m, stride, dilation, padding, explicit):
    n, h, w, c = shape
    rng = _rng(op, label)
    x = rng.standard_normal(shape).astype(f32)
    f = rng.standard_normal((*kernel, c, m)).astype(f32)
    geometry = [dw_output_size(op, size, k, stride, dilation, padding, explicit and (explicit[2 * a], explicit[2 * a + 1]),
                               ("rows", "cols")[a]) for a, (size, k) in enumerate(zip((h, w), kernel))]
    out = [g[0] for g in geometry]
    pads = [(explicit[0], explicit[1]), (explicit[2], explicit[3])] if explicit else [(g[1], g[2]) for g in geometry]
    dy = rng.standard_normal((n, *out, c * m)).astype(f32)
    attrs = dict(strides=[1, stride, stride, 1], padding=padding, dilations=[1, dilation, dilation, 1],
                 explicit_paddings=[0, 0, *explicit, 0, 0] if explicit else [])
    expected = depthwise_reference(op, x, f, dy, stride, dilation, pads, out)
    if op == "fwd":
        return label, (lambda a, b: raw.DepthwiseConv2dNative(input=a, filter=b, **attrs)), [x, f], expected, (0,)
    if op == "bi":
        return label, (lambda b, g: raw.DepthwiseConv2dNativeBackpropInput(
            input_sizes=tf.constant(list(shape)), filter=b, out_backprop=g, **attrs)), [f, dy], expected, (1,)
    filter_sizes = list(f.shape)
    return label, (lambda a, g: raw.DepthwiseConv2dNativeBackpropFilter(
        input=a, filter_sizes=tf.constant(filter_sizes), out_backprop=g, **attrs)), [x, dy], expected, (0, 1)


@pytest.mark.parametrize("op", ["fwd", "bi", "bf"])
def test_depthwise_degenerate_geometries(op):
    cases = [_depthwise_case(op, *case) for case in DEPTHWISE]
    _compare(cases, _convert_check_run(cases))


def test_issue_12_reported_case_alone():
    """The reported model, exactly: one op, the pipeline's optimizers, float32 against TF's kernel."""
    case = _depthwise_case("bf", *DEPTHWISE[0])
    fn, inputs = case[1], case[2]
    got = _convert_check_run([case])
    tf_value = np.asarray(fn(*inputs))
    np.testing.assert_allclose(got[0], tf_value, rtol=RTOL, atol=RTOL * float(np.abs(tf_value).max()))


def test_depthwise_none_batch():
    cases = [_depthwise_case(op, *case) for op in ("fwd", "bf") for case in DEPTHWISE[:10]]
    _compare(cases, _convert_check_run(cases, none_batch=True))


# ---------------------------------------------------------------- Conv2D gradients

# (label, input HW, kernel, strides, dilations, padding, explicit (top, bottom, left, right))
CONV2D = [
    ("kernel larger than the input, SAME", (2, 3), (5, 4), (1, 1), (1, 1), "SAME", None),
    ("stride larger than the input, SAME", (3, 2), (2, 2), (5, 4), (1, 1), "SAME", None),
    ("stride larger than the input, VALID", (3, 4), (2, 3), (5, 5), (1, 1), "VALID", None),
    ("output 1x1, VALID", (4, 3), (4, 3), (1, 1), (1, 1), "VALID", None),
    ("window one row longer than the input, VALID: empty output", (2, 5), (3, 3), (1, 1), (1, 1), "VALID", None),
    ("dilation spanning more than the input", (3, 3), (3, 3), (1, 1), (2, 3), "SAME", None),
    ("explicit padding beyond every window", (1, 3), (1, 1), (5, 5), (1, 1), "EXPLICIT", (3, 0, 0, 2)),
    ("leading padding past the windows", (2, 5), (1, 2), (20, 1), (1, 1), "EXPLICIT", (10, 0, 1, 1)),
    ("explicit padding larger than the kernel", (1, 3), (2, 3), (2, 2), (1, 1), "EXPLICIT", (1, 1, 4, 0)),
    ("empty input, explicit padding makes it non-empty", (0, 3), (2, 2), (1, 1), (1, 1), "EXPLICIT", (2, 1, 0, 0)),
    ("empty input and output, SAME", (0, 3), (3, 3), (1, 1), (1, 1), "SAME", None),
    ("one channel", (5, 4), (3, 3), (2, 2), (1, 1), "SAME", None),
]


def _conv2d_case(op, label, hw, kernel, strides, dilations, padding, explicit, batch=2):
    rng = _rng(op, label)
    cin, cout = (1, 1) if label == "one channel" else (2, 3)
    x = rng.standard_normal((batch, *hw, cin)).astype(f32)
    w = rng.standard_normal((*kernel, cin, cout)).astype(f32)
    pads = []
    for a, (n, k, s, d) in enumerate(zip(hw, kernel, strides, dilations)):
        if padding == "EXPLICIT":
            pads.append((explicit[2 * a], explicit[2 * a + 1]))
        elif padding == "VALID":
            pads.append((0, 0))
        else:
            total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
            pads.append((total // 2, total - total // 2))
    out = [output_size(n, k, s, d, *p) for n, k, s, d, p in zip(hw, kernel, strides, dilations, pads)]
    dy = rng.standard_normal((batch, *out, cout)).astype(f32)
    attrs = dict(strides=[1, *strides, 1], padding=padding, dilations=[1, *dilations, 1],
                 explicit_paddings=[0, 0, *explicit, 0, 0] if explicit else [])
    expected = conv2d_reference(op, x, w, dy, strides, dilations, pads, out)
    if op == "cbf":
        sizes = list(w.shape)
        return (label, (lambda a, g: raw.Conv2DBackpropFilter(input=a, filter_sizes=sizes, out_backprop=g, **attrs)),
                [x, dy], expected, (0, 1))
    sizes = list(x.shape)
    return (label, (lambda b, g: raw.Conv2DBackpropInput(input_sizes=sizes, filter=b, out_backprop=g, **attrs)),
            [w, dy], expected, (1,))


@pytest.mark.parametrize("op", ["cbf", "cbi"])
def test_conv2d_backprop_degenerate_geometries(op):
    cases = [_conv2d_case(op, *case) for case in CONV2D]
    _compare(cases, _convert_check_run(cases))


def test_conv2d_backprop_filter_none_batch():
    cases = [_conv2d_case("cbf", *case) for case in CONV2D if case[1][0] > 0]
    _compare(cases, _convert_check_run(cases, none_batch=True))


def test_filter_gradients_of_an_empty_batch_at_run_time():
    """A None batch that is 0 at run time: the filter gradients' Conv takes the batch as its channel
    axis, and ONNX Runtime's Conv loops forever over zero channels (both builds), so the lowerings
    append one zero image; the other ops run as they are."""
    cases = [_depthwise_case(op, *DEPTHWISE[-1]) for op in ("fwd", "bi", "bf")]
    cases += [_conv2d_case(op, *CONV2D[-1], batch=0) for op in ("cbf", "cbi")]
    _compare(cases, _convert_check_run(cases, none_batch=True))


# ---------------------------------------------------------------- pooling gradients (TF is exact here)

# (label, input NHWC shape, ksize, stride, padding)
POOLS = [
    ("window larger than the input, SAME", (2, 2, 3, 2), (5, 4), 1, "SAME"),
    ("window larger than a 1x1 input, 1 channel", (1, 1, 1, 1), (3, 3), 1, "SAME"),
    ("stride larger than the input, SAME", (2, 3, 2, 1), (2, 2), 5, "SAME"),
    ("stride larger than the input, VALID", (2, 3, 4, 2), (2, 3), 5, "VALID"),
    ("output 1x1, VALID, window = input", (2, 4, 3, 1), (4, 3), 1, "VALID"),
    ("empty input, SAME", (2, 0, 3, 2), (2, 2), 1, "SAME"),
]


def _pool_cases(kind):
    cases = []
    for label, shape, ksize, stride, padding in POOLS:
        rng = _rng(kind, label)
        x = rng.standard_normal(shape).astype(f32)
        ks, st = [1, *ksize, 1], [1, stride, stride, 1]
        if kind == "max":
            y = np.asarray(raw.MaxPool(input=x, ksize=ks, strides=st, padding=padding))
            g = rng.standard_normal(y.shape).astype(f32)
            fn = (lambda ks, st, padding: lambda a, o, d: raw.MaxPoolGrad(
                orig_input=a, orig_output=o, grad=d, ksize=ks, strides=st, padding=padding))(ks, st, padding)
            inputs, batched = [x, y, g], (0, 1, 2)
        else:
            y = np.asarray(raw.AvgPool(value=x, ksize=ks, strides=st, padding=padding))
            g = rng.standard_normal(y.shape).astype(f32)
            fn = (lambda shape, ks, st, padding: lambda d: raw.AvgPoolGrad(
                orig_input_shape=list(shape), grad=d, ksize=ks, strides=st, padding=padding))(shape, ks, st, padding)
            inputs, batched = [g], (0,)
        expected = np.asarray(fn(*inputs)) if x.size else np.zeros(shape, f32)
        cases.append((label, fn, inputs, expected, batched))
    return cases


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pool_gradients_degenerate_geometries(kind):
    cases = _pool_cases(kind)
    _compare(cases, _convert_check_run(cases), exact=kind == "max")


def test_max_pool_grad_explicit_padding_of_a_whole_window_is_rejected_like_tf():
    x = np.ones((1, 3, 4, 1), f32)
    attrs = dict(ksize=[1, 2, 2, 1], strides=[1, 1, 1, 1], padding="EXPLICIT", explicit_paddings=[0, 0, 2, 0, 0, 0, 0, 0])
    with pytest.raises(tf.errors.InvalidArgumentError, match="Top padding 2 needs to be smaller than the window size 2"):
        raw.MaxPool(input=x, **attrs)
    fn = lambda a, o, d: raw.MaxPoolGrad(orig_input=a, orig_output=o, grad=d, **attrs)  # noqa: E731
    specs = [tf.TensorSpec([1, 3, 4, 1], tf.float32), tf.TensorSpec([1, 4, 3, 1], tf.float32), tf.TensorSpec([1, 4, 3, 1], tf.float32)]
    with pytest.raises(converters.ConversionError, match="Top padding 2 needs to be smaller than the window size 2"):
        converters.from_function(tf.function(fn), specs, lowering="standard")


# ---------------------------------------------------------------- StridedSliceGrad (TF is exact)

# (shape, begin, end, strides, masks): negative strides over empty dims, begin before -dim
SLICES = [
    ((0, 3), [-1, 0], [0, 3], [-1, 1], {}),
    ((0, 3), [0, 1], [0, 2], [-1, 1], dict(begin_mask=1, end_mask=1)),
    ((3, 0), [0, 0], [3, 0], [1, -1], dict(end_mask=2)),
    ((4, 3), [-10, 1], [-20, 2], [-1, 1], {}),
    ((4, 3), [-10, 0], [0, 3], [-1, 1], dict(end_mask=1)),
    ((4, 3), [2, 0], [-10, 3], [-1, 1], {}),
    ((4, 3), [-10, 0], [10, 3], [1, 1], {}),
    ((4, 3), [3, 0], [1, 3], [1, 1], {}),
    ((1, 3), [0, 2], [1, 0], [1, -2], {}),
    ((4, 3), [-2, 1], [-1, 2], [1, 1], dict(shrink_axis_mask=2)),
]


@pytest.mark.parametrize("none_batch", [False, True], ids=["static", "none_batch"])
def test_strided_slice_grad_empty_dims_and_far_bounds(none_batch):
    cases = []
    for shape, begin, end, strides, masks in SLICES:
        rng = _rng(shape, begin, end, strides)
        x = rng.standard_normal(shape).astype(f32)
        dy = rng.standard_normal(tf.strided_slice(x, begin, end, strides, **masks).shape).astype(f32)
        fn = (lambda begin, end, strides, masks: lambda d, a: raw.StridedSliceGrad(
            shape=tf.shape(a), begin=begin, end=end, strides=strides, dy=d, **masks))(begin, end, strides, masks)
        batched = (0, 1) if dy.ndim == 2 else (1,)
        cases.append((f"{shape} [{begin}:{end}:{strides}] {masks}", fn, [dy, x], np.asarray(fn(dy, x)), batched))
    _compare(cases, _convert_check_run(cases, none_batch=none_batch), exact=True)


# ---------------------------------------------------------------- resize gradient, one channel

@pytest.mark.parametrize("none_batch", [False, True], ids=["static", "none_batch"])
def test_resize_nearest_grad_one_channel(none_batch):
    # Its NHWC -> NCHW Transpose of one channel becomes a Reshape in tf2onnx's optimizer; the Reshapes
    # after it must not use ONNX's 0 (copy) entries, which the folded Reshape would read wrongly.
    rng = _rng("resize")
    g = rng.standard_normal((2, 6, 5, 1)).astype(f32)
    fn = lambda d: raw.ResizeNearestNeighborGrad(grads=d, size=[3, 4])  # noqa: E731
    case = [("1 channel", fn, [g], np.asarray(fn(g)), (0,))]
    _compare(case, _convert_check_run(case, none_batch=none_batch), exact=True)


# ---------------------------------------------------------------- the static check catches what it should

def test_static_check_catches_the_issue_12_graph():
    """The reported graph's shape: a 1-channel input reshaped with a copied dim that reads the wrong
    tensor, so the Conv's dilated kernel is larger than its padded input and a Slice reads its output."""
    from onnx import TensorProto, helper

    def model(with_slice):
        nodes = [helper.make_node("Reshape", ["x", "shape"], ["x_groups"]),
                 helper.make_node("Conv", ["x_groups", "w"], ["dw"], dilations=[2, 2], pads=[2, 2, 2, 2])]
        if with_slice:
            nodes.append(helper.make_node("Slice", ["dw", "starts", "ends", "axes"], ["cropped"]))
        inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
                 (("shape", [1, -1, 0, 0]), ("starts", [0, 0]), ("ends", [5, 5]), ("axes", [2, 3]))]
        graph = helper.make_graph(nodes, "issue12", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 9, 9, 1]),
                                                     helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 18, 5, 5])],
                                  [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)], inits)
        return ort_ops.model.set_lowest_ir_version(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))

    with pytest.raises(AssertionError, match="window span 9 > padded input 1"):
        assert_safe_graph(model(with_slice=False))
    # With the Slice, ONNX's own shape inference (an assertion-enabled build too) aborts: a child dies.
    with pytest.raises(AssertionError, match="shape inference died"):
        assert_safe_graph(model(with_slice=True))
