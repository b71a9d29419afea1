"""Keras 3 (TF 2.21's ``import keras``) quantization through both lowerings, against TensorFlow.

* ``keras.quantizers.fake_quant_with_min_max_vars`` per channel on any axis: Keras 3 swaps the axis with
  the last dim around TF's FakeQuantWithMinMaxVarsPerChannel (and its gradient); the converter gives the
  node an ``axis`` instead (converters.layout.absorb_channel_transposes), so no Transpose is left.
  Inference and a training step's gradient, bit for bit.
* ``model.quantize("int8" | "int4" | "float8")`` on Dense / EinsumDense models (Keras 3.15 quantizes no
  convolution: a Conv2D stays float).
* float8: TF's Cast to float8_e4m3fn / float8_e5m2 as ONNX Cast (opset >= 19) with the overflow guard of
  converters.float8, proved against tf.cast on every float16 value and a dense float32 sweep.
"""
from __future__ import annotations

import os

os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import converters  # noqa: E402
import ort_ops  # noqa: E402
from comparison import assert_bits_equal, sum_mismatch  # noqa: E402
from converters.layout import keeps_sum_order  # noqa: E402
from converters.verification import run_onnx  # noqa: E402

pytestmark = pytest.mark.tensorflow

SEED = 20240611
LOWERINGS = ("custom", "standard")
# (axis, input shape): Keras' own swap for axis 1 and 2 of a 4-D tensor and axis 0 of a 2-D one; -1 has none.
AXES = [(-1, (2, 3, 4, 5)), (1, (2, 3, 4, 5)), (2, (2, 3, 4, 5)), (0, (6, 4))]
# Per-channel ranges, cycled over the channels: ordinary, asymmetric, one-sided, zero, inverted, narrow.
RANGES = [(-1.0, 1.0), (-0.3, 2.7), (1.0, 3.0), (0.0, 0.0), (-5.0, -2.0), (2.0, -1.0), (-6.0, 6.0)]


def _edge_values():
    tiny = np.finfo(np.float32).smallest_subnormal
    fixed = [0.0, -0.0, np.nan, np.inf, -np.inf, tiny, -tiny, 0.5, -0.5, 1.5, 2.5, -2.5, 6.0, -6.0]
    return np.concatenate([np.array(fixed, np.float32), (np.arange(-40, 41) / 8).astype(np.float32)])


def _x(rng, shape):
    """Random values with the edge values (ties, range ends, NaN, infinities, signed zeros, subnormals)."""
    x = (rng.normal(size=int(np.prod(shape))) * 3).astype(np.float32)
    edges = _edge_values()
    x[: min(edges.size, x.size)] = edges[: x.size]
    return rng.permutation(x).reshape(shape)


def _ranges(d, shift=0):
    r = [RANGES[(i + shift) % len(RANGES)] for i in range(d)]
    return np.array([a for a, _ in r], np.float32), np.array([b for _, b in r], np.float32)


def _run(model, feeds: dict) -> list:
    names = [i.name for i in model.graph.input]
    out = run_onnx(model, {n: np.asarray(feeds[n]) for n in names})
    return [out[o.name] for o in model.graph.output]


def _types(model) -> list:
    return [n.op_type for n in model.graph.node]


# ---------------------------------------------------------------- fake_quant_with_min_max_vars per channel


def _fq_function(axis, shape, ranges: str, step: bool, num_bits=8, narrow_range=False, sums=True):
    """A tf.function around Keras 3's fake quantizer: inference (x [, min, max]) or a training step's
    gradient (x, dy [, min, max]) -> (y, dx, dmin, dmax), or (y, dx) with ``sums=False``. ``ranges``:
    "constant" (variables, frozen to constants) or "input" (computed in the graph)."""
    d = shape[axis]
    fq = keras.quantizers.fake_quant_with_min_max_vars
    spec = tf.TensorSpec(shape, tf.float32)
    rspec = tf.TensorSpec([d], tf.float32)
    mn0, mx0 = _ranges(d)
    variables = (tf.Variable(mn0), tf.Variable(mx0))

    def forward(x, mn, mx):
        return fq(x, mn, mx, num_bits=num_bits, narrow_range=narrow_range, axis=axis)

    def train(x, dy, mn, mx):
        with tf.GradientTape() as tape:
            tape.watch([x, mn, mx] if ranges == "input" else [x])
            y = forward(x, mn, mx)
        if not sums:
            return y, tape.gradient(y, x, output_gradients=dy)
        dx, dmn, dmx = tape.gradient(y, [x, mn, mx], output_gradients=dy)
        return y, dx, dmn, dmx

    if ranges == "constant":
        if step:
            fn = tf.function(lambda x, dy: train(x, dy, *variables), input_signature=[spec, spec])
        else:
            fn = tf.function(lambda x: forward(x, *variables), input_signature=[spec])
    elif step:
        fn = tf.function(train, input_signature=[spec, spec, rspec, rspec])
    else:
        fn = tf.function(forward, input_signature=[spec, rspec, rspec])
    return fn


def _feeds(fn, model, arrays):
    names = [i.name for i in model.graph.input]
    assert len(names) == len(arrays), names
    return dict(zip(names, arrays))


def _no_transposes(model, what):
    types = _types(model)
    assert "Transpose" not in types, f"{what}: Transpose left in {types}"


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("axis,shape", AXES)
def test_per_channel_inference_bit_exact_without_transposes(axis, shape, lowering):
    rng = np.random.default_rng(SEED)
    x = _x(rng, shape)
    for ranges, bits, narrow in (("constant", 8, False), ("input", 4, True)):
        fn = _fq_function(axis, shape, ranges, step=False, num_bits=bits, narrow_range=narrow)
        model = converters.from_function(fn, fn.input_signature, lowering=lowering)
        _no_transposes(model, f"axis {axis} {ranges} range")
        if lowering == "custom":
            (node,) = [n for n in model.graph.node if n.op_type == "FakeQuantWithMinMaxVarsPerChannel"]
            axis_attr = [a.i for a in node.attribute if a.name == "axis"]
            assert axis_attr == [axis], axis_attr
        for shift in range(2):
            mn, mx = _ranges(shape[axis], shift)
            args = [x] if ranges == "constant" else [x, mn, mx]
            if ranges == "constant" and shift:
                continue
            want = np.asarray(fn(*args))
            (got,) = _run(model, _feeds(fn, model, args))
            assert_bits_equal(want, got, f"axis {axis} {lowering} {ranges} bits {bits} shift {shift}")


def _dyadic(rng, shape):
    """Gradients whose sums are exact in any order (multiples of 1/8 below 8), both signs."""
    return (rng.integers(-64, 64, size=shape) / 8).astype(np.float32)


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("axis,shape", AXES)
def test_per_channel_training_step_bit_exact(axis, shape, lowering):
    """y, dx, dmin, dmax of a training step. dx is element-wise: bit for bit. The sums: bit for bit in the
    custom lowering for any gradient (the kernel adds in TF's order, which the axis keeps, or the node keeps
    its Transposes, see converters.layout.keeps_sum_order); in the standard lowering (ONNX Runtime's
    ReduceSum) bit for bit where the sum is exact in any order (dyadic gradients), else to the suite's sum
    tolerance."""
    rng = np.random.default_rng(SEED + 1)
    x = _x(rng, shape)
    perm = list(range(len(shape)))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    pair_kept = lowering == "custom" and not keeps_sum_order(perm, shape)
    for ranges in ("constant", "input"):
        fn = _fq_function(axis, shape, ranges, step=True)
        model = converters.from_function(fn, fn.input_signature, lowering=lowering)
        types = _types(model)
        if pair_kept:  # axis 1 of 4-D: TF's sums run over (n, w, h), the axis would give (n, h, w)
            assert types.count("Transpose") == 3, types  # g and x in, dx out; the forward has none
            (fwd,) = [n for n in model.graph.node if n.op_type == "FakeQuantWithMinMaxVarsPerChannel"]
            assert fwd.input[0] == model.graph.input[0].name, "the forward node should read x itself"
        else:
            _no_transposes(model, f"axis {axis} {ranges} step")
        mn, mx = _ranges(shape[axis])
        for gradients in ("dyadic", "normal"):
            dy = _dyadic(rng, shape) if gradients == "dyadic" else rng.normal(size=shape).astype(np.float32)
            dy.reshape(-1)[:3] = [np.inf, np.nan, -1.0]
            args = [x, dy] if ranges == "constant" else [x, dy, mn, mx]
            want = [np.asarray(t) for t in fn(*args)]
            got = _run(model, _feeds(fn, model, args))
            what = f"axis {axis} {lowering} {ranges} {gradients} gradients"
            for i in (0, 1):
                assert_bits_equal(want[i], got[i], f"{what} output {i}")
            for i in (2, 3):  # a NaN gradient makes a channel's sum NaN: which NaN follows the order
                if lowering == "custom" or gradients == "dyadic":
                    assert_bits_equal(want[i], got[i], f"{what} output {i}", nan_payloads=False)
                else:
                    why = sum_mismatch(want[i], got[i], dy)
                    assert why is None, f"{what} output {i}: {why}"


def test_per_channel_saliency_axis1_loses_every_transpose():
    """Where no node reads the gradient's sums (a saliency map), axis 1 of a 4-D tensor loses its pair in
    the custom lowering too: dx is element-wise."""
    axis, shape = 1, (2, 3, 4, 5)
    rng = np.random.default_rng(SEED + 2)
    fn = _fq_function(axis, shape, "constant", step=True, sums=False)
    x, dy = _x(rng, shape), rng.normal(size=shape).astype(np.float32)
    for lowering in LOWERINGS:
        model = converters.from_function(fn, fn.input_signature, lowering=lowering)
        _no_transposes(model, f"saliency {lowering}")
        want = [np.asarray(t) for t in fn(x, dy)]
        for i, got in enumerate(_run(model, _feeds(fn, model, [x, dy]))):
            assert_bits_equal(want[i], got, f"saliency {lowering} output {i}")


def test_sum_order_rule_is_not_vacuous():
    """keeps_sum_order says which swaps keep TF's order of the per-channel sums. Where it says no (axis 1
    of a 4-D tensor), the op with the axis instead of the Transposes does give other bits than TF for
    ordinary gradients; where it says yes, the same bits."""
    rng = np.random.default_rng(SEED + 3)
    shape = (2, 3, 8, 16)
    spec = ort_ops.get_spec("FakeQuantWithMinMaxVarsPerChannelGradient")
    attrs = {"num_bits": 8, "narrow_range": False}
    assert not keeps_sum_order([0, 3, 2, 1], shape)
    assert keeps_sum_order([0, 1, 3, 2], shape) and keeps_sum_order([1, 0], (6, 4))
    assert keeps_sum_order([0, 3, 2, 1], (2, 3, 1, 16)) and keeps_sum_order([0, 3, 2, 1], (2, 3, 8, 1))
    results = {}
    for axis, perm in ((1, [0, 3, 2, 1]), (2, [0, 1, 3, 2])):
        x = rng.normal(size=shape).astype(np.float32) * 4
        g = rng.normal(size=shape).astype(np.float32)
        mn = np.full([shape[axis]], -0.5, np.float32)
        mx = np.full([shape[axis]], 0.5, np.float32)
        want = tf.raw_ops.FakeQuantWithMinMaxVarsPerChannelGradient(
            gradients=np.transpose(g, perm), inputs=np.transpose(x, perm), min=mn, max=mx, **attrs)
        got = spec.run_reference([g, x, mn, mx], dict(attrs, axis=axis))
        assert_bits_equal(np.transpose(np.asarray(want[0]), perm), got[0], f"axis {axis} dx")
        results[axis] = [np.array_equal(np.asarray(want[i]).view(np.uint32), got[i].view(np.uint32)) for i in (1, 2)]
    assert results[2] == [True, True], results
    assert results[1] != [True, True], "axis 1's sums should differ in order (pick another seed if they round alike)"
