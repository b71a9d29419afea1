"""The C++ depthwise kernels (through onnxruntime with the library) against the NumPy kernels.

Tolerance: none. The C++ kernels perform the same IEEE operations in the same order as the NumPy
reference (taps in row-major filter order, multiply then add with no FMA, the multiplier sum in
TF's SIMD-register order, per-batch filter partials summed in batch order, float16/bfloat16
rounded to T after every tap), so every output must be bit-identical, for every thread count.
(The reference itself is compared with TensorFlow in test_depthwise.py.)
"""
import zlib

import ml_dtypes
import numpy as np
import pytest

from backends import BackendError, run, run_ort
from comparison import assert_bits_equal

FWD = "DepthwiseConv2dNative"
BPI = "DepthwiseConv2dNativeBackpropInput"
BPF = "DepthwiseConv2dNativeBackpropFilter"
DTYPES = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]
# Bit for bit with nan_payloads=False: NaN payloads and signs depend on which operand the CPU propagates,
# not on the math, so any NaN matches any NaN; every other value must have identical bits (so -0 != +0).


def make_attrs(fmt, stride, dil, padding, pads=None):
    nhwc = fmt == "NHWC"
    attrs = dict(
        strides=[1, stride, stride, 1] if nhwc else [1, 1, stride, stride],
        padding=padding,
        data_format=fmt,
        dilations=[1, dil[0], dil[1], 1] if nhwc else [1, 1, dil[0], dil[1]],
    )
    if padding == "EXPLICIT":
        (t, b), (l, r) = pads
        attrs["explicit_paddings"] = [0, 0, t, b, l, r, 0, 0] if nhwc else [0, 0, 0, 0, t, b, l, r]
    return attrs


def check_all_three(x, f, attrs, dy_seed=0, threads=2):
    """Forward, BackpropInput and BackpropFilter bit-equal to the NumPy kernels (shape errors alike)."""
    try:
        expected = run("numpy", FWD, [x, f], attrs)[0]
    except BackendError as e:
        with pytest.raises(BackendError) as got:
            run_ort(FWD, [x, f], attrs, threads)
        assert str(e) in str(got.value)
        return
    assert_bits_equal(expected, run_ort(FWD, [x, f], attrs, threads)[0], FWD, nan_payloads=False)
    dy = np.random.default_rng(dy_seed).standard_normal(expected.shape).astype(x.dtype)
    sizes = np.array(x.shape, np.int32)
    ins = [sizes, f, dy]
    assert_bits_equal(run("numpy", BPI, ins, attrs)[0], run_ort(BPI, ins, attrs, threads)[0], BPI, nan_payloads=False)
    ins = [x, np.array(f.shape, np.int32), dy]
    assert_bits_equal(run("numpy", BPF, ins, attrs)[0], run_ort(BPF, ins, attrs, threads)[0], BPF, nan_payloads=False)


def random_case(rng, dtype, fmt):
    n, h, w = int(rng.integers(1, 4)), int(rng.integers(1, 10)), int(rng.integers(1, 10))
    c, m = int(rng.integers(1, 12)), int(rng.choice([1, 2, 3, 8, 9, 17]))
    kh, kw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    stride = int(rng.integers(1, 4))
    dil = (int(rng.integers(1, 3)), int(rng.integers(1, 3)))
    padding = str(rng.choice(["SAME", "VALID", "EXPLICIT"]))
    pads = [(int(rng.integers(0, 3)), int(rng.integers(0, 3))) for _ in range(2)]
    x = rng.standard_normal((n, h, w, c) if fmt == "NHWC" else (n, c, h, w)).astype(dtype)
    f = rng.standard_normal((kh, kw, c, m)).astype(dtype)
    return x, f, make_attrs(fmt, stride, dil, padding, pads)


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_random_parity(dtype, fmt):
    rng = np.random.default_rng(zlib.crc32(f"{dtype.name}-{fmt}".encode()))
    for _ in range(12):
        x, f, attrs = random_case(rng, dtype, fmt)
        check_all_three(x, f, attrs, dy_seed=int(rng.integers(1 << 30)))


@pytest.mark.parametrize(
    "shape, filt, stride, dil, padding, pads",
    [
        ((1, 1, 1, 1), (1, 1, 1, 1), 1, (1, 1), "VALID", None),  # a single element
        ((2, 2, 2, 3), (3, 3, 3, 2), 1, (1, 1), "VALID", None),  # empty output (n < k), no error
        ((0, 4, 4, 3), (2, 2, 3, 1), 1, (1, 1), "SAME", None),  # empty batch: zero filter gradient
        ((1, 4, 4, 0), (2, 2, 0, 2), 1, (1, 1), "SAME", None),  # zero channels
        ((1, 4, 4, 3), (2, 2, 3, 0), 1, (1, 1), "SAME", None),  # zero multiplier
        ((1, 4, 4, 3), (0, 2, 3, 1), 1, (1, 1), "EXPLICIT", ((1, 1), (0, 0))),  # empty filter, non-empty output
        ((1, 3, 3, 2), (2, 2, 2, 1), 1, (1, 1), "EXPLICIT", ((0, 0), (0, 0))),
        ((2, 9, 7, 5), (3, 3, 5, 37), 2, (1, 1), "SAME", None),  # large multiplier (4 full AVX blocks + tail)
        ((1, 8, 8, 3), (3, 3, 3, 1), 3, (1, 1), "SAME", None),  # stride larger than the overlap
        ((1, 9, 9, 2), (3, 2, 2, 3), 1, (3, 2), "SAME", None),  # dilations
        ((1, 9, 9, 2), (2, 3, 2, 2), 2, (2, 3), "EXPLICIT", ((2, 1), (0, 3))),  # dilation + stride + pads
        ((1, 2, 2, 1), (3, 3, 1, 1), 1, (1, 1), "EXPLICIT", ((3, 3), (3, 3))),  # taps that only see padding
        ((1, 5, 5, 13), (3, 3, 13, 1), 1, (1, 1), "SAME", None),  # channels not a multiple of the vector width
        # Rows wide enough for the NCHW kernel's register blocks (32 columns) plus a tail, per stride.
        ((2, 4, 75, 3), (3, 3, 3, 2), 1, (1, 1), "SAME", None),
        ((1, 5, 113, 2), (3, 3, 2, 1), 2, (1, 1), "SAME", None),
        ((1, 4, 140, 2), (3, 5, 2, 1), 3, (1, 2), "EXPLICIT", ((1, 2), (3, 1))),
        ((1, 3, 96, 1), (2, 4, 1, 3), 2, (2, 3), "VALID", None),
        ((1, 3, 64, 2), (3, 3, 2, 1), 2, (1, 1), "EXPLICIT", ((0, 1), (1, 2))),  # odd left padding, stride 2
        # Planes narrower than one vector: every column takes the NCHW kernel's column tail (stride 2: phase
        # stepping from an even and an odd start; 7 columns: the partial store of the last vector).
        ((2, 14, 14, 5), (3, 3, 5, 1), 2, (1, 1), "EXPLICIT", ((0, 1), (0, 1))),
        ((1, 7, 7, 3), (3, 3, 3, 2), 2, (1, 1), "SAME", None),
        ((1, 7, 7, 4), (3, 3, 4, 1), 1, (1, 1), "SAME", None),
        ((1, 6, 11, 2), (3, 3, 2, 1), 3, (1, 1), "EXPLICIT", ((2, 0), (1, 2))),
    ],
)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_edge_shapes(dtype, shape, filt, stride, dil, padding, pads):
    rng = np.random.default_rng(7)
    for fmt in ("NHWC", "NCHW"):
        x = rng.standard_normal(shape).astype(dtype)
        if fmt == "NCHW":
            x = np.ascontiguousarray(np.transpose(x, (0, 3, 1, 2)))
        f = rng.standard_normal(filt).astype(dtype)
        check_all_three(x, f, make_attrs(fmt, stride, dil, padding, pads))


def test_empty_out_backprop_gives_zero_filter_gradient():
    x = np.ones((0, 4, 4, 3), np.float32)
    dy = np.ones((0, 4, 4, 3), np.float32)
    out = run_ort(BPF, [x, np.array([2, 2, 3, 1], np.int32), dy], make_attrs("NHWC", 1, (1, 1), "SAME"))[0]
    assert out.shape == (2, 2, 3, 1) and not out.any()


def test_special_values():
    """NaN, infinities, signed zeros and subnormals flow through exactly as in the reference."""
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-40, 3e38, -3e38, 1.0], np.float32)
    rng = np.random.default_rng(3)
    for dtype in DTYPES:
        x = rng.choice(specials, (2, 5, 5, 3)).astype(dtype)
        f = rng.choice(specials, (2, 2, 3, 2)).astype(dtype)
        check_all_three(x, f, make_attrs("NHWC", 1, (1, 1), "SAME"))
        check_all_three(np.ascontiguousarray(x.transpose(0, 3, 1, 2)), f, make_attrs("NCHW", 1, (1, 1), "SAME"))
        # A finite filter over special inputs in rows wide enough for the NCHW kernel's vectors, with padding
        # taps (whose w * 0 must not change a sum, signed zeros included).
        x = rng.choice(specials, (2, 3, 7, 40)).astype(dtype)
        f = rng.choice(specials[3:], (3, 3, 3, 2)).astype(dtype)
        for stride in (1, 2):
            check_all_three(x, f, make_attrs("NCHW", stride, (1, 1), "SAME"))


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float16)], ids=lambda d: d.name)
def test_thread_count_does_not_change_results(dtype):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((5, 23, 19, 40)).astype(dtype)
    f = rng.standard_normal((3, 3, 40, 2)).astype(dtype)
    attrs = make_attrs("NHWC", 1, (1, 1), "SAME")
    dy = rng.standard_normal((5, 23, 19, 80)).astype(dtype)
    cases = [
        (FWD, [x, f]),
        (BPI, [np.array(x.shape, np.int32), f, dy]),
        (BPF, [x, np.array(f.shape, np.int32), dy]),
    ]
    for op, ins in cases:
        one = run_ort(op, ins, attrs, threads=1)[0]
        for threads in (2, 3, 8):
            assert_bits_equal(one, run_ort(op, ins, attrs, threads=threads)[0], f"{op} threads={threads}", nan_payloads=False)
        assert_bits_equal(run("numpy", op, ins, attrs)[0], one, op, nan_payloads=False)


BAD = [
    (FWD, "input must be 4-dimensional[4,4,2]", lambda: ([np.ones((4, 4, 2), np.float32), np.ones((1, 1, 2, 1), np.float32)], {})),
    (FWD, "filter must be 4-dimensional", lambda: ([np.ones((1, 4, 4, 2), np.float32), np.ones((1, 2, 1), np.float32)], {})),
    (FWD, "input and filter must have the same depth: 2 vs 3", lambda: ([np.ones((1, 4, 4, 2), np.float32), np.ones((1, 1, 3, 1), np.float32)], {})),
    (FWD, "Computed output size would be negative", lambda: ([np.ones((1, 1, 4, 2), np.float32), np.ones((3, 1, 2, 1), np.float32)], {"padding": "VALID"})),
    (FWD, "Stride must be > 0, but got 0", lambda: ([np.ones((1, 4, 4, 2), np.float32), np.ones((1, 1, 2, 1), np.float32)], {"strides": [1, 0, 0, 1]})),
    (FWD, "strides in the batch and depth", lambda: ([np.ones((1, 4, 4, 2), np.float32), np.ones((1, 1, 2, 1), np.float32)], {"strides": [2, 1, 1, 1]})),
    (FWD, "equal length strides", lambda: ([np.ones((1, 4, 4, 2), np.float32), np.ones((1, 1, 2, 1), np.float32)], {"strides": [1, 1, 2, 1]})),
    (FWD, "explicit_paddings attribute must contain 8 values, but got: 6", lambda: ([np.ones((1, 4, 4, 2), np.float32), np.ones((1, 1, 2, 1), np.float32)], {"padding": "EXPLICIT", "explicit_paddings": [0] * 6})),
    (FWD, "Nonzero explicit padding in the batch or depth", lambda: ([np.ones((1, 4, 4, 2), np.float32), np.ones((1, 1, 2, 1), np.float32)], {"padding": "EXPLICIT", "explicit_paddings": [1, 0, 0, 0, 0, 0, 0, 0]})),
    (FWD, "must be nonnegative", lambda: ([np.ones((1, 4, 4, 2), np.float32), np.ones((1, 1, 2, 1), np.float32)], {"padding": "EXPLICIT", "explicit_paddings": [0, 0, -1, 0, 0, 0, 0, 0]})),
    (FWD, "must be empty if the padding attribute is not EXPLICIT", lambda: ([np.ones((1, 4, 4, 2), np.float32), np.ones((1, 1, 2, 1), np.float32)], {"explicit_paddings": [0] * 8})),
    (FWD, "Dilated rates should be larger than 0", lambda: ([np.ones((1, 4, 4, 2), np.float32), np.ones((1, 1, 2, 1), np.float32)], {"dilations": [1, 0, 1, 1]})),
    (BPI, "input_sizes input must be 1-dim, not 2", lambda: ([np.ones((2, 2), np.int32), np.ones((1, 1, 2, 1), np.float32), np.ones((1, 4, 4, 2), np.float32)], {})),
    (BPI, "Dimension 1 of input_sizes must be >= 0", lambda: ([np.array([1, -4, 4, 2], np.int32), np.ones((1, 1, 2, 1), np.float32), np.ones((1, 4, 4, 2), np.float32)], {})),
    (BPI, "DepthwiseConv2DBackpropInput: input must be 4-dimensional", lambda: ([np.array([1, 4, 2], np.int32), np.ones((1, 1, 2, 1), np.float32), np.ones((1, 4, 4, 2), np.float32)], {})),
    (BPI, "input and out_backprop must have the same batch size", lambda: ([np.array([2, 4, 4, 2], np.int32), np.ones((1, 1, 2, 1), np.float32), np.ones((1, 4, 4, 2), np.float32)], {})),
    (BPI, "depth_multiplier * in_depth not equal to out_depth", lambda: ([np.array([1, 4, 4, 2], np.int32), np.ones((1, 1, 2, 1), np.float32), np.ones((1, 4, 4, 3), np.float32)], {})),
    (BPI, "Number of rows of out_backprop doesn't match computed: actual = 4, computed = 5", lambda: ([np.array([1, 5, 4, 2], np.int32), np.ones((1, 1, 2, 1), np.float32), np.ones((1, 4, 4, 2), np.float32)], {})),
    (BPI, "Number of cols of out_backprop doesn't match computed", lambda: ([np.array([1, 4, 2147483647, 2], np.int32), np.ones((1, 1, 2, 1), np.float32), np.ones((1, 4, 4, 2), np.float32)], {})),
    (BPI, "is too large to allocate", lambda: ([np.array([1, 2147483647, 2147483647, 2], np.int32), np.ones((1, 1, 2, 1), np.float32), np.ones((1, 1, 1, 2), np.float32)], {"strides": [1, 2147483647, 2147483647, 1]})),
    (BPF, "filter_sizes input must be 1-dim, not 0", lambda: ([np.ones((1, 4, 4, 2), np.float32), np.array(3, np.int32), np.ones((1, 4, 4, 2), np.float32)], {})),
    (BPF, "DepthwiseConv2DBackpropFilter: filter must be 4-dimensional", lambda: ([np.ones((1, 4, 4, 2), np.float32), np.array([1, 1, 2], np.int32), np.ones((1, 4, 4, 2), np.float32)], {})),
    (BPF, "input and filter must have the same in_depth", lambda: ([np.ones((1, 4, 4, 2), np.float32), np.array([1, 1, 3, 1], np.int32), np.ones((1, 4, 4, 3), np.float32)], {})),
    (BPF, "is too large to allocate", lambda: ([np.ones((1, 4, 4, 2), np.float32), np.array([2147483647, 2147483647, 2, 1], np.int32), np.ones((1, 1, 1, 2), np.float32)], {"padding": "EXPLICIT", "explicit_paddings": [0, 0, 2147483643, 0, 2147483643, 0, 0, 0]})),
]


@pytest.mark.parametrize("op, message, make", BAD, ids=[f"{op}-{msg[:40]}" for op, msg, _ in BAD])
def test_bad_input_is_an_error_naming_the_op(op, message, make):
    inputs, extra = make()
    attrs = {"strides": [1, 1, 1, 1], "padding": "SAME", **extra}
    with pytest.raises(BackendError) as numpy_error:
        run("numpy", op, inputs, attrs)
    with pytest.raises(BackendError) as ort_error:
        run("ort", op, inputs, attrs)
    assert message in str(numpy_error.value)
    text = str(ort_error.value)
    assert f"{op}: " in text and message in text, text


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize(
    "channels, multiplier, stride, dil, padding",
    [
        (64, 1, 1, (1, 1), "SAME"),  # exactly one 64-wide filter-gradient block (register path)
        (130, 1, 2, (1, 2), "VALID"),  # two full blocks and a partial one
        (32, 2, 1, (2, 1), "SAME"),  # multiplier 2: one full block of 64 outputs
        (70, 2, 2, (1, 1), "EXPLICIT"),  # multiplier 2, full blocks and a partial one
        (75, 1, 1, (1, 1), "SAME"),  # forward by pixel: a 64-channel block, an 8-channel one, 3 alone
    ],
)
def test_wide_channel_blocks(fmt, channels, multiplier, stride, dil, padding):
    """Channel counts that fill the 64-output blocks of the vectorized filter-gradient path and of the
    forward's pixel-at-a-time path (float, multiplier 1 or 2), with 8-wide blocks and single channels after."""
    rng = np.random.default_rng(channels * 10 + multiplier)
    shape = (2, 7, 9, channels) if fmt == "NHWC" else (2, channels, 7, 9)
    x = rng.standard_normal(shape).astype(np.float32)
    f = rng.standard_normal((3, 3, channels, multiplier)).astype(np.float32)
    check_all_three(x, f, make_attrs(fmt, stride, dil, padding, [(1, 0), (2, 1)]), dy_seed=channels)
