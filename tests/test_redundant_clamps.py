"""A ReLU/ReLU6 before a fake-quantizer whose range it contains is dropped, bit-exactly (converters.redundant_clamps).

Each graph is converted in both lowerings and run on inputs that hit every case of the argument in the
module's docstring: NaN of both signs, infinities, signed zeros, subnormals, the clamp's bounds and their
neighbours, and a dense sweep across the range. The outputs must be TF's bit for bit whether the ReLU is
dropped or kept; which of the two happens is asserted too, so a rewrite that drops a ReLU it must keep (a
range reaching below 0 or above 6) fails on the values between the bounds, and one that never drops fails
the node count.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import converters
import ort_ops
from converters.redundant_clamps import clamp_is_redundant, tf_relu
from converters.verification import run_onnx

pytestmark = pytest.mark.tensorflow

F32 = np.float32
LOWERINGS = ("custom", "standard")


def probe_inputs(channels: int = 4) -> np.ndarray:
    tiny = np.finfo(F32).tiny
    special = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, tiny / 3, -tiny / 3, tiny, -tiny, 6.0, -1e-30,
               np.nextafter(F32(6), F32(7)), np.nextafter(F32(6), F32(5)), 1e30, -1e30, 6.5, 7.0, 5.9999, -0.2]
    sweep = np.linspace(-1.5, 7.5, 4000)
    x = np.concatenate([special, sweep]).astype(F32)
    x = np.concatenate([x, np.zeros((-x.size) % (4 * channels), F32)])
    return x.reshape(-1, 2, 2, channels)


def relu_count(model) -> int:
    """The nodes tf2onnx made of the TF ReLU (named after it; the standard quantizer has a Clip of its own)."""
    return sum(n.op_type in ("Clip", "Relu") and n.output[0].startswith("Relu") for n in model.graph.node)


def convert_and_compare(fn, x, lowering, *extra_inputs):
    signature = [tf.TensorSpec(x.shape, tf.float32)] + [tf.TensorSpec(e.shape, tf.float32) for e in extra_inputs]
    model = converters.from_function(tf.function(fn), signature, lowering=lowering)
    expected = fn(tf.constant(x), *(tf.constant(e) for e in extra_inputs)).numpy()
    feeds = dict(zip([i.name for i in model.graph.input], [x, *extra_inputs]))
    (got,) = run_onnx(model, feeds).values()
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
    return model


MERGED = "merged"  # kept, and in the standard lowering merged into the quantizer's Clip (converters.fusions)
CASES = {
    # name: (the graph, whether its ReLU is dropped, or MERGED)
    "relu6, vars [0, 5.5]": (lambda x: tf.quantization.fake_quant_with_min_max_vars(tf.nn.relu6(x), 0.0, 5.5), True),
    "relu6, vars [0, 6] (nudged max is 6)": (
        lambda x: tf.quantization.fake_quant_with_min_max_vars(tf.nn.relu6(x), 0.0, 6.0), True),
    "relu, args [0, 4], 4 bits, narrow": (
        lambda x: tf.quantization.fake_quant_with_min_max_args(tf.nn.relu(x), 0.0, 4.0, num_bits=4,
                                                               narrow_range=True), True),
    "relu6, per channel, every min 0": (
        lambda x: tf.quantization.fake_quant_with_min_max_vars_per_channel(
            tf.nn.relu6(x), [0.0, 0.0, 0.0, 0.0], [6.0, 5.0, 2.5, 0.7]), True),
    "relu6, vars [-1, 6]: nudged min below 0": (
        lambda x: tf.quantization.fake_quant_with_min_max_vars(tf.nn.relu6(x), -1.0, 6.0), MERGED),
    "relu6, vars [0, 6.5]: max above 6": (
        lambda x: tf.quantization.fake_quant_with_min_max_vars(tf.nn.relu6(x), 0.0, 6.5), MERGED),
    "relu6, vars [0.3, 5]: min inside the clamp (nudged to 0)": (
        lambda x: tf.quantization.fake_quant_with_min_max_vars(tf.nn.relu6(x), 0.3, 5.0), True),
    "relu6, vars [0.01, 5], 2 bits: min nudged to 0 on a coarse grid": (
        lambda x: tf.quantization.fake_quant_with_min_max_vars(tf.nn.relu6(x), 0.01, 5.0, num_bits=2), True),
    "relu6, vars [-0.01, 6], 8 bits: min nudged to 0": (
        lambda x: tf.quantization.fake_quant_with_min_max_vars(tf.nn.relu6(x), -0.01, 6.0), True),
    "relu6, per channel, one min below 0": (
        lambda x: tf.quantization.fake_quant_with_min_max_vars_per_channel(
            tf.nn.relu6(x), [0.0, -0.5, 0.0, 0.0], [6.0, 5.0, 2.5, 0.7]), False),
    "relu6 read by two quantizers": (
        lambda x: (lambda r: tf.quantization.fake_quant_with_min_max_vars(r, 0.0, 5.5)
                   + tf.quantization.fake_quant_with_min_max_vars(r, 0.0, 3.0))(tf.nn.relu6(x)), False),
}


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("case", list(CASES))
def test_relu_before_a_quantizer(case, lowering):
    fn, outcome = CASES[case]
    model = convert_and_compare(fn, probe_inputs(), lowering)
    if outcome == MERGED:
        outcome = lowering == "standard"  # the merged Clip carries the quantizer clamp's name
    assert relu_count(model) == (0 if outcome else 1), [n.op_type for n in model.graph.node]


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_a_range_from_the_graph_keeps_the_relu(lowering):
    def fn(x, lo, hi):
        return tf.quantization.fake_quant_with_min_max_vars(tf.nn.relu6(x), lo, hi)

    model = convert_and_compare(fn, probe_inputs(), lowering, np.array(0, F32), np.array(5.5, F32))
    assert relu_count(model) == 1


def test_the_decision_against_every_float32_near_the_bounds():
    """Where the check says the clamp is redundant, it is: every float32 within 2^16 ulps of 0 and 6, both
    signs, and a random sample of all bit patterns, quantize to the same bits with and without the clamp."""
    rng = np.random.default_rng(3)
    near = np.concatenate([np.arange(-(1 << 16), 1 << 16, dtype=np.int64) + F32(6).view(np.int32),
                           np.arange(0, 1 << 16, dtype=np.int64), np.arange(0, 1 << 16, dtype=np.int64) | (1 << 31)])
    x = np.concatenate([near.astype(np.uint32).view(F32), rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64)
                        .astype(np.uint32).view(F32)])
    spec = ort_ops.get_spec("FakeQuantWithMinMaxVars")
    decided = {True: 0, False: 0}
    for lo_q, hi_q, bits in [(0, 6, 8), (-0.01, 6, 8), (0.01, 5.99, 3), (-1, 6, 8), (0, 6.02, 8), (0.2, 5, 2),
                             (-0.3, 5.99, 8), (0, 0, 8), (1, 3, 4)]:
        ranges = [np.array(lo_q, F32), np.array(hi_q, F32)]
        attrs = {"num_bits": bits, "narrow_range": False}
        redundant = clamp_is_redundant("FakeQuantWithMinMaxVars", F32(0), F32(6), ranges, attrs)
        decided[redundant] += 1
        with np.errstate(all="ignore"):
            plain = spec.run_reference([x] + ranges, attrs)[0]
            clamped = spec.run_reference([tf_relu(x, F32(0), F32(6))] + ranges, attrs)[0]
        same = np.array_equal(plain.view(np.uint32), clamped.view(np.uint32))
        if redundant:
            assert same, (lo_q, hi_q, bits)
    assert decided[True] and decided[False], decided  # both answers were exercised


def test_merged_clip_bounds_select_what_the_pair_selects():
    """converters.fusions.merged_clip_bounds against ONNX Runtime's own Clip, bit for bit: every pair of ordered
    bounds from a set with both zeros, infinities and ties, every input among specials and the bounds' neighbours.
    A merge that picks the wrong zero on a tie, or merges disjoint ranges, fails here."""
    import onnx
    from onnx import TensorProto, helper

    from converters.fusions import merged_clip_bounds

    values = [-np.inf, -6.0, -1.0, -0.0, 0.0, 1.0, 6.0, np.inf]
    pairs = [(a, b) for a in values for b in values if a <= b]
    tiny = np.finfo(F32).tiny
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, tiny / 3, -tiny / 3, 0.5, -0.5, 3.0, -3.0, 7.0, -7.0]
                 + [v for v in values if np.isfinite(v)]
                 + [np.nextafter(F32(v), F32(s)) for v in values if np.isfinite(v) for s in (-np.inf, np.inf)], F32)
    nodes, outputs, initializers, expected_merges = [], [], [], 0
    for i, inner in enumerate(pairs):
        for j, outer in enumerate(pairs):
            merged = merged_clip_bounds(inner, outer)
            if merged is None:
                assert max(inner[0], outer[0]) > min(inner[1], outer[1])  # only disjoint ranges stay unmerged
                continue
            expected_merges += 1
            tag = f"{i}_{j}"
            for name, v in (("a", inner[0]), ("b", inner[1]), ("c", outer[0]), ("d", outer[1]),
                            ("lo", merged[0]), ("hi", merged[1])):
                initializers.append(helper.make_tensor(f"{name}{tag}", TensorProto.FLOAT, [], [v]))
            nodes += [helper.make_node("Clip", ["x", f"a{tag}", f"b{tag}"], [f"in{tag}"]),
                      helper.make_node("Clip", [f"in{tag}", f"c{tag}", f"d{tag}"], [f"pair{tag}"]),
                      helper.make_node("Clip", ["x", f"lo{tag}", f"hi{tag}"], [f"one{tag}"])]
            outputs += [f"pair{tag}", f"one{tag}"]
    graph = helper.make_graph(nodes, "clips", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [x.size])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, [x.size]) for o in outputs],
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    got = run_onnx(model, {"x": x})
    assert expected_merges > len(pairs)
    for k in range(0, len(outputs), 2):
        pair, one = got[outputs[k]], got[outputs[k + 1]]
        np.testing.assert_array_equal(pair.view(np.uint32), one.view(np.uint32), err_msg=outputs[k])


@pytest.mark.parametrize("low, high", [(-1.0, 6.0), (0.0, 6.5), (-0.7, 9.0)])
def test_a_kept_relu6_merges_into_the_standard_quantizer_clamp(low, high):
    """Where the ReLU6 must stay (the range reaches past [0, 6]), the standard lowering's quantizer clamp takes
    its bounds instead of a second pass: one Clip in the graph, TF's bits on every probe."""
    fn = lambda x: tf.quantization.fake_quant_with_min_max_vars(tf.nn.relu6(x), low, high)  # noqa: E731
    model = convert_and_compare(fn, probe_inputs(), "standard")
    assert [n.op_type for n in model.graph.node].count("Clip") == 1, [n.op_type for n in model.graph.node]
