"""The lean standard lowering of the quantization ops (issue 12): a constant range is nudged at
conversion time, so the graph holds only per-element nodes (counted here), and both forms, constant
range and range computed in the graph, stay bit-exact against live TensorFlow on edge inputs: rounding
ties, the range ends and the values next to them, NaN of both signs, infinities, subnormals and
signed zeros, with ranges chosen to reach every branch (zero ranges, ranges near FLT_MIN where the
flushes decide, ranges whose nudged minimum is zero).
"""
from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf

from comparison import assert_bits_equal
from test_standard_lowering import Runner, convert

pytestmark = pytest.mark.tensorflow

F32 = np.float32
TINY = np.finfo(F32).tiny
SUB = np.finfo(F32).smallest_subnormal
BITS = [(2, False), (8, False), (8, True), (16, False)]
# Ordinary ranges (ReLU6-like [0, 6] has nudged_min 0 and quant_zero 0, the shortest sequence), a
# range that nudges (zero point rounded), one-sided ranges, a zero range, and ranges near FLT_MIN
# where TF's flushes change results (the lowering must then keep them).
RANGES = [
    (0.0, 6.0), (-6.0, 6.0), (-0.3, 2.7), (1.0, 3.0), (-5.0, -2.0), (-1.0, 1.0), (0.0, 0.0), (-1e-40, 1e-40),
    (-1e-36, 2e-36), (0.0, 3e-36), (-2e-37, 0.0), (-3e-38, 4e-38), (0.0, 2.0**-110),
]


def edge_inputs(rng, n_random=200):
    """x: ties on the grids of RANGES, both zeros and NaNs, infinities, subnormals of both signs and the
    normals around FLT_MIN, the ends of the nudged ranges and their neighbours; g: dyadic values (sums
    exact in any order), subnormals, infinities and NaNs. 8 columns (PerChannel uses them as channels)."""
    fixed = [0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, SUB, -SUB, 1e-40, -1e-40, TINY, -TINY,
             np.nextafter(TINY, F32(0)), -np.nextafter(TINY, F32(0)), np.nextafter(TINY, F32(1)), 1e-36, -1e-36, 2.5e-36]
    ties = np.arange(-60, 61) * F32(6.0 / 255 / 2)  # half steps of [-6, 6] and [0, 6]
    ends = []
    for mn, mx in RANGES[:6]:
        for b in (mn, mx):
            ends += [b, np.nextafter(F32(b), F32(-np.inf)), np.nextafter(F32(b), F32(np.inf))]
    x = np.concatenate([F32(fixed), ties.astype(F32), F32(ends), (rng.normal(size=n_random) * 4).astype(F32)])
    x = np.concatenate([x, np.zeros((-x.size) % 8, F32)]).astype(F32)
    g = (rng.integers(-64, 64, size=x.size) / 8).astype(F32)
    g[:6] = [np.inf, -np.inf, np.nan, -1.0, 1e-40, -SUB]
    g[6:10] = [-0.0, 1e-39, -3e-39, 0.0]
    return x.reshape(-1, 8), g.reshape(-1, 8)


def _per_channel_ranges():
    mn = np.array([r[0] for r in RANGES], F32)
    mx = np.array([r[1] for r in RANGES], F32)
    sets = [(np.resize(np.roll(mn, k), 8), np.resize(np.roll(mx, k), 8)) for k in (0, 3)]
    nonzero = [(a, b) for a, b in RANGES if not (abs(a) < TINY and abs(b) < TINY)]  # the lean per-channel form
    sets.append((np.resize(F32([r[0] for r in nonzero]), 8), np.resize(F32([r[1] for r in nonzero]), 8)))
    return sets


def _check(run, args, labels):
    got, expected = run.both(*args)
    assert len(got) == len(labels)
    for a, b, what in zip(got, expected, labels):
        assert_bits_equal(b, a, what)


# ------------------------------------------------------------------ bit-exact, constant range


def test_fake_quant_constant_range_bit_exact():
    """Every FakeQuant op with its range a constant of the graph (the lean form)."""
    cases = [(mn, mx, b, nr) for (mn, mx) in RANGES for (b, nr) in BITS]
    args_cases = [c for c in cases if F32(c[0]) < F32(c[1]) and not (abs(c[0]) < TINY and abs(c[1]) < TINY)]
    channel_cases = [(mn, mx, b, nr) for (mn, mx) in _per_channel_ranges() for (b, nr) in BITS]

    def fn(x, g):
        outs, labels = [], []
        for mn, mx, b, nr in cases:
            lo, hi = tf.constant(F32(mn)), tf.constant(F32(mx))
            outs.append(tf.raw_ops.FakeQuantWithMinMaxVars(inputs=x, min=lo, max=hi, num_bits=b, narrow_range=nr))
            outs += tf.raw_ops.FakeQuantWithMinMaxVarsGradient(gradients=g, inputs=x, min=lo, max=hi, num_bits=b, narrow_range=nr)
            labels += [f"Vars{k} {(mn, mx, b, nr)}" for k in ("", " dx", " dmin", " dmax")]
        for mn, mx, b, nr in args_cases:
            outs.append(tf.raw_ops.FakeQuantWithMinMaxArgs(inputs=x, min=mn, max=mx, num_bits=b, narrow_range=nr))
            outs.append(tf.raw_ops.FakeQuantWithMinMaxArgsGradient(gradients=g, inputs=x, min=mn, max=mx, num_bits=b, narrow_range=nr))
            labels += [f"Args{k} {(mn, mx, b, nr)}" for k in ("", " dx")]
        for mn, mx, b, nr in channel_cases:
            lo, hi = tf.constant(mn), tf.constant(mx)
            outs.append(tf.raw_ops.FakeQuantWithMinMaxVarsPerChannel(inputs=x, min=lo, max=hi, num_bits=b, narrow_range=nr))
            outs += tf.raw_ops.FakeQuantWithMinMaxVarsPerChannelGradient(gradients=g, inputs=x, min=lo, max=hi, num_bits=b, narrow_range=nr)
            labels += [f"PerChannel{k} {(mn[0], b, nr)}" for k in ("", " dx", " dmin", " dmax")]
        fn.labels = labels
        return outs

    run = Runner(fn, [tf.TensorSpec([None, 8], tf.float32)] * 2)
    x, g = edge_inputs(np.random.default_rng(7))
    _check(run, (x, g), fn.labels)


def test_fake_quant_graph_range_bit_exact():
    """The same ranges fed at run time (the nudge written in the graph)."""

    def fn(x, g, mn, mx, cmn, cmx):
        outs = []
        for b, nr in BITS:
            outs.append(tf.raw_ops.FakeQuantWithMinMaxVars(inputs=x, min=mn, max=mx, num_bits=b, narrow_range=nr))
            outs += tf.raw_ops.FakeQuantWithMinMaxVarsGradient(gradients=g, inputs=x, min=mn, max=mx, num_bits=b, narrow_range=nr)
            outs.append(tf.raw_ops.FakeQuantWithMinMaxVarsPerChannel(inputs=x, min=cmn, max=cmx, num_bits=b, narrow_range=nr))
            outs += tf.raw_ops.FakeQuantWithMinMaxVarsPerChannelGradient(gradients=g, inputs=x, min=cmn, max=cmx, num_bits=b, narrow_range=nr)
        return outs

    scalar, vector = tf.TensorSpec([], tf.float32), tf.TensorSpec([8], tf.float32)
    run = Runner(fn, [tf.TensorSpec([None, 8], tf.float32)] * 2 + [scalar, scalar, vector, vector])
    x, g = edge_inputs(np.random.default_rng(8))
    channel = _per_channel_ranges()
    for i, (mn, mx) in enumerate(RANGES + [(2.0, -1.0)]):
        cmn, cmx = channel[i % 3]
        labels = [f"{op} {(mn, mx, b, nr)}" for b, nr in BITS for op in ("Vars", "dx", "dmin", "dmax", "PerChannel", "pc dx", "pc dmin", "pc dmax")]
        _check(run, (x, g, F32(mn), F32(mx), cmn, cmx), labels)


QDQ_RANGES = [(-1.0, 1.0), (0.0, 2.0), (-6.0, 6.0), (-3.0, -1.0), (0.5, 3.0), (0.0, 0.0), (-0.0, 0.0), (-1e-40, 1e-40), (-1e-36, 3e-36)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_quantize_and_dequantize_constant_range_bit_exact(dtype):
    """QDQ V2/V3/V4 with a given constant range and V4Grad with a constant range."""
    tf_dtype = tf.as_dtype(dtype)
    configs = [(s, b, nr, m) for s in (True, False) for b, nr in ((2, False), (8, False), (8, True)) for m in ("HALF_TO_EVEN", "HALF_UP")]

    def fn(x, g):
        outs, labels = [], []
        for mn, mx in QDQ_RANGES:
            lo, hi = tf.constant(mn, tf_dtype), tf.constant(mx, tf_dtype)
            for s, b, nr, m in configs:
                outs.append(tf.raw_ops.QuantizeAndDequantizeV4(
                    input=x, input_min=lo, input_max=hi, range_given=True, num_bits=b, narrow_range=nr, signed_input=s, round_mode=m))
                labels.append(f"V4 {(mn, mx, s, b, nr, m)}")
                if m == "HALF_TO_EVEN":
                    outs.append(tf.raw_ops.QuantizeAndDequantizeV3(
                        input=x, input_min=lo, input_max=hi, num_bits=tf.constant(b), range_given=True, narrow_range=nr, signed_input=s))
                    labels.append(f"V3 {(mn, mx, s, b, nr)}")
            outs += tf.raw_ops.QuantizeAndDequantizeV4Grad(gradients=g, input=x, input_min=lo, input_max=hi)
            labels += [f"V4Grad{k} {(mn, mx)}" for k in ("", " dmin", " dmax")]
        fn.labels = labels
        return outs

    run = Runner(fn, [tf.TensorSpec([None, 8], tf_dtype)] * 2)
    x, g = edge_inputs(np.random.default_rng(9))
    x, g = x.astype(dtype), g.astype(dtype)
    if dtype == np.float64:  # float64 subnormals and FLT_MIN neighbours
        x[0, :4] = [5e-324, -5e-324, 1e-310, -2.2250738585072014e-308]
    _check(run, (x, g), fn.labels)


# ------------------------------------------------------------------ node counts


def _node_counts(fn, signature):
    model = convert(fn, signature)
    return collections.Counter(n.op_type for n in model.graph.node if n.op_type not in ("Constant", "Identity"))


# Per-element ops only: nothing of the nudge (Div of scalars, Floor of the zero point, flushes of the
# range) may remain. The bounds are the sequences' lengths (see converters.standard.fake_quant).
PER_ELEMENT = {"Clip", "Min", "Max", "Sub", "Mul", "Div", "Add", "Floor", "Round", "Abs", "GreaterOrEqual",
               "LessOrEqual", "Less", "Greater", "And", "Cast", "ReduceSum", "Reshape"}


@pytest.mark.parametrize(
    "op, limit",
    [
        ("FakeQuantWithMinMaxArgs", 7),
        ("FakeQuantWithMinMaxVars", 7),
        ("FakeQuantWithMinMaxVarsPerChannel", 8),
        ("FakeQuantWithMinMaxArgsGradient", 9),
        ("FakeQuantWithMinMaxVarsGradient", 17),
        ("FakeQuantWithMinMaxVarsPerChannelGradient", 19),
        ("QuantizeAndDequantizeV2", 4),
        ("QuantizeAndDequantizeV4", 5),
        ("QuantizeAndDequantizeV4Grad", 9),
    ],
)
def test_constant_range_lowering_has_only_per_element_nodes(op, limit):
    raw = getattr(tf.raw_ops, op)
    per_channel = "PerChannel" in op
    mn, mx = (F32([-0.3, -6.0, 0.0, -1.0]), F32([2.7, 6.0, 6.0, 1.0])) if per_channel else (F32(-0.3), F32(2.7))

    def fn(x, g):
        kw = dict(inputs=x) if "FakeQuant" in op else dict(input=x)
        if "Args" in op:
            kw.update(min=-0.3, max=2.7)
        elif "FakeQuant" in op:
            kw.update(min=tf.constant(mn), max=tf.constant(mx))
        else:
            kw.update(input_min=tf.constant(mn), input_max=tf.constant(mx))
            if op != "QuantizeAndDequantizeV4Grad":
                kw.update(range_given=True)
            if op == "QuantizeAndDequantizeV4":
                kw.update(round_mode="HALF_UP")
        if "Grad" in op:
            kw.update(gradients=g)
        out = raw(**kw)
        return list(out) if isinstance(out, (list, tuple)) else out

    counts = _node_counts(fn, [tf.TensorSpec([None, 4], tf.float32)] * 2)
    assert set(counts) <= PER_ELEMENT, f"{op}: {counts}"
    assert sum(counts.values()) <= limit, f"{op}: {sum(counts.values())} nodes, {counts}"


def test_graph_range_nudge_is_written_once_per_node():
    """With the range computed in the graph, the scalar nudge stays, once per node (about 70 nodes on
    scalars), with the per-element work (about 25 nodes each): a Vars node and its gradient took 377
    nodes in the first standard lowering."""

    def fn(x, g, mn, mx):
        return [tf.raw_ops.FakeQuantWithMinMaxVars(inputs=x, min=mn, max=mx)] + list(
            tf.raw_ops.FakeQuantWithMinMaxVarsGradient(gradients=g, inputs=x, min=mn, max=mx)
        )

    scalar = tf.TensorSpec([], tf.float32)
    counts = _node_counts(fn, [tf.TensorSpec([None, 4], tf.float32)] * 2 + [scalar, scalar])
    assert sum(counts.values()) <= 200, counts
