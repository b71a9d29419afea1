"""FusedBatchNorm{,V2,V3} and FusedBatchNormGrad{,V2,V3} against the installed TensorFlow, in both of its CPU
kernel sets: Eigen (the suite's pinned mode, in this process) and oneDNN (forced on in a child process, see
tf_modes.py), on the same seeded random cases over the whole op grid.

Tolerances are test_batch_norm.py's (``compare_outputs``); they hold for both kernel sets. Two kinds of output
are not compared by value, each for a stated reason:
* reserve_space_1/2 of the forward ops in inference mode: TF's Eigen kernel never writes them.
* the outputs the spec flags ``placeholder`` (reserve_space_3 of FusedBatchNormV3, the last two of every
  gradient op): TF's two builds give them different shapes (Eigen: a scalar for V3's, [0] for the gradients';
  oneDNN: the other way round) and nothing reads them. TF's shape may be either; ours must be exactly the spec's (Eigen's).
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

import ort_ops
from backends import run
from test_batch_norm import ALL_OPS, BF16, F16, F32, FORWARD_OPS, GRAD_OPS, compare_outputs
from tf_modes import MODES, call_in_mode

pytestmark = pytest.mark.tensorflow


def placeholders(op):
    """The outputs the spec flags ``placeholder``."""
    return ort_ops.get_spec(op).placeholder_outputs()


TF_PLACEHOLDER_SHAPES = {(), (0,)}
LIVE_CASES_PER_OP = 35  # 210 in all


def _random_case(rng, op):
    version = 3 if op.endswith("V3") else 2 if op.endswith("V2") else 1
    dtype = F32 if version == 1 else (F32, F32, F16, BF16)[rng.integers(4)]
    c = int(rng.integers(1, 21))
    five_d = version == 3 and rng.random() < 0.3
    spatial = tuple(int(d) for d in rng.integers(1, 5, size=4 if five_d else 3))
    channels_first = rng.random() < 0.5
    fmt = ("NCDHW" if channels_first else "NDHWC") if five_d else ("NCHW" if channels_first else "NHWC")
    last = spatial + (c,)
    shape = (last[0], c) + last[1:-1] if channels_first else last
    is_training = bool(rng.random() < 0.6)
    epsilon = float(np.float32(10.0 ** rng.uniform(-5, -1)))

    def tensor(shape, loc=0.0, scale=1.0, dt=F32):
        return (rng.standard_normal(shape) * scale + loc).astype(np.float32).astype(dt)

    if op in FORWARD_OPS:
        f = 1.0 if rng.random() < 0.5 else float(np.float32(rng.uniform(0.01, 0.99)))
        inputs = [tensor(shape, rng.uniform(-2, 2), rng.uniform(0.1, 4), dtype), tensor(c, 1.0, 0.5), tensor(c),
                  tensor(c), rng.uniform(0.1, 3, c).astype(np.float32)]
        attrs = {"epsilon": epsilon, "exponential_avg_factor": f, "data_format": fmt, "is_training": is_training}
    else:
        inputs = [tensor(shape, dt=dtype), tensor(shape, 0.3, 1.5, dtype), tensor(c, 1.0, 0.5), tensor(c, 0.3, 0.3),
                  rng.uniform(0.2, 3, c).astype(np.float32)]
        if version == 3:
            inputs.append(np.zeros((), np.float32))
        attrs = {"epsilon": epsilon, "data_format": fmt, "is_training": is_training}
    return inputs, attrs


@functools.lru_cache(maxsize=None)
def live_cases():
    """Seeded random cases over the whole op grid (no TF needed to make them)."""
    rng = np.random.default_rng(20240521)
    return tuple((op, *_random_case(rng, op)) for op in ALL_OPS for _ in range(LIVE_CASES_PER_OP))


@functools.lru_cache(maxsize=None)
def tf_results(mode):
    return call_in_mode(mode, "tf_oracle:batch_norm_outputs", list(live_cases()))


def check_placeholder(op, index, got, want):
    spec_shape = tuple(ort_ops.get_spec(op).shape_fn([np.shape(x) for x in got["inputs"]], [None] * len(got["inputs"]),
                                                     ort_ops.get_spec(op).with_defaults(got["attrs"]))[index])
    ours = got["outputs"][index]
    assert ours.shape == spec_shape, f"{op} output {index}: shape {ours.shape}, the spec says {spec_shape}"
    assert ours.dtype == want.dtype, f"{op} output {index}: dtype {ours.dtype} != TF's {want.dtype}"
    assert want.shape in TF_PLACEHOLDER_SHAPES, f"{op} output {index}: TF gave shape {want.shape}, a new placeholder shape"


@pytest.mark.parametrize("mode", MODES)
def test_live_against_tensorflow(backend, mode):
    assert len(live_cases()) >= 200
    failures = []
    for (op, inputs, attrs), want in zip(live_cases(), tf_results(mode)):
        skip = set(placeholders(op))
        if op in FORWARD_OPS and not attrs["is_training"]:
            skip |= {3, 4}  # uninitialized in TF's Eigen kernel
        try:
            got = run(backend, op, inputs, attrs)
            compare_outputs(op, inputs, attrs, got, want, f"{op} x{inputs[0].shape} {attrs}", tuple(skip))
            for i in placeholders(op):
                check_placeholder(op, i, {"inputs": inputs, "attrs": attrs, "outputs": got}, want[i])
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, f"{len(failures)} live cases differ from TF ({mode}):\n" + "\n".join(failures[:10])


def test_the_two_kernel_sets_really_differ_in_placeholders():
    """The reason for the placeholder flag: if TF's builds ever agree again, this says so (and the flag can go)."""
    shapes = {mode: {(op, tuple(w[i].shape)) for (op, _, _), w in zip(live_cases(), tf_results(mode))
                     for i in placeholders(op)} for mode in MODES}
    assert shapes["eigen"] != shapes["onednn"]
