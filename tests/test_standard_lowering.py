"""The standard-ONNX lowerings (converters.standard) against live TensorFlow.

Each test builds a tf.function holding the op (several attribute configurations at once, as
separate outputs, to keep the number of conversions small), converts it with tf2onnx using our
lowerings as handlers, checks that only default-domain ONNX nodes remain, runs it in plain
onnxruntime (no custom-op library) and compares with TF on the same inputs:
quantization ops bit for bit (raw bits, so NaN positions and signed zeros count), float ops within
a stated tolerance.
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from unittest import mock  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf2onnx  # noqa: E402
import tf2onnx.optimizer  # noqa: E402

from backends import cpu_session  # noqa: E402
from comparison import assert_bits_equal  # noqa: E402
from converters.errors import LoweringError  # noqa: E402
from converters.standard import STANDARD_LOWERINGS  # noqa: E402
from ort_ops.model import set_lowest_ir_version  # noqa: E402

pytestmark = pytest.mark.tensorflow

RNG_SEED = 1234


def _no_rewrite(g, ops):
    return ops


_optimize_graph = tf2onnx.optimizer.optimize_graph


def _remove_identities(graph, catch_errors=True, optimizers=None):
    from tf2onnx.optimizer.identity_optimizer import IdentityOptimizer

    return _optimize_graph(graph, catch_errors, optimizers={"remove_identity": IdentityOptimizer})


def convert(fn, signature):
    """tf2onnx with our lowerings as handlers.

    tf2onnx's graph rewriters run before handlers: its QuantizeAndDequantize rewriter would replace
    the QDQ ops with QuantizeLinear/DequantizeLinear and its dilation rewriter folds
    SpaceToBatchND/BatchToSpaceND around depthwise convs, so both are switched off here (they are
    looked up as module globals of tf2onnx.tfonnx when a conversion starts). Of tf2onnx's optimizers
    only the identity remover runs (the others only slow the many-node test graphs down); it has to,
    because ONNX Runtime 1.31's own identity elimination breaks graphs where an Identity ending in a
    graph output reads a value that other nodes read too (which tf2onnx's output Identities do).
    """
    errors = []

    def handler(ctx, node, name, args, lower):
        try:
            lower(ctx, node)
        except LoweringError as e:  # tf2onnx logs handler exceptions and goes on; keep them
            errors.append(e)
            raise

    handlers = {op: (lambda ctx, node, name, args, f=f: handler(ctx, node, name, args, f), ()) for op, f in STANDARD_LOWERINGS.items()}
    with mock.patch("tf2onnx.tfonnx.rewrite_quantize_and_dequantize", _no_rewrite), mock.patch(
        "tf2onnx.tfonnx.rewrite_conv_dilations", _no_rewrite
    ), mock.patch("tf2onnx.optimizer.optimize_graph", _remove_identities):
        model, _ = tf2onnx.convert.from_function(
            tf.function(fn), input_signature=signature, opset=17, custom_op_handlers=handlers
        )
    if errors:
        raise errors[0]
    set_lowest_ir_version(model)
    foreign = sorted({(n.domain, n.op_type) for n in model.graph.node if n.domain not in ("", "ai.onnx")})
    assert not foreign, f"non-standard nodes left: {foreign}"
    return model


class Runner:
    def __init__(self, fn, signature, oracle=None):
        """``fn`` is converted; TF runs ``oracle`` (default: ``fn``) as a graph for the expected values."""
        self.fn = tf.function(oracle or fn, input_signature=signature)
        self.session = cpu_session(convert(fn, signature))
        self.names = [i.name for i in self.session.get_inputs()]

    def both(self, *args):
        got = self.session.run(None, dict(zip(self.names, [np.asarray(a) for a in args])))
        expected = self.fn(*args)
        expected = expected if isinstance(expected, (list, tuple)) else [expected]
        return got, [np.asarray(e) for e in expected]


def edge_values(dtype, scale):
    """Grid points, half-grid ties, the range ends and beyond, NaN, +-inf, subnormals, +-0."""
    tiny = np.finfo(dtype).smallest_subnormal
    fixed = [0.0, -0.0, np.nan, np.inf, -np.inf, tiny, -tiny, 0.5, -0.5, 1.5, 2.5, -2.5, 6.0, -6.0, 5.9764705, -6.0235295]
    grid = np.arange(-40, 41, dtype=np.float64) * scale / 8  # quarter and half steps of typical grids
    return np.concatenate([np.array(fixed, dtype), grid.astype(dtype), np.nextafter(grid.astype(dtype), dtype(np.inf))])


# ---------------------------------------------------------------- FakeQuant*

FQ_BITS = [(2, False), (4, True), (8, False), (8, True), (16, False)]
FQ_RANGES = [(-6.0, 6.0), (-1.0, 1.0), (-0.3, 2.7), (1.0, 3.0), (-5.0, -2.0), (0.0, 0.0), (2.0, -1.0), (1.5, 1.5)]


def _fq_inputs(rng, n_random=300):
    x = np.concatenate([edge_values(np.float32, 1.0), (rng.normal(size=n_random) * 4).astype(np.float32)])
    # gradients: dyadic values (sums are exact in any order) with both signs, plus inf/NaN
    g = (rng.integers(-64, 64, size=x.size) / 8).astype(np.float32)
    g[:4] = [np.inf, -np.inf, np.nan, -1.0]
    return x, g


def test_fake_quant_args_and_gradient_bit_exact():
    configs = [dict(min=mn, max=mx, num_bits=b, narrow_range=nr) for (mn, mx) in FQ_RANGES[:5] for (b, nr) in FQ_BITS]

    def fn(x, g):
        outs = [tf.raw_ops.FakeQuantWithMinMaxArgs(inputs=x, **c) for c in configs]
        outs += [tf.raw_ops.FakeQuantWithMinMaxArgsGradient(gradients=g, inputs=x, **c) for c in configs]
        return outs

    run = Runner(fn, [tf.TensorSpec([None], tf.float32)] * 2)
    x, g = _fq_inputs(np.random.default_rng(RNG_SEED))
    got, expected = run.both(x, g)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert_bits_equal(b, a, f"{'grad' if i >= len(configs) else 'fwd'} {configs[i % len(configs)]}")


def test_fake_quant_vars_and_gradient_bit_exact():
    def fn(x, g, mn, mx):
        outs = [tf.raw_ops.FakeQuantWithMinMaxVars(inputs=x, min=mn, max=mx, num_bits=b, narrow_range=nr) for b, nr in FQ_BITS]
        for b, nr in FQ_BITS:
            outs += list(tf.raw_ops.FakeQuantWithMinMaxVarsGradient(gradients=g, inputs=x, min=mn, max=mx, num_bits=b, narrow_range=nr))
        return outs

    run = Runner(fn, [tf.TensorSpec([None, 4], tf.float32)] * 2 + [tf.TensorSpec([], tf.float32)] * 2)
    x, g = _fq_inputs(np.random.default_rng(RNG_SEED + 1), n_random=302)
    x, g = x.reshape(-1, 4), g.reshape(-1, 4)
    for mn, mx in FQ_RANGES:
        got, expected = run.both(x, g, np.float32(mn), np.float32(mx))
        for i, (a, b) in enumerate(zip(got, expected)):
            assert_bits_equal(b, a, f"range {(mn, mx)} output {i}")


def test_fake_quant_per_channel_and_gradient_bit_exact():
    def fn(x, g, mn, mx):
        outs = [tf.raw_ops.FakeQuantWithMinMaxVarsPerChannel(inputs=x, min=mn, max=mx, num_bits=b, narrow_range=nr) for b, nr in FQ_BITS]
        for b, nr in FQ_BITS:
            outs += list(
                tf.raw_ops.FakeQuantWithMinMaxVarsPerChannelGradient(gradients=g, inputs=x, min=mn, max=mx, num_bits=b, narrow_range=nr)
            )
        return outs

    run = Runner(fn, [tf.TensorSpec([None, 2, 8], tf.float32)] * 2 + [tf.TensorSpec([8], tf.float32)] * 2)
    x, g = _fq_inputs(np.random.default_rng(RNG_SEED + 2), n_random=302)
    x, g = x.reshape(-1, 2, 8), g.reshape(-1, 2, 8)
    mn = np.array([r[0] for r in FQ_RANGES], np.float32)
    mx = np.array([r[1] for r in FQ_RANGES], np.float32)
    for shift in range(3):  # every channel sees several ranges
        got, expected = run.both(x, g, np.roll(mn, shift), np.roll(mx, shift))
        for i, (a, b) in enumerate(zip(got, expected)):
            assert_bits_equal(b, a, f"shift {shift} output {i}")


def test_fake_quant_bad_num_bits_is_a_lowering_error():
    def fn(x):
        return tf.raw_ops.FakeQuantWithMinMaxArgs(inputs=x, num_bits=17)

    with pytest.raises(LoweringError, match="num_bits must be between 2 and 16"):
        convert(fn, [tf.TensorSpec([None], tf.float32)])


# ---------------------------------------------------------------- QuantizeAndDequantize*


@pytest.mark.parametrize("lo, hi", [(2.0, 1.0), (np.nan, 1.0), (0.0, np.nan)])
def test_quantize_and_dequantize_invalid_constant_range_is_a_lowering_error(lo, hi):
    """TF rejects a per-tensor range unless min <= max (a NaN end included) when the op runs; a constant one
    is rejected at conversion time (a standard ONNX graph cannot raise at run time)."""
    def fn(x):
        return tf.raw_ops.QuantizeAndDequantizeV4(input=x, input_min=np.float32(lo), input_max=np.float32(hi),
                                                  range_given=True)

    with pytest.raises(tf.errors.InvalidArgumentError, match="Invalid range"):
        fn(tf.constant([0.5], tf.float32))
    with pytest.raises(LoweringError, match="Invalid range"):
        convert(fn, [tf.TensorSpec([None], tf.float32)])


def _qdq_configs():
    cfgs = []
    for signed in (True, False):
        for bits, narrow in ((1, False), (3, True), (8, False), (8, True)):
            for mode in ("HALF_TO_EVEN", "HALF_UP"):
                cfgs.append(("V2", dict(signed_input=signed, num_bits=bits, narrow_range=narrow, round_mode=mode, range_given=True)))
                cfgs.append(("V4", dict(signed_input=signed, num_bits=bits, narrow_range=narrow, round_mode=mode, range_given=False)))
                cfgs.append(("V4", dict(signed_input=signed, num_bits=bits, narrow_range=narrow, round_mode=mode, range_given=False, axis=1)))
            # V3: HALF_TO_EVEN only; per-axis with a given range works in V3 (not in V2/V4 on TF 2.21)
            cfgs.append(("V3", dict(signed_input=signed, range_given=True, narrow_range=narrow, axis=1, num_bits=bits)))
            cfgs.append(("V3", dict(signed_input=signed, range_given=False, narrow_range=narrow, num_bits=bits)))
    return cfgs


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_quantize_and_dequantize_bit_exact(dtype):
    tf_dtype = tf.as_dtype(dtype)
    cfgs = _qdq_configs()

    def fn(x, mn, mx, vmn, vmx):
        outs = []
        for version, attrs in cfgs:
            attrs = dict(attrs)
            per_axis = attrs.get("axis", -1) != -1
            lo, hi = (vmn, vmx) if per_axis else (mn, mx)
            if version == "V3":
                bits = attrs.pop("num_bits")
                outs.append(tf.raw_ops.QuantizeAndDequantizeV3(input=x, input_min=lo, input_max=hi, num_bits=bits, **attrs))
            else:
                outs.append(getattr(tf.raw_ops, "QuantizeAndDequantize" + version)(input=x, input_min=lo, input_max=hi, **attrs))
        outs += list(tf.raw_ops.QuantizeAndDequantizeV4Grad(gradients=x * 3, input=x, input_min=mn, input_max=mx))
        outs += list(tf.raw_ops.QuantizeAndDequantizeV4Grad(gradients=-x, input=x, input_min=vmn, input_max=vmx, axis=1))
        return outs

    sig = [tf.TensorSpec([None, 3], tf_dtype), tf.TensorSpec([], tf_dtype), tf.TensorSpec([], tf_dtype)]
    run = Runner(fn, sig + [tf.TensorSpec([3], tf_dtype)] * 2)
    rng = np.random.default_rng(RNG_SEED + 3)
    finite = (rng.normal(size=(40, 3)) * 3).astype(dtype)
    finite[:8] = np.round(finite[:8] * 4) / 4  # ties at several grid spacings
    # edge values (NaN, +-inf, +-0, subnormals) reach the data ranges too, which follow TF's reduction
    # order (tests/test_standard_qdq_nan.py has the NaN-heavy cases). A given max of 0 on the 1-bit
    # signed grid [-1, 0] makes the step 0/0, so NaN inputs there also test which NaN the output keeps
    # (tests/test_standard_qdq_given_nan.py has more).
    edges = edge_values(dtype, 1.0)
    edges = edges[: edges.size // 3 * 3].reshape(-1, 3)
    for x in (finite, edges):
        ranges = [(-1.0, 1.0), (-2.5, 7.0), (0.5, 3.0), (-3.0, -1.0), (0.0, 0.0), (-0.0, 0.0)]
        for mn, mx in ranges:
            args = [x, np.array(mn, dtype), np.array(mx, dtype), np.array([mn, mn * 2, mn / 3], dtype), np.array([mx, mx, mx * 2], dtype)]
            got, expected = run.both(*args)
            for i, (a, b) in enumerate(zip(got, expected)):
                assert_bits_equal(b, a, f"x {x.shape} range {(mn, mx)} {cfgs[i] if i < len(cfgs) else 'V4Grad'}")


def test_quantize_and_dequantize_range_given_edge_values_bit_exact():
    def fn(x, mn, mx):
        return [
            tf.raw_ops.QuantizeAndDequantizeV2(input=x, input_min=mn, input_max=mx, range_given=True, num_bits=b, round_mode=m, signed_input=s)
            for b in (2, 8)
            for m in ("HALF_TO_EVEN", "HALF_UP")
            for s in (True, False)
        ] + list(tf.raw_ops.QuantizeAndDequantizeV4Grad(gradients=-x, input=x, input_min=mn, input_max=mx))

    run = Runner(fn, [tf.TensorSpec([None], tf.float32), tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.float32)])
    x = edge_values(np.float32, 0.25)
    for mn, mx in [(-1.0, 1.0), (-6.0, 6.0), (0.0, 2.0)]:
        got, expected = run.both(x, np.float32(mn), np.float32(mx))
        for i, (a, b) in enumerate(zip(got, expected)):
            assert_bits_equal(b, a, f"range {(mn, mx)} output {i}")


# ---------------------------------------------------------------- FusedBatchNorm*

# float32 tolerance: the lowering sums in ONNX Runtime's order and uses a correctly rounded 1/sqrt,
# TF (oneDNN) its own order and an rsqrt estimate refined once; a few ulps on O(1) values after
# normalization, times the reduction length (<= 150 here). rtol 1e-5 with a small atol for values
# that cancel to ~0 covers that and is still far below any formula error (a wrong Bessel factor,
# epsilon or layout changes results by > 1e-3).
BN_RTOL, BN_ATOL = 1e-5, 1e-5


def _bn_case(rng, shape, c):
    x = (rng.normal(size=shape) * 2 + 0.5).astype(np.float32)
    scale = rng.uniform(0.5, 1.5, c).astype(np.float32)
    offset = rng.normal(size=c).astype(np.float32)
    mean = rng.normal(size=c).astype(np.float32)
    var = rng.uniform(0.5, 2.0, c).astype(np.float32)
    return x, scale, offset, mean, var


@pytest.mark.parametrize(
    "version,data_format,shape",
    [
        ("", "NHWC", (2, 3, 4, 5)),
        ("V2", "NCHW", (2, 5, 3, 4)),
        ("V3", "NHWC", (2, 3, 4, 5)),
        ("V3", "NCHW", (2, 5, 3, 4)),
        ("V3", "NDHWC", (2, 2, 3, 2, 5)),
        ("V3", "NCDHW", (2, 5, 2, 3, 2)),
    ],
)
def test_fused_batch_norm_forward_and_grad(version, data_format, shape):
    c = 5
    fwd = getattr(tf.raw_ops, "FusedBatchNorm" + version)
    grad = getattr(tf.raw_ops, "FusedBatchNormGrad" + version)
    modes = [(True, 1.0), (True, 0.3), (False, 1.0)]
    channels_first = data_format.startswith("NC")
    perm = [0, 2, 3, 1] if len(shape) == 4 else [0, 2, 3, 4, 1]
    back = [0, 3, 1, 2] if len(shape) == 4 else [0, 4, 1, 2, 3]

    def build(x, dy, scale, offset, mean, var, oracle):
        outs = []
        for training, factor in modes:
            r = fwd(x=x, scale=scale, offset=offset, mean=mean, variance=var, epsilon=1e-3,
                    exponential_avg_factor=factor, data_format=data_format, is_training=training)
            outs += [r[0], r[1], r[2]]
            extra = {"reserve_space_3": r[5]} if version == "V3" else {}
            if oracle and channels_first and not training:
                # TF's CPU kernel has no channels-first inference gradient; its Python gradient
                # transposes to channels-last around it, and so does the oracle.
                g = grad(y_backprop=tf.transpose(dy, perm), x=tf.transpose(x, perm), scale=scale, reserve_space_1=mean,
                         reserve_space_2=var, epsilon=1e-3, data_format="NHWC" if len(shape) == 4 else "NDHWC",
                         is_training=False, **extra)
                outs += [tf.transpose(g[0], back), g[1], g[2]]
                continue
            g = grad(y_backprop=dy, x=x, scale=scale, reserve_space_1=r[3] if training else mean,
                     reserve_space_2=r[4] if training else var, epsilon=1e-3,
                     data_format=data_format, is_training=training, **extra)
            outs += [g[0], g[1], g[2]]
        return outs

    def fn(*args):
        return build(*args, oracle=False)

    def oracle(*args):
        return build(*args, oracle=True)

    spec = tf.TensorSpec(shape, tf.float32)
    vec = tf.TensorSpec([c], tf.float32)
    run = Runner(fn, [spec, spec] + [vec] * 4, oracle)
    rng = np.random.default_rng(RNG_SEED + 4)
    x, scale, offset, mean, var = _bn_case(rng, shape, c)
    dy = rng.normal(size=shape).astype(np.float32)
    got, expected = run.both(x, dy, scale, offset, mean, var)
    names = ["y", "batch_mean", "batch_variance", "x_backprop", "scale_backprop", "offset_backprop"]
    for i, (a, b) in enumerate(zip(got, expected)):
        what = f"{modes[i // 6]} {names[i % 6]}"
        assert a.shape == b.shape, what
        np.testing.assert_allclose(a, b, rtol=BN_RTOL, atol=BN_ATOL * max(1.0, float(np.abs(b).max())), err_msg=what)


def test_fused_batch_norm_v3_half():
    # float16 x: computed in float32 and rounded once (as TF); TF and the lowering may round an
    # intermediate differently, so allow 2 float16 ulps (2**-9 relative).
    shape, c = (2, 3, 3, 4), 4

    def fn(x, scale, offset, mean, var):
        r = tf.raw_ops.FusedBatchNormV3(x=x, scale=scale, offset=offset, mean=mean, variance=var, is_training=True)
        return [r[0], r[1], r[2]]

    run = Runner(fn, [tf.TensorSpec(shape, tf.float16)] + [tf.TensorSpec([c], tf.float32)] * 4)
    x, scale, offset, mean, var = _bn_case(np.random.default_rng(RNG_SEED + 5), shape, c)
    got, expected = run.both(x.astype(np.float16), scale, offset, mean, var)
    assert got[0].dtype == np.float16
    np.testing.assert_allclose(got[0].astype(np.float32), expected[0].astype(np.float32), rtol=2**-9, atol=2**-9)
    for a, b in zip(got[1:], expected[1:]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- DepthwiseConv2dNative*

# float32 tolerance: sums of kh*kw (forward) or up to N*oh*ow (filter gradient, <= 200 here) products
# of O(1) values in a different order than TF/oneDNN: a few ulps each, so 1e-5 relative to the
# largest magnitude of the output.
DW_RTOL = 1e-5

DW_CASES = [
    # (data_format, stride, padding, explicit, dilation, M, input NHWC shape, kernel)
    ("NHWC", 1, "SAME", None, 1, 1, (2, 6, 7, 3), (3, 3)),
    ("NHWC", 2, "SAME", None, 1, 3, (2, 7, 6, 2), (3, 2)),
    ("NHWC", 2, "VALID", None, 1, 2, (1, 8, 7, 3), (3, 3)),
    ("NHWC", 1, "VALID", None, 2, 2, (2, 8, 8, 2), (3, 3)),
    ("NHWC", 1, "SAME", None, 2, 1, (1, 7, 6, 3), (2, 3)),
    ("NHWC", 2, "EXPLICIT", (1, 2, 0, 1), 1, 2, (2, 6, 7, 2), (3, 3)),
    ("NCHW", 1, "SAME", None, 1, 2, (2, 6, 5, 3), (3, 3)),
    ("NCHW", 2, "VALID", None, 1, 1, (1, 9, 8, 2), (2, 2)),
]


def _dw_attrs(fmt, stride, padding, explicit, dilation):
    if fmt == "NHWC":
        strides, dilations = [1, stride, stride, 1], [1, dilation, dilation, 1]
        pads = [0, 0, explicit[0], explicit[1], explicit[2], explicit[3], 0, 0] if explicit else []
    else:
        strides, dilations = [1, 1, stride, stride], [1, 1, dilation, dilation]
        pads = [0, 0, 0, 0, explicit[0], explicit[1], explicit[2], explicit[3]] if explicit else []
    return dict(strides=strides, padding=padding, explicit_paddings=pads, data_format=fmt, dilations=dilations)


def _dw_oracle(fmt, stride, padding, explicit, dilation):
    """TF's meaning of the op and its gradients, computed in NHWC.

    TF's CPU kernels on a machine without oneDNN's rewrite (this one) reject dilations and NCHW in
    the forward op and ignore dilations in the backprops, so the oracle is tf.nn.depthwise_conv2d
    (SpaceToBatchND around the op for dilations) and its gradients by GradientTape, with NCHW data
    transposed to NHWC and back (layout does not change the arithmetic)."""
    pad = padding if explicit is None else [[0, 0], [explicit[0], explicit[1]], [explicit[2], explicit[3]], [0, 0]]
    to_nhwc, to_nchw = (lambda t: tf.transpose(t, [0, 2, 3, 1])), (lambda t: tf.transpose(t, [0, 3, 1, 2]))

    def oracle(x, f, dy):
        if fmt == "NCHW":
            x, dy = to_nhwc(x), to_nhwc(dy)
        with tf.GradientTape() as tape:
            tape.watch([x, f])
            y = tf.nn.depthwise_conv2d(x, f, strides=[1, stride, stride, 1], padding=pad, dilations=[dilation, dilation])
        dx, df = tape.gradient(y, [x, f], output_gradients=dy)
        if fmt == "NCHW":
            y, dx = to_nchw(y), to_nchw(dx)
        return [y, dx, df]

    return oracle


@pytest.mark.parametrize("case", DW_CASES, ids=lambda c: "-".join(map(str, c[:6])))
def test_depthwise_forward_and_backprops(case):
    fmt, stride, padding, explicit, dilation, m, nhwc, (kh, kw) = case
    attrs = _dw_attrs(fmt, stride, padding, explicit, dilation)
    n, h, w, c = nhwc
    in_shape = list(nhwc) if fmt == "NHWC" else [n, c, h, w]
    filt_shape = [kh, kw, c, m]
    oracle = tf.function(_dw_oracle(fmt, stride, padding, explicit, dilation))
    rng = np.random.default_rng(RNG_SEED + 6)
    x = rng.normal(size=in_shape).astype(np.float32)
    f = rng.normal(size=filt_shape).astype(np.float32)
    # the forward output shape, from the oracle
    probe = tf.nn.depthwise_conv2d(
        tf.constant(np.transpose(x, [0, 2, 3, 1]) if fmt == "NCHW" else x), f, strides=[1, stride, stride, 1],
        padding=padding if explicit is None else [[0, 0], [explicit[0], explicit[1]], [explicit[2], explicit[3]], [0, 0]],
        dilations=[dilation, dilation],
    )
    y_shape = list(probe.shape) if fmt == "NHWC" else [probe.shape[0], probe.shape[3], probe.shape[1], probe.shape[2]]
    dy = rng.normal(size=y_shape).astype(np.float32)

    def fn(x, f, dy):
        return [
            tf.raw_ops.DepthwiseConv2dNative(input=x, filter=f, **attrs),
            tf.raw_ops.DepthwiseConv2dNativeBackpropInput(input_sizes=tf.constant(in_shape), filter=f, out_backprop=dy, **attrs),
            tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(input=x, filter_sizes=tf.constant(filt_shape), out_backprop=dy, **attrs),
        ]

    model = convert(fn, [tf.TensorSpec(in_shape, tf.float32), tf.TensorSpec(filt_shape, tf.float32), tf.TensorSpec(y_shape, tf.float32)])
    session = cpu_session(model)
    got = session.run(None, dict(zip([i.name for i in session.get_inputs()], [x, f, dy])))
    expected = [np.asarray(e) for e in oracle(x, f, dy)]
    for name, a, b in zip(("forward", "backprop_input", "backprop_filter"), got, expected):
        assert a.shape == b.shape, (name, a.shape, b.shape)
        np.testing.assert_allclose(a, b, rtol=DW_RTOL, atol=DW_RTOL * float(np.abs(b).max()), err_msg=name)


def test_depthwise_dilated_python_wrapper():
    # tf.nn.depthwise_conv2d with a dilation emits SpaceToBatchND -> DepthwiseConv2dNative -> BatchToSpaceND;
    # converted as is (tf2onnx's dilation rewriter off), the inner op is plain.
    def fn(x, f):
        return tf.nn.depthwise_conv2d(x, f, strides=[1, 1, 1, 1], padding="SAME", dilations=[2, 2])

    run = Runner(fn, [tf.TensorSpec([1, 9, 8, 2], tf.float32), tf.TensorSpec([3, 3, 2, 2], tf.float32)])
    rng = np.random.default_rng(RNG_SEED + 7)
    x, f = rng.normal(size=(1, 9, 8, 2)).astype(np.float32), rng.normal(size=(3, 3, 2, 2)).astype(np.float32)
    got, expected = run.both(x, f)
    np.testing.assert_allclose(got[0], expected[0], rtol=DW_RTOL, atol=DW_RTOL * float(np.abs(expected[0]).max()))


def test_depthwise_half():
    # float16: TF rounds its accumulator to half after every tap, the lowering once at the end:
    # up to kh*kw/2 half ulps apart, so a 2**-7 relative tolerance.
    attrs = _dw_attrs("NHWC", 1, "SAME", None, 1)

    def fn(x, f):
        return tf.raw_ops.DepthwiseConv2dNative(input=x, filter=f, **attrs)

    run = Runner(fn, [tf.TensorSpec([1, 5, 5, 2], tf.float16), tf.TensorSpec([3, 3, 2, 2], tf.float16)])
    rng = np.random.default_rng(RNG_SEED + 8)
    x = rng.normal(size=(1, 5, 5, 2)).astype(np.float16)
    f = rng.normal(size=(3, 3, 2, 2)).astype(np.float16)
    got, expected = run.both(x, f)
    assert got[0].dtype == np.float16
    np.testing.assert_allclose(got[0].astype(np.float32), expected[0].astype(np.float32), rtol=2**-7, atol=2**-7 * float(np.abs(expected[0]).max()))


def test_depthwise_double_is_a_lowering_error():
    attrs = _dw_attrs("NHWC", 1, "SAME", None, 1)

    def fn(x, f):
        return tf.raw_ops.DepthwiseConv2dNative(input=x, filter=f, **attrs)

    with pytest.raises(LoweringError, match="float64"):
        convert(fn, [tf.TensorSpec([1, 5, 5, 2], tf.float64), tf.TensorSpec([3, 3, 2, 2], tf.float64)])
