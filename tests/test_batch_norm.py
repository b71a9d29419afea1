"""Conformance of FusedBatchNorm{,V2,V3} and FusedBatchNormGrad{,V2,V3}: goldens, finite differences, bad input.

No TensorFlow here: the live comparisons (Eigen and oneDNN kernels) are in test_batch_norm_live.py.

Tolerances (why not bit-exact): TF's AVX kernels compute rsqrt for the channels that fill whole 8-float
packets as the RSQRTPS estimate plus one Newton step, which is 1-2 float32 ulp away from the correctly
rounded 1/sqrt used here (and depends on the CPU vendor, so it cannot be emulated portably); oneDNN also sums
the per-channel reductions (mean, variance, the gradients' sum(dy) and sum(dy*xhat)) in its own order. Every
output is a few float32 operations from that rsqrt and those sums: y = (x - mean)*k + offset with
k = rsqrt(var + eps)*scale, and x_backprop = k*(dy - mean(dy) - xhat*mean(dy*xhat)) (training), so its error
relative to the size of its terms is a few ulps from k plus the reduction's ordering error, which for
independent rounding errors grows like sqrt(R)*u, R <= 256 here. Sizes are measured against
max(1, max|expected|): inputs are O(1), so a sum that cancels to near 0 is still judged against the size of
its terms. Measured over the goldens and the live cases (Eigen and oneDNN, both backends), the worst float32
error is 3.9 ulps (2^-23) of that size (Eigen's FusedBatchNormGrad x_backprop; oneDNN: 2.7), so
FLOAT32_TOL = 16 ulps = 2^-19 (1.9e-6) leaves 4x headroom. Dropping epsilon changes y by about
eps/(2*var) relative (>= 16 ulps for the epsilons and variances of nearly every case) and fails it on every
golden and live case where the float64 math says epsilon moves an output by more than twice the tolerance
(test_dropping_epsilon_fails_the_tolerance).
float16/bfloat16 outputs are the float32 result rounded to T, so a float32 difference of a few ulps can flip
one rounding: tolerance one unit in the last place of T at that size (worst measured: float16 0.54 of it,
bfloat16 0). Channels TF computes with scalar 1/sqrt (index >= 8*floor(C/8)) must match bit for bit (numpy
kernels).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import ort_ops
from backends import BackendError, run
from ort_ops.conformance import judge, rules
from ort_ops.conformance.goldens import load_cases
from ort_ops.reference import _batch_norm as bn
from ort_ops.spec import OpError

FORWARD_OPS = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
GRAD_OPS = ("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3")
ALL_OPS = FORWARD_OPS + GRAD_OPS
F32, F16, BF16 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)

FLOAT32_TOL = rules.BATCH_NORM_ULPS["float32"]  # 16 float32 ulps at the output's size (module docstring)
EPS = float(np.float32(1e-4))


def assert_close(got, want, what):
    """``got`` within the bound of TF's ``want``: the conformance kit's rule and judgment."""
    why = judge.bounded_mismatch(want, got, rules.batch_norm_bound(want))
    assert why is None, f"{what}: {why}"


def compare_outputs(op, inputs, attrs, got, want, what, skip=()):
    """Every output but ``skip`` by the kit's rule for it: the summed gradient outputs against their terms."""
    assert len(got) == len(want), f"{what}: {len(got)} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if i not in skip:
            why = judge.bounded_mismatch(w, g, rules.batch_norm_output_bound(op, inputs, attrs, i, w))
            assert why is None, f"{what} output {i}: {why}"


# ---------------------------------------------------------------------------------------------- goldens


def golden_compared(outputs):
    """Indices the generator marked as undefined in TF (stored as an empty bool array)."""
    return tuple(i for i, w in enumerate(outputs) if rules.is_undefined(w))


# The golden cases themselves run through the conformance kit (tests/test_conformance.py), judged by this
# same rule (ort_ops/conformance/rules.py).


def float64_outputs(op, inputs, attrs):
    """The op's exact math (the shared kernels in float64) for float inputs of any precision."""
    attrs = ort_ops.get_spec(op).with_defaults(attrs)
    args = [np.asarray(x).astype(np.float64) for x in inputs[:5]]
    if op in FORWARD_OPS:
        return bn.forward(*args, attrs["epsilon"], attrs["exponential_avg_factor"],
                          attrs["data_format"], attrs["is_training"])
    return bn.backward(*args, attrs["epsilon"], attrs["data_format"], attrs["is_training"])


def epsilon_matters(op, inputs, attrs, outputs, compared):
    """Whether, in exact math, dropping epsilon moves a compared output by more than twice its tolerance."""
    with np.errstate(all="ignore"):
        with_eps = float64_outputs(op, inputs, attrs)
        without = float64_outputs(op, inputs, {**attrs, "epsilon": 0.0})
    for i in compared:
        if i >= len(with_eps):
            continue  # FusedBatchNormV3's reserve_space_3 placeholder
        want = outputs[i].astype(np.float64)
        finite = np.isfinite(want)
        if not finite.any():
            continue
        if not np.array_equal(np.isfinite(with_eps[i]), np.isfinite(without[i])):
            return True
        bound = np.broadcast_to(rules.batch_norm_output_bound(op, inputs, attrs, i, outputs[i]), want.shape)
        with np.errstate(invalid="ignore"):
            moved = np.abs(with_eps[i] - without[i])[finite]
        if np.nanmax(moved - 2 * bound[finite], initial=0.0) > 0:
            return True
    return False


@pytest.mark.parametrize("op", ALL_OPS)
def test_dropping_epsilon_fails_the_tolerance(op):
    """An implementation that forgets epsilon (the reference run with epsilon=0) fails the comparison with TF
    on every golden case where epsilon moves an output by more than twice the tolerance, and such cases are
    most float32 cases (the tolerance is far below epsilon's effect). (In the float16/bfloat16 forward goldens
    epsilon is below half an ulp of T, so it cannot show there; in their gradients it does.)"""
    spec = ort_ops.get_spec(op)
    cases = [c for c in load_cases(op) if "error" not in c]
    float32_cases = [c for c in cases if c["outputs"][0].dtype == F32]
    matter = float32_matter = 0
    for case in cases:
        skip = golden_compared(case["outputs"])
        compared = [i for i in range(len(case["outputs"])) if i not in skip]
        if not epsilon_matters(op, case["inputs"], case["attrs"], case["outputs"], compared):
            continue
        matter += 1
        float32_matter += case["outputs"][0].dtype == F32
        without = spec.run_reference(case["inputs"], {**case["attrs"], "epsilon": 0.0})
        with pytest.raises(AssertionError):
            compare_outputs(op, case["inputs"], case["attrs"], without, case["outputs"],
                            f"{op} [{case['note']}] without epsilon", skip)
    assert matter >= 20 and float32_matter >= 0.8 * len(float32_cases), (
        f"{op}: epsilon shows in only {float32_matter} of {len(float32_cases)} float32 cases")


def _tree_sums(dy, x, mean, var, eps):
    """scale_backprop and offset_backprop summed pairwise in float32 (NumPy's order along a contiguous row),
    where TF's CPU kernel adds the N*H*W terms one after the other: another valid order, as a GPU's."""
    dys = np.ascontiguousarray(dy.reshape(-1, dy.shape[-1]).T)
    centered = x.reshape(-1, x.shape[-1]).T - mean[:, None]
    c0 = (np.float32(1) / np.sqrt(var + np.float32(eps))).astype(F32)
    return (dys * (centered * c0[:, None]).astype(F32)).sum(axis=1), dys.sum(axis=1)


@pytest.mark.parametrize("op", GRAD_OPS)
def test_gradient_sums_judged_against_their_terms(op):
    """scale_backprop and offset_backprop are sums over N*H*W: the kit judges them against the size of their
    terms (rules.batch_norm_grad_sum_bound). Another summation order passes where 16 ulps at the output's own
    size would not (the first H200 run failed so), and a wrong sum (sign, zeros, mean not subtracted) fails."""
    rng = np.random.default_rng(7)
    dy = rng.uniform(0.0, 1.0, (8, 32, 32, 16)).astype(F32)  # one sign: the order matters most
    x = rng.normal(2.0, 1.0, dy.shape).astype(F32)
    scale = rng.uniform(0.5, 1.5, 16).astype(F32)
    mean = x.reshape(-1, 16).mean(axis=0).astype(F32)
    var = x.reshape(-1, 16).var(axis=0).astype(F32)
    attrs = {"is_training": True, "data_format": "NHWC", "epsilon": EPS}
    inputs = [dy, x, scale, mean, var] + ([np.zeros((), F32)] if op == "FusedBatchNormGradV3" else [])
    want = ort_ops.get_spec(op).run_reference(inputs, attrs)
    skip = tuple(range(3, len(want)))
    tree = list(want)
    tree[1], tree[2] = _tree_sums(dy, x, mean, var, EPS)
    compare_outputs(op, inputs, attrs, tree, want, f"{op} pairwise sums", skip)
    assert any(judge.bounded_mismatch(want[k], tree[k], rules.batch_norm_bound(want[k])) for k in (1, 2)), (
        "the orders agree to 16 ulps of the outputs here: this case no longer shows why sums need their own bound")
    uncentered = (np.ascontiguousarray(dy.reshape(-1, 16).T) * x.reshape(-1, 16).T).sum(axis=1)
    c0 = (np.float32(1) / np.sqrt(var + np.float32(EPS))).astype(F32)
    for k, wrong in ((1, -want[1]), (2, -want[2]), (1, np.zeros_like(want[1])), (2, np.zeros_like(want[2])),
                     (1, (uncentered * c0).astype(F32))):
        bad = list(want)
        bad[k] = wrong
        with pytest.raises(AssertionError):
            compare_outputs(op, inputs, attrs, bad, want, f"{op} wrong output {k}", skip)


@pytest.mark.parametrize("op", ALL_OPS)
def test_reference_bit_exact_on_scalar_rsqrt_channels(op):
    """Where TF uses scalar 1/sqrt (channels past the last full 8-float packet) the kernels match bit for bit:
    this pins the formula order and the reduction order, not just the values."""
    spec = ort_ops.get_spec(op)
    checked = 0
    for case in load_cases(op):
        if "error" in case:
            continue
        attrs = case["attrs"]
        got = spec.run_reference(case["inputs"], attrs)
        x = case["inputs"][1 if op in GRAD_OPS else 0]
        axis = 1 if attrs["data_format"] in ("NCHW", "NCDHW") else x.ndim - 1
        channels = x.shape[axis]
        first_scalar = 8 * (channels // 8)
        for i, (g, w) in enumerate(zip(got, case["outputs"])):
            if w.dtype == np.bool_ or w.ndim == 0 or w.size == 0:
                continue
            if i == 0:
                g, w = np.moveaxis(g, axis, -1), np.moveaxis(w, axis, -1)
            g, w = g[..., first_scalar:], w[..., first_scalar:]
            assert np.array_equal(g, w, equal_nan=True), f"{op} [{case['note']}] output {i} not bit-exact"
            checked += g.size
    assert checked > 100


@pytest.mark.parametrize("op", ALL_OPS)
def test_shape_function_agrees_with_goldens(op):
    """The spec's shape function rejects what TF rejects (shape-detectable cases, with TF's message) and
    predicts the shape of every output TF defines."""
    spec = ort_ops.get_spec(op)
    for case in load_cases(op):
        shapes = [np.shape(v) for v in case["inputs"]]
        attrs = spec.with_defaults(case["attrs"])
        if "error" in case:
            with pytest.raises(OpError) as info:
                spec.shape_fn(shapes, [None] * len(shapes), attrs)
            assert case["error"] in str(info.value), case["note"]
            continue
        predicted = spec.shape_fn(shapes, [None] * len(shapes), attrs)
        for i, (p, w) in enumerate(zip(predicted, case["outputs"])):
            if w.dtype != np.bool_:
                assert tuple(p) == w.shape, f"{op} [{case['note']}] output {i}"


# ------------------------------------------------------------------------------- finite differences

FD_STEP = 1e-6
# The gradient ops run in float32 (~1e-7 relative rounding); the float64 central difference has truncation
# error ~h^2 and rounding ~1e-16/h, both below 1e-9. 1e-4 of the size is far above the former and far
# below any formula mistake (those are O(1)). The float64 core itself must agree to FD_TOL_F64.
FD_TOL_F32 = 1e-4
FD_TOL_F64 = 1e-7


def _loss_gradient_fd(dy, x, scale, offset, mean, var, fmt, is_training):
    """Central differences of L = sum(dy * y) with y from the float64 forward math, for x, scale, offset."""

    def loss(x_, scale_, offset_):
        y = bn.forward(x_, scale_, offset_, mean, var, EPS, 1.0, fmt, is_training)[0]
        return float(np.sum(dy * y))

    grads = []
    args = [x, scale, offset]
    for k in range(3):
        g = np.zeros_like(args[k])
        for idx in np.ndindex(args[k].shape):
            plus, minus = [a.copy() for a in args], [a.copy() for a in args]
            plus[k][idx] += FD_STEP
            minus[k][idx] -= FD_STEP
            g[idx] = (loss(*plus) - loss(*minus)) / (2 * FD_STEP)
        grads.append(g)
    return grads


def _fd_problem(seed, fmt, is_training):
    rng = np.random.default_rng(seed)
    last = (2, 3, 2, 3)  # N, H, W, C: R = 12
    shape = (2, 3, 3, 2) if fmt == "NCHW" else last
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731  float32-representable inputs for both paths
    x = f32(rng.standard_normal(shape) * 1.5 + 0.3)
    dy = f32(rng.standard_normal(shape))
    scale, offset = f32(rng.uniform(0.5, 1.5, 3)), f32(rng.standard_normal(3))
    if is_training:
        # The gradient op gets the forward op's batch mean and biased variance.
        out = bn.forward(x.astype(np.float64), scale, offset, f32([]), f32([]), EPS, 1.0, fmt, True)
        mean, var = f32(out[3]), f32(out[4])
    else:
        mean, var = f32(rng.standard_normal(3) * 0.3), f32(rng.uniform(0.5, 2.0, 3))
    return dy, x, scale, offset, mean, var


@pytest.mark.parametrize("op", GRAD_OPS)
@pytest.mark.parametrize("is_training", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_gradient_matches_finite_differences(backend, op, is_training, fmt):
    dy, x, scale, offset, mean, var = _fd_problem(7, fmt, is_training)
    f64 = lambda a: a.astype(np.float64)  # noqa: E731
    fd = _loss_gradient_fd(f64(dy), f64(x), f64(scale), f64(offset), f64(mean), f64(var), fmt, is_training)
    inputs = [dy, x, scale, mean, var] + ([np.zeros((), np.float32)] if op.endswith("V3") else [])
    attrs = {"epsilon": EPS, "data_format": fmt, "is_training": is_training}
    got = run(backend, op, inputs, attrs)
    for name, g, want in zip(("x_backprop", "scale_backprop", "offset_backprop"), got, fd):
        size = max(1.0, float(np.max(np.abs(want))))
        err = float(np.max(np.abs(g.astype(np.float64) - want)))
        assert err <= FD_TOL_F32 * size, f"{op} {name}: {err:.3g} from the finite difference"


@pytest.mark.parametrize("is_training", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_float64_gradient_math_matches_finite_differences(is_training, fmt):
    dy, x, scale, offset, mean, var = (a.astype(np.float64) for a in _fd_problem(11, fmt, is_training))
    fd = _loss_gradient_fd(dy, x, scale, offset, mean, var, fmt, is_training)
    got = bn.backward(dy, x, scale, mean, var, EPS, fmt, is_training)
    assert got[0].dtype == np.float64
    for name, g, want in zip(("x_backprop", "scale_backprop", "offset_backprop"), got, fd):
        err = float(np.max(np.abs(g - want)))
        assert err <= FD_TOL_F64 * max(1.0, float(np.max(np.abs(want)))), f"{name}: {err:.3g}"


# --------------------------------------------------------------------------------------- bad input


def _x(shape=(2, 3, 3, 4)):
    return np.random.default_rng(3).standard_normal(shape).astype(np.float32)


C4, C3 = np.ones(4, np.float32), np.ones(3, np.float32)
TRAIN = {"is_training": True}
BAD_INPUT = [
    ("FusedBatchNormV3", [_x((3, 3, 4)), C4, C4, C4, C4], TRAIN, "input must be 4 or 5-dimensional[3,3,4]"),
    ("FusedBatchNorm", [_x((1, 2, 3, 3, 4, 1)), C4, C4, C4, C4], TRAIN, "input must be 4 or 5-dimensional"),
    ("FusedBatchNormV2", [_x(), C4[None], C4, C4, C4], TRAIN, "scale must be 1-dimensional[1,4]"),
    ("FusedBatchNormV3", [_x(), C4, C4, C4, np.float32(1)], TRAIN, "estimated_variance must be 1-dimensional[]"),
    ("FusedBatchNorm", [_x(), C4, C3, C4, C4], TRAIN, "offset must have the same number of elements as the channels of x, got 3 and 4"),
    ("FusedBatchNormV3", [_x(), C4, C4, C3, C4], {"is_training": False}, "When is_training=false, mean must have the same number"),
    ("FusedBatchNormV2", [_x(), C4, C4, C4, C3], {"exponential_avg_factor": 0.5},
     "When exponential_avg_factor != 1, variance must have the same number of elements as the channels of x, got 3 and 4"),
    ("FusedBatchNormGrad", [_x(), _x((3, 3, 4)), C4, C4, C4], TRAIN, "input must be 4 or 5-dimensional[3,3,4]"),
    ("FusedBatchNormGradV2", [_x(), _x(), C4, C4[None], C4], TRAIN, "saved mean must be 1-dimensional[1,4]"),
    ("FusedBatchNormGradV3", [_x((1, 3, 3, 4)), _x(), C4, C4, C4, C4], TRAIN,
     "x and y_backprop must have same shape, but x has shape [2,3,3,4] and y_backprop has shape [1,3,3,4]"),
    ("FusedBatchNormGradV3", [_x(), _x(), C4, C4, C3, C4], {"is_training": False},
     "reserve_space_2 must have the same number of elements as the channels of x, got 3 and 4"),
    ("FusedBatchNormGrad", [_x(), _x(), C3, C4, C4], {"data_format": "NCHW"},
     "reserve_space_1 must have the same number of elements as the channels of x, got 4 and 3"),
]


@pytest.mark.parametrize("op,inputs,attrs,message", BAD_INPUT, ids=[f"{i}-{c[0]}" for i, c in enumerate(BAD_INPUT)])
def test_bad_input_is_rejected_with_tf_message(backend, op, inputs, attrs, message):
    with pytest.raises(BackendError) as info:
        run(backend, op, inputs, attrs)
    assert op in str(info.value) and message in str(info.value), str(info.value)


@pytest.mark.parametrize("op", ["FusedBatchNorm", "FusedBatchNormGradV2"])
def test_bad_data_format_is_rejected(backend, op):
    # V1/V2 take only NHWC/NCHW (op-def choices); TF rejects the 3-D names there at attribute level.
    spec = ort_ops.get_spec(op)
    inputs = [_x()] * (2 if op in GRAD_OPS else 1) + [C4] * (len(spec.inputs) - (2 if op in GRAD_OPS else 1))
    for bad in ("NDHWC", "HWCN"):
        with pytest.raises(BackendError) as info:
            run(backend, op, inputs, {"data_format": bad})
        text = str(info.value)
        assert op in text and "data_format" in text.replace("data format", "data_format"), text


def test_family_check_names_a_bad_data_format_itself():
    """Past the attribute's own check (OpSpec.validate given complete attributes), the family's check,
    which the kernels run behind, still names the problem in TF's words."""
    spec = ort_ops.get_spec("FusedBatchNormV3")
    attrs = {**spec.with_defaults({"epsilon": EPS}), "data_format": "NWHC"}
    inputs = [_x(), C4, C4, C4, C4]
    with pytest.raises(OpError, match="FusedBatchNormV3: Invalid data format"):
        spec.validate([x.shape for x in inputs], inputs, [x.dtype for x in inputs], attrs)


# --------------------------------------------------------------------------------- edge semantics


def test_training_ignores_mean_and_variance_unless_averaging(backend):
    x = _x()
    attrs = {"is_training": True, "exponential_avg_factor": 1.0}
    empty = np.zeros(0, np.float32)
    with_stats = run(backend, "FusedBatchNormV3", [x, C4, C4, C4, C4], attrs)
    without = run(backend, "FusedBatchNormV3", [x, C4, C4, empty, empty], attrs)
    for a, b in zip(with_stats, without):
        np.testing.assert_array_equal(a, b)
    # Running statistics: Bessel-corrected variance; the reserve spaces keep the biased one.
    rows = x.reshape(-1, 4).astype(np.float64)
    np.testing.assert_allclose(with_stats[2], rows.var(axis=0, ddof=1), rtol=1e-5)
    np.testing.assert_allclose(with_stats[4], rows.var(axis=0), rtol=1e-5)
    assert with_stats[5].shape == () and with_stats[5] == 0


def test_empty_batch(backend):
    x = np.zeros((0, 2, 2, 3), np.float32)
    for is_training in (True, False):
        out = run(backend, "FusedBatchNormV3", [x, C3, C3, C3, C3], {"is_training": is_training})
        assert out[0].shape == x.shape
        assert np.isnan(out[1]).all() and np.isnan(out[2]).all()
        # TF leaves these uninitialized; the project defines them as zeros (spec deviation).
        np.testing.assert_array_equal(out[3], np.zeros(3, np.float32))
        np.testing.assert_array_equal(out[4], np.zeros(3, np.float32))


def test_inference_reserve_spaces_hold_the_given_statistics(backend):
    mean, var = np.array([0.5, -1, 2, 0], np.float32), np.array([1, 2, 3, 4], np.float32)
    out = run(backend, "FusedBatchNormV2", [_x(), C4, C4, mean, var], {"is_training": False})
    for got, want in zip(out[1:], (mean, var, mean, var)):
        np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------------------ reference evaluator

EVAL_SAMPLES = {
    "FusedBatchNorm": ([_x(), C4, C4, C4 * 0.5, C4 * 2], {"is_training": False}),
    "FusedBatchNormV2": ([_x((2, 4, 3, 3)).astype(F16), C4, C4, C4, C4], {"data_format": "NCHW", "exponential_avg_factor": 0.3}),
    "FusedBatchNormV3": ([_x((2, 2, 3, 3, 4)).astype(BF16), C4, C4, C4, C4], {"data_format": "NDHWC"}),
    "FusedBatchNormGrad": ([_x(), _x() + 1, C4, C4 * 0.1, C4], {}),
    "FusedBatchNormGradV2": ([_x().astype(F16), _x().astype(F16), C4, C4, C4], {"is_training": False}),
    "FusedBatchNormGradV3": ([_x((2, 4, 3, 3)), _x((2, 4, 3, 3)), C4, C4, C4, np.zeros(0, np.float32)],
                             {"data_format": "NCHW"}),
}


@pytest.mark.parametrize("op", ALL_OPS)
def test_reference_evaluator_runs_op(op):
    inputs, attrs = EVAL_SAMPLES[op]
    spec = ort_ops.get_spec(op)
    model = ort_ops.make_single_op_model(op, inputs, attrs)
    feed = {p.name: v for p, v in zip(spec.inputs, inputs)}
    got = ort_ops.reference_evaluator(model).run(None, feed)
    want = spec.run_reference(inputs, attrs)
    shapes = spec.shape_fn([np.shape(v) for v in inputs], [None] * len(inputs), spec.with_defaults(attrs))
    assert len(got) == len(want) == len(spec.outputs)
    for g, w, s in zip(got, want, shapes):
        assert g.dtype == w.dtype and tuple(g.shape) == tuple(s)
        np.testing.assert_array_equal(g, w)
