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
import ml_dtypes  # noqa: E402
from onnx import TensorProto as onnx_types  # noqa: E402
from onnx import helper as onnx_helper  # noqa: E402
from tensorflow.python.framework import dtypes as tf_dtypes  # noqa: E402

import converters  # noqa: E402
import ort_ops  # noqa: E402
from comparison import assert_bits_equal, bits_mismatch, sum_mismatch  # noqa: E402
from converters import float8  # noqa: E402
from converters.errors import ConversionError  # noqa: E402
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


# ---------------------------------------------------------------- model.quantize: int8, int4, float8


def _dense():
    keras.utils.set_random_seed(SEED)
    return keras.Sequential([keras.Input((16,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(4)])


def _einsum():
    keras.utils.set_random_seed(SEED)
    return keras.Sequential([keras.Input((3, 16)),
                             keras.layers.EinsumDense("abc,cd->abd", output_shape=(3, 8), bias_axes="d")])


def _conv():
    keras.utils.set_random_seed(SEED)
    return keras.Sequential([keras.Input((6, 6, 3)), keras.layers.Conv2D(4, 3, activation="relu"),
                             keras.layers.Flatten(), keras.layers.Dense(4)])


def _finite_inputs(model, rng, batch=12):
    """Normal values with the finite corners of a dynamic quantizer: zero and -0 rows, a row of subnormals,
    tiny and huge rows, a row of ties (every |x| equal)."""
    shape = (batch,) + tuple(model.inputs[0].shape[1:])
    x = rng.normal(size=shape).astype(np.float32)
    x[0] = 0.0
    x[1] = -0.0
    x[2] *= np.float32(1e-40)
    x[3] *= np.float32(1e-20)
    x[4] *= np.float32(1e30)
    x[5] = 2.5
    return x


def _keras_run(model, onnx_model, x):
    want = np.asarray(model(x, training=False))
    got = _run(onnx_model, {onnx_model.graph.input[0].name: x})[0]
    return want, got


def _assert_close(want, got, what, rtol=1e-5):
    """Float tolerance: non-finite values where TF has them, |got - want| <= rtol * (|want| + max|want|)."""
    assert want.shape == got.shape and want.dtype == got.dtype, what
    finite = np.isfinite(want)
    assert np.array_equal(finite, np.isfinite(got)), f"{what}: non-finite positions differ"
    scale = np.abs(want[finite]).max(initial=0.0)
    err = np.abs(got[finite].astype(np.float64) - want[finite])
    assert (err <= rtol * (np.abs(want[finite]) + scale)).all(), f"{what}: max error {err.max()} (scale {scale})"


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("build", [_dense, _einsum])
def test_quantize_int8_bit_exact(build, lowering):
    """int8: Keras quantizes each input row with its abs-max (round half to even, clip to +-127), multiplies in
    int8 (tf2onnx: MatMulInteger, exact int32 sums) and divides the int32 result, as float, by the two scales:
    every step is exact or one IEEE operation, so finite inputs give TF's bits."""
    rng = np.random.default_rng(SEED + 10)
    m = build()
    m.quantize("int8")
    model = converters.from_keras(m, lowering=lowering)
    types = _types(model)
    assert "MatMulInteger" in types and "MatMul" not in types, types
    x = _finite_inputs(m, rng)
    want, got = _keras_run(m, model, x)
    assert_bits_equal(want, got, f"{build.__name__} int8 {lowering}")


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("build", [_dense, _einsum])
def test_quantize_int4_float_tolerance(build, lowering):
    """int4 (Keras 3.15's default, per output channel, weights only): grappler folds the unpacking and the
    dequantization of the constant kernel into a float32 kernel, so the graph ends in a float MatMul, whose
    sums ONNX Runtime adds in another order than TF: float tolerance, not bits."""
    rng = np.random.default_rng(SEED + 11)
    m = build()
    m.quantize("int4")
    model = converters.from_keras(m, lowering=lowering)
    types = _types(model)
    assert "MatMul" in types and "MatMulInteger" not in types, types
    want, got = _keras_run(m, model, _finite_inputs(m, rng))
    _assert_close(want, got, f"{build.__name__} int4 {lowering}")


def test_quantize_leaves_conv_float_and_int8_dense_converts():
    """Keras 3.15 quantizes no convolution: a Conv2D stays float32 (its ONNX Conv sums in another order than
    TF) and the Dense after it is int8; the model converts in both lowerings, within float tolerance here
    (a float difference reaching a dynamic quantizer's rounding boundary could move one grid step)."""
    rng = np.random.default_rng(SEED + 12)
    m = _conv()
    m.quantize("int8")
    assert [getattr(layer, "quantization_mode", None) for layer in m.layers] == [None, None, "int8"]
    x = rng.normal(size=(4, 6, 6, 3)).astype(np.float32)
    for lowering in LOWERINGS:
        model = converters.from_keras(m, lowering=lowering)
        types = _types(model)
        assert "Conv" in types and "MatMulInteger" in types, types
        want, got = _keras_run(m, model, x)
        _assert_close(want, got, f"conv + int8 dense {lowering}")


def test_quantize_int8_through_export(tmp_path):
    """The SavedModel path (model.export + from_saved_model) gives the same bit-exact int8 model."""
    rng = np.random.default_rng(SEED + 13)
    m = _dense()
    m.quantize("int8")
    m.export(str(tmp_path / "int8"), verbose=False)
    x = _finite_inputs(m, rng)
    for lowering in LOWERINGS:
        model = converters.from_saved_model(str(tmp_path / "int8"), lowering=lowering)
        want, got = _keras_run(m, model, x)
        assert_bits_equal(want, got, f"exported int8 {lowering}")


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("build", [_dense, _einsum])
def test_quantize_float8(build, lowering):
    """float8 (opset 19): the activations' quantize-dequantize (x * 1/scale, clip to +-448, Cast to
    FLOAT8E4M3FN and back, * scale) is exact; Keras' clip bounds the Cast's input, so no overflow guard is
    written; the kernel's quantize-dequantize is folded by grappler; the graph ends in a float MatMul: float
    tolerance. NaN and infinities go through the clip and the Cast as in TF."""
    rng = np.random.default_rng(SEED + 14)
    m = build()
    m.quantize("float8")
    model = converters.from_keras(m, lowering=lowering, opset=19)
    casts = [n for n in model.graph.node if n.op_type == "Cast"]
    to_float8 = [n for n in casts if any(a.name == "to" and a.i == onnx_types.FLOAT8E4M3FN for a in n.attribute)]
    assert to_float8 and all(any(a.name == "saturate" and a.i == 0 for a in n.attribute) for n in to_float8)
    assert "Where" not in _types(model), "Keras' clip should make the overflow guard unnecessary"
    x = _finite_inputs(m, rng)
    x.reshape(x.shape[0], -1)[6, :4] = [np.nan, np.inf, -np.inf, -500.0]
    want, got = _keras_run(m, model, x)
    _assert_close(want, got, f"{build.__name__} float8 {lowering}")


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_float8_quantize_and_dequantize_bit_exact(lowering):
    """Keras 3's float8 quantize-dequantize alone, on every float16 value and the specials: bit for bit."""
    from keras.src import quantizers

    spec = tf.TensorSpec([None], tf.float32)
    fn = tf.function(lambda v: quantizers.quantize_and_dequantize(v, tf.constant(0.75), "float8_e4m3fn", "float32"),
                     input_signature=[spec])
    model = converters.from_function(fn, [spec], lowering=lowering, opset=19)
    v = np.concatenate([_all_float16(), _specials()])
    (got,) = _run(model, {model.graph.input[0].name: v})
    assert_bits_equal(np.asarray(fn(v)), got, f"float8 qdq {lowering}")


# ---------------------------------------------------------------- float8 casts: ONNX Runtime against tf.cast

FLOAT8 = {"float8_e4m3fn": (tf_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fn, onnx_types.FLOAT8E4M3FN),
          "float8_e5m2": (tf_dtypes.float8_e5m2, ml_dtypes.float8_e5m2, onnx_types.FLOAT8E5M2)}


def _all_float16():
    return np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float32)


def _specials():
    bits = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7FC00001, 0xFFFFFFFF,
            0x7F800001, 0xFF800001, 0x7F7FFFFF, 0xFF7FFFFF, 0x00800000, 0x80800000, 0x00000001, 0x80000001,
            0x007FFFFF, 0x807FFFFF]
    return np.array(bits, np.uint32).view(np.float32)


def _grid_and_ties(np_type):
    """Every finite value of the format, every midpoint between neighbours (the ties), the midpoint past the
    largest value (where overflow starts) and the float32 neighbours of all of them."""
    values = np.arange(256, dtype=np.uint8).view(np_type).astype(np.float32)
    grid = np.unique(values[np.isfinite(values)])
    top = grid[-1] + (grid[-1] - grid[-2])  # the next step past the largest finite value
    mids = np.concatenate([(grid[:-1] + grid[1:]) / 2, [(grid[-1] + top) / 2, top]]).astype(np.float32)
    points = np.concatenate([grid, mids])
    return np.concatenate([points, np.nextafter(points, np.float32(np.inf)), np.nextafter(points, np.float32(-np.inf))])


def _dense_sweep():
    """Every float32 within 2^14 ulps of each boundary of the two formats' overflow (448, 464, 480, 496 for
    e4m3fn; 57344, 61440, 65536 for e5m2)."""
    centres = np.array([448, 464, 480, 496, 512, 57344, 61440, 65536], np.float32).view(np.int32)
    return (centres[:, None] + np.arange(-2**14, 2**14, dtype=np.int32)[None, :]).reshape(-1).view(np.float32)


def _float32_probe(rng):
    """Every float32 class: all float16 values, the specials (signed zeros, infinities, NaNs with payloads and
    signaling ones, subnormals, the largest finite), each format's grid and ties, a dense sweep around the
    overflow boundaries and random bit patterns; each with both signs."""
    random_bits = rng.integers(0, 2**32, size=2**18, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([_all_float16(), _specials(), _dense_sweep(), random_bits]
                       + [_grid_and_ties(f[1]) for f in FLOAT8.values()])
    return np.concatenate([x, -x])


def _cast_graph(bound=None):
    """A GraphDef: float32 v and float16 h, each cast to both float8 formats and back (optionally clipped to
    +-bound first). Built as a GraphDef for convert_frozen_graph: TF's grappler cannot export a float8_e5m2
    tensor ("Converting f8E5M2 to DataType"), so the function frontends cannot freeze one."""
    g = tf.Graph()
    with g.as_default():
        v = tf.compat.v1.placeholder(tf.float32, [None], name="v")
        h = tf.compat.v1.placeholder(tf.float16, [None], name="h")
        outs = []
        for name, (tf_type, _, _) in FLOAT8.items():
            for src, wide in ((v, tf.float32), (h, tf.float16)):
                x = src if bound is None else tf.clip_by_value(src, -bound, bound)
                outs.append(tf.identity(tf.cast(tf.cast(x, tf_type), wide), name=f"{name}_{wide.name}"))
    return g, [o.name for o in outs]


def _tf_session_run(g, names, feeds):
    with tf.compat.v1.Session(graph=g) as s:
        return s.run(names, feeds)


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_float8_casts_match_tf_bit_for_bit(lowering):
    """The converter's float8 Casts (guard + Cast saturate=0, and the widening Cast back) against tf.cast,
    float32 and float16 sources, every value of the probe, NaN payloads included."""
    rng = np.random.default_rng(SEED + 20)
    v, h = _float32_probe(rng), np.arange(2**16, dtype=np.uint16).view(np.float16)
    g, names = _cast_graph()
    feeds = {"v:0": v, "h:0": h}
    want = _tf_session_run(g, names, feeds)
    model = converters.convert_frozen_graph(g.as_graph_def(), ["v:0", "h:0"], names, lowering=lowering, opset=19)
    got = run_onnx(model, feeds)
    for name, w in zip(names, want):
        assert_bits_equal(w, got[name], f"{name} {lowering}")


def _onnx_cast_model(to, saturate):
    nodes = [onnx_helper.make_node("Cast", ["v"], ["y"], to=to, saturate=saturate),
             onnx_helper.make_node("Cast", ["y"], ["z"], to=onnx_types.FLOAT)]
    graph = onnx_helper.make_graph(nodes, "cast", [onnx_helper.make_tensor_value_info("v", onnx_types.FLOAT, [None])],
                                   [onnx_helper.make_tensor_value_info("z", onnx_types.FLOAT, [None])])
    return onnx_helper.make_model(graph, opset_imports=[onnx_helper.make_opsetid("", 19)], ir_version=9)


def test_ort_cast_alone_differs_from_tf():
    """Why the guard: ONNX Runtime's Cast without it differs from tf.cast in either saturate mode, and where
    the module docstring of converters.float8 says (so the agreement above is not vacuous)."""
    rng = np.random.default_rng(SEED + 21)
    v = _float32_probe(rng)
    expected_region = {"float8_e4m3fn": (480, 496), "float8_e5m2": (61440, 65536)}
    for name, (tf_type, _, onnx_type) in FLOAT8.items():
        want = tf.cast(tf.cast(v, tf_type), tf.float32).numpy()
        for saturate in (0, 1):
            (got,) = run_onnx(_onnx_cast_model(onnx_type, saturate), {"v": v}).values()
            assert bits_mismatch(want, got) is not None, f"{name} saturate={saturate} agrees with TF"
            if saturate == 0:
                differ = want.view(np.uint32) != got.view(np.uint32)
                lo, hi = expected_region[name]
                assert np.all((np.abs(v[differ]) >= lo) & (np.abs(v[differ]) < hi)), (name, v[differ][:5])


def test_float8_guard_is_left_out_only_where_a_clip_bounds_the_input(monkeypatch):
    """Keras' clip to +-448 makes the guard unnecessary (test_quantize_float8); a clip to +-490 does not:
    480 <= |x| <= 490 would cast to +-448 instead of TF's NaN. The guard is written, the bits are TF's, and
    the same graph without the guard (the wrong variant) differs from TF."""
    rng = np.random.default_rng(SEED + 22)
    v = _float32_probe(rng)
    h = np.arange(2**16, dtype=np.uint16).view(np.float16)
    g, names = _cast_graph(bound=490.0)
    feeds = {"v:0": v, "h:0": h}
    want = _tf_session_run(g, names, feeds)
    model = converters.convert_frozen_graph(g.as_graph_def(), ["v:0", "h:0"], names, opset=19)
    assert _types(model).count("Where") == 2, _types(model)  # e4m3fn from float32 and from float16; e5m2 needs none
    got = run_onnx(model, feeds)
    for name, w in zip(names, want):
        assert_bits_equal(w, got[name], f"clip 490 {name}")
    monkeypatch.setattr(float8, "needs_guard", lambda *args: False)
    model = converters.convert_frozen_graph(g.as_graph_def(), ["v:0", "h:0"], names, opset=19)
    got = run_onnx(model, feeds)
    assert bits_mismatch(want[0], got[names[0]]) is not None, "the unguarded cast should differ from TF"


def _graph_def(build):
    g = tf.Graph()
    with g.as_default():
        out = build()
    return g.as_graph_def(), out.name


@pytest.mark.parametrize("opset", [17, 18, 20])
def test_float8_needs_opset_19(opset):
    def build():
        v = tf.compat.v1.placeholder(tf.float32, [None], name="v")
        return tf.identity(tf.cast(tf.cast(v, tf_dtypes.float8_e4m3fn, name="to_f8"), tf.float32))

    gd, out = _graph_def(build)
    with pytest.raises(ConversionError, match=r"Cast \(node 'to_f8'\): float8_e4m3fn tensors need ONNX opset 19.*opset=19"):
        converters.convert_frozen_graph(gd, ["v:0"], [out], opset=opset)


def test_keras_float8_model_at_default_opset_names_the_layer():
    m = _dense()
    m.quantize("float8")
    with pytest.raises(ConversionError, match=r"node '[^']*dense[^']*'.*float8_e4m3fn.*opset=19"):
        converters.from_keras(m)


@pytest.mark.parametrize("dtype", ["float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz"])
def test_other_float8_formats_are_conversion_errors(dtype):
    """No bare KeyError from tf2onnx's dtype map for any float8 dtype: the formats not converted are named."""
    def build():
        v = tf.compat.v1.placeholder(tf.float32, [None], name="v")
        return tf.identity(tf.cast(tf.cast(v, getattr(tf_dtypes, dtype), name="to_f8"), tf.float32))

    gd, out = _graph_def(build)
    for opset in (17, 19):
        with pytest.raises(ConversionError, match=rf"Cast \(node 'to_f8'\): {dtype} is not converted"):
            converters.convert_frozen_graph(gd, ["v:0"], [out], opset=opset)


@pytest.mark.parametrize("case", ["cast_to_int", "cast_from_bfloat16", "reshape", "input"])
def test_unchecked_float8_uses_are_conversion_errors(case):
    def build():
        if case == "input":
            f8 = tf.compat.v1.placeholder(tf_dtypes.float8_e5m2, [None], name="bad")
            return tf.identity(tf.cast(f8, tf.float32))
        v = tf.compat.v1.placeholder(tf.float32, [None], name="v")
        if case == "cast_from_bfloat16":
            return tf.identity(tf.cast(tf.cast(tf.cast(v, tf.bfloat16), tf_dtypes.float8_e4m3fn, name="bad"), tf.float32))
        f8 = tf.cast(v, tf_dtypes.float8_e4m3fn)
        if case == "cast_to_int":
            return tf.identity(tf.cast(f8, tf.int32, name="bad"))
        return tf.identity(tf.cast(tf.reshape(f8, [-1, 1], name="bad"), tf.float32))

    gd, out = _graph_def(build)
    inputs = ["bad:0"] if case == "input" else ["v:0"]
    with pytest.raises(ConversionError, match=r"\(node 'bad'\)"):
        converters.convert_frozen_graph(gd, inputs, [out], opset=19)
