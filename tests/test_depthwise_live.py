"""DepthwiseConv2dNative and its two backprops against the installed TensorFlow, in both of its CPU kernel
sets: Eigen (the suite's pinned mode, in this process) and oneDNN (forced on in a child process, see
tf_modes.py), on the same seeded random grid. Tolerance: test_depthwise.py's ``assert_close``, a bound on
summation-order differences, which covers oneDNN's own order too.

Not compared, each for a stated reason:
* BackpropFilter with an empty out_backprop: TF's Eigen kernel returns uninitialized memory (ours: zeros).
* oneDNN with an empty batch: its forward kernel returns an empty tensor of the *input's* shape
  (e.g. [0,3,7,1] for a [0,4,4,2] result), a TF bug; the Eigen run covers empty batches.
"""
from __future__ import annotations

import functools
import re

import numpy as np
import pytest

import ort_ops
from backends import BackendError, run
from ort_ops.spec import OpError
from test_depthwise import BPF, BPI, DTYPES, FWD, OPS, _attr4, _from_nhwc, assert_close
from tf_modes import MODES, call_in_mode

pytestmark = pytest.mark.tensorflow


@functools.lru_cache(maxsize=None)
def live_cases(count=200, seed=2024):
    """Seeded random cases over the grid, made without TF: (note, attrs, NHWC oracle arguments, layout inputs)."""
    rng = np.random.default_rng(seed)
    cases = []
    while len(cases) < count:
        dtype = DTYPES[len(cases) % 4]
        fmt = ("NHWC", "NCHW")[(len(cases) // 4) % 2]
        n = int(rng.choice([1, 1, 2, 0])) if len(cases) % 23 else 0
        h, w_ = (int(v) for v in rng.integers(2, 10, 2))
        c = int(rng.choice([1, 3, 5, 7]))
        m = int(rng.choice([1, 2, 3, 8, 9]))
        kh, kw = (int(v) for v in rng.integers(1, 4, 2))
        s = int(rng.integers(1, 3))
        pad = ("SAME", "VALID", "EXPLICIT")[int(rng.integers(0, 3))]
        dil = (1, 1)
        if s == 1 and pad != "EXPLICIT" and rng.random() < 0.4:
            dil = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
        pads = [int(v) for v in rng.integers(0, 3, 4)] if pad == "EXPLICIT" else None
        ep_nhwc = [0, 0, *pads, 0, 0] if pads else []
        x = (rng.standard_normal((n, h, w_, c)) * 2).astype(dtype)
        wt = (rng.standard_normal((kh, kw, c, m)) * 2).astype(dtype)
        nhwc_attrs = {"strides": [1, s, s, 1], "padding": pad, "explicit_paddings": ep_nhwc,
                      "dilations": [1, *dil, 1]}
        spec = ort_ops.get_spec(FWD)
        try:
            (y_shape,) = spec.shape_fn([x.shape, wt.shape], [None, None], spec.with_defaults(nhwc_attrs))
        except OpError:
            continue  # a negative output size: the error tests cover it
        if 0 in y_shape and dil != (1, 1):
            continue
        dy = (rng.standard_normal(tuple(y_shape)) * 2).astype(dtype)
        ep = ([0, 0, 0, 0, *pads] if fmt == "NCHW" else ep_nhwc) if pads else []
        attrs = {"strides": _attr4(fmt, s, s), "padding": pad, "explicit_paddings": ep, "data_format": fmt,
                 "dilations": _attr4(fmt, *dil)}
        note = f"{dtype.name} {fmt} N={n} {h}x{w_}x{c} k={kh}x{kw} M={m} s={s} {pad} {ep} dil={dil}"
        xl, dyl = _from_nhwc(x, fmt), _from_nhwc(dy, fmt)
        inputs = {FWD: [xl, wt], BPI: [np.array(xl.shape, np.int32), wt, dyl], BPF: [xl, np.array(wt.shape, np.int32), dyl]}
        cases.append({"note": note, "attrs": attrs, "fmt": fmt, "oracle": (x, wt, dy, s, pad, ep_nhwc, dil),
                      "inputs": inputs})
    return tuple(cases)


def _compared(mode, case):
    """Whether this mode's TF result for the case is defined (see the module docstring)."""
    return not (mode == "onednn" and case["inputs"][FWD][0].shape[0] == 0)


@functools.lru_cache(maxsize=None)
def tf_results(mode):
    cases = [c for c in live_cases() if _compared(mode, c)]
    results = call_in_mode(mode, "tf_oracle:depthwise_outputs", [c["oracle"] for c in cases])
    return {c["note"]: dict(zip(OPS, r)) for c, r in zip(cases, results)}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", OPS)
def test_live_against_tensorflow(backend, op, mode):
    results = tf_results(mode)
    checked = 0
    for case in live_cases():
        if case["note"] not in results:
            continue
        want = results[case["note"]][op]
        if op == BPF and case["inputs"][BPF][2].size == 0:
            continue  # TF's Eigen BackpropFilter returns uninitialized memory for an empty out_backprop
        inputs = case["inputs"][op]
        (got,) = run(backend, op, inputs, case["attrs"])
        if op != BPF:  # the filter gradient has the filter's layout in every data_format
            want = _from_nhwc(want, case["fmt"])
        assert_close(op, got, want, inputs, case["attrs"], f"{op} {mode} [{case['note']}]")
        checked += 1
    assert checked > 120
    notes = " ".join(results)
    assert "dil=(2" in notes and "NCHW" in notes and "bfloat16" in notes
    if mode == "eigen":
        assert "N=0" in notes


OVERHANG = [  # (input rows, filter rows, stride, padding, explicit rows): windows past the input's end
    (2, 6, 3, "VALID", None), (2, 5, 3, "VALID", None), (2, 6, 4, "EXPLICIT", (0, 0)), (1, 6, 5, "EXPLICIT", (1, 0)),
    (2, 9, 3, "VALID", None), (2, 9, 3, "EXPLICIT", (0, 0)), (3, 8, 2, "EXPLICIT", (1, 1)),
]


@pytest.mark.parametrize("rows,k,stride,padding,pads", OVERHANG)
def test_window_overhang_matches_tensorflow(backend, rows, k, stride, padding, pads):
    """TF rounds the output size toward zero: an overhang shorter than a stride is an empty output, a longer one
    is TF's error with TF's number."""
    from tf_oracle import tf_raw_op

    ep = [0, 0, *pads, 0, 0, 0, 0] if pads else []
    attrs = {"strides": [1, stride, stride, 1], "padding": padding, "explicit_paddings": ep}
    x, w = np.ones((1, rows, 4, 1), np.float32), np.ones((k, 1, 1, 1), np.float32)
    try:
        (want,) = tf_raw_op(FWD, [x, w], attrs)
    except Exception as e:  # TF's InvalidArgumentError
        tf_words = re.search(r"Computed output size would be negative: -?\d+", str(e)).group(0)
        with pytest.raises(BackendError) as info:
            run(backend, FWD, [x, w], attrs)
        assert tf_words in str(info.value)
        return
    (got,) = run(backend, FWD, [x, w], attrs)
    assert got.shape == want.shape and want.shape[1] == 0
    dy = np.ones(want.shape, np.float32)
    (dx,) = run(backend, BPI, [np.array(x.shape, np.int32), w, dy], attrs)
    (dw,) = run(backend, BPF, [x, np.array(w.shape, np.int32), dy], attrs)
    assert dx.shape == x.shape and not dx.any() and dw.shape == w.shape and not dw.any()
