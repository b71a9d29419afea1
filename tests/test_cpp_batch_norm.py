"""The C++ batch-norm kernels (through onnxruntime with the library) against the NumPy kernels.

Tolerance: none. The C++ kernels perform the reference's IEEE float32 operations in the same order
(Eigen's split column sum in the training forward, plain running sums in the gradients, the
correctly rounded 1/sqrt, one rounding to T at the end), so all outputs must be bit-identical
(any NaN matches any NaN), for every thread count. (The reference itself is compared with
TensorFlow in test_batch_norm.py.)
"""
import ml_dtypes
import numpy as np
import pytest

from backends import BackendError, run, run_ort
from comparison import assert_bits_equal

F32, F16, BF16 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
VERSIONS = {"": (F32,), "V2": (F32, F16, BF16), "V3": (F32, F16, BF16)}


def channels_of(shape, fmt):
    return shape[1] if fmt.startswith("NC") else shape[-1]


def check_forward_and_grad(version, x, fmt, training, factor, rng, threads=2):
    c = channels_of(x.shape, fmt)
    scale, offset = rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    mean, var = rng.standard_normal(c).astype(np.float32), rng.random(c).astype(np.float32)
    attrs = dict(epsilon=0.001, exponential_avg_factor=factor, data_format=fmt, is_training=training)
    op = "FusedBatchNorm" + version
    inputs = [x, scale, offset, mean, var]
    expected = run("numpy", op, inputs, attrs)
    got = run_ort(op, inputs, attrs, threads)
    assert len(got) == len(expected)
    for i, (e, g) in enumerate(zip(expected, got)):
        if i in (3, 4) and not training and x.size == 0:
            continue  # unspecified in TF (uninitialized); both give zeros, checked below anyway
        assert_bits_equal(e, g, f"{op} output {i}", nan_payloads=False)
    dy = rng.standard_normal(x.shape).astype(x.dtype)
    grad = "FusedBatchNormGrad" + version
    ginputs = [dy, x, scale, expected[3], expected[4]] + ([np.zeros((7,), np.float32)] if version == "V3" else [])
    gattrs = dict(epsilon=0.001, data_format=fmt, is_training=training)
    gexpected = run("numpy", grad, ginputs, gattrs)
    ggot = run_ort(grad, ginputs, gattrs, threads)
    for i, (e, g) in enumerate(zip(gexpected, ggot)):
        assert_bits_equal(e, g, f"{grad} output {i}", nan_payloads=False)


def formats(version, rank):
    if rank == 5:
        return ("NDHWC", "NCDHW", "NHWC", "NCHW")  # the 4-D names take 5-D x too
    return ("NHWC", "NCHW") + (("NDHWC", "NCDHW") if version == "V3" else ())


@pytest.mark.parametrize("version", list(VERSIONS))
def test_random_parity(version):
    rng = np.random.default_rng(len(version) + 1)
    for dtype in VERSIONS[version]:
        for rank in (4, 5) if version == "V3" else (4,):
            for fmt in formats(version, rank):
                for _ in range(3):
                    shape = [int(v) for v in rng.integers(1, 7, rank)]
                    # channel counts around the 8-wide packet boundary, and row counts around 16
                    shape[1 if fmt.startswith("NC") else -1] = int(rng.choice([1, 3, 8, 9, 16, 17, 40]))
                    x = (rng.standard_normal(shape) * 4 + 2).astype(dtype)
                    for training, factor in ((True, 1.0), (True, 0.25), (False, 1.0)):
                        check_forward_and_grad(version, x, fmt, training, factor, rng)


@pytest.mark.parametrize(
    "shape",
    [(1, 1, 1, 1), (16, 1, 1, 8), (15, 1, 1, 8), (1, 4, 4, 24), (0, 3, 3, 4), (2, 0, 3, 9), (2, 3, 3, 0), (3, 1, 1, 17)],
)
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=lambda d: d.name)
def test_edge_shapes(shape, dtype):
    """One row (variance 0), exactly 16 / 15 rows, empty x (NaN statistics), zero channels."""
    rng = np.random.default_rng(5)
    for fmt in ("NHWC", "NCHW"):
        x = rng.standard_normal(shape).astype(dtype)
        for training, factor in ((True, 1.0), (True, 0.5), (False, 1.0)):
            check_forward_and_grad("V3", x, fmt, training, factor, rng)


def test_special_values():
    rng = np.random.default_rng(9)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, 3e38, -1.0, 2.5], np.float32)
    for dtype in (F32, F16, BF16):
        x = rng.choice(specials, (2, 4, 4, 10)).astype(dtype)
        for training in (True, False):
            check_forward_and_grad("V3", x, "NHWC", training, 1.0, rng)


def test_thread_count_does_not_change_results():
    rng = np.random.default_rng(13)
    x = rng.standard_normal((4, 30, 30, 72)).astype(np.float32)
    c = x.shape[-1]
    stats = [rng.standard_normal(c).astype(np.float32) for _ in range(4)]
    stats[3] = np.abs(stats[3])
    dy = rng.standard_normal(x.shape).astype(np.float32)
    for training in (True, False):
        attrs = dict(is_training=training, exponential_avg_factor=0.5)
        fwd = run_ort("FusedBatchNormV3", [x] + stats, attrs, threads=1)
        gin = [dy, x, stats[0], fwd[3], fwd[4], fwd[5]]
        grad = run_ort("FusedBatchNormGradV3", gin, {"is_training": training}, threads=1)
        for threads in (2, 3, 8):
            for i, (a, b) in enumerate(zip(fwd, run_ort("FusedBatchNormV3", [x] + stats, attrs, threads=threads))):
                assert_bits_equal(a, b, f"forward output {i}, {threads} threads", nan_payloads=False)
            for i, (a, b) in enumerate(zip(grad, run_ort("FusedBatchNormGradV3", gin, {"is_training": training}, threads=threads))):
                assert_bits_equal(a, b, f"grad output {i}, {threads} threads", nan_payloads=False)


def _vec(n):
    return np.ones(n, np.float32)


BAD = [
    ("FusedBatchNormV3", "input must be 4 or 5-dimensional[3,3,4]", [np.ones((3, 3, 4), np.float32), _vec(4), _vec(4), _vec(4), _vec(4)], {}),
    ("FusedBatchNormV3", "scale must be 1-dimensional[1,4]", [np.ones((1, 2, 2, 4), np.float32), np.ones((1, 4), np.float32), _vec(4), _vec(4), _vec(4)], {}),
    ("FusedBatchNormV3", "scale must have the same number of elements as the channels of x, got 3 and 4", [np.ones((1, 2, 2, 4), np.float32), _vec(3), _vec(4), _vec(4), _vec(4)], {}),
    ("FusedBatchNormV3", "offset must have the same number of elements", [np.ones((1, 2, 2, 4), np.float32), _vec(4), _vec(5), _vec(4), _vec(4)], {}),
    ("FusedBatchNormV3", "When is_training=false, mean must have the same number of elements as the channels of x, got 3 and 4", [np.ones((1, 2, 2, 4), np.float32), _vec(4), _vec(4), _vec(3), _vec(4)], {"is_training": False}),
    ("FusedBatchNormV3", "When exponential_avg_factor != 1, variance must have", [np.ones((1, 2, 2, 4), np.float32), _vec(4), _vec(4), _vec(4), _vec(2)], {"exponential_avg_factor": 0.5}),
    ("FusedBatchNormGradV3", "x and y_backprop must have same shape, but x has shape [1,2,2,4] and y_backprop has shape [1,2,3,4]", [np.ones((1, 2, 3, 4), np.float32), np.ones((1, 2, 2, 4), np.float32), _vec(4), _vec(4), _vec(4), _vec(0)], {}),
    ("FusedBatchNormGradV3", "saved mean must be 1-dimensional", [np.ones((1, 2, 2, 4), np.float32), np.ones((1, 2, 2, 4), np.float32), _vec(4), np.ones((2, 2), np.float32), _vec(4), _vec(0)], {}),
    ("FusedBatchNormGradV3", "reserve_space_2 must have the same number of elements as the channels of x, got 3 and 4", [np.ones((1, 2, 2, 4), np.float32), np.ones((1, 2, 2, 4), np.float32), _vec(4), _vec(4), _vec(3), _vec(0)], {}),
    ("FusedBatchNormGrad", "input must be 4 or 5-dimensional", [np.ones((2, 4), np.float32), np.ones((2, 4), np.float32), _vec(4), _vec(4), _vec(4)], {}),
]


@pytest.mark.parametrize("op, message, inputs, attrs", BAD, ids=[f"{op}-{msg[:40]}" for op, msg, _, _ in BAD])
def test_bad_input_is_an_error_naming_the_op(op, message, inputs, attrs):
    with pytest.raises(BackendError) as numpy_error:
        run("numpy", op, inputs, attrs)
    with pytest.raises(BackendError) as ort_error:
        run("ort", op, inputs, attrs)
    assert message in str(numpy_error.value)
    text = str(ort_error.value)
    assert f"{op}: " in text and message in text, text


def test_mean_and_variance_unread_when_training_with_factor_one():
    """tf.compat.v1.nn.fused_batch_norm passes empty mean/variance; they are not read then."""
    x = np.random.default_rng(1).standard_normal((2, 3, 3, 5)).astype(np.float32)
    empty = np.zeros(0, np.float32)
    inputs = [x, _vec(5), _vec(5), empty, empty]
    for e, g in zip(run("numpy", "FusedBatchNormV3", inputs, {}), run("ort", "FusedBatchNormV3", inputs, {})):
        assert_bits_equal(e, g, "FusedBatchNormV3", nan_payloads=False)


@pytest.mark.parametrize("op", ["FusedBatchNorm", "FusedBatchNormGradV2"])
def test_version_without_3d_formats_rejects_them(op):
    """V1/V2 know only NHWC/NCHW (the NumPy side rejects the attribute value before its kernel)."""
    x = np.ones((1, 2, 2, 4), np.float32)
    inputs = [x, _vec(4), _vec(4), _vec(4), _vec(4)] if "Grad" not in op else [x, x, _vec(4), _vec(4), _vec(4)]
    with pytest.raises(BackendError, match="data_format"):
        run("numpy", op, inputs, {"data_format": "NDHWC"})
    with pytest.raises(BackendError, match=f"{op}: Invalid data format"):
        run("ort", op, inputs, {"data_format": "NDHWC"})
