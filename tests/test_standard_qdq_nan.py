"""QuantizeAndDequantize{V2,V3,V4} with a range taken from the data, through the standard lowering, on inputs
full of NaNs of both signs and signed zeros: bit for bit against live TensorFlow and the NumPy reference.

TF's range follows Eigen's reduction order (ort_ops/reference/_qdq_eigen_order.py): per tensor a NaN
last in the scalar tail (the last n % W elements, W = 8 float32 / 4 float64) is the range and NaNs in
the tail hide the tail's earlier elements, while NaNs in whole packets are skipped; per axis the range is
the channel's last element in (post, pre) order when that is a NaN, else the extremes after the channel's
last NaN. A NaN range makes every output of its range NaN: the step's NaN, or per axis with HALF_UP the
input's own NaN where Eigen's tiled executor takes the packet path. The directed cases below hit each
rule; the random ones (most elements NaN, +-0 or +-inf) and the long ones (rows past Eigen's tile,
depth-1 rows that merge) mix them.
"""
from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tensorflow as tf
from onnx import helper

import converters
import ort_ops
from backends import cpu_session
from comparison import assert_bits_equal
from test_standard_lowering import Runner, convert

pytestmark = pytest.mark.tensorflow

NAN = np.nan
CONFIGS = []
for _axis in (-1, 0, 1, 2):
    CONFIGS += [
        ("QuantizeAndDequantizeV4", dict(axis=_axis, num_bits=8, signed_input=True, round_mode="HALF_TO_EVEN")),
        ("QuantizeAndDequantizeV4", dict(axis=_axis, num_bits=2, signed_input=False, round_mode="HALF_UP")),
        ("QuantizeAndDequantizeV4", dict(axis=_axis, num_bits=3, signed_input=True, narrow_range=True, round_mode="HALF_UP")),
        ("QuantizeAndDequantizeV2", dict(axis=_axis, num_bits=3, signed_input=True, narrow_range=True)),
        ("QuantizeAndDequantizeV3", dict(axis=_axis, num_bits=8, signed_input=False, range_given=False)),
    ]


def _graph(x):
    outs = []
    for op, attrs in CONFIGS:
        attrs = dict(attrs)
        axis = attrs["axis"]
        zeros = tf.zeros([] if axis == -1 else [tf.shape(x)[axis]], x.dtype)  # unused: the range is the data's
        if op.endswith("V3"):
            bits = attrs.pop("num_bits")
            outs.append(tf.raw_ops.QuantizeAndDequantizeV3(input=x, input_min=zeros, input_max=zeros, num_bits=bits, **attrs))
        else:
            outs.append(getattr(tf.raw_ops, op)(input=x, input_min=zeros, input_max=zeros, **attrs))
    return outs


def _reference(x):
    outs = []
    for op, attrs in CONFIGS:
        attrs = dict(attrs)
        inputs = [x, x.dtype.type(0), x.dtype.type(0)]
        if op.endswith("V3"):
            inputs.append(np.int32(attrs.pop("num_bits")))
        outs.append(ort_ops.get_spec(op).run_reference(inputs, attrs)[0])
    return outs


def _directed(dtype):
    """Each rule once, as [pre, depth, post] arrays."""
    w = 8 if dtype == np.float32 else 4
    cases = []
    # per tensor: a NaN last in the tail is the range (-NaN: every output -NaN)
    v = np.arange(2 * w + 3, dtype=np.float64) - 5
    v[-1] = -NAN
    cases.append(v)
    # a NaN in the tail hides the tail's earlier elements (-100 is not the min): the range is [+0, 2W - 1]
    v = np.arange(2 * w + 5, dtype=np.float64)
    v[2 * w:] = [-100.0, NAN, -0.0, 3.0, 0.0]
    cases.append(v)
    # NaNs in whole packets only: skipped; the tail's -0 then decides a zero min
    v = np.full(3 * w + 1, NAN)
    v[1::3] = 5.0
    v[2::3] = -NAN
    v[-1] = -0.0
    cases.append(v)
    # whole packets, NaN last: no tail, so the NaN is skipped
    v = np.linspace(-3, 4, 4 * w)
    v[-1] = -NAN
    cases.append(v)
    # all NaN, length a multiple of W: an empty range (+inf, -inf)
    cases.append(np.full(2 * w, -NAN))
    out = [np.asarray(c, dtype).reshape(1, 1, -1) for c in cases]
    # per axis: channel 0's last element in (post, pre) order is x[1, 0, 2] (-NaN); channel 1 has a NaN
    # after its minimum; channel 2's zeros of both signs after its NaN
    x = np.array([[[1.0, -7.0, 2.0], [-9.0, NAN, 4.0], [-0.0, NAN, 3.0]],
                  [[0.5, 2.0, -NAN], [1.0, NAN, 2.5], [0.0, -0.0, 6.0]]])
    out.append(x.astype(dtype))
    return out


def _random(rng, dtype, shape):
    pool = np.array([NAN, -NAN, 0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, 0.5, 2.0, -3.5, 1e-40], dtype)
    if rng.random() < 0.6:
        return rng.choice(pool, shape).astype(dtype)
    return np.where(rng.random(shape) < 0.25, rng.choice(pool, shape), rng.normal(size=shape) * 3).astype(dtype)


SHAPES = [(1, 1, 1), (1, 1, 7), (1, 1, 13), (1, 1, 37), (3, 13, 1), (2, 2, 5), (4, 1, 9), (5, 3, 2), (1, 2, 17),
          (300, 3, 1), (2, 3, 4), (1, 1, 33), (0, 3, 2), (2, 0, 3)]
# past Eigen's tile (11428 float32 / 5714 float64 coefficients) and depth-1 rows that merge
LONG_SHAPES = [(1, 2, 11500), (2, 1, 6000), (3000, 1, 5), (6000, 2, 1)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_data_range_nan_bits_match_tf_and_reference(dtype):
    run = Runner(_graph, [tf.TensorSpec([None, None, None], tf.as_dtype(dtype))])
    rng = np.random.default_rng(2121 if dtype == np.float32 else 2122)
    inputs = _directed(dtype)
    inputs += [_random(rng, dtype, SHAPES[i % len(SHAPES)]) for i in range(3 * len(SHAPES))]
    inputs += [_random(rng, dtype, s) for s in LONG_SHAPES]
    all_nan_outputs = signed_nan_outputs = 0
    for k, x in enumerate(inputs):
        got, tf_out = run.both(x)
        for (op, attrs), a, t, r in zip(CONFIGS, got, tf_out, _reference(x)):
            what = f"input {k} {x.shape} {op} {attrs}"
            assert_bits_equal(t, r, what + " (reference vs TF)")
            assert_bits_equal(t, a, what)
            if t.size and np.isnan(t).all():
                all_nan_outputs += 1
                signed_nan_outputs += int(np.signbit(t).any())
    # the inputs discriminate: NaN ranges, of either sign, occur
    assert all_nan_outputs > 20 and signed_nan_outputs > 10, (all_nan_outputs, signed_nan_outputs)


@pytest.mark.parametrize("dtype, shape", [(np.float32, (4, 3, 13)), (np.float64, (4, 3, 13)), (np.float32, (6, 3, 1))])
def test_data_range_nan_bits_through_the_pipeline_with_static_shapes(dtype, shape):
    """The real pipeline (tf2onnx's optimizers included) on a static shape, where the per-axis range
    gathers straight from the input (no stand-in for an empty one) and trailing dims of 1 take the
    [pre, D] view."""
    fn = tf.function(_graph, input_signature=[tf.TensorSpec(shape, tf.as_dtype(dtype))])
    model = converters.from_function(fn, list(fn.input_signature), lowering="standard")
    session = cpu_session(model)
    rng = np.random.default_rng(2123)
    for k in range(12):
        x = _random(rng, dtype, shape)
        got = session.run(None, {session.get_inputs()[0].name: x})
        for (op, attrs), a, t in zip(CONFIGS, got, fn(x)):
            assert_bits_equal(np.asarray(t), a, f"input {k} {op} {attrs}")


def test_directed_cases_show_each_rule():
    """The directed inputs do what their comments say, in TF itself (float32, HALF_TO_EVEN, 8 bits)."""
    x = _directed(np.float32)

    def tf_range(v, axis=-1):
        depth = 1 if axis == -1 else v.shape[axis]
        z = np.zeros([] if axis == -1 else [depth], np.float32)
        return tf.raw_ops.QuantizeAndDequantizeV4(input=v, input_min=z, input_max=z, axis=axis).numpy()

    assert np.isnan(tf_range(x[0])).all() and np.signbit(tf_range(x[0])).all()
    # the range [+0, 15] gives the step 15/127 (with -100 in it, the step would be 100/128)
    step = np.float32(15) / np.float32(127)
    assert tf_range(x[1]).reshape(-1)[1] == np.float32(8) * step
    assert not np.isnan(tf_range(x[3])).all()
    per_axis = tf_range(x[5], axis=1)
    assert np.isnan(per_axis[:, 0]).all() and np.signbit(per_axis[:, 0]).all()
    assert not np.isnan(per_axis[:, 1:]).all()


def _per_element_nodes(fn, shape):
    """Nodes of the converted ``fn`` whose output has as many elements as its input (ONNX Runtime runs the
    model with every intermediate as an output)."""
    model = convert(fn, [tf.TensorSpec([None] + list(shape[1:]), tf.float32)])
    nodes = [n for n in model.graph.node if n.op_type != "Constant"]
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    del model.graph.output[:]
    names = [o for n in nodes for o in n.output]
    model.graph.output.extend(helper.make_tensor_value_info(o, types.get(o, onnx.TensorProto.FLOAT), None) for o in names)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = cpu_session(model, options)
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    values = session.run(None, {session.get_inputs()[0].name: x})
    producers = [n for n in nodes for _ in n.output]
    return len(nodes), collections.Counter(n.op_type for n, v in zip(producers, values) if np.asarray(v).size >= x.size)


@pytest.mark.parametrize("axis, round_mode, limit", [(-1, "HALF_TO_EVEN", 17), (3, "HALF_TO_EVEN", 21), (3, "HALF_UP", 25)])
def test_data_range_per_element_cost(axis, round_mode, limit):
    """Data without NaNs pays little for the NaN rules. Per element: the flush (4), the operands of the
    range's reductions (per tensor: pad, IsNaN, two masks, Equal, uint8 Cast; per axis: IsNaN, Equal,
    two uint8 Casts and their ArgMax guards for an empty axis, Greater, two masks, and a gather stand-in
    for an empty input), the quantization (3 or 4), the NaN-range Where (per axis HALF_UP: also IsNaN,
    And and Where for the input's NaN) and the free Reshapes. The lowering before the NaN rules took 48
    per tensor and 36 per axis (37 with HALF_UP)."""

    def fn(x):
        z = tf.zeros([] if axis == -1 else [32], tf.float32)
        return tf.raw_ops.QuantizeAndDequantizeV4(input=x, input_min=z, input_max=z, axis=axis, round_mode=round_mode)

    total, per_element = _per_element_nodes(fn, (2, 16, 16, 32))
    assert sum(per_element.values()) <= limit, (total, per_element)
