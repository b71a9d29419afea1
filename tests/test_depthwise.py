"""Conformance of DepthwiseConv2dNative, ...BackpropInput and ...BackpropFilter against TensorFlow.

* goldens (tools/goldens/gen_depthwise.py): TF's Eigen kernels, oneDNN (dilations, NCHW) and the dilated
  gradients through tf.nn.depthwise_conv2d's space-to-batch path, plus every input TF rejects (with TF's message);
* (live differential tests against the installed TF, Eigen and oneDNN: test_depthwise_live.py);
* float64 finite differences of both backprops against the forward op;
* bad input: every error class, each message naming the op;
* the onnx reference evaluator running each op.

Tolerance (``assert_close``; the conformance kit's rule, ort_ops/conformance/rules.py): each output element
is a sum of n products (forward: kh*kw taps; BackpropInput: kh*kw*M; BackpropFilter: N*oh*ow output
positions); S = sum(|products|) and the exact sum come from the reference run in float64 (on |inputs| for
S), exact to ~n*2^-53*S. u is the unit roundoff of T.

* float32/float64: the products and the running sum are rounded in T, so any order is within
  (n+1)*u*S of the exact sum (Higham's gamma_n, first order) and two orders (the reference follows Eigen;
  oneDNN and the space-to-batch path of dilated gradients do not) differ by at most 2*(n+1)*u*S.
  Worst measured err/bound, goldens and live (Eigen and oneDNN, both backends): 0.33.
* float16/bfloat16: products of two T values are exact in float32, so all the error is in the additions.
  The bound is |ours - TF| <= |ref - exact| + |TF - exact|. The first term is the reference kernel's own
  rounding error, computed exactly here (run in T and in float64; the C++ kernels are bit-identical to it,
  test_cpp_depthwise.py). For the second, TF has two kinds of kernel:
  - accumulate in float32, round to T once (oneDNN's bfloat16 kernels): |TF - exact| <= u*|exact| + n*2^-24*S;
  - round the running sum to T after every addition, in another order (the space-to-batch path TF takes
    for dilated BackpropFilter): the worst case n*u*S is as large as the output itself (bfloat16, n ~ 100),
    so a bound of that form would let a zero output pass. The rounding errors delta_k of such a sum are
    independent and mean-zero to a good approximation, and Higham & Mary's probabilistic analysis (SIAM J.
    Sci. Comput. 41(5), 2019) bounds the error by lambda*sqrt(n)*u*S except with probability at most
    about 2n*exp(-lambda^2/2) (it also bounds every partial sum by S, so it is pessimistic); LAMBDA = 5.
  so |TF - exact| <= max(u*|exact| + 2*(n+1)*2^-24*S, 5*sqrt(n)*u*S). Measured over goldens and live (Eigen
  and oneDNN, both backends): the space-to-batch cases reach 0.24 of the bound (0.29 with lambda = 4, 0.37
  with 3), so lambda = 5 leaves 4x headroom; oneDNN's bfloat16 kernels reach 0.999 of it, in the rigorous
  first branch (round to nearest attains u*|exact|).
  With this bound an all-zero or a sign-flipped output fails on every golden case with a nonzero output
  (test_wrong_outputs_fail_the_tolerance).

An absolute n*tiny(T) covers TF flushing subnormals to zero. NaN and +-inf must appear at exactly the same places.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest

import ort_ops
from backends import BackendError, run
from comparison import assert_bits_equal
from ort_ops.conformance import judge, rules
from ort_ops.conformance.goldens import load_cases
from ort_ops.evaluator import reference_evaluator
from ort_ops.model import make_single_op_model

FWD = "DepthwiseConv2dNative"
BPI = "DepthwiseConv2dNativeBackpropInput"
BPF = "DepthwiseConv2dNativeBackpropFilter"
OPS = (FWD, BPI, BPF)
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), BF16)


def reference(op, inputs, attrs):
    return ort_ops.get_spec(op).run_reference(inputs, attrs)[0]


def tolerance(op, inputs, attrs, dtype):
    """The largest |ours - TF| allowed per output element: the conformance kit's bound (module docstring)."""
    return rules.depthwise_bound(op, inputs, attrs, dtype)


def assert_close(op, got, want, inputs, attrs, context=""):
    """``got`` within the bound of TF's ``want``: the kit's judgment (ort_ops/conformance/judge.py)."""
    why = judge.bounded_mismatch(want, got, tolerance(op, inputs, attrs, np.asarray(want).dtype))
    assert why is None, f"{context}: {why} (n={rules.depthwise_terms(op, inputs, attrs)})"


# ---------------------------------------------------------------------------------------------------- goldens


# The golden cases themselves run through the conformance kit (tests/test_conformance.py), judged by this
# same bound (ort_ops/conformance/rules.py).


@pytest.mark.parametrize("op", OPS)
def test_wrong_outputs_fail_the_tolerance(op):
    """The tolerance is tight enough to catch a wrong result: on every golden case with a nonzero finite
    output, an all-zero output and the sign-flipped output both fail ``assert_close`` on the bound itself."""
    checked = 0
    for case in load_cases(op):
        if "error" in case:
            continue
        want = case["outputs"][0]
        finite = np.isfinite(want.astype(np.float64))
        if not np.any(want.astype(np.float64)[finite] != 0):
            continue
        masked = np.where(finite, 0, want).astype(want.dtype)  # specials kept, so only the bound can fail
        flipped = np.where(finite, -want.astype(np.float64), want.astype(np.float64)).astype(want.dtype)
        for wrong, what in ((masked, "zeros"), (flipped, "negated")):
            with pytest.raises(AssertionError, match="more than the bound"):
                assert_close(op, wrong, want, case["inputs"], case["attrs"], f"{op} [{case['note']}] {what}")
        checked += 1
    assert checked > 40


@pytest.mark.parametrize("op", OPS)
def test_numpy_bit_exact_on_eigen_goldens(op):
    """The reference follows the Eigen kernels' order of operations, so their cases match bit for bit (all dtypes)."""
    cases = [c for c in load_cases(op) if c["note"].startswith("eigen:") and "error" not in c]
    assert len(cases) > 30
    for case in cases:
        got = reference(op, case["inputs"], case["attrs"])
        want = case["outputs"][0]
        assert_bits_equal(want, got, f"{op} [{case['note']}] not bit-exact")


def test_goldens_cover_the_grid():
    """The goldens hold what the brief asks for: dtypes, layouts, dilations, multipliers, paddings, empties."""
    notes = " ".join(c["note"] for op in OPS for c in load_cases(op))
    for needle in ("float64", "float16", "bfloat16", "NCHW", "dilations 2x2", "EXPLICIT", "VALID", "stride 2",
                   "M=9", "M=8", "empty batch", "output size 0", "empty filter", "NaN", "bad: "):
        assert needle in notes, needle


# ------------------------------------------------------------------------------------------ layout helpers


def _nhwc(a, fmt):
    return np.transpose(a, (0, 2, 3, 1)) if fmt == "NCHW" else a


def _from_nhwc(a, fmt):
    return np.ascontiguousarray(np.transpose(a, (0, 3, 1, 2))) if fmt == "NCHW" else a


def _attr4(fmt, row, col):
    return [1, 1, row, col] if fmt == "NCHW" else [1, row, col, 1]


# ------------------------------------------------------------------------------------- finite differences

FD_CONFIGS = [
    # (N, H, W, C, kh, kw, M, stride, (dil_h, dil_w), padding, explicit (top, bottom, left, right), format)
    (2, 6, 7, 3, 3, 3, 2, 1, (2, 2), "SAME", None, "NHWC"),
    (1, 7, 6, 2, 3, 2, 3, 2, (2, 3), "SAME", None, "NCHW"),
    (1, 8, 7, 3, 2, 3, 1, 2, (3, 1), "VALID", None, "NHWC"),
    (2, 6, 6, 1, 3, 3, 9, 1, (1, 2), "EXPLICIT", (1, 2, 0, 3), "NCHW"),
    (1, 5, 6, 5, 3, 3, 8, 2, (1, 1), "EXPLICIT", (2, 0, 1, 1), "NHWC"),
    (1, 6, 5, 3, 2, 2, 2, 1, (2, 2), "VALID", None, "NCHW"),
]


def _fd_setup(config, rng):
    n, h, w_, c, kh, kw, m, s, dil, pad, ex, fmt = config
    ep = []
    if ex:
        ep = [0, 0, 0, 0, *ex] if fmt == "NCHW" else [0, 0, *ex, 0, 0]
    attrs = {"strides": _attr4(fmt, s, s), "padding": pad, "explicit_paddings": ep, "data_format": fmt,
             "dilations": _attr4(fmt, *dil)}
    xshape = (n, c, h, w_) if fmt == "NCHW" else (n, h, w_, c)
    x, w = rng.standard_normal(xshape), rng.standard_normal((kh, kw, c, m))
    dy = rng.standard_normal(reference(FWD, [x, w], attrs).shape)
    return x, w, dy, attrs


def _loss(x, w, dy, attrs):
    """L = sum(dy * forward(x, w)) in float64 with the NumPy forward op; dL/dx and dL/dw are the backprops."""
    return float(np.sum(dy * reference(FWD, [x, w], attrs)))


@pytest.mark.parametrize("which", ["input", "filter"])
@pytest.mark.parametrize("config", FD_CONFIGS, ids=lambda c: f"{c[11]}-{c[9]}-s{c[7]}-d{c[8][0]}x{c[8][1]}-M{c[6]}")
def test_backprop_finite_differences(backend, config, which):
    rng = np.random.default_rng(7)
    x, w, dy, attrs = _fd_setup(config, rng)
    if which == "input":
        (grad,) = run(backend, BPI, [np.array(x.shape, np.int32), w, dy], attrs)
        point, perturb = x, lambda d: _loss(x + d, w, dy, attrs) - _loss(x - d, w, dy, attrs)
    else:
        (grad,) = run(backend, BPF, [x, np.array(w.shape, np.int32), dy], attrs)
        point, perturb = w, lambda d: _loss(x, w + d, dy, attrs) - _loss(x, w - d, dy, attrs)
    assert grad.shape == point.shape and grad.dtype == np.float64
    # L is linear in x and in w, so a central difference is exact up to rounding (~1e-13 relative here).
    step = 1e-3
    scale = np.sum(np.abs(dy)) * max(np.max(np.abs(x)), np.max(np.abs(w)))
    coords = [tuple(int(i) for i in np.unravel_index(k, point.shape)) for k in rng.choice(point.size, min(point.size, 40), replace=False)]
    for idx in coords:
        d = np.zeros_like(point)
        d[idx] = step
        fd = perturb(d) / (2 * step)
        assert abs(fd - grad[idx]) <= 1e-9 * scale, f"{which} gradient at {idx}: {grad[idx]} vs finite difference {fd}"
    # and one random direction, which touches every coordinate (including those on padding-only taps)
    v = rng.standard_normal(point.shape)
    fd = perturb(step * v) / (2 * step)
    assert abs(fd - np.sum(grad * v)) <= 1e-9 * scale * point.size


# ------------------------------------------------------------------------------------------------ bad input


def _bad_cases():
    f32, f64 = np.float32, np.float64
    x, w, dy = np.ones((1, 4, 4, 2), f32), np.ones((3, 3, 2, 1), f32), np.ones((1, 4, 4, 2), f32)
    xs, ws = np.array(x.shape, np.int32), np.array(w.shape, np.int32)
    same = {"strides": [1, 1, 1, 1], "padding": "SAME"}
    out = []
    for op, inputs in ((FWD, [x, w]), (BPI, [xs, w, dy]), (BPF, [x, ws, dy])):
        out += [
            (op, inputs, {**same, "dilations": [1, 2, 2]}, "dilations field must specify 4 dimensions"),
            (op, inputs, {**same, "dilations": [2, 1, 1, 1]}, "does not support dilations in the batch and depth"),
            (op, inputs, {**same, "dilations": [1, 1, 1, 2]}, "does not support dilations in the batch and depth"),
            (op, inputs, {**same, "dilations": [1, 0, 1, 1]}, "Dilated rates should be larger than 0"),
            (op, inputs, {**same, "strides": [1, -1, -1, 1]}, "Stride must be > 0"),
            (op, inputs, {**same, "padding": "FULL"}, "padding"),
            (op, inputs, {**same, "data_format": "NCDHW"}, "data_format"),
        ]
    out += [
        (FWD, [x, w.astype(f64)], same, None),  # T must agree
        (FWD, [x.astype(np.int32), w.astype(np.int32)], same, None),  # T is a float type
        (BPI, [xs.astype(np.int64), w, dy], same, None),  # input_sizes is int32
        (BPF, [x, ws, dy.astype(f64)], same, None),
        # a 2^31 x 2^31 input from a 1x1 out_backprop: refused, not allocated
        (BPI, [np.array([1, 2**31 - 1, 2**31 - 1, 2], np.int32), w[:1, :1], np.ones((1, 1, 1, 2), f32)],
         {"strides": [1, 2**31 - 1, 2**31 - 1, 1], "padding": "SAME"}, "too large"),
    ]
    return out


@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: f"{c[0][-14:]}-{c[3] or 'dtype'}"[:60])
def test_bad_input(backend, case):
    op, inputs, attrs, phrase = case
    with pytest.raises(BackendError) as err:
        run(backend, op, inputs, attrs)
    assert op in str(err.value), f"the message does not name the op: {err.value!s}"
    if phrase is not None:
        assert phrase in str(err.value)


@pytest.mark.parametrize("op", OPS)
def test_numpy_errors_are_op_errors(op):
    """Directly through the spec (no backend wrapper): an OpError whose .op is the op."""
    x, w = np.ones((1, 4, 4, 2), np.float32), np.ones((3, 3, 3, 1), np.float32)
    inputs = {FWD: [x, w], BPI: [np.array(x.shape, np.int32), w, x], BPF: [x, np.array(w.shape, np.int32), x]}[op]
    with pytest.raises(ort_ops.spec.OpError) as err:
        ort_ops.get_spec(op).run_reference(inputs, {"strides": [1, 1, 1, 1], "padding": "SAME"})
    assert err.value.op == op and "depth" in err.value.detail


# ---------------------------------------------------------------------------------------- reference evaluator


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("constant_sizes", [False, True])
def test_reference_evaluator(op, constant_sizes):
    rng = np.random.default_rng(3)
    attrs = {"strides": [1, 1, 2, 2], "padding": "SAME", "data_format": "NCHW", "dilations": [1, 1, 2, 1]}
    x, w = rng.standard_normal((2, 3, 7, 6)).astype(np.float32), rng.standard_normal((3, 2, 3, 2)).astype(np.float32)
    dy = rng.standard_normal(reference(FWD, [x, w], attrs).shape).astype(np.float32)
    inputs = {FWD: [x, w], BPI: [np.array(x.shape, np.int32), w, dy], BPF: [x, np.array(w.shape, np.int32), dy]}[op]
    sizes_index = {FWD: None, BPI: 0, BPF: 1}[op]
    if sizes_index is None and constant_sizes:
        constant = (1,)  # the forward op with a constant filter
    else:
        constant = (sizes_index,) if constant_sizes else ()
    model = make_single_op_model(op, inputs, attrs, constant_inputs=constant)
    assert model.ir_version == ort_ops.lowest_ir_version(model) == 8
    onnx.checker.check_model(model)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    want = reference(op, inputs, attrs)
    out_type = inferred.graph.output[0].type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else None for d in out_type.shape.dim]
    if constant_sizes or op == FWD:
        assert dims == list(want.shape)
    feed = {p.name: v for i, (p, v) in enumerate(zip(ort_ops.get_spec(op).inputs, inputs)) if i not in constant}
    (got,) = reference_evaluator(model).run(None, feed)
    assert np.array_equal(got, want)
