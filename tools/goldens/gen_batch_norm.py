"""Golden cases for FusedBatchNorm{,V2,V3} and FusedBatchNormGrad{,V2,V3}, computed by TensorFlow.

Re-run with ``PYTHONPATH=. python tools/goldens/gen_batch_norm.py`` (writes ort_ops/conformance/goldens/FusedBatchNorm*.npz).
TensorFlow runs its Eigen kernels (TF_ENABLE_ONEDNN_OPTS=0 is pinned here, whatever the CPU; the suite compares
with oneDNN live, in tests/test_batch_norm_live.py).

Grid: every version, NHWC/NCHW (and NDHWC/NCDHW for V3), training with exponential_avg_factor 1 and 0.25,
inference, every x dtype the CPU kernels take, channel counts 1, 3, 8, 17 (below, at and above one
8-float packet, which changes TF's reduction order), row counts below and above 16 (the other switch of
that order), R == 1, an empty batch, negative variance, and every class of input TF rejects (with its message).

Outputs TF leaves undefined are not compared: they are stored as ``UNCHECKED`` (an empty bool array, a dtype no
output of these ops has), and the note says why. Those are reserve_space_1/2 of the forward ops in inference
mode and for an empty x (TF's Eigen kernel never writes them: uninitialized memory).
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from ort_ops.conformance.goldens import save_cases  # noqa: E402
from tools.goldens._common import check_tf_mode  # noqa: E402

import ort_ops  # noqa: E402

UNCHECKED = np.zeros((0,), np.bool_)

F32, F16, BF16 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
FORWARD = {"FusedBatchNorm": 1, "FusedBatchNormV2": 2, "FusedBatchNormV3": 3}
GRADIENT = {"FusedBatchNormGrad": 1, "FusedBatchNormGradV2": 2, "FusedBatchNormGradV3": 3}
CHANNELS = (1, 3, 8, 17)
# Channels-last shapes without C: rows R = 18, 4, 20 and 3 (< 16 and >= 16 both appear for every C).
SPATIAL_4D = ((2, 3, 3), (1, 2, 2), (2, 5, 2), (3, 1, 1))
SPATIAL_5D = ((1, 2, 3, 3), (2, 1, 2, 1))
EPSILON = float(np.float32(1e-4))


def tf_message(err: Exception) -> str:
    """TF's own text, without the eager wrapper's "{{function_node ...}}" prefix and "[Op:...]" suffix."""
    text = getattr(err, "message", str(err))
    text = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", text)
    return re.sub(r"\s*\[Op:[^\]]*\].*$", "", text, flags=re.S).strip()


def run_tf(op, inputs, attrs):
    spec = ort_ops.get_spec(op)
    kwargs = {p.name: tf.constant(v) for p, v in zip(spec.inputs, inputs)}
    return [o.numpy() for o in getattr(tf.raw_ops, op)(**kwargs, **attrs)]


def channels_first(shape_last):
    """NHWC-ordered dims -> NCHW-ordered dims (also NDHWC -> NCDHW)."""
    return (shape_last[0], shape_last[-1]) + tuple(shape_last[1:-1])


def x_shape(spatial, c, data_format):
    last = (spatial[0],) + tuple(spatial[1:]) + (c,)
    return channels_first(last) if data_format.startswith("NC") else last


class Builder:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def tensor(self, shape, dtype=F32, loc=0.0, scale=1.0):
        return (self.rng.standard_normal(shape) * scale + loc).astype(np.float32).astype(dtype)

    def positive(self, n, low=0.25, high=2.0):
        return self.rng.uniform(low, high, n).astype(np.float32)


def stat_dtype(op):
    return F32  # U is float32 on every CPU kernel (V1: T = float32 too)


def forward_case(b, op, dtype, spatial, c, data_format, is_training, f, note, epsilon=EPSILON, stats=None):
    x = b.tensor(x_shape(spatial, c, data_format), dtype, loc=0.5, scale=2.0)
    scale, offset = b.tensor(c, scale=0.8, loc=1.0), b.tensor(c, scale=0.5)
    mean, variance = stats if stats is not None else (b.tensor(c, scale=0.3), b.positive(c))
    attrs = {"epsilon": epsilon, "exponential_avg_factor": f, "data_format": data_format, "is_training": is_training}
    return {"attrs": attrs, "inputs": [x, scale, offset, mean, variance], "note": note}


def grad_case(b, op, dtype, spatial, c, data_format, is_training, note, rs3=None):
    shape = x_shape(spatial, c, data_format)
    dy, x = b.tensor(shape, dtype), b.tensor(shape, dtype, loc=0.3, scale=1.5)
    scale = b.tensor(c, scale=0.8, loc=1.0)
    inputs = [dy, x, scale, b.tensor(c, scale=0.3, loc=0.3), b.positive(c, 0.5, 3.0)]
    if GRADIENT[op] == 3:
        inputs.append(np.zeros((), np.float32) if rs3 is None else rs3)
    attrs = {"epsilon": EPSILON, "data_format": data_format, "is_training": is_training}
    return {"attrs": attrs, "inputs": inputs, "note": note}


def forward_cases(op):
    version = FORWARD[op]
    b = Builder(100 + version)
    dtypes = (F32,) if version == 1 else (F32, F16, BF16)
    modes = ((True, 1.0), (True, 0.25), (False, 1.0))
    cases, k = [], 0
    for dtype in dtypes:
        for c in CHANNELS:
            for is_training, f in modes:
                spatial = SPATIAL_4D[k % len(SPATIAL_4D)]
                fmt = ("NHWC", "NCHW")[k % 2]
                if version == 3 and k % 3 == 2:
                    spatial, fmt = SPATIAL_5D[k % 2], ("NDHWC", "NCDHW")[(k // 3) % 2]
                k += 1
                mode = f"training f={f}" if is_training else "inference"
                cases.append(forward_case(b, op, dtype, spatial, c, fmt, is_training, f, f"{dtype.name} {fmt} C={c} {mode}"))
    # R == 1: the batch variance is 0 and the Bessel factor 1.
    cases.append(forward_case(b, op, F32, (1, 1, 1), 3, "NHWC", True, 1.0, "R == 1"))
    cases.append(forward_case(b, op, F32, (1, 1, 1), 3, "NCHW", True, 0.5, "R == 1, f=0.5"))
    # Larger R with 17 channels: the 4-accumulator column sum plus leftover rows, and scalar channels.
    cases.append(forward_case(b, op, F32, (3, 3, 7), 17, "NHWC", True, 1.0, "R=63 C=17 training"))
    # Training with f == 1 never reads mean/variance: TF accepts any size (tf.compat.v1 passes empty ones).
    cases.append(
        forward_case(b, op, F32, (2, 2, 2), 3, "NHWC", True, 1.0, "training f=1, empty mean/variance",
                     stats=(np.zeros(0, np.float32), np.zeros(0, np.float32)))
    )
    cases.append(forward_case(b, op, F32, (2, 3, 3), 4, "NHWC", True, 1.0, "epsilon 1e-3", epsilon=float(np.float32(1e-3))))
    cases.append(
        forward_case(b, op, F32, (2, 2, 2), 3, "NHWC", False, 1.0, "inference, negative variance gives NaN",
                     stats=(np.zeros(3, np.float32), np.array([-1.0, 0.5, -0.5], np.float32)))
    )
    for is_training in (True, False):
        cases.append(forward_case(b, op, F32, (0, 2, 2), 3, "NHWC", is_training, 1.0, f"empty batch, is_training={is_training}"))
    cases.append(forward_case(b, op, F32, (2, 2, 2), 3, "NHWC", True, 0.0, "f == 0 keeps the running statistics"))
    for is_training in (True, False):
        case = forward_case(b, op, F32, (2, 2, 3), 4, "NHWC", is_training, 0.5, f"NaN/+Inf/-Inf in x, is_training={is_training}")
        case["inputs"][0][0, 0, 0, :3] = [np.nan, np.inf, -np.inf]  # channel 3 stays finite
        cases.append(case)
    if version == 3:
        cases.append(forward_case(b, op, F32, (2, 2, 3, 2), 8, "NDHWC", True, 1.0, "5-D NDHWC R=24 C=8"))
        cases.append(forward_case(b, op, F16, (2, 2, 3, 2), 5, "NCDHW", False, 1.0, "5-D NCDHW inference"))
        cases.append(forward_case(b, op, F32, (2, 3, 3), 3, "NCDHW", True, 1.0, "4-D x with NCDHW is NCHW"))
    cases += forward_error_cases(b, op)
    cases += forward_denormal_cases(op)
    return cases


def _full(shape, values, dtype=F32):
    return np.resize(np.asarray(values, np.float32), shape).astype(dtype)


def _tiny(dtype):
    """A subnormal of dtype: bfloat16 (widened bit for bit) is flushed like float32; float16 is not."""
    return {F32.name: 1e-45, F16.name: 6e-8, BF16.name: 1e-40}[dtype.name]


def forward_denormal_cases(op):
    """Issue 11: TF's kernels compute with denormals-are-zero and flush-to-zero on."""
    cases = []
    dtypes = (F32,) if FORWARD[op] == 1 else (F32, F16, BF16)
    for dtype in dtypes:
        c = 2
        attrs = {"epsilon": 0.0, "exponential_avg_factor": 1.0, "data_format": "NHWC", "is_training": False}
        # variance 1e-45 is 0: rsqrt gives inf (not 2.7e22)
        inputs = [_full((1, 1, 2, c), [1.0, -2.0], dtype), _full(c, 1.0), _full(c, 0.0), _full(c, 0.0), _full(c, 1e-45)]
        cases.append({"attrs": attrs, "inputs": inputs, "note": f"issue 11: {dtype.name} inference, epsilon 0, subnormal variance"})
        # a subnormal x times an infinite scale: NaN when x is flushed, -inf when it is not (float16)
        inputs = [_full((1, 1, 2, c), [-_tiny(dtype), 1.0], dtype), _full(c, np.inf), _full(c, 0.0), _full(c, 0.0), _full(c, 1.0)]
        cases.append({"attrs": dict(attrs, epsilon=EPSILON), "inputs": inputs, "note": f"issue 11: {dtype.name} inference, subnormal x, infinite scale"})
        # training: the squared deviations 1e-40 are flushed, so the variance is 0 and y is +-inf
        inputs = [_full((1, 1, 2, c), [1e-20, -1e-20], dtype), _full(c, 1.0), _full(c, 0.0), _full(c, 0.0), _full(c, 1.0)]
        cases.append({"attrs": dict(attrs, is_training=True), "inputs": inputs,
                      "note": f"issue 11: {dtype.name} training, epsilon 0, squared deviations below the normal range"})
    return cases


def forward_error_cases(b, op):
    x = b.tensor((2, 3, 3, 4))
    c4, c3 = b.positive(4), b.positive(3)
    base = {"epsilon": EPSILON, "exponential_avg_factor": 1.0, "data_format": "NHWC", "is_training": True}
    infer, avg = dict(base, is_training=False), dict(base, exponential_avg_factor=0.5)
    return [
        ({"attrs": base, "inputs": [x[0], c4, c4, c4, c4], "note": "x rank 3"}),
        ({"attrs": base, "inputs": [x[None, None], c4, c4, c4, c4], "note": "x rank 6"}),
        ({"attrs": base, "inputs": [x, c4[None], c4, c4, c4], "note": "scale 2-D"}),
        ({"attrs": base, "inputs": [x, c4, c4[None], c4, c4], "note": "offset 2-D"}),
        ({"attrs": base, "inputs": [x, c4, c4, c4[None], c4], "note": "mean 2-D"}),
        ({"attrs": base, "inputs": [x, c4, c4, c4, c4[None]], "note": "variance 2-D"}),
        ({"attrs": base, "inputs": [x, c3, c4, c4, c4], "note": "scale size"}),
        ({"attrs": base, "inputs": [x, c4, c3, c4, c4], "note": "offset size"}),
        ({"attrs": dict(base, data_format="NCHW"), "inputs": [x, c4, c4, c4, c4], "note": "NCHW channels are dim 1"}),
        ({"attrs": infer, "inputs": [x, c4, c4, c3, c4], "note": "inference mean size"}),
        ({"attrs": infer, "inputs": [x, c4, c4, c4, c3], "note": "inference variance size"}),
        ({"attrs": avg, "inputs": [x, c4, c4, c3, c4], "note": "f != 1 mean size"}),
        ({"attrs": avg, "inputs": [x, c4, c4, c4, c3], "note": "f != 1 variance size"}),
    ]


def grad_cases(op):
    version = GRADIENT[op]
    b = Builder(200 + version)
    dtypes = (F32,) if version == 1 else (F32, F16, BF16)
    cases, k = [], 0
    for dtype in dtypes:
        for c in CHANNELS:
            for is_training in (True, False):
                for fmt in ("NHWC", "NCHW"):
                    spatial = SPATIAL_4D[k % len(SPATIAL_4D)]
                    if version == 3 and k % 4 == 3:
                        spatial, fmt = SPATIAL_5D[k % 2], {"NHWC": "NDHWC", "NCHW": "NCDHW"}[fmt]
                    k += 1
                    mode = "training" if is_training else "inference"
                    cases.append(grad_case(b, op, dtype, spatial, c, fmt, is_training, f"{dtype.name} {fmt} C={c} {mode}"))
    for is_training in (True, False):
        cases.append(grad_case(b, op, F32, (1, 1, 1), 3, "NHWC", is_training, f"R == 1, is_training={is_training}"))
        cases.append(grad_case(b, op, F32, (0, 2, 2), 3, "NHWC", is_training, f"empty batch, is_training={is_training}"))
        cases.append(grad_case(b, op, F32, (3, 3, 7), 17, "NHWC", is_training, f"R=63 C=17, is_training={is_training}"))
        case = grad_case(b, op, F32, (2, 2, 3), 4, "NHWC", is_training, f"NaN/+Inf in dy and x, is_training={is_training}")
        case["inputs"][0][0, 0, 0, 0], case["inputs"][1][0, 0, 0, 1:3] = np.nan, [np.inf, -np.inf]
        cases.append(case)
    if version == 3:
        cases.append(grad_case(b, op, F32, (2, 3, 3), 4, "NHWC", True, "reserve_space_3 of any shape is ignored",
                               rs3=b.tensor((2, 5))))
    cases += grad_error_cases(b, op)
    cases += grad_denormal_cases(op)
    return cases


def grad_denormal_cases(op):
    """Issue 11: denormals-are-zero on dy and the saved variance; a one-row offset_backprop is a copy."""
    cases = []
    dtypes = (F32,) if GRADIENT[op] == 1 else (F32, F16, BF16)
    for dtype in dtypes:
        for rows in (1, 2):
            for is_training in (False, True):
                shape = (rows, 1, 1, 2)
                inputs = [_full(shape, [_tiny(dtype), -1.0], dtype), _full(shape, [1.0, 3.0, -1.0, 2.0], dtype),
                          _full(2, 1.0), _full(2, 0.0), _full(2, [1e-45, 1.0])]
                if GRADIENT[op] == 3:
                    inputs.append(np.zeros((), np.float32))
                # epsilon as elsewhere (0 would hide in tests that drop it); the subnormal variance then
                # does not show, the subnormal dy does (and in offset_backprop for R == 1, unflushed)
                attrs = {"epsilon": EPSILON, "data_format": "NHWC", "is_training": is_training}
                note = f"issue 11: {dtype.name} subnormal dy and saved variance, R={rows}, is_training={is_training}"
                cases.append({"attrs": attrs, "inputs": inputs, "note": note})
    # epsilon 0 once (float32): the saved variance 1e-45 is 0, so rsqrt gives inf and dx is +-inf, not 2.7e22 * dy
    inputs = [_full((2, 1, 1, 2), [1.0, -1.0, -2.0, 0.5]), _full((2, 1, 1, 2), [1.0, 3.0, -1.0, 2.0]),
              _full(2, 1.0), _full(2, 0.0), _full(2, [1e-45, 1.0])]
    if GRADIENT[op] == 3:
        inputs.append(np.zeros((), np.float32))
    attrs = {"epsilon": 0.0, "data_format": "NHWC", "is_training": False}
    cases.append({"attrs": attrs, "inputs": inputs, "note": "issue 11: float32 inference, epsilon 0, subnormal saved variance"})
    return cases


def grad_error_cases(b, op):
    x = b.tensor((2, 3, 3, 4))
    c4, c3 = b.positive(4), b.positive(3)
    tail = [np.zeros((), np.float32)] if GRADIENT[op] == 3 else []
    base = {"epsilon": EPSILON, "data_format": "NHWC", "is_training": True}

    def case(note, dy, xx, scale, rs1, rs2, attrs=base):
        return {"attrs": attrs, "inputs": [dy, xx, scale, rs1, rs2] + tail, "note": note}

    return [
        case("y_backprop rank 3", x[0], x, c4, c4, c4),
        case("x rank 3", x, x[0], c4, c4, c4),
        case("scale 2-D", x, x, c4[None], c4, c4),
        case("saved mean 2-D", x, x, c4, c4[None], c4),
        case("saved variance 2-D", x, x, c4, c4, c4[None]),
        case("x / y_backprop shapes differ", x[:1], x, c4, c4, c4),
        case("scale size", x, x, c3, c4, c4),
        case("reserve_space_1 size", x, x, c4, c3, c4),
        case("reserve_space_2 size", x, x, c4, c4, c3),
        case("reserve_space_2 size, inference", x, x, c4, c4, c3, dict(base, is_training=False)),
    ]


def to_nhwc(a):
    return np.moveaxis(a, 1, -1)


def from_nhwc(a):
    return np.moveaxis(a, -1, 1)


def run_case(op, case):
    """Fill in TF's outputs (or its error message) for one case."""
    attrs = case["attrs"]
    is_grad = op in GRADIENT
    try:
        if is_grad and not attrs["is_training"] and attrs["data_format"].startswith("NC"):
            # TF's Eigen freeze gradient only takes NHWC; its Python gradient (and oneDNN) transposes around
            # it, which is what the project's deviation does too. Reproduce that transpose here.
            inputs = [to_nhwc(case["inputs"][0]), to_nhwc(case["inputs"][1])] + case["inputs"][2:]
            nhwc = "NHWC" if case["inputs"][1].ndim == 4 else "NDHWC"
            outputs = run_tf(op, inputs, dict(attrs, data_format=nhwc))
            outputs[0] = from_nhwc(outputs[0])
            case["note"] += " (TF run on the NHWC transpose: its Eigen freeze gradient takes NHWC only)"
        else:
            outputs = run_tf(op, case["inputs"], attrs)
    except (tf.errors.InvalidArgumentError, ValueError) as e:
        case["error"] = tf_message(e)
        return case
    unchecked = []
    if not is_grad and (not attrs["is_training"] or case["inputs"][0].size == 0):
        unchecked += [3, 4]  # uninitialized memory in TF's Eigen kernel
    for i in unchecked:
        outputs[i] = UNCHECKED
    if unchecked:
        case["note"] += f" (outputs {sorted(set(unchecked))} undefined in TF: not compared)"
    case["outputs"] = outputs
    return case


def main():
    check_tf_mode(onednn=False)
    print(f"TensorFlow {tf.__version__}, Eigen kernels (oneDNN off)")
    for op, make in [(op, forward_cases) for op in FORWARD] + [(op, grad_cases) for op in GRADIENT]:
        cases = [run_case(op, c) for c in make(op)]
        path = save_cases(op, cases)
        errors = sum("error" in c for c in cases)
        print(f"{op}: {len(cases)} cases ({errors} errors), {path.stat().st_size // 1024} KiB")


if __name__ == "__main__":
    main()
