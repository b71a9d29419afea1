"""Window geometry shared by the convolution and pooling gradients: TF's padding rules, layouts."""
from __future__ import annotations

from typing import List, Sequence, Tuple

from converters.standard._builder import Lowering

# data_format -> (perm NHWC-or-NCHW -> NCHW, perm NCHW -> data_format, spatial axes in data_format)
LAYOUTS = {
    "NHWC": ([0, 3, 1, 2], [0, 2, 3, 1], (1, 2)),
    "NCHW": ([0, 1, 2, 3], [0, 1, 2, 3], (2, 3)),
}


def layout(b: Lowering) -> str:
    data_format = b.attr("data_format", "NHWC")
    if data_format not in LAYOUTS:
        b.fail(f"data_format {data_format!r} is not supported (NHWC or NCHW)")
    return data_format


def spatial(b: Lowering, values: Sequence[int], data_format: str, what: str) -> Tuple[int, int]:
    """The (H, W) entries of a 4-entry per-dimension attribute; batch and channel entries must be 1."""
    values = list(values)
    if len(values) != 4:
        b.fail(f"attribute {what} must have 4 entries, got {values}")
    h, w = LAYOUTS[data_format][2]
    others = [values[i] for i in range(4) if i not in (h, w)]
    if any(v != 1 for v in others):
        b.fail(f"attribute {what} = {values}: batch and channel entries must be 1")
    return int(values[h]), int(values[w])


def pads(b: Lowering, padding: str, sizes, windows, strides, dilations, data_format: str,
         explicit: Sequence[int] = ()) -> List[Tuple[int, int]]:
    """(before, after) padding per spatial dim, as TF computes it for ``padding``."""
    out = []
    if padding == "EXPLICIT":
        explicit = list(explicit)
        if len(explicit) != 8:
            b.fail(f"attribute explicit_paddings must have 8 entries for EXPLICIT padding, got {explicit}")
        for axis in LAYOUTS[data_format][2]:
            before, after = explicit[2 * axis], explicit[2 * axis + 1]
            if before < 0 or after < 0:
                b.fail(f"attribute explicit_paddings = {explicit} has a negative entry")
            out.append((int(before), int(after)))
        return out
    for size, k, s, d in zip(sizes, windows, strides, dilations):
        if padding == "VALID":
            out.append((0, 0))
        elif padding == "SAME":
            extent = (k - 1) * d + 1
            n_out = -(-size // s)
            total = max((n_out - 1) * s + extent - size, 0)
            out.append((total // 2, total - total // 2))
        else:
            b.fail(f"padding {padding!r} is not supported (SAME, VALID or EXPLICIT)")
    return out


def output_size(size: int, window: int, stride: int, dilation: int, before: int, after: int) -> int:
    """TF's windowed output size: C++'s truncating division, so a window that overhangs the padded input
    by less than a stride (and up to 2 strides - 1) gives an empty output, not a negative one."""
    span = size + before + after - ((window - 1) * dilation + 1) + stride
    return span // stride if span >= 0 else -((-span) // stride)


def forward_geometry(b: Lowering, padding: str, sizes, windows, strides, dilations, data_format: str,
                     explicit: Sequence[int] = ()):
    """((before, after) padding, output size) per spatial dim of the forward convolution.

    TF's backprop kernels accept only an out_backprop of exactly this output size, so the handlers
    compute it here rather than reading it from out_backprop's shape, which tf2onnx may not know
    (e.g. behind the gradient of a Pad or Concat with a None batch: a Slice of run-time size).
    An output size may be 0 (TF's empty output); the handlers then write zeros without a convolution.
    """
    padded = pads(b, padding, sizes, windows, strides, dilations, data_format, explicit)
    out = [output_size(n, k, s, d, before, after)
           for n, k, s, d, (before, after) in zip(sizes, windows, strides, dilations, padded)]
    for n, k, d, (before, after), n_out in zip(sizes, windows, dilations, padded, out):
        if n_out < 0:
            b.fail(f"the forward convolution's window ({k} taps, dilation {d}) does not fit the input's "
                   f"spatial size {n} padded by ({before}, {after})")
    return padded, out


def check_out_backprop(b: Lowering, index: int, data_format: str, expected) -> None:
    """Fail if out_backprop's known spatial dims differ from the forward convolution's output size."""
    shape = b.shape(index)
    if shape is None:
        return
    if len(shape) != 4:
        b.fail(f"input out_backprop ({b.inputs[index]!r}) must be 4-D, got shape {shape}")
    got = [shape[axis] for axis in LAYOUTS[data_format][2]]
    if any(g >= 0 and g != want for g, want in zip(got, expected)):
        b.fail(f"input out_backprop ({b.inputs[index]!r}) has spatial dims {got}; "
               f"the forward convolution's output is {list(expected)}")


def crop_full_to_input(b: Lowering, full: str, padded, height: int, width: int, tail, data_format: str,
                       from_nchw) -> None:
    """Emit output 0: ``full`` (NCHW, a transposed convolution over the padded input) padded at the end by
    ``tail`` rows/cols where it stops short of the input, cropped to the input's window (which starts at the
    leading pads), and transposed back to NHWC if the data is."""
    import numpy as np

    if any(tail):
        full = b.op("Pad", full, b.const([0, 0, 0, 0, 0, 0, tail[0], tail[1]], np.int64))
    starts = [padded[0][0], padded[1][0]]
    cropped = b.op("Slice", full, b.const(starts, np.int64),
                   b.const([starts[0] + height, starts[1] + width], np.int64), b.const([2, 3], np.int64))
    b.emit(0, b.op("Transpose", cropped, perm=from_nchw) if data_format == "NHWC" else cropped)
