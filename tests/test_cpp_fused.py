"""FusedBatchNormClipFakeQuant (ort_ops/specs/fused.py): TF's chain, the NumPy kernel, the C++ kernel, and the
unfused nodes it replaces in a converted model.

Tolerance: none. The goldens are TensorFlow's FusedBatchNormV3 -> Relu6/Maximum/Minimum -> FakeQuant outputs
(tools/goldens/gen_fused.py, channel counts where TF's batch norm is the correctly rounded one), and both
kernels must give them bit for bit, NaN payloads included. The fused node must also give the bits of the
nodes it replaces (FusedBatchNormV3, Clip or Relu, FakeQuant in ONNX Runtime with this library): that is the
promise the converter's fusion rests on (converters/fusions.py).
"""
import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

import ort_ops
from backends import library_session, run, run_ort
from comparison import assert_bits_equal, check_error
from ort_ops.conformance.goldens import load_cases

OP = "FusedBatchNormClipFakeQuant"
F32 = np.float32
CASES = load_cases(OP)


# The golden cases run through the conformance kit (tests/test_conformance.py): every output bit for bit (the
# summed ones to their sum bound), TF's rejections with TF's words (ort_ops/conformance/rules.py).


@pytest.mark.parametrize("backend", ["numpy", "ort"])
@pytest.mark.parametrize("clip", [(6.0, 0.0), (math.nan, 6.0), (0.0, math.nan)])
def test_clip_bounds_out_of_order_or_nan_are_rejected(backend, clip):
    case = next(c for c in CASES if "error" not in c)
    attrs = dict(case["attrs"], clip_min=clip[0], clip_max=clip[1])
    check_error(OP, backend, case["inputs"], attrs, "clip_min must be <= clip_max")


# ------------------------------------------------------------------ the fused node against the nodes it replaces

DOMAIN = ort_ops.DOMAIN


def _chain_model(shape, fmt, clip, quantizer, num_bits, narrow, fused):
    """x -> [FusedBatchNormClipFakeQuant] or [FusedBatchNormV3 -> Clip/Relu -> FakeQuant], statistics as inputs."""
    c = shape[1] if fmt.startswith("NC") else shape[-1]
    vec = lambda n: helper.make_tensor_value_info(n, TP.FLOAT, [c])  # noqa: E731
    scalar = lambda n: helper.make_tensor_value_info(n, TP.FLOAT, [])  # noqa: E731
    inputs = [helper.make_tensor_value_info("x", TP.FLOAT, list(shape))] + [vec(n) for n in ("s", "o", "m", "v")]
    inputs += [scalar("lo"), scalar("hi")]
    bits = {"num_bits": num_bits, "narrow_range": narrow}
    if fused:
        nodes = [helper.make_node(OP, ["x", "s", "o", "m", "v", "lo", "hi"], ["y"], domain=DOMAIN, epsilon=1e-3,
                                  data_format=fmt, clip_min=clip[0], clip_max=clip[1], fake_quant=quantizer, **bits)]
        inits = []
    else:
        nodes = [helper.make_node("FusedBatchNormV3", ["x", "s", "o", "m", "v"], ["b"] + [f"b{i}" for i in range(5)],
                                  domain=DOMAIN, epsilon=1e-3, data_format=fmt, is_training=0)]
        inits = []
        if clip == (0.0, math.inf):
            nodes.append(helper.make_node("Relu", ["b"], ["c"]))
        else:
            inits = [helper.make_tensor("cmin", TP.FLOAT, [], [clip[0]]), helper.make_tensor("cmax", TP.FLOAT, [], [clip[1]])]
            nodes.append(helper.make_node("Clip", ["b", "cmin", "cmax"], ["c"]))
        if quantizer == "FakeQuantWithMinMaxVars":
            nodes.append(helper.make_node(quantizer, ["c", "lo", "hi"], ["y"], domain=DOMAIN, **bits))
        else:  # the Args node's range is an attribute: the test feeds the same values
            nodes.append(helper.make_node(quantizer, ["c"], ["y"], domain=DOMAIN, min=-0.7, max=5.3, **bits))
    graph = helper.make_graph(nodes, "chain", inputs, [helper.make_tensor_value_info("y", TP.FLOAT, list(shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    return ort_ops.model.set_lowest_ir_version(model)


def _probe_x(rng, shape):
    tiny = np.finfo(F32).tiny
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, tiny / 3, -tiny / 3, tiny, 1e30, -1e30], F32)
    x = (rng.standard_normal(shape) * 4).astype(F32)
    flat = x.reshape(-1)
    flat[rng.choice(flat.size, 64, replace=False)] = np.resize(special, 64)
    return x


@pytest.mark.parametrize("fmt,shape", [("NCHW", (2, 19, 7, 9)), ("NHWC", (2, 7, 9, 19)), ("NHWC", (1, 3, 5, 64)),
                                       ("NCHW", (2, 72, 5, 3))])
@pytest.mark.parametrize("clip", [(0.0, 6.0), (0.0, math.inf), (-1.0, 2.0), (-math.inf, math.inf)])
@pytest.mark.parametrize("quantizer", ["FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxArgs"])
def test_fused_node_gives_the_bits_of_the_nodes_it_replaces(fmt, shape, clip, quantizer):
    rng = np.random.default_rng(abs(hash((fmt, shape, clip, quantizer))) % 2**32)
    c = shape[1] if fmt.startswith("NC") else shape[-1]
    stats = [rng.standard_normal(c).astype(F32) * 2, rng.standard_normal(c).astype(F32),
             rng.standard_normal(c).astype(F32), rng.random(c).astype(F32)]
    feeds = dict(zip(["x", "s", "o", "m", "v", "lo", "hi"],
                     [_probe_x(rng, shape)] + stats + [np.array(-0.7, F32), np.array(5.3, F32)]))
    outs = {}
    for fused in (False, True):
        model = _chain_model(shape, fmt, clip, quantizer, 8, 0, fused)
        sess = library_session(model, threads=2)
        feed = {i.name: feeds[i.name] for i in sess.get_inputs()}
        outs[fused] = sess.run(None, feed)[0]
    assert_bits_equal(outs[False], outs[True], f"{quantizer} {fmt} {shape} clip {clip}")
    if clip != (-math.inf, math.inf):  # the data reaches the clip: a kernel that skipped it would fail above
        unclipped = run_ort(OP, list(feeds.values()), {"epsilon": 1e-3, "data_format": fmt, "fake_quant": quantizer})[0]
        assert not np.array_equal(unclipped.view(np.uint32), outs[True].view(np.uint32))


def test_a_dropped_epsilon_or_a_flipped_offset_changes_the_result():
    """The goldens would catch a kernel that drops epsilon or negates the offset: it changes many values."""
    case = next(c for c in CASES if "error" not in c and c["inputs"][0].size > 50)
    x, s, o, m, v, lo, hi = case["inputs"]
    want = case["outputs"][0]
    for inputs, attrs in (([x, s, o, m, v, lo, hi], dict(case["attrs"], epsilon=0.0)),
                          ([x, s, -o, m, v, lo, hi], case["attrs"])):
        (got,) = run_ort(OP, inputs, attrs)
        assert np.sum(got.view(np.uint32) != want.view(np.uint32)) > 0


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_thread_count_does_not_change_the_bits(threads):
    rng = np.random.default_rng(7)
    x = _probe_x(rng, (3, 40, 33, 17))
    c = 40
    stats = [rng.standard_normal(c).astype(F32) for _ in range(3)] + [rng.random(c).astype(F32)]
    inputs = [x] + stats + [np.array(-1.0, F32), np.array(6.0, F32)]
    attrs = {"data_format": "NCHW", "clip_min": 0.0, "clip_max": 6.0}
    expected = run("numpy", OP, inputs, attrs)[0]
    assert_bits_equal(expected, run_ort(OP, inputs, attrs, threads=threads)[0], f"{threads} threads")


def test_schema_infers_the_output_shape():
    ort_ops.register_schemas()
    model = _chain_model((2, 5, 3, 3), "NCHW", (0.0, 6.0), "FakeQuantWithMinMaxVars", 8, 0, fused=True)
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("y", TP.FLOAT, None))
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    dims = [d.dim_value for d in inferred.graph.output[0].type.tensor_type.shape.dim]
    assert dims == [2, 5, 3, 3]
