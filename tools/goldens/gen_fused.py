"""Golden cases for FusedBatchNormClipFakeQuant, computed by TensorFlow's chain of the ops it fuses.

Re-run with ``PYTHONPATH=. python tools/goldens/gen_fused.py`` (writes ort_ops/conformance/goldens/FusedBatchNormClipFakeQuant.npz).
TF has no such op: each case runs ``FusedBatchNormV3`` (inference) on TF's Eigen kernels, then the clip
(``Relu6`` for [0, 6], ``Maximum``/``Minimum`` otherwise, nothing for an infinite bound), then
``FakeQuantWithMinMaxVars`` or ``FakeQuantWithMinMaxArgs`` (TF_ENABLE_ONEDNN_OPTS=0 is pinned here).

Channel counts stay below 8: TF's batch norm takes the RSQRTPS estimate for channels that fill a whole
8-float packet (a documented deviation of the batch-norm ops), and a last-bit difference there moves a
quantized value by a grid step now and then. Below 8 channels TF's batch norm is the correctly rounded one
this project computes, so every output here is TF's bit for bit. Error cases are the TF chain's errors
(batch norm's rank and size rules, the quantizer's range and num_bits rules), in TF's words.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from tools.goldens._common import check_tf_mode, specials, tf_case  # noqa: E402

import numpy as np  # noqa: E402

from ort_ops.conformance.goldens import save_cases  # noqa: E402

OP = "FusedBatchNormClipFakeQuant"
F32 = np.float32


def case(inputs, attrs, note):
    return tf_case(OP, inputs, attrs, note)  # _common.run_tf runs the chain for a fused op


def attrs_of(fmt="NHWC", clip=(0.0, 6.0), quantizer="FakeQuantWithMinMaxVars", num_bits=8, narrow_range=0,
             epsilon=float(F32(1e-3))):
    return {"epsilon": epsilon, "data_format": fmt, "clip_min": clip[0], "clip_max": clip[1],
            "fake_quant": quantizer, "num_bits": num_bits, "narrow_range": narrow_range}


def x_shape(spatial, c, fmt):
    return (spatial[0], c) + tuple(spatial[1:]) if fmt.startswith("NC") else tuple(spatial) + (c,)


def statistics(rng, c):
    return [(rng.standard_normal(c) * 0.8 + 1.0).astype(F32), (rng.standard_normal(c) * 0.5).astype(F32),
            (rng.standard_normal(c) * 0.3).astype(F32), rng.uniform(0.25, 2.0, c).astype(F32)]


def cases():
    rng = np.random.default_rng(4321)
    out = []
    grid = [("NHWC", (2, 5, 3)), ("NCHW", (2, 4, 5)), ("NDHWC", (1, 2, 3, 4)), ("NCDHW", (2, 1, 3, 3))]
    clips = [(0.0, 6.0), (-math.inf, math.inf), (-1.0, 2.5), (0.0, math.inf)]
    ranges = [(-0.5, 5.75), (0.0, 6.0), (-3.0, 3.0)]
    k = 0
    for quantizer in ("FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxArgs"):
        for fmt, spatial in grid:
            for clip in clips:
                c = (1, 3, 5, 7)[k % 4]
                mn, mx = ranges[k % len(ranges)]
                bits = ((8, 0), (8, 1), (4, 0))[k % 3]
                k += 1
                x = (rng.standard_normal(x_shape(spatial, c, fmt)) * 4).astype(F32)
                inputs = [x] + statistics(rng, c) + [np.array(mn, F32), np.array(mx, F32)]
                note = f"{quantizer} {fmt} C={c} clip {clip} range ({mn}, {mx}) bits {bits}"
                out.append(case(inputs, attrs_of(fmt, clip, quantizer, *bits), note))
    # Special values in x (NaN, ±inf, ±0, subnormals, the largest floats) and a 7-channel NCHW ramp over the
    # grid's ties.
    for quantizer in ("FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxArgs"):
        sp = specials(F32)
        x = np.resize(sp, (2, 3, 4, 3)).astype(F32)
        stats = [np.ones(3, F32), np.zeros(3, F32), np.zeros(3, F32), np.full(3, 1.0 - 1e-3, F32)]
        for clip in ((0.0, 6.0), (-math.inf, math.inf)):
            out.append(case([x] + stats + [np.array(-1.0, F32), np.array(5.0, F32)], attrs_of("NHWC", clip, quantizer),
                            f"{quantizer} special values, clip {clip}"))
        ramp = np.linspace(-8, 8, 7 * 2 * 3 * 5, dtype=F32).reshape(2, 7, 3, 5)
        stats7 = [np.ones(7, F32), np.zeros(7, F32), np.zeros(7, F32), np.full(7, 1.0 - 1e-3, F32)]
        out.append(case([ramp] + stats7 + [np.array(-0.5, F32), np.array(5.75, F32)], attrs_of("NCHW", (0.0, 6.0), quantizer),
                        f"{quantizer} ramp over [-8, 8] NCHW"))
    # Vars' min == max == 0 writes zeros; an infinite range gives NaN (Vars only: Args rejects it).
    x = (rng.standard_normal((2, 3, 3, 2)) * 3).astype(F32)
    stats = statistics(rng, 2)
    out.append(case([x] + stats + [np.array(0.0, F32), np.array(0.0, F32)], attrs_of(), "Vars min == max == 0"))
    out.append(case([x] + stats + [np.array(-np.inf, F32), np.array(6.0, F32)], attrs_of(), "Vars min = -inf"))
    out.append(case([x[:0]] + stats + [np.array(-1.0, F32), np.array(6.0, F32)], attrs_of(), "empty batch"))
    # Errors: the batch norm's, then the quantizer's.
    out.append(case([x[0]] + stats + [np.array(-1.0, F32), np.array(6.0, F32)], attrs_of(), "x rank 3"))
    out.append(case([x] + [stats[0][:1]] + stats[1:] + [np.array(-1.0, F32), np.array(6.0, F32)], attrs_of(),
                    "scale size"))
    out.append(case([x] + stats[:3] + [stats[3][:1]] + [np.array(-1.0, F32), np.array(6.0, F32)], attrs_of(),
                    "inference variance size"))
    out.append(case([x] + stats + [np.array([-1.0], F32), np.array(6.0, F32)], attrs_of(), "Vars min rank 1"))
    out.append(case([x] + stats + [np.array(6.0, F32), np.array(-1.0, F32)],
                    attrs_of(quantizer="FakeQuantWithMinMaxArgs"), "Args min > max"))
    out.append(case([x] + stats + [np.array(-1.0, F32), np.array(6.0, F32)], attrs_of(num_bits=17), "num_bits 17"))
    return out


def main():
    check_tf_mode(onednn=False)
    cs = cases()
    path = save_cases(OP, cs)
    print(f"wrote {path}: {len(cs)} cases, {sum('error' in c for c in cs)} errors")


if __name__ == "__main__":
    main()
