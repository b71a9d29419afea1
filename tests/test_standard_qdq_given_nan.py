"""QuantizeAndDequantize{V2,V3,V4} with a GIVEN range whose step is NaN, through the standard lowering:
bit for bit against live TensorFlow and the NumPy reference.

The step (TF's inverse scale) is NaN when the max side decides it and the max is NaN (a NaN in a
per-axis range: a min of 0 or NaN, or an unsigned grid, leaves the max side to decide), or 0/0 (a max
of 0 on the 1-bit signed grid [-1, 0] with a min of +-0, per tensor too). Every output of such a
channel is NaN; TF keeps the input's own NaN, except on the scalar tail of each channel's pre * post
elements (the last L % W, W = 8 float32 / 4 float64), where the step's NaN wins
(ort_ops/reference/_qdq_eigen_order.py ``keeps_input_nan``). The range is tried as graph inputs and
as constants; a constant range whose step is not NaN must not cost a single node more.

TF 2.21 rejects a per-axis given range in V2/V4 (it demands scalars, then vectors), so those cases
are compared with the reference only; V3 runs them in TF.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import converters
import ort_ops
from backends import cpu_session
from comparison import assert_bits_equal
from test_standard_lowering import Runner, convert

pytestmark = pytest.mark.tensorflow

NAN = np.nan
# (per axis) channel ranges: NaN steps of both signs (NaN max, min side undecided), 0/0 on the 1-bit
# signed grid, and ranges whose step is not NaN (a NaN max the min side overrules; an ordinary one)
PAIRS = [(0.0, NAN), (0.0, -NAN), (NAN, -NAN), (-1.0, 1.0), (-2.0, NAN), (-0.0, 0.0), (0.0, 0.0), (1.0, NAN), (-0.5, 3.0)]

# name -> (op, attrs); TF runs the first group, the reference alone the second
TF_CONFIGS = {}
for _axis in (0, 1, 2):
    TF_CONFIGS[f"v3 axis {_axis} signed 8"] = ("V3", dict(axis=_axis, num_bits=8, signed_input=True))
    TF_CONFIGS[f"v3 axis {_axis} unsigned 4"] = ("V3", dict(axis=_axis, num_bits=4, signed_input=False))
    TF_CONFIGS[f"v3 axis {_axis} signed 1"] = ("V3", dict(axis=_axis, num_bits=1, signed_input=True))
for _mode in ("HALF_TO_EVEN", "HALF_UP"):
    TF_CONFIGS[f"v4 per tensor signed 1 {_mode}"] = ("V4", dict(axis=-1, num_bits=1, signed_input=True, round_mode=_mode))
    TF_CONFIGS[f"v2 per tensor signed 1 narrow {_mode}"] = ("V2", dict(axis=-1, num_bits=1, signed_input=True, narrow_range=True, round_mode=_mode))
TF_CONFIGS["v3 per tensor signed 1"] = ("V3", dict(axis=-1, num_bits=1, signed_input=True))
TF_CONFIGS["v4 per tensor signed 8"] = ("V4", dict(axis=-1, num_bits=8, signed_input=True))  # a step that is not NaN
REF_CONFIGS = {}
for _axis in (0, 2):
    for _mode in ("HALF_TO_EVEN", "HALF_UP"):
        REF_CONFIGS[f"v4 axis {_axis} signed 8 {_mode}"] = ("V4", dict(axis=_axis, num_bits=8, signed_input=True, round_mode=_mode))
        REF_CONFIGS[f"v2 axis {_axis} unsigned 3 {_mode}"] = ("V2", dict(axis=_axis, num_bits=3, signed_input=False, round_mode=_mode))
        REF_CONFIGS[f"v4 axis {_axis} signed 1 {_mode}"] = ("V4", dict(axis=_axis, num_bits=1, signed_input=True, round_mode=_mode))


def _apply(op, attrs, x, mn, mx):
    attrs = dict(attrs, range_given=True)
    if op == "V3":
        bits = attrs.pop("num_bits")
        return tf.raw_ops.QuantizeAndDequantizeV3(input=x, input_min=mn, input_max=mx, num_bits=bits, **attrs)
    return getattr(tf.raw_ops, "QuantizeAndDequantize" + op)(input=x, input_min=mn, input_max=mx, **attrs)


def _reference(op, attrs, x, mn, mx):
    attrs = dict(attrs, range_given=True)
    inputs = [x, mn, mx]
    if op == "V3":
        inputs.append(np.int32(attrs.pop("num_bits")))
    return ort_ops.get_spec("QuantizeAndDequantize" + op).run_reference(inputs, attrs)[0]


def _graph(configs):
    """fn(x, mn, mx, mn0, mx0, mn1, mx1, mn2, mx2): each config with the range of its axis (scalars per tensor)."""

    def fn(x, *ranges):
        return [_apply(op, attrs, x, *ranges[2 * (attrs["axis"] + 1): 2 * (attrs["axis"] + 1) + 2]) for op, attrs in configs.values()]

    return fn


def _signature(dtype):
    t = tf.as_dtype(dtype)
    return [tf.TensorSpec([None, None, None], t), tf.TensorSpec([], t), tf.TensorSpec([], t)] + [tf.TensorSpec([None], t)] * 6


def _ranges(rng, shape, dtype, scalar):
    """Per-tensor (min, max) and, per axis, vectors of PAIRS drawn so that most channels' steps are NaN."""
    out = [np.asarray(scalar[0], dtype), np.asarray(scalar[1], dtype)]
    for d in shape:
        pick = rng.integers(0, len(PAIRS), d)
        out += [np.array([PAIRS[i][0] for i in pick], dtype), np.array([PAIRS[i][1] for i in pick], dtype)]
    return out


def _x(rng, shape, dtype):
    pool = np.array([NAN, -NAN, 0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, 0.5, -0.25, 2.0, -3.5, 1e-40], dtype)
    x = rng.choice(pool, shape).astype(dtype)
    return np.where(rng.random(shape) < 0.3, rng.normal(size=shape) * 2, x).astype(dtype)


# channel lengths pre * post with and without a scalar tail for both packet widths, past a packet
SHAPES = [(1, 3, 13), (2, 3, 5), (4, 3, 1), (3, 3, 3), (2, 3, 8), (5, 2, 7), (1, 1, 37), (6, 2, 3), (1, 4, 9), (0, 3, 2), (2, 0, 3)]
# per tensor: 0/0 with each zero sign, and an ordinary range
SCALARS = [(0.0, 0.0), (-0.0, 0.0), (-0.0, -0.0), (0.0, -0.0), (-1.0, 1.0)]


def _check(got, expected, what):
    if expected.size == 0:
        assert got.shape == expected.shape and got.dtype == expected.dtype, what
    else:
        assert_bits_equal(expected, got, what)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_given_range_input_nan_step_bits_match_tf_and_reference(dtype):
    """The range as graph inputs: ORT against TF and the reference (TF-valid configs), and against the
    reference alone (V2/V4 per axis)."""
    run = Runner(_graph(TF_CONFIGS), _signature(dtype))
    ref_session = cpu_session(convert(_graph(REF_CONFIGS), _signature(dtype)))
    names = [i.name for i in ref_session.get_inputs()]
    rng = np.random.default_rng(1212 if dtype == np.float32 else 1213)
    signed_nan_kept = tail_step_nan = 0
    for k in range(3 * len(SHAPES)):
        shape = SHAPES[k % len(SHAPES)]
        x = _x(rng, shape, dtype)
        args = [x] + _ranges(rng, shape, dtype, SCALARS[k % len(SCALARS)])
        got, expected = run.both(*args)
        for (name, (op, attrs)), a, t in zip(TF_CONFIGS.items(), got, expected):
            axis = attrs["axis"]
            mn, mx = args[1 + 2 * (axis + 1): 3 + 2 * (axis + 1)]
            what = f"case {k} {shape} {name} range {mn} {mx}"
            _check(_reference(op, attrs, x, mn, mx), t, what + " (reference vs TF)")
            _check(a, t, what)
            nan_in = np.isnan(x) & np.isnan(t)
            signed_nan_kept += int((nan_in & (np.signbit(x) != np.signbit(t))).any())
            tail_step_nan += int((nan_in & (np.signbit(x) == np.signbit(t))).any())
        got = ref_session.run(None, dict(zip(names, args)))
        for (name, (op, attrs)), a in zip(REF_CONFIGS.items(), got):
            axis = attrs["axis"]
            mn, mx = args[1 + 2 * (axis + 1): 3 + 2 * (axis + 1)]
            _check(a, _reference(op, attrs, x, mn, mx), f"case {k} {shape} {name} range {mn} {mx} (vs reference)")
    # the inputs discriminate: NaN inputs turned to the step's NaN of the other sign, and kept
    assert signed_nan_kept > 10 and tail_step_nan > 10, (signed_nan_kept, tail_step_nan)


def _constant_graph(configs, ranges):
    """fn(x0, x1, x2, x): each config on the input of its axis (x for per tensor), dim ``axis`` being 3."""

    def fn(*xs):
        outs = []
        for op, attrs in configs.values():
            mn, mx = ranges[attrs["axis"]]
            x = xs[attrs["axis"]]
            outs.append(_apply(op, attrs, x, tf.constant(mn, x.dtype), tf.constant(mx, x.dtype)))
        return outs

    return fn


def _with_channels(u, v):
    """The inputs' shapes for the channel-free dims (u, v): x0, x1, x2 with dim 0, 1, 2 of 3, then x."""
    return [(3, u, v), (u, 3, v), (u, v, 3), (u, 3, v)]


CONSTANT_RANGES = {
    # per axis, 3 channels: a NaN step (+NaN / -NaN) or 0/0 on the 1-bit grid in some, none in others
    0: ([0.0, -1.0, -0.0], [NAN, 1.0, 0.0]),
    1: ([0.0, -2.0, 0.0], [-NAN, NAN, 0.0]),
    2: ([NAN, -0.5, 0.0], [NAN, 3.0, 0.0]),
    -1: (-0.0, 0.0),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("static", [False, True])
def test_given_range_constant_nan_step_bits_match_tf_and_reference(dtype, static):
    """The range as constants of the graph (decided at conversion time), with run-time shapes and,
    through the whole pipeline, static ones (channels of 21 elements: a tail; of 24: none)."""
    t = tf.as_dtype(dtype)
    ranges = {a: tuple(np.asarray(v, dtype) for v in r) for a, r in CONSTANT_RANGES.items()}
    rng = np.random.default_rng(1214)
    dynamic = [tf.TensorSpec(s, t) for s in _with_channels(None, None)]
    for dims in ([(3, 7), (3, 8)] if static else [None]):
        cases = [dims] * 3 if static else [(1, 7), (2, 5), (3, 1), (1, 13), (4, 2), (2, 4), (5, 5), (0, 3)]
        sig = [tf.TensorSpec(s, t) for s in _with_channels(*dims)] if static else dynamic
        for configs, with_tf in ((TF_CONFIGS, True), (REF_CONFIGS, False)):
            fn = _constant_graph(configs, ranges)
            if static:
                f = tf.function(fn, input_signature=sig)
                model = converters.from_function(f, list(f.input_signature), lowering="standard")
            else:
                model = convert(fn, sig)
            session = cpu_session(model)
            names = [i.name for i in session.get_inputs()]
            tf_fn = tf.function(fn, input_signature=sig)
            for u, v in cases:
                xs = [_x(rng, s, dtype) for s in _with_channels(u, v)]
                got = session.run(None, dict(zip(names, xs)))
                expected = [np.asarray(e) for e in tf_fn(*xs)] if with_tf else [None] * len(got)
                for (name, (op, attrs)), a, e in zip(configs.items(), got, expected):
                    x = xs[attrs["axis"]]
                    r = _reference(op, attrs, x, *ranges[attrs["axis"]])
                    what = f"{x.shape} {name} constant range"
                    if e is not None:
                        _check(r, e, what + " (reference vs TF)")
                    _check(a, r, what)


# Nodes of the converted model (Constants aside) for a constant range whose step is not NaN, counted
# before the NaN-step handling existed: it must add none.
BEFORE = [
    ("V4", dict(axis=-1), -1.0, 1.0, 4),  # the lean path: Clip, Mul, Round, Mul
    ("V4", dict(axis=-1, signed_input=False), 0.0, 1.0, 8),  # + the flush for a +0 lower bound
    ("V4", dict(axis=-1, round_mode="HALF_UP"), -1.0, 1.0, 5),
    ("V4", dict(axis=-1), 0.0, 0.0, 105),  # step 0: the general sequence
    ("V4", dict(axis=1), [-1.0, -2.0, -3.0], [1.0, 2.0, 3.0], 5),
    ("V3", dict(axis=1, num_bits=8), [-1.0, -2.0, -3.0], [1.0, NAN, 3.0], 5),  # a NaN max the min side overrules
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", range(len(BEFORE)))
def test_constant_range_without_nan_step_adds_no_node(dtype, case):
    op, attrs, mn, mx, nodes = BEFORE[case]

    def fn(x):
        return _apply(op, dict(attrs, num_bits=attrs.get("num_bits", 8)), x, tf.constant(mn, x.dtype), tf.constant(mx, x.dtype))

    model = convert(fn, [tf.TensorSpec([None, 3, 4], tf.as_dtype(dtype))])
    ops = [n.op_type for n in model.graph.node if n.op_type != "Constant"]
    assert len(ops) == nodes and "ScatterND" not in ops, ops


@pytest.mark.parametrize("axis, round_mode, limit", [(-1, "HALF_TO_EVEN", 30), (3, "HALF_TO_EVEN", 30), (3, "HALF_UP", 31)])
def test_given_range_input_per_element_cost(axis, round_mode, limit):
    """A range computed at run time pays 3 nodes per element for the NaN step: the ScatterND of the
    tails and the two Reshapes around it (before: 27 per element, 28 with HALF_UP; the clamp with its
    signed-zero repair is most of it)."""
    from test_standard_qdq_nan import _per_element_nodes

    def fn(x):
        if axis == -1:
            mn, mx = tf.reduce_min(x) - 1.0, tf.reduce_max(x) + 1.0
        else:
            mn, mx = -tf.reduce_max(x, axis=[0, 1, 2]), tf.reduce_max(x, axis=[0, 1, 2])
        return tf.raw_ops.QuantizeAndDequantizeV4(input=x, input_min=mn, input_max=mx, axis=axis, range_given=True,
                                                  round_mode=round_mode)

    total, per_element = _per_element_nodes(fn, (2, 16, 16, 32))
    assert sum(per_element.values()) <= limit, (total, per_element)
