"""Golden cases for DepthwiseConv2dNative and its two backprops, computed by TensorFlow 2.21.

Re-run with ``PYTHONPATH=. python tools/goldens/gen_depthwise.py`` (writes ort_ops/conformance/goldens/DepthwiseConv2dNative*.npz).

TF's CPU build has two kernel sets for these ops, and whether oneDNN is on by default depends on the CPU
(on with AVX-512). So the generator does not rely on the default: it runs two
child processes, one per oracle, and every case's note starts with the oracle that produced it:

* ``eigen:`` TF_ENABLE_ONEDNN_OPTS=0, TF's own Eigen kernels: NHWC, dilations 1, all four dtypes. The reference
  kernels follow these kernels' summation order, so these cases are bit-exact for the NumPy backend.
* ``onednn:`` TF_ENABLE_ONEDNN_OPTS=1, oneDNN (float32 only; other dtypes fall back to Eigen): the forward op with
  true dilations and strides, NCHW, and both backprops in NCHW. oneDNN sums in another order (tolerance).
* ``s2b:`` the gradients of ``tf.nn.depthwise_conv2d`` with dilations (SpaceToBatchND -> DepthwiseConv2dNative ->
  BatchToSpaceND) taken with a GradientTape, for the dilated backprops: TF's raw backprop kernels ignore (Eigen)
  or mishandle (oneDNN: exceptions and wrong values) dilations, while this path computes the exact gradient.
  Stride 1 only (the wrapper's space-to-batch is only the dilated convolution for stride 1). NCHW cases are the
  NHWC computation transposed, since TF's CPU kernels behind that path take NHWC only.

Plus the input TF rejects (with TF's message, from the Eigen kernels) and edge cases: empty batch, output size 0,
empty filter, non-finite values, and the ones where TF is broken are left out or taken from the oracle that
behaves as documented (BackpropFilter with an empty out_backprop returns uninitialized memory under Eigen, so
that case comes from oneDNN, which returns zeros).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402

from ort_ops.conformance.goldens import load_cases, save_cases  # noqa: E402

OPS = ("DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter")
FWD, BPI, BPF = OPS
ORACLES = ("eigen", "onednn", "s2b", "denormals")  # appended last, so earlier cases keep their places


def _dtypes():
    import ml_dtypes

    return (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def tf_message(err: Exception) -> str:
    """TF's own text, without the eager wrapper's "{{function_node ...}}" prefix and "[Op:...]" suffix."""
    text = getattr(err, "message", str(err))
    text = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", text)
    return re.sub(r"\s*\[Op:[^\]]*\].*$", "", text, flags=re.S).strip()


def nchw(shape_nhwc):
    n, h, w, c = shape_nhwc
    return (n, c, h, w)


def to_nchw(a):
    return np.ascontiguousarray(np.transpose(a, (0, 3, 1, 2)))


def layout_list(fmt, row, col, batch=1, depth=1):
    """A 4-entry attr (strides, dilations) in data_format order."""
    return [batch, depth, row, col] if fmt == "NCHW" else [batch, row, col, depth]


def explicit_list(fmt, top, bottom, left, right):
    return [0, 0, 0, 0, top, bottom, left, right] if fmt == "NCHW" else [0, 0, top, bottom, left, right, 0, 0]


class Generator:
    """Runs inside a child process with TF imported under one oracle's setting."""

    def __init__(self, oracle):
        import tensorflow as tf

        self.tf = tf
        self.oracle = oracle
        self.rng = np.random.default_rng({"eigen": 11, "onednn": 12, "s2b": 13, "denormals": 14}[oracle])
        self.cases = {op: [] for op in OPS}
        # Only the Eigen oracle's rejections are stored: under oneDNN, TF still rejects some inputs this project
        # accepts on purpose (NCHW backprops with EXPLICIT padding fall back to Eigen, which is NHWC only).
        self.keep_errors = oracle == "eigen"

    def values(self, shape, dtype):
        # Small integers over 4 plus a random fraction: mixed signs and magnitudes, no exact cancellations.
        return (self.rng.standard_normal(shape) * 2).astype(np.float32).astype(dtype)

    def raw(self, op, inputs, attrs):
        tf = self.tf
        names = {FWD: ("input", "filter"), BPI: ("input_sizes", "filter", "out_backprop"),
                 BPF: ("input", "filter_sizes", "out_backprop")}[op]
        return getattr(tf.raw_ops, op)(**{n: tf.constant(v) for n, v in zip(names, inputs)}, **attrs).numpy()

    def add(self, op, inputs, attrs, note, expected_shape=None):
        """Run op in TF and store the case; a TF error is stored as an error case with TF's message."""
        try:
            out = self.raw(op, inputs, attrs)
        except Exception as e:  # noqa: BLE001 (TF raises many error classes; the message is what is kept)
            if not self.keep_errors:
                print(f"{self.oracle}: not storing {op} {note}: TF says {tf_message(e)}", file=sys.stderr)
                return None
            self.cases[op].append({"attrs": attrs, "inputs": inputs, "error": tf_message(e), "note": f"{self.oracle}: {note}"})
            return None
        if expected_shape is not None and tuple(out.shape) != tuple(expected_shape):
            # oneDNN with dilations and an empty output returns the input tensor; not a result to keep.
            print(f"skipping {op} {note}: TF returned shape {out.shape}, documented {expected_shape}", file=sys.stderr)
            return None
        self.cases[op].append({"attrs": attrs, "inputs": inputs, "outputs": [out], "note": f"{self.oracle}: {note}"})
        return out

    def conv_triplet(self, x, w, attrs, note, dtype, backprops=True):
        """The forward case and, when it has a result, both backprops with a random out_backprop."""
        y = self.add(FWD, [x, w], attrs, note)
        if y is None or not backprops:
            return
        dy = self.values(y.shape, dtype)
        self.add(BPI, [np.array(x.shape, np.int32), w, dy], attrs, note)
        self.add(BPF, [x, np.array(w.shape, np.int32), dy], attrs, note)

    # ---- the Eigen oracle: the grid over dtypes, paddings, strides, multipliers; errors -------------------------
    def eigen(self):
        configs = [
            # (N, H, W, C, kh, kw, M, stride, padding)
            (2, 5, 6, 3, 3, 3, 1, 1, "SAME"),
            (1, 7, 5, 5, 3, 2, 2, 2, "SAME"),
            (2, 6, 6, 1, 2, 2, 3, 2, "VALID"),
            (1, 5, 7, 3, 3, 3, 8, 1, "VALID"),
            (1, 6, 5, 3, 3, 3, 9, 2, "EXPLICIT"),
            (2, 4, 4, 5, 1, 1, 2, 1, "SAME"),
            (1, 8, 8, 3, 5, 5, 1, 2, "SAME"),
            (1, 4, 5, 7, 2, 3, 9, 1, "EXPLICIT"),
            (3, 3, 3, 1, 3, 3, 17, 1, "SAME"),
        ]
        for dtype in _dtypes():
            for i, (n, h, w_, c, kh, kw, m, s, pad) in enumerate(configs):
                ep = [0, 0, 1, 2, 0, 1, 0, 0] if pad == "EXPLICIT" else []
                attrs = {"strides": [1, s, s, 1], "padding": pad, "explicit_paddings": ep}
                x, w = self.values((n, h, w_, c), dtype), self.values((kh, kw, c, m), dtype)
                self.conv_triplet(x, w, attrs, f"grid {i} {dtype.name} M={m} stride {s} {pad}", dtype)
        f32 = np.dtype(np.float32)
        same = {"strides": [1, 1, 1, 1], "padding": "SAME", "explicit_paddings": []}
        valid = {"strides": [1, 1, 1, 1], "padding": "VALID", "explicit_paddings": []}
        # empty batch (forward and BackpropInput; BackpropFilter's Eigen result is uninitialized memory)
        x, w = self.values((0, 4, 4, 3), f32), self.values((3, 3, 3, 2), f32)
        self.add(FWD, [x, w], same, "empty batch")
        self.add(BPI, [np.array(x.shape, np.int32), w, self.values((0, 4, 4, 6), f32)], same, "empty batch")
        # output size 0 (VALID, n=2 < k=3)
        x, w = self.values((1, 2, 5, 3), f32), self.values((3, 3, 3, 2), f32)
        self.add(FWD, [x, w], valid, "output size 0")
        self.add(BPI, [np.array(x.shape, np.int32), w, self.values((1, 0, 3, 6), f32)], valid, "output size 0: zero gradient")
        # an empty filter with a non-empty output: the empty sum (oneDNN rejects this, Eigen gives zeros)
        self.add(FWD, [self.values((1, 3, 3, 2), f32), self.values((0, 2, 2, 1), f32)], same, "empty filter: zeros")
        # non-finite and signed-zero values away from padding (VALID): propagate as IEEE arithmetic says
        x = self.values((1, 4, 4, 2), f32)
        x[0, 1, 1, 0], x[0, 2, 2, 1], x[0, 0, 3, 1], x[0, 3, 0, 0] = np.nan, np.inf, -np.inf, -0.0
        self.conv_triplet(x, self.values((2, 2, 2, 2), f32), valid, "NaN, +-inf, -0 in the input", f32)
        x = np.full((1, 3, 3, 1), -0.0, np.float32)
        self.conv_triplet(x, np.full((2, 2, 1, 1), 1.0, np.float32), valid, "all -0 input: +0 sums", f32)
        self.errors()

    def errors(self):
        f32 = np.float32
        x, w = self.values((1, 4, 4, 2), f32), self.values((3, 3, 2, 1), f32)
        base = {"strides": [1, 1, 1, 1], "padding": "SAME", "explicit_paddings": []}
        bad_attrs = [
            ({"strides": [1, 1, 1]}, "3 strides"),
            ({"strides": [2, 1, 1, 1]}, "batch stride"),
            ({"strides": [1, 1, 1, 2]}, "depth stride"),
            ({"strides": [1, 1, 2, 1]}, "unequal strides"),
            ({"strides": [1, 0, 0, 1]}, "stride 0"),
            ({"padding": "EXPLICIT", "explicit_paddings": [0, 0, 1, 1, 1, 1]}, "6 explicit paddings"),
            ({"padding": "EXPLICIT", "explicit_paddings": [0, 0, -1, 1, 1, 1, 0, 0]}, "negative explicit padding"),
            ({"padding": "EXPLICIT", "explicit_paddings": [1, 0, 1, 1, 1, 1, 0, 0]}, "batch explicit padding"),
            ({"padding": "EXPLICIT", "explicit_paddings": [0, 0, 1, 1, 1, 1, 0, 1]}, "depth explicit padding"),
            ({"explicit_paddings": [0, 0, 1, 1, 1, 1, 0, 0]}, "explicit paddings with SAME"),
        ]
        dy = self.values((1, 4, 4, 2), f32)
        for extra, note in bad_attrs:
            attrs = {**base, **extra}
            self.add(FWD, [x, w], attrs, f"bad: {note}")
            self.add(BPI, [np.array(x.shape, np.int32), w, dy], attrs, f"bad: {note}")
            self.add(BPF, [x, np.array(w.shape, np.int32), dy], attrs, f"bad: {note}")
        valid = {**base, "padding": "VALID"}
        self.add(FWD, [x[0], w], base, "bad: 3-D input")
        self.add(FWD, [x, w[0]], base, "bad: 3-D filter")
        self.add(FWD, [x, self.values((3, 3, 3, 1), f32)], base, "bad: depth mismatch")
        self.add(FWD, [self.values((1, 1, 4, 2), f32), w], valid, "bad: negative output size")
        sizes = np.array(x.shape, np.int32)
        for op in (BPI, BPF):
            def inputs(sz, dyv=dy, op=op):
                return [sz, w, dyv] if op == BPI else [x, sz, dyv]

            fshape = np.array(w.shape, np.int32)
            good = sizes if op == BPI else fshape
            self.add(op, inputs(good.reshape(2, 2)), base, "bad: 2-D sizes")
            neg = good.copy()
            neg[1] = -1
            self.add(op, inputs(neg), base, "bad: negative size")
            self.add(op, inputs(good[:3]), base, "bad: 3 sizes")
            if op == BPI:
                self.add(op, [sizes, w[0], dy], base, "bad: 3-D filter")
            else:
                self.add(op, [x[0], fshape, dy], base, "bad: 3-D input")
            self.add(op, inputs(good, dyv=dy[0]), base, "bad: 3-D out_backprop")
            self.add(op, inputs(good, dyv=self.values((2, 4, 4, 2), f32)), base, "bad: batch mismatch")
            if op == BPI:
                self.add(op, [sizes, self.values((3, 3, 3, 1), f32), dy], base, "bad: in_depth mismatch")
                self.add(op, [sizes, self.values((3, 3, 2, 2), f32), dy], base, "bad: out_depth mismatch")
            else:
                self.add(op, [x, np.array([3, 3, 3, 1], np.int32), dy], base, "bad: in_depth mismatch")
                self.add(op, [x, np.array([3, 3, 2, 2], np.int32), dy], base, "bad: out_depth mismatch")
            self.add(op, inputs(good, dyv=self.values((1, 5, 4, 2), f32)), base, "bad: out_backprop rows")
            self.add(op, inputs(good, dyv=self.values((1, 4, 3, 2), f32)), base, "bad: out_backprop cols")
            small = [1, 1, 4, 2]
            if op == BPI:
                self.add(op, [np.array(small, np.int32), w, self.values((1, 1, 2, 2), f32)], valid, "bad: negative output size")
            else:
                self.add(op, [self.values(small, f32), fshape, self.values((1, 1, 2, 2), f32)], valid, "bad: negative output size")

    # ---- the oneDNN oracle (float32): dilations, strides, NCHW --------------------------------------------------
    def onednn(self):
        f32 = np.dtype(np.float32)
        # (N, H, W, C, kh, kw, M, stride, (dil_h, dil_w), padding)
        configs = [
            (2, 7, 8, 3, 3, 3, 1, 1, (2, 2), "SAME"),
            (1, 9, 7, 5, 3, 2, 2, 2, (2, 3), "SAME"),
            (1, 9, 9, 3, 3, 3, 3, 1, (3, 1), "VALID"),
            (2, 8, 9, 1, 2, 3, 8, 2, (2, 2), "VALID"),
            (1, 8, 7, 3, 3, 3, 9, 2, (1, 2), "EXPLICIT"),
            (1, 6, 6, 3, 2, 2, 2, 1, (1, 1), "SAME"),
            (2, 7, 6, 5, 3, 3, 1, 2, (1, 1), "EXPLICIT"),
            (1, 5, 5, 3, 3, 3, 9, 1, (1, 1), "VALID"),
        ]
        for fmt in ("NHWC", "NCHW"):
            for i, (n, h, w_, c, kh, kw, m, s, (dh, dw), pad) in enumerate(configs):
                ep = explicit_list(fmt, 1, 2, 2, 0) if pad == "EXPLICIT" else []
                attrs = {"strides": layout_list(fmt, s, s), "padding": pad, "explicit_paddings": ep, "data_format": fmt,
                         "dilations": layout_list(fmt, dh, dw)}
                xs = nchw((n, h, w_, c)) if fmt == "NCHW" else (n, h, w_, c)
                x, w = self.values(xs, f32), self.values((kh, kw, c, m), f32)
                note = f"grid {i} {fmt} M={m} stride {s} dilations {dh}x{dw} {pad}"
                # the raw backprops mishandle dilations under oneDNN: those come from the s2b oracle
                self.conv_triplet(x, w, attrs, note, f32, backprops=(dh, dw) == (1, 1))
        # BackpropFilter with an empty out_backprop: oneDNN returns zeros (Eigen: uninitialized memory)
        same = {"strides": [1, 1, 1, 1], "padding": "SAME", "explicit_paddings": []}
        self.add(BPF, [self.values((0, 4, 4, 3), f32), np.array([3, 3, 3, 2], np.int32), self.values((0, 4, 4, 6), f32)],
                 same, "empty batch: zero filter gradient")

    # ---- dilated backprops through tf.nn.depthwise_conv2d's space-to-batch path, stride 1 ------------------------
    def s2b(self):
        tf = self.tf
        # (N, H, W, C, kh, kw, M, (dil_h, dil_w), padding)
        configs = [
            (2, 7, 8, 3, 3, 3, 1, (2, 2), "SAME"),
            (1, 9, 7, 5, 3, 2, 2, (2, 3), "SAME"),
            (1, 9, 9, 3, 3, 3, 3, (3, 1), "VALID"),
            (2, 8, 9, 1, 2, 3, 8, (2, 2), "VALID"),
            (1, 8, 7, 3, 2, 2, 9, (3, 2), "SAME"),
        ]
        for dtype in _dtypes():
            for i, (n, h, w_, c, kh, kw, m, (dh, dw), pad) in enumerate(configs):
                if dtype.itemsize == 2 and i % 2:
                    continue  # half the grid is enough for the 16-bit types
                x, w = self.values((n, h, w_, c), dtype), self.values((kh, kw, c, m), dtype)
                xt, wt = tf.constant(x), tf.constant(w)
                with tf.GradientTape(persistent=True) as tape:
                    tape.watch([xt, wt])
                    y = tf.nn.depthwise_conv2d(xt, wt, [1, 1, 1, 1], pad, dilations=[dh, dw])
                dy = self.values(tuple(y.shape), dtype)
                dx, dwt = tape.gradient(y, [xt, wt], output_gradients=tf.constant(dy))
                dx, dwt = dx.numpy(), dwt.numpy()
                for fmt in ("NHWC", "NCHW"):
                    attrs = {"strides": [1, 1, 1, 1], "padding": pad, "explicit_paddings": [], "data_format": fmt,
                             "dilations": layout_list(fmt, dh, dw)}
                    lay = to_nchw if fmt == "NCHW" else (lambda a: a)
                    xi, dyi = lay(x), lay(dy)
                    note = f"{self.oracle}: grid {i} {dtype.name} {fmt} M={m} dilations {dh}x{dw} {pad}"
                    self.cases[FWD].append({"attrs": attrs, "inputs": [xi, w], "outputs": [lay(y.numpy())], "note": note})
                    self.cases[BPI].append({"attrs": attrs, "inputs": [np.array(xi.shape, np.int32), w, dyi],
                                            "outputs": [lay(dx)], "note": note})
                    self.cases[BPF].append({"attrs": attrs, "inputs": [xi, np.array(w.shape, np.int32), dyi],
                                            "outputs": [dwt], "note": note})


    # ---- issue 11: TF's denormal mode (Eigen kernels) -------------------------------------------------------
    def denormals(self):
        """Subnormal operands act as signed zeros (so -tiny * inf is NaN, not -inf) and subnormal products
        become zeros, for float32, float64 and bfloat16; float16 subnormals widen to normal float32s and
        are not flushed. One tap and M == 1, then 2x2 taps with M == 2 (the sum over the multiplier)."""
        attrs = {"strides": [1, 1, 1, 1], "padding": "VALID", "explicit_paddings": [], "data_format": "NHWC",
                 "dilations": [1, 1, 1, 1]}
        for dtype in _dtypes():
            tiny = {"float32": 1e-45, "float64": 5e-324, "float16": 6e-8, "bfloat16": 1e-40}[dtype.name]
            small = {"float32": 1e-20, "float64": 1e-160, "float16": 1e-3, "bfloat16": 1e-20}[dtype.name]
            pairs = [(-tiny, np.inf, "-subnormal * inf")]
            if dtype.name != "float16":  # float16 products land in float32's normal range
                pairs.append((small, small, "a product below the normal range"))
            for a, b, what in pairs:
                x = np.full((1, 1, 1, 1), a, np.float64).astype(dtype)
                w = np.full((1, 1, 1, 1), b, np.float64).astype(dtype)
                self.conv_triplet(x, w, attrs, f"{dtype.name} {what}", dtype, backprops=False)
                self.add(BPI, [np.array(x.shape, np.int32), w, x], attrs, f"{dtype.name} {what}")
                self.add(BPF, [x, np.array(w.shape, np.int32), w], attrs, f"{dtype.name} {what}")
            # finite (an infinite tap meets the kernels' padding, a separate, documented matter)
            big = 6e4 if dtype.name == "float16" else 1e30
            x = np.array([tiny, -tiny, small, 1.0, -tiny, 2.0, small, -small], np.float64).reshape(1, 2, 2, 2).astype(dtype)
            w = np.array([big, 1.0, small, -big, 1.0, small, 3.0, 0.5] * 2, np.float64).reshape(2, 2, 2, 2).astype(dtype)
            dy = np.array([small, -tiny, big, 1.0], np.float64).reshape(1, 1, 1, 4).astype(dtype)
            note = f"{dtype.name} mixed subnormal, tiny and large values, 2x2 taps, M=2"
            self.add(FWD, [x, w], attrs, note)
            self.add(BPI, [np.array(x.shape, np.int32), w, dy], attrs, note)
            self.add(BPF, [x, np.array(w.shape, np.int32), dy], attrs, note)


def child(oracle, out_dir):
    from tools.goldens._common import check_tf_mode

    check_tf_mode(onednn=oracle == "onednn")
    gen = Generator(oracle)
    getattr(gen, oracle)()
    for op, cases in gen.cases.items():
        save_cases(op, cases, Path(out_dir) / oracle)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        for oracle in ORACLES:
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS="1" if oracle == "onednn" else "0")
            subprocess.run([sys.executable, __file__, "--child", oracle, tmp], env=env, check=True)
        for op in OPS:
            cases = [c for oracle in ORACLES for c in load_cases(op, Path(tmp) / oracle)]
            path = save_cases(op, cases)
            errors = sum("error" in c for c in cases)
            print(f"{path.relative_to(ROOT)}: {len(cases)} cases ({errors} errors), {path.stat().st_size} bytes")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
    else:
        main()
