"""TF's gradient ops (converters.gradients) converted alone and compared with live TensorFlow.

Every handler runs in both lowerings on seeded random inputs and on its edge inputs (exact zeros,
-0, the 6.0 bound, subnormals, NaN/Inf, ties in max-pool windows, an empty batch), with a static
and, where the op sees one, a None batch dimension.

Tolerances:
* bit-exact: the activation gradients, MaxPoolGrad/V2, StridedSliceGrad and the shape ops. They are
  TF's own formulas in TF's order, with TF's flush-to-zero (subnormals act as zeros); NaN compares
  equal to NaN.
* SigmoidGrad/SqrtGrad on a tensor whose size is not a multiple of the SIMD width: TF computes the
  last n % 16 elements with Eigen's scalar formula, which rounds twice in another order: 2 ulp
  (rtol 2**-22, no absolute floor).
* sums (BiasAddGrad, Conv2DBackprop*, AvgPoolGrad, the cross-entropies, L2Loss): ONNX Runtime adds in
  another order than TF's Eigen kernels. The reordering error of a float32 sum of n terms is at most
  about n * 2**-24 * sum|terms|; our sums have n <= 100 terms of size ~1 whose total is within ~10x
  the largest output, so rtol 1e-5 with an absolute floor of 1e-5 * max|TF output| bounds it with
  margin (the largest error seen is ~2e-6 relative). The Conv2DBackpropFilter cases sum up to ~200
  terms (batch x output rows x columns) of random sign, whose rounding errors add like a random walk
  (~sqrt(n) * 2**-24 * |term|), far below that bound: the largest error seen against any reference
  below is 3e-7 * max|output|, 30x inside the floor. test_tolerances_catch_wrong_results shows that
  zeros and a flipped sign fail these tolerances, and the tf2onnx cases (relative errors ~1) too.
Conv2DBackprop* references: TF's Eigen kernels (this process, the suite's pinned mode) run NHWC without
dilations only ("Current CPU implementations do not yet support dilation rates larger than 1", "only
supports the NHWC tensor format"). TF's oneDNN kernels, run in a child process (tests/tf_modes.py,
tests/tf_oracle.py:conv2d_backprops), compute dilations and NCHW with SAME/VALID padding, and agree with a
float64 NumPy evaluation of the definition within SUM_RTOL (test_onednn_conv_backprops); with EXPLICIT
padding they fall back to Eigen and reject dilations and NCHW alike. So an undilated NCHW EXPLICIT case is
compared with TF's NHWC result transposed, and a dilated EXPLICIT case with NumPy only. The same sum
tolerance applies to oneDNN (it too adds in its own order) and to NumPy's float64 result rounded to float32.
test_conv2d_backprop_input_against_tf2onnx records where tf2onnx's own Conv2DBackpropInput is right and
wrong (details in converters/gradients/bias_conv.py).
"""
from __future__ import annotations

import zlib
from typing import NamedTuple

import numpy as np
import pytest
import tensorflow as tf
import tf2onnx

import converters
from converters.errors import ConversionError, LoweringError
from converters.gradients import GRADIENT_HANDLERS
from converters.gradients._conv import output_size
from converters.verification import compare_output, run_onnx
from tf_modes import call_in_mode

pytestmark = pytest.mark.tensorflow

LOWERINGS = ("custom", "standard")
raw = tf.raw_ops
f32 = np.float32
SUM_RTOL = 1e-5
ULP2 = 2.0 ** -22

SPECIALS = np.array([-1.0, 1.0, np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 2.0, 6.0, 5.999, 6.001,
                     1.2e-38, -1.2e-38, 3e38], f32)


def _convert_run(fn, inputs, lowering, none_batch=False):
    """(TF outputs, ORT outputs) of ``fn`` traced on ``inputs``' specs (batch None if asked)."""
    specs = []
    for a in inputs:
        shape = list(a.shape)
        if none_batch and shape and a.dtype.kind == "f":
            shape[0] = None
        specs.append(tf.TensorSpec(shape, tf.as_dtype(a.dtype)))
    function = tf.function(fn)
    model = converters.from_function(function, specs, lowering=lowering)
    expected = function(*inputs)
    expected = [np.asarray(e) for e in (expected if isinstance(expected, (list, tuple)) else [expected])]
    feed = dict(zip([i.name for i in model.graph.input], inputs))
    got = run_onnx(model, feed)
    return expected, [got[o.name] for o in model.graph.output]


def _check(fn, inputs, lowering, none_batch=False, exact=True, rtol=None, atol=None):
    expected, actual = _convert_run(fn, inputs, lowering, none_batch)
    assert len(expected) == len(actual)
    errors = []
    for i, (e, a) in enumerate(zip(expected, actual)):
        check = compare_output(f"output {i}", e, a, exact=exact, rtol=rtol, atol=atol)
        assert check.ok, f"{check}"
        errors.append(check.max_abs_err)
    return errors


def _sum_check(fn, inputs, lowering, none_batch=False):
    return _check(fn, inputs, lowering, none_batch, exact=False, rtol=SUM_RTOL)


# ---------------------------------------------------------------- activations

ACTIVATIONS = {
    "ReluGrad": lambda dy, x: raw.ReluGrad(gradients=dy, features=x),
    "Relu6Grad": lambda dy, x: raw.Relu6Grad(gradients=dy, features=x),
    "LeakyReluGrad": lambda dy, x: raw.LeakyReluGrad(gradients=dy, features=x, alpha=0.3),
    "EluGrad": lambda dy, x: raw.EluGrad(gradients=dy, outputs=x),
    "SeluGrad": lambda dy, x: raw.SeluGrad(gradients=dy, outputs=x),
    "SigmoidGrad": lambda dy, x: raw.SigmoidGrad(y=x, dy=dy),
    "TanhGrad": lambda dy, x: raw.TanhGrad(y=x, dy=dy),
    "SoftsignGrad": lambda dy, x: raw.SoftsignGrad(gradients=dy, features=x),
    "SqrtGrad": lambda dy, x: raw.SqrtGrad(y=x, dy=dy),
    "RsqrtGrad": lambda dy, x: raw.RsqrtGrad(y=x, dy=dy),
    "ReciprocalGrad": lambda dy, x: raw.ReciprocalGrad(y=x, dy=dy),
    "InvGrad": lambda dy, x: raw.InvGrad(y=x, dy=dy),
}
# Eigen's scalar and vector formulas round differently for these (see the module docstring).
SCALAR_TAIL_DIFFERS = {"SigmoidGrad", "SqrtGrad"}


def _activation_inputs(dtype, rows=3, width=None):
    """Every special paired with every special (as dy and as x), then seeded random values; the
    total size a multiple of 16 unless ``width`` says otherwise."""
    rng = np.random.default_rng(7)
    dy, x = np.meshgrid(SPECIALS, SPECIALS)
    random = rng.standard_normal((2, 256)).astype(f32) * 3
    dy = np.concatenate([dy.reshape(-1), random[0]])
    x = np.concatenate([x.reshape(-1), random[1]])
    width = width or dy.size // rows
    n = rows * width
    dy, x = np.resize(dy, n), np.resize(x[::-1], n)
    return dy.reshape(rows, width).astype(dtype), x.reshape(rows, width).astype(dtype)


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("op", sorted(ACTIVATIONS))
def test_activation_gradients_bit_exact(op, lowering):
    for dtype, none_batch in ((np.float32, False), (np.float32, True), (np.float64, True)):
        dy, x = _activation_inputs(dtype)
        _check(ACTIVATIONS[op], [dy, x], lowering, none_batch=none_batch)
    empty = np.zeros((0, 16), f32)
    _check(ACTIVATIONS[op], [empty, empty], lowering, none_batch=True)


@pytest.mark.parametrize("op", sorted(ACTIVATIONS))
def test_activation_gradients_scalar_tail(op):
    dy, x = _activation_inputs(np.float32, rows=1, width=37)
    if op in SCALAR_TAIL_DIFFERS:
        _check(ACTIVATIONS[op], [dy, x], "standard", exact=False, rtol=ULP2, atol=0.0)
    else:
        _check(ACTIVATIONS[op], [dy, x], "standard")


def test_selection_quirks_hold_in_tf():
    """The TF behaviour the handlers reproduce, asserted on TF itself (so a TF change shows up)."""
    masked = np.asarray(raw.ReluGrad(gradients=f32([-1, np.nan, np.inf]), features=f32([-1, -1, -1])))
    assert np.signbit(masked[0]) and masked[0] == 0 and np.isnan(masked[1:]).all()
    bound = np.asarray(raw.Relu6Grad(gradients=np.ones(4, f32), features=f32([0, 6, 5.999, 1e-40])))
    assert bound.tolist() == [0, 0, 1, 0]
    assert np.asarray(raw.SqrtGrad(y=f32([0.0]), dy=f32([0.0])))[0] == 0  # mul_no_nan, not NaN


# ---------------------------------------------------------------- bias and convolution

@pytest.mark.parametrize("lowering", LOWERINGS)
def test_bias_add_grad(lowering):
    rng = np.random.default_rng(1)
    g = rng.standard_normal((3, 4, 5, 6)).astype(f32)
    _sum_check(lambda a: raw.BiasAddGrad(out_backprop=a, data_format="NHWC"), [g], lowering, none_batch=True)
    _sum_check(lambda a: raw.BiasAddGrad(out_backprop=a, data_format="NCHW"), [g], lowering, none_batch=True)
    _sum_check(lambda a: raw.BiasAddGrad(out_backprop=a), [g[:, 0, 0, :]], lowering, none_batch=True)
    _sum_check(lambda a: raw.BiasAddGrad(out_backprop=a), [g[:0]], lowering, none_batch=True)


class ConvCase(NamedTuple):
    """One Conv2D backprop geometry. ``explicit`` holds NHWC-ordered (before, after) pairs whatever ``fmt``;
    x is (2, *size, 3) and the filter (*kernel, 3, 4)."""
    fmt: str
    padding: str
    strides: tuple
    dilations: tuple
    explicit: tuple = ()
    size: tuple = (9, 8)
    kernel: tuple = (3, 2)

    def __str__(self):
        pads = f"{self.explicit[2:6]}" if self.padding == "EXPLICIT" else ""
        return (f"{self.fmt}-{self.padding}{pads}-x{self.size}-k{self.kernel}-s{self.strides}-d{self.dilations}"
                .replace(" ", ""))


def _conv_geometry(case):
    """((before, after) per spatial dim, output size per spatial dim) as TF computes them."""
    pads, out = [], []
    for size, k, s, d, axis in zip(case.size, case.kernel, case.strides, case.dilations, (1, 2)):
        if case.padding == "VALID":
            p = (0, 0)
        elif case.padding == "SAME":
            total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
            p = (total // 2, total - total // 2)
        else:
            p = (case.explicit[2 * axis], case.explicit[2 * axis + 1])
        pads.append(p)
        out.append(output_size(size, k, s, d, *p))
    return pads, out


def _to_layout(case, a):
    return a.transpose(0, 3, 1, 2) if case.fmt == "NCHW" else a


def _conv_inputs(case):
    """Seeded NHWC (x, w, dy) of the case."""
    rng = np.random.default_rng(zlib.crc32(str(case).encode()))
    _, (oh, ow) = _conv_geometry(case)
    x = rng.standard_normal((2, *case.size, 3)).astype(f32)
    w = rng.standard_normal((*case.kernel, 3, 4)).astype(f32)
    dy = rng.standard_normal((2, oh, ow, 4)).astype(f32)
    return x, w, dy


def _conv_attrs(case, fmt=None):
    fmt = fmt or case.fmt
    four = (lambda v: [1, v[0], v[1], 1]) if fmt == "NHWC" else (lambda v: [1, 1, v[0], v[1]])
    explicit = list(case.explicit)
    if fmt == "NCHW" and explicit:
        explicit = explicit[0:2] + explicit[6:8] + explicit[2:6]
    return dict(strides=four(case.strides), padding=case.padding, explicit_paddings=explicit, data_format=fmt,
                dilations=four(case.dilations))


def _conv_fns(case, x_shape, w_shape):
    """(filter gradient fn(x, dy), input gradient fn(w, dy) with constant input_sizes, input gradient
    fn(x, w, dy) with input_sizes = tf.shape(x), as a tape gradient builds it)."""
    attrs = _conv_attrs(case)

    def by_filter(a, g):
        return raw.Conv2DBackpropFilter(input=a, filter_sizes=list(w_shape), out_backprop=g, **attrs)

    def by_input(k, g):
        return raw.Conv2DBackpropInput(input_sizes=list(x_shape), filter=k, out_backprop=g, **attrs)

    def by_input_shape_of_x(a, k, g):
        return raw.Conv2DBackpropInput(input_sizes=tf.shape(a), filter=k, out_backprop=g, **attrs)

    return by_filter, by_input, by_input_shape_of_x


def _numpy_conv_grads(x, w, dy, pads, strides, dilations):
    """float64 (filter gradient, input gradient) of an NHWC convolution, from its definition."""
    x, w, dy = (a.astype(np.float64) for a in (x, w, dy))
    (pt, pb), (pl, pr) = pads
    xp = np.pad(x, [(0, 0), (pt, pb), (pl, pr), (0, 0)])
    dxp = np.zeros_like(xp)
    dw = np.zeros_like(w)
    oh, ow = dy.shape[1:3]
    for i in range(w.shape[0]):
        for j in range(w.shape[1]):
            r0, c0 = i * dilations[0], j * dilations[1]
            taps = (slice(None), slice(r0, r0 + (oh - 1) * strides[0] + 1, strides[0]),
                    slice(c0, c0 + (ow - 1) * strides[1] + 1, strides[1]))
            dw[i, j] = np.einsum("nhwc,nhwo->co", xp[taps], dy)
            dxp[taps] += np.einsum("nhwo,co->nhwc", dy, w[i, j])
    return dw, dxp[:, pt:pt + x.shape[1], pl:pl + x.shape[2], :]


# NHWC geometries: the undilated ones against TF's Eigen kernels here, the dilated ones against oneDNN.
CONV_CASES = [
    ConvCase("NHWC", "SAME", (1, 1), (1, 1)),
    ConvCase("NHWC", "SAME", (2, 3), (1, 1)),
    ConvCase("NHWC", "VALID", (2, 2), (1, 1)),
    ConvCase("NHWC", "VALID", (1, 2), (1, 1)),
    ConvCase("NHWC", "EXPLICIT", (1, 1), (1, 1), (0, 0, 1, 2, 0, 3, 0, 0)),
    ConvCase("NHWC", "EXPLICIT", (2, 3), (1, 1), (0, 0, 2, 0, 1, 1, 0, 0)),
    ConvCase("NHWC", "SAME", (1, 1), (2, 3)),
    ConvCase("NHWC", "SAME", (2, 2), (2, 2)),
    ConvCase("NHWC", "VALID", (2, 1), (2, 2)),
    ConvCase("NHWC", "EXPLICIT", (2, 2), (3, 1), (0, 0, 1, 2, 2, 0, 0, 0)),
    ConvCase("NCHW", "SAME", (2, 3), (1, 1)),
    ConvCase("NCHW", "VALID", (2, 2), (1, 1)),
    ConvCase("NCHW", "SAME", (1, 1), (2, 3)),
    ConvCase("NCHW", "VALID", (2, 1), (1, 2)),
    ConvCase("NCHW", "EXPLICIT", (2, 1), (1, 1), (0, 0, 1, 1, 2, 0, 0, 0)),
    ConvCase("NCHW", "EXPLICIT", (1, 2), (2, 1), (0, 0, 2, 1, 0, 1, 0, 0)),
]

# tf2onnx 1.17's own Conv2DBackpropInput handler (plain tf2onnx.convert.from_function, opset 17), checked
# against the same references: (case, input_sizes "constant" or "shape" (tf.shape(x), None batch),
# tf2onnx right?). See converters/gradients/bias_conv.py for what goes wrong where.
TF2ONNX_CASES = [
    (ConvCase("NHWC", "SAME", (2, 2), (1, 1), size=(9, 7)), "constant", True),
    (ConvCase("NHWC", "SAME", (2, 2), (1, 1), size=(9, 7)), "shape", True),
    (ConvCase("NHWC", "VALID", (1, 1), (2, 3), size=(9, 7)), "constant", True),
    (ConvCase("NCHW", "SAME", (2, 2), (2, 2), size=(9, 7)), "constant", True),
    (ConvCase("NHWC", "VALID", (2, 2), (1, 1), size=(9, 7)), "shape", True),
    (ConvCase("NHWC", "VALID", (2, 2), (1, 1), size=(9, 7)), "constant", False),  # 3: negative pads
    (ConvCase("NHWC", "EXPLICIT", (1, 1), (1, 1), (0, 0, 2, 0, 0, 1, 0, 0)), "constant", False),  # 1: values
    (ConvCase("NHWC", "EXPLICIT", (2, 2), (1, 1), (0, 0, 2, 0, 0, 1, 0, 0)), "shape", False),  # 1
    (ConvCase("NHWC", "EXPLICIT", (1, 1), (1, 1), (0, 0, 1, 1, 2, 2, 0, 0)), "constant", False),  # 2: fails
    (ConvCase("NHWC", "EXPLICIT", (1, 1), (2, 2), (0, 0, 2, 0, 0, 1, 0, 0)), "constant", False),  # 1, dilated
    (ConvCase("NCHW", "SAME", (1, 1), (1, 1), size=(9, 7)), "shape", False),  # 4: shape
    (ConvCase("NCHW", "SAME", (2, 2), (2, 2), size=(9, 7)), "shape", False),  # 4
]


@pytest.fixture(scope="module")
def onednn_conv():
    """TF's oneDNN results (or its error message) for every case Eigen cannot run, from one child process."""
    cases = sorted({c for c in CONV_CASES + [c for c, _, _ in TF2ONNX_CASES]
                    if c.fmt == "NCHW" or c.dilations != (1, 1)}, key=str)
    requests = []
    for case in cases:
        x, w, dy = _conv_inputs(case)
        requests.append((_to_layout(case, x), w, _to_layout(case, dy), _conv_attrs(case)))
    return dict(zip(cases, call_in_mode("onednn", "tf_oracle:conv2d_backprops", requests)))


def _conv_reference(case, onednn):
    """(filter gradient, input gradient) in the case's layout, and where they come from.

    TF's Eigen kernels (this process) run NHWC without dilation only. oneDNN (tests/tf_modes.py) also runs
    dilations and NCHW, but not with EXPLICIT padding: it hands those to Eigen, which rejects them (see
    test_onednn_conv_backprops). So an undilated NCHW EXPLICIT case is TF's Eigen NHWC result transposed
    (the layout only moves data), and a dilated EXPLICIT case is checked against NumPy.
    """
    x, w, dy = _conv_inputs(case)
    from_onednn = onednn.get(case)
    if from_onednn is not None and not isinstance(from_onednn, str):
        return from_onednn, "TF oneDNN"
    if case.dilations == (1, 1):
        attrs = _conv_attrs(case, "NHWC")
        dw = np.asarray(raw.Conv2DBackpropFilter(input=x, filter_sizes=list(w.shape), out_backprop=dy, **attrs))
        dx = np.asarray(raw.Conv2DBackpropInput(input_sizes=list(x.shape), filter=w, out_backprop=dy, **attrs))
        return (dw, _to_layout(case, dx)), "TF Eigen"
    pads, _ = _conv_geometry(case)
    dw, dx = _numpy_conv_grads(x, w, dy, pads, case.strides, case.dilations)
    return (dw.astype(f32), _to_layout(case, dx.astype(f32))), "NumPy"


def _run_converted(fn, inputs, lowering, none_batch=()):
    """ORT's output of ``fn`` converted by the project; inputs at the indices in none_batch get a None batch."""
    specs = [tf.TensorSpec([None, *a.shape[1:]] if i in none_batch else a.shape, tf.float32)
             for i, a in enumerate(inputs)]
    model = converters.from_function(tf.function(fn), specs, lowering=lowering)
    return list(run_onnx(model, dict(zip([i.name for i in model.graph.input], inputs))).values())[0]


def _run_plain_tf2onnx(fn, inputs, none_batch=()):
    """ORT's output of ``fn`` converted by tf2onnx alone (its own handlers, opset 17), or the exception."""
    specs = [tf.TensorSpec([None, *a.shape[1:]] if i in none_batch else a.shape, tf.float32)
             for i, a in enumerate(inputs)]
    try:
        model, _ = tf2onnx.convert.from_function(tf.function(fn), input_signature=specs, opset=17)
        return list(run_onnx(model, dict(zip([i.name for i in model.graph.input], inputs))).values())[0]
    except Exception as e:  # a failed conversion or a model ONNX Runtime refuses: tf2onnx is wrong there
        return e


def _sum_close(expected, actual):
    return not isinstance(actual, Exception) and compare_output("grad", expected, actual, rtol=SUM_RTOL).ok


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("case", CONV_CASES, ids=str)
def test_conv2d_backprop(case, lowering, onednn_conv):
    x, w, dy = _conv_inputs(case)
    x, dy = _to_layout(case, x), _to_layout(case, dy)
    (dw, dx), source = _conv_reference(case, onednn_conv)
    by_filter, by_input, by_input_shape_of_x = _conv_fns(case, x.shape, w.shape)
    checks = [(by_filter, [x, dy], (0, 1), dw), (by_input, [w, dy], (), dx),
              (by_input_shape_of_x, [x, w, dy], (0, 2), dx)]
    for fn, inputs, none_batch, expected in checks:
        check = compare_output(f"{fn.__name__} vs {source}", expected, _run_converted(fn, inputs, lowering, none_batch),
                               rtol=SUM_RTOL)
        assert check.ok, f"{check}"


def test_onednn_conv_backprops(onednn_conv):
    """What oneDNN does with the cases Eigen rejects: it runs dilations and NCHW, and agrees with NumPy's
    float64 result within SUM_RTOL; it rejects EXPLICIT padding with a dilation or in NCHW. If TF changes
    either, this fails and _conv_reference's choice of reference needs a look."""
    for case, result in onednn_conv.items():
        if case.padding == "EXPLICIT":
            rejected = isinstance(result, str) and ("dilation rates larger than 1" in result or "only supports NHWC" in result)
            assert rejected, f"{case}: oneDNN now runs it"
            continue
        assert not isinstance(result, str), f"{case}: {result}"
        x, w, dy = _conv_inputs(case)
        pads, _ = _conv_geometry(case)
        dw, dx = _numpy_conv_grads(x, w, dy, pads, case.strides, case.dilations)
        for name, expected, got in (("dw", dw, result[0]), ("dx", _to_layout(case, dx), result[1])):
            check = compare_output(f"{case} {name}", expected.astype(f32), got, rtol=SUM_RTOL)
            assert check.ok, f"{check}"


@pytest.mark.parametrize("case,input_sizes,tf2onnx_right", TF2ONNX_CASES, ids=lambda v: str(v))
def test_conv2d_backprop_input_against_tf2onnx(case, input_sizes, tf2onnx_right, onednn_conv):
    """Ours matches the reference in both lowerings; tf2onnx's handler is right or wrong as recorded."""
    x, w, dy = _conv_inputs(case)
    x, dy = _to_layout(case, x), _to_layout(case, dy)
    (_, dx), source = _conv_reference(case, onednn_conv)
    _, by_input, by_input_shape_of_x = _conv_fns(case, x.shape, w.shape)
    fn, inputs, none_batch = ((by_input, [w, dy], ()) if input_sizes == "constant"
                              else (by_input_shape_of_x, [x, w, dy], (0, 2)))
    for lowering in LOWERINGS:
        check = compare_output(f"ours ({lowering}) vs {source}", dx, _run_converted(fn, inputs, lowering, none_batch),
                               rtol=SUM_RTOL)
        assert check.ok, f"{check}"
    theirs = _run_plain_tf2onnx(fn, inputs, none_batch)
    assert _sum_close(dx, theirs) == tf2onnx_right, f"tf2onnx: {theirs if isinstance(theirs, Exception) else 'values'}"


# ---------------------------------------------------------------- pooling

def _pool_inputs(kind, shape, rng):
    x = rng.standard_normal(shape).astype(f32)
    if kind == "ties":
        x = np.round(x).astype(f32)  # many equal maxima per window
    elif kind == "specials":
        flat = x.reshape(-1)
        picks = rng.choice(flat.size, flat.size // 3, replace=False)
        flat[picks] = rng.choice(f32([np.nan, -np.inf, np.inf, 0.0, -0.0, 1e-40]), picks.size)
    return x


POOL_CASES = [("SAME", (2, 2), (2, 2)), ("SAME", (3, 3), (1, 1)), ("VALID", (3, 2), (2, 1)), ("VALID", (2, 2), (1, 2))]


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("padding,ksize,strides", POOL_CASES)
def test_max_pool_grad_bit_exact(padding, ksize, strides, lowering):
    rng = np.random.default_rng(5)
    ks, st = [1, *ksize, 1], [1, *strides, 1]
    for kind in ("random", "ties", "specials"):
        x = _pool_inputs(kind, (2, 7, 6, 3), rng)
        y = np.asarray(raw.MaxPool(input=x, ksize=ks, strides=st, padding=padding))
        g = rng.standard_normal(y.shape).astype(f32)
        g.reshape(-1)[::5] = -1.0
        g.reshape(-1)[1::7] = np.nan
        v1 = lambda a, o, d: raw.MaxPoolGrad(orig_input=a, orig_output=o, grad=d, ksize=ks, strides=st, padding=padding)
        v2 = lambda a, o, d: raw.MaxPoolGradV2(orig_input=a, orig_output=o, grad=d, ksize=ks, strides=st, padding=padding)
        _check(v1, [x, y, g], lowering, none_batch=True)
        _check(v2, [x, y, g], lowering, none_batch=(kind == "ties"))
    empty = np.zeros((0, 7, 6, 3), f32)
    y = np.asarray(raw.MaxPool(input=empty, ksize=ks, strides=st, padding=padding))
    _check(v1, [empty, y, y], lowering, none_batch=True)


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("padding,ksize,strides", POOL_CASES)
def test_avg_pool_grad(padding, ksize, strides, lowering):
    rng = np.random.default_rng(6)
    ks, st = [1, *ksize, 1], [1, *strides, 1]
    y = np.asarray(raw.AvgPool(value=np.zeros((2, 7, 6, 3), f32), ksize=ks, strides=st, padding=padding))
    g = rng.standard_normal(y.shape).astype(f32)
    _sum_check(lambda d: raw.AvgPoolGrad(orig_input_shape=[2, 7, 6, 3], grad=d, ksize=ks, strides=st, padding=padding),
               [g], lowering)


# ---------------------------------------------------------------- losses

@pytest.mark.parametrize("lowering", LOWERINGS)
def test_softmax_cross_entropy_both_outputs(lowering):
    rng = np.random.default_rng(8)
    logits = rng.standard_normal((6, 7)).astype(f32) * 4
    logits[0] = 0.0  # a row of equal logits
    labels = rng.random((6, 7)).astype(f32)
    labels /= labels.sum(1, keepdims=True)
    ids = np.array([0, 6, 3, 2, 2, 5], np.int32)
    dense = lambda a, b: raw.SoftmaxCrossEntropyWithLogits(features=a, labels=b)
    sparse = lambda a, b: raw.SparseSoftmaxCrossEntropyWithLogits(features=a, labels=b)
    for none_batch in (False, True):
        _sum_check(dense, [logits, labels], lowering, none_batch)
        _sum_check(sparse, [logits, ids], lowering, none_batch)
        _sum_check(sparse, [logits, ids.astype(np.int64)], lowering, none_batch)
    _sum_check(dense, [logits[:0], labels[:0]], lowering, none_batch=True)


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_l2_loss(lowering):
    x = np.random.default_rng(9).standard_normal((5, 4, 3)).astype(f32)
    _sum_check(lambda a: raw.L2Loss(t=a), [x], lowering, none_batch=True)
    _sum_check(lambda a: raw.L2Loss(t=a), [x[:0]], lowering, none_batch=True)


# ---------------------------------------------------------------- slicing and shapes

SLICES = [
    ([1, 0, 2], [3, 5, 6], [1, 1, 2], {}),
    ([0, -1, 1], [4, 0, -1], [1, -1, 2], {}),
    ([1, 2], [3, 0], [1, 1], dict(end_mask=2)),
    ([0, 3], [0, 4], [1, 1], dict(ellipsis_mask=1, shrink_axis_mask=2)),
    ([0, 1, 0], [0, 2, 0], [1, 1, 1], dict(new_axis_mask=1, shrink_axis_mask=2, ellipsis_mask=4)),
    ([-1, 0], [0, 0], [-1, 1], dict(end_mask=1, begin_mask=2)),
    ([10, -10], [-10, 10], [-1, 1], {}),
    ([-1], [0], [1], dict(shrink_axis_mask=1)),
    ([2], [2], [1], {}),
]


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("begin,end,strides,masks", SLICES)
def test_strided_slice_grad_bit_exact(begin, end, strides, masks, lowering):
    rng = np.random.default_rng(10)
    x = rng.standard_normal((4, 5, 6)).astype(f32)
    dy = rng.standard_normal(tf.strided_slice(x, begin, end, strides, **masks).shape).astype(f32)
    dy.reshape(-1)[:3] = f32([-0.0, np.nan, -np.inf])[: dy.size]
    fn = lambda d, a: raw.StridedSliceGrad(shape=tf.shape(a), begin=begin, end=end, strides=strides, dy=d, **masks)
    _check(fn, [dy, x], lowering)
    _check(fn, [dy, x], lowering, none_batch=True)


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_shape_ops_with_none_batch(lowering):
    ones = lambda *s: np.ones(s, f32)  # noqa: E731
    bga = lambda p, q: raw.BroadcastGradientArgs(s0=tf.shape(p), s1=tf.shape(q))
    for a, b in (((3, 1, 4), (1, 4)), ((2, 3), (2, 3)), ((1, 3), (5, 1)), ((4, 1, 1), (4, 1, 1)), ((1, 1), (1, 1))):
        _check(bga, [ones(*a), ones(*b)], lowering, none_batch=True)
    offsets = lambda p, q, r: raw.ConcatOffset(concat_dim=1, shape=[tf.shape(p), tf.shape(q), tf.shape(r)])
    _check(offsets, [ones(2, 3), ones(2, 4), ones(2, 1)], lowering, none_batch=True)
    shapes = lambda p, q: raw.ShapeN(input=[p, q])
    _check(shapes, [ones(2, 3), ones(2, 4, 1)], lowering, none_batch=True)
    shapes64 = lambda p, q: raw.ShapeN(input=[p, q], out_type=tf.int64)
    _check(shapes64, [ones(2, 3), ones(0, 4, 1)], lowering, none_batch=True)


RESIZES = [((4, 5), (8, 10)), ((5, 7), (3, 4)), ((3, 3), (7, 5)), ((1, 3), (4, 2))]


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("align_corners,half_pixel_centers", [(False, False), (True, False), (False, True)])
def test_resize_grads(align_corners, half_pixel_centers, lowering):
    """Nearest: bit-exact (a scatter-add in TF's order). Bilinear: sums of at most 4 * 4 terms."""
    rng = np.random.default_rng(12)
    flags = dict(align_corners=align_corners, half_pixel_centers=half_pixel_centers)
    for (h, w), (oh, ow) in RESIZES:
        g = rng.standard_normal((2, oh, ow, 3)).astype(f32)
        g.reshape(-1)[:4] = f32([-0.0, np.nan, np.inf, 1e-40])
        nearest = lambda d: raw.ResizeNearestNeighborGrad(grads=d, size=[h, w], **flags)  # noqa: E731
        _check(nearest, [g], lowering, none_batch=True)
        g = rng.standard_normal((2, oh, ow, 3)).astype(f32)
        bilinear = lambda d, im: raw.ResizeBilinearGrad(grads=d, original_image=im, **flags)  # noqa: E731
        _sum_check(bilinear, [g, np.zeros((2, h, w, 3), f32)], lowering, none_batch=True)


# ---------------------------------------------------------------- registry, errors, tolerances

ITEM_ONE_OPS = {
    "ReluGrad", "Relu6Grad", "LeakyReluGrad", "EluGrad", "SeluGrad", "SigmoidGrad", "TanhGrad", "SoftsignGrad",
    "SqrtGrad", "RsqrtGrad", "ReciprocalGrad", "InvGrad", "BiasAddGrad", "Conv2DBackpropFilter",
    "Conv2DBackpropInput", "MaxPoolGrad", "MaxPoolGradV2", "AvgPoolGrad", "SoftmaxCrossEntropyWithLogits",
    "SparseSoftmaxCrossEntropyWithLogits", "L2Loss", "StridedSliceGrad", "BroadcastGradientArgs",
    "ConcatOffset", "ShapeN", "ResizeBilinearGrad", "ResizeNearestNeighborGrad",
}


def test_registry_holds_the_gradient_ops():
    assert ITEM_ONE_OPS <= set(GRADIENT_HANDLERS)


def test_handler_failure_names_op_and_node():
    x = np.zeros((1, 4, 4, 1), np.float64)
    fn = lambda a, g: raw.MaxPoolGrad(orig_input=a, orig_output=g, grad=g, ksize=[1, 2, 2, 1],  # noqa: E731
                                      strides=[1, 2, 2, 1], padding="VALID", name="pool_grad")
    spec = [tf.TensorSpec(x.shape, tf.float64), tf.TensorSpec((1, 2, 2, 1), tf.float64)]
    with pytest.raises(LoweringError, match=r"MaxPoolGrad \(node 'pool_grad'\).*float32"):
        converters.from_function(tf.function(fn), spec, lowering="standard")
    sizes = tf.TensorSpec((4,), tf.int32)
    grouped = lambda a, g: raw.Conv2DBackpropFilter(input=a, filter_sizes=[1, 1, 2, 4], out_backprop=g,  # noqa: E731
                                                    strides=[1, 1, 1, 1], padding="VALID", name="grouped")
    # 3 input channels cannot be groups of 2 (4 channels in 2 groups convert: tests/test_grouped_conv.py).
    with pytest.raises(ConversionError, match=r"Conv2DBackpropFilter \(node 'grouped'\).*not a grouped convolution"):
        converters.from_function(tf.function(grouped), [tf.TensorSpec((1, 3, 3, 3), tf.float32),
                                                        tf.TensorSpec((1, 3, 3, 4), tf.float32)])
    del sizes


def test_tolerances_catch_wrong_results():
    """The sum tolerance and bit-exactness reject zeros, a flipped sign, and a lost -0."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 9, 8, 3)).astype(f32)
    dy = rng.standard_normal((2, 9, 8, 4)).astype(f32)
    fn = lambda a, g: raw.Conv2DBackpropFilter(input=a, filter_sizes=[3, 2, 3, 4], out_backprop=g,  # noqa: E731
                                               strides=[1, 1, 1, 1], padding="SAME")
    expected, (actual,) = _convert_run(fn, [x, dy], "standard")
    assert compare_output("ok", expected[0], actual, rtol=SUM_RTOL).ok
    for wrong in (np.zeros_like(actual), -actual):
        assert not compare_output("wrong", expected[0], wrong, rtol=SUM_RTOL).ok
    relu = np.asarray(raw.ReluGrad(gradients=f32([-1.0, 2.0]), features=f32([-1.0, 1.0])))
    assert not compare_output("sign", relu, f32([0.0, 2.0]), exact=True).ok
    assert not compare_output("tail", np.ones(4, f32), np.ones(4, f32) * f32(1 + 2 ** -21), rtol=ULP2, atol=0.0).ok


def test_conv2d_backprop_bad_geometry_names_op_and_input():
    """An out_backprop whose known spatial size is not the forward convolution's output, and a window
    that does not fit the padded input, fail naming the op, the node and the input at fault."""
    attrs = dict(strides=[1, 2, 2, 1], padding="VALID")
    spec = lambda *shape: tf.TensorSpec(shape, tf.float32)  # noqa: E731
    by_filter = lambda a, g: raw.Conv2DBackpropFilter(input=a, filter_sizes=[3, 3, 2, 4], out_backprop=g,  # noqa: E731
                                                      name="dw", **attrs)
    with pytest.raises(ConversionError, match=r"Conv2DBackpropFilter \(node 'dw'\).*out_backprop.*\[4, 3\].*\[3, 3\]"):
        converters.from_function(tf.function(by_filter), [spec(1, 7, 8, 2), spec(1, 4, 3, 4)])
    by_input = lambda k, g: raw.Conv2DBackpropInput(input_sizes=[1, 7, 8, 2], filter=k, out_backprop=g,  # noqa: E731
                                                    name="dx", **attrs)
    with pytest.raises(ConversionError, match=r"Conv2DBackpropInput \(node 'dx'\).*out_backprop.*\[3, 4\].*\[3, 3\]"):
        converters.from_function(tf.function(by_input), [spec(3, 3, 2, 4), spec(1, 3, 4, 4)])
    too_small = lambda a, g: raw.Conv2DBackpropFilter(input=a, filter_sizes=[3, 3, 2, 4], out_backprop=g,  # noqa: E731
                                                      name="dw", strides=[1, 1, 1, 1], padding="VALID")
    # One row under a 3-row window: TF's output size is (1 - 3 + 1) / 1 = -1, an error. (Two rows give 0,
    # an empty output whose gradients are zeros: tests/test_standard_safe.py.)
    with pytest.raises(ConversionError, match=r"Conv2DBackpropFilter \(node 'dw'\).*window.*does not fit"):
        converters.from_function(tf.function(too_small), [spec(1, 1, 8, 2), spec(1, None, None, 4)])
