"""QuantizeAndDequantize{V2,V3,V4} and QuantizeAndDequantizeV4Grad as standard ONNX ops.

Written as the same float32/float64 steps as TF's ComputeQuantizationRange and its quantize
functor: the scale from whichever side of the range is tighter (T_MAX when a side cannot decide),
the other side re-derived from the dequantization step, the clamp only when the range is given,
ONNX Round (ties to even, what rint does on x86) for HALF_TO_EVEN and Floor(v + 0.5) in T for HALF_UP.

A given range that is a constant of the graph is adjusted at conversion time by the NumPy reference
(ort_ops.reference._quantize_dequantize.compute_range, bit-exact against TF), so the graph holds only
the per-element clamp, scale, round and rescale (``_lean_constant_range``); V4Grad's constant range
becomes two constant bounds (``_lean_grad_bounds``). A given range whose step is NaN (TF: every output
NaN, the input's own NaN or the step's by Eigen's code path) is handled bit for bit too, at no cost
where a constant range's step is not NaN (decided at conversion time; see "a given range whose step is
NaN" below).

A range taken from the data (``_from_data``) is TF's reduction in Eigen's order, written out: which
elements count (NaNs hide some), when the range is a NaN and which one, which signed zero an extreme
keeps, and, for a NaN range, which NaN each output keeps. Bit for bit with the reference
(``_qdq_eigen_order``) on every input, NaNs and signed zeros included.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from converters.standard._builder import NP_TYPES, Lowering
from ort_ops.reference import _qdq_eigen_order as order
from ort_ops.reference import _quantize_dequantize as reference


def _rank_for_axis(lw: Lowering, axis: int, x_index: int):
    """The input's rank when per-axis (this lowering needs it at conversion time), else None."""
    if axis == -1:
        return None
    rank = lw.rank(x_index)
    if rank is None:
        lw.fail("per-axis quantization needs the input's rank at conversion time")
    return rank


def _per_axis_view(lw: Lowering, v: str, axis: int, rank: int) -> str:
    """A [D] vector reshaped to broadcast along ``axis`` of a rank-``rank`` tensor."""
    return lw.op("Reshape", v, lw.const([-1] + [1] * (rank - 1 - axis), np.int64))


def quantize_dequantize(lw, x, mn, mx, min_q, max_q, np_type, range_given: bool, half_up: bool,
                        flushed: bool = False, parts: bool = False, nan_step: bool = False):
    """The quantize-dequantize formula for a (min, max) pair of tensor names (scalars or broadcastable).

    ``flushed``: ``x`` is flushed already. ``parts``: return (output, inverse step, rounded input).
    ``nan_step`` (a given range whose step may be NaN): where the step is NaN, the output is the
    input's own NaN for a NaN input and the step's NaN otherwise, as TF's packet path gives it; the
    caller puts the step's NaN on the scalar tails (``_given_range_tails``). No node per element for
    that: the clamp's bounds, per channel, do the choosing (see the comment below).
    """
    # TF's kernels run with flush-to-zero/denormals-are-zero: flush the inputs and the range values
    # (the per-element products can only turn subnormal where these already are).
    f = lambda v: lw.flush(v, np_type)  # noqa: E731
    x, mn, mx = x if flushed else f(x), f(mn), f(mx)
    t_max = lw.const(np.finfo(np_type).max, np_type)
    zero = lw.const(0, np_type)
    qmin, qmax = lw.const(min_q, np_type), lw.const(max_q, np_type)  # int64 -> T, rounded like TF's cast
    s_min = lw.where(lw.op("Greater", lw.op("Mul", qmin, mn), zero), lw.op("Div", qmin, mn), t_max)
    s_max = lw.where(lw.op("Greater", lw.op("Mul", qmax, mx), zero), lw.op("Div", qmax, mx), t_max)
    from_min = lw.op("Less", s_min, s_max)  # ties and the both-T_MAX case take the max side
    scale = f(lw.where(from_min, s_min, s_max))
    inv = f(lw.where(from_min, f(lw.op("Div", mn, qmin)), f(lw.op("Div", mx, qmax)), np_type))
    v = x
    step = inv
    if range_given:
        hi = lw.where(from_min, f(lw.op("Mul", qmax, inv)), mx, np_type)
        lo = lw.where(from_min, mn, f(lw.op("Mul", qmin, inv)), np_type)
        hi_at, lo_at = hi, lo
        if nan_step:
            # TF multiplies rounded * step; with a NaN step both may be NaN, and ORT's Mul picks between
            # two NaNs by its broadcast path. So where the step is NaN (per channel) the clamp does the
            # choice: its tests are made true for every non-NaN x (x > -inf, then x < +inf for what is
            # left) and its bounds are the step's NaN, which Where returns bit for bit; a NaN x passes
            # both tests untouched, as in TF. The NaN then goes through the scale (T_MAX, never NaN) and
            # the rounding as the only NaN operand, and the final product takes a step of 1 there.
            bad = lw.op("IsNaN", inv)
            hi_at = lw.op("Where", bad, lw.const(-np.inf, np_type), hi)
            lo_at = lw.op("Where", bad, lw.const(np.inf, np_type), lo)
            hi, lo = lw.op("Where", bad, inv, hi), lw.op("Where", bad, inv, lo)
            step = lw.op("Where", bad, lw.const(1, np_type), inv)
        # Eigen's cwiseMin(hi).cwiseMax(lo): a NaN x or a NaN bound leaves the value as it is.
        v = lw.where(lw.op("Less", hi_at, v), hi, v, np_type)
        v = lw.where(lw.op("Less", v, lo_at), lo, v, np_type)
    scaled = lw.op("Mul", v, scale)
    if half_up:
        rounded = lw.op("Floor", lw.op("Add", scaled, lw.const(0.5, np_type)))
    else:
        rounded = lw.op("Round", scaled)  # ONNX Round is half to even, like rint
    out = lw.op("Mul", rounded, step)
    return (out, inv, rounded) if parts else out


def _lean_constant_range(lw: Lowering, x: str, mn, mx, axis: int, rank, grid, np_type, half_up: bool):
    """The output for a constant given range, or None where the parameters need the general sequence.

    The adjusted range, scale and inverse scale come from the reference. Per element: clamp, * scale,
    round, * inverse (4 or 5 nodes, TF's own operations). The flushes can go: a subnormal x inside the
    range times a scale below 1/(4 FLT_MIN) stays below 1/4 and rounds to a zero of x's sign, which
    is what TF's flushed x gives; a subnormal product rounds to that zero too; a nonzero rounded value
    times an inverse scale >= FLT_MIN is normal. One exception: a lower bound +0 turns a negative
    subnormal x into +0 where TF's flushed -0 stays -0, so x is flushed there (4 more nodes). The clamp
    is Clip for a scalar range (ORT's Clip is Eigen's clamp bit for bit: NaN x kept, ties keep x); per
    axis Min/Max return the bound on a signed-zero tie, so a zero bound takes the general sequence.
    """
    signed, num_bits, narrow = grid
    lo, hi, scale, inverse = reference.compute_range(
        np.asarray(mn, np_type).reshape(-1), np.asarray(mx, np_type).reshape(-1), signed, num_bits, narrow
    )
    tiny = np.finfo(np_type).tiny
    params = (lo, hi, scale, inverse)
    if not all(np.all(np.isfinite(p)) for p in params) or not np.all(lo <= hi):
        return None
    if np.any(inverse < tiny) or np.any(scale <= 0) or np.any(scale >= np_type(0.25) / tiny):
        return None
    if axis != -1 and (np.any(lo == 0) or np.any(hi == 0)):
        return None
    if axis == -1:
        if lo[0] == 0 and not np.signbit(lo[0]):
            x = lw.flush(x, np_type)
        clamped = lw.op("Clip", x, lw.const(lo[0], np_type), lw.const(hi[0], np_type))
        scale, inverse = scale[0], inverse[0]
    else:
        view = [-1] + [1] * (rank - 1 - axis)
        clamped = lw.op("Max", lw.op("Min", x, lw.const(hi.reshape(view), np_type)), lw.const(lo.reshape(view), np_type))
        scale, inverse = scale.reshape(view), inverse.reshape(view)
    scaled = lw.op("Mul", clamped, lw.const(scale, np_type))
    rounded = lw.op("Floor", lw.op("Add", scaled, lw.const(0.5, np_type))) if half_up else lw.op("Round", scaled)
    return lw.op("Mul", rounded, lw.const(inverse, np_type))


# ---- a range taken from the data (range_given=False)
#
# TF reduces the (flushed) data in Eigen's order, and that order decides more than signs: a NaN can end
# up as the range, and NaNs hide some of the values (docs/semantics.md 2.6, ort_ops/reference/
# _qdq_eigen_order.py). ReduceMin/ReduceMax cannot say which element wins (nor handle NaN reliably: ORT's
# float64 ReduceMin over [1, NaN, -inf, ...] gives 0), so the order's rules are written out below, with
# the reductions only ever seeing NaN-free operands.
#
# A NaN range gives a NaN inverse step, so every output of that range is NaN; TF keeps the step's NaN
# except for the elements ``keeps_input_nan`` names (per axis, HALF_UP), where a NaN input keeps its
# own. ORT's Mul would pick between two NaNs by its operand order (which differs between its broadcast
# paths), so the NaN is chosen with Where: ORT's Where (select X, select Y, keep the X selection where
# it is nonzero) returns X's bits exactly where X is a NaN and Y's bits exactly, -0 included, so
# ``Where(cond, a NaN, y)`` needs no sign repair.

# A key above every priority key here (rows 0..7, fold ranks below the packet width). The keys go to ArgMin as
# int32: onnxruntime 1.17 has no int64 ArgMin, and the shipped models must load there.
_BIG = 1 << 30


def _int(lw: Lowering, v) -> str:
    return lw.const(v, np.int64)


def _scalar(lw: Lowering, v: str) -> str:
    return lw.op("Reshape", v, _int(lw, []))


def _fold_rank(width: int):
    """Each packet lane's rank in the horizontal fold (a tie keeps the lower half): the lane index read
    with its bits reversed (W=8: lanes 0, 4, 2, 6, 1, 5, 3, 7 in that order)."""
    bits = width.bit_length() - 1
    return [int(format(lane, f"0{bits}b")[::-1], 2) for lane in range(width)]


def _per_tensor_range(lw: Lowering, flat: str, np_type):
    """(min, max) of the flushed 1-D ``flat`` as Eigen's vectorized full reduction finds them: scalars.

    The data padded with NaN to whole groups of 4 packets of W lanes (W = 8 for float32, 4 for float64)
    is a [G, 4, W] grid, G = n // 4W + 1: groups 0..G-2 are the blocks that the 4 packet accumulators
    take in turn (accumulator k the packets k of each group), and the last group holds the leftover
    whole packets (rows k < lr, up to 3), then the tail (the first t lanes of row lr), then the padding
    (at least one NaN). Per extreme:

    * the packets: an accumulator lane takes a new element only when it is strictly better, so a NaN
      element never enters; NaNs are masked out of a per-group reduction and the groups reduced;
    * the tail: a scalar scan that takes the new element unless the accumulator is strictly better, so
      a NaN element replaces the accumulator and the next element replaces that NaN: the tail's result
      is its last element if that is a NaN, else the extreme of the tail after its last NaN;
    * the final combine keeps the tail's result unless the packets' is strictly better: a NaN tail
      result is the range (both ends, one element), else the two extremes' extreme.

    A zero extreme takes the sign of the zero that order keeps: the last zero of the tail after its last
    NaN; else, in the packets, the lane first in the horizontal fold's rank holding a zero (a fold tie
    keeps the lower half), and in that lane accumulator 0's first zero, then accumulator 1's, 2's, 3's
    (ArgMax over the groups: the first group with a zero), then the leftover packets' in order.

    Per element: the pad, IsNaN, two masks and group reductions for the values, Equal, a uint8 Cast
    and an ArgMax for the zero; no int64 keys and no broadcast against a second operand (ORT's Where
    and Mul are several times slower when one operand repeats along a short axis).
    """
    width = order.packet_width(np_type)
    inf, ninf = lw.const(np.inf, np_type), lw.const(-np.inf, np_type)
    n = lw.op("Size", flat)
    w, group = _int(lw, width), _int(lw, 4 * width)
    blocks = lw.op("Div", n, group)
    rest = lw.op("Sub", n, lw.op("Mul", blocks, group))
    pads = lw.op("Concat", _int(lw, [0]), lw.op("Reshape", lw.op("Sub", group, rest), _int(lw, [1])), axis=0)
    padded = lw.op("Pad", flat, pads, lw.const(np.nan, np_type))
    grid = lw.op("Reshape", padded, _int(lw, [-1, 4, width]))
    nan = lw.op("IsNaN", grid)
    group_lo = lw.reduce("ReduceMin", lw.op("Where", nan, inf, grid), [1, 2], False)
    group_hi = lw.reduce("ReduceMax", lw.op("Where", nan, ninf, grid), [1, 2], False)
    is_block = lw.op("Less", lw.op("Range", _int(lw, 0), lw.op("Add", blocks, _int(lw, 1)), _int(lw, 1)), blocks)
    # values only: a zero's sign is set below (Where may drop a selected -0)
    lo_b = lw.reduce("ReduceMin", lw.op("Where", is_block, group_lo, inf), None, False)
    hi_b = lw.reduce("ReduceMax", lw.op("Where", is_block, group_hi, ninf), None, False)

    last = lw.op("Gather", grid, blocks, axis=0)  # [4, W]: leftover packets, tail, padding
    lr, t = lw.op("Div", rest, w), lw.op("Mod", rest, w)
    row, lane = _int(lw, [[0], [1], [2], [3]]), _int(lw, [list(range(width))])
    last_nan = lw.op("IsNaN", last)
    leftover = lw.op("Less", row, lr)
    counted = lw.op("And", leftover, lw.op("Not", last_nan))
    lo_l = lw.reduce("ReduceMin", lw.op("Where", counted, last, inf), None, False)
    hi_l = lw.reduce("ReduceMax", lw.op("Where", counted, last, ninf), None, False)
    in_tail = lw.op("And", lw.op("Equal", row, lr), lw.op("Less", lane, t))
    tail_nan = lw.reduce("ReduceMax", lw.op("Where", lw.op("And", in_tail, last_nan), lane, _int(lw, -2)), None, False)
    live = lw.op("And", in_tail, lw.op("Greater", lane, tail_nan))  # the tail after its last NaN
    lo_t = lw.reduce("ReduceMin", lw.op("Where", live, last, inf), None, False)
    hi_t = lw.reduce("ReduceMax", lw.op("Where", live, last, ninf), None, False)
    lo = lw.op("Min", lw.op("Min", lo_b, lo_l), lo_t)  # NaN-free operands
    hi = lw.op("Max", lw.op("Max", hi_b, hi_l), hi_t)

    zero = lw.const(0, np_type)
    is_zero = lw.op("Cast", lw.op("Equal", grid, zero), to=TensorProto.UINT8)
    first = lw.op("ArgMax", is_zero, axis=0, keepdims=1)  # [1, 4, W]: the first group with a zero
    found = lw.op("Cast", lw.op("GatherElements", is_zero, first, axis=0), to=TensorProto.BOOL)
    first = lw.op("Reshape", first, _int(lw, [4, width]))
    in_block = lw.op("And", lw.op("Reshape", found, _int(lw, [4, width])), lw.op("Less", first, blocks))
    left_zero = lw.op("And", leftover, lw.op("Equal", last, zero))
    big, four = _int(lw, _BIG), _int(lw, 4)

    def flat_at(group, k, lanes):  # the position of lane ``lanes`` of packet k of ``group``
        return lw.op("Add", lw.op("Mul", lw.op("Add", lw.op("Mul", group, four), k), w), lanes)

    # per lane, 8 candidates in accumulation order: accumulators 0..3, then leftover packets 0..2
    key = lw.op("Concat", lw.op("Where", in_block, row, big), lw.op("Where", left_zero, lw.op("Add", row, four), big), axis=0)
    at = lw.op("Concat", flat_at(first, row, lane), flat_at(blocks, row, lane), axis=0)
    best = lw.op("ArgMin", lw.op("Cast", key, to=TensorProto.INT32), axis=0, keepdims=1)  # [1, W]
    has_zero = lw.op("Less", lw.op("GatherElements", key, best, axis=0), big)
    rank = lw.op("Cast", lw.op("Where", has_zero, _int(lw, [_fold_rank(width)]), w), to=TensorProto.INT32)
    pick = lw.op("ArgMin", rank, axis=1, keepdims=0)  # [1]
    packet_zero = lw.op("Gather", lw.op("Reshape", lw.op("GatherElements", at, best, axis=0), _int(lw, [-1])), pick, axis=0)
    live_zero = lw.op("And", live, lw.op("Equal", last, zero))
    tail_zero = lw.reduce("ReduceMax", lw.op("Where", live_zero, lane, _int(lw, -1)), None, True)  # [1], -1: none
    zero_at = lw.op("Where", lw.op("Less", tail_zero, _int(lw, 0)), packet_zero, flat_at(blocks, lr, tail_zero))
    kept_zero = _scalar(lw, lw.op("Gather", padded, zero_at, axis=0))
    lo = lw.where(lw.op("Equal", lo, zero), kept_zero, lo, np_type)
    hi = lw.where(lw.op("Equal", hi, zero), kept_zero, hi, np_type)

    nan_range = lw.op("Equal", tail_nan, lw.op("Sub", t, _int(lw, 1)))  # never for t = 0 (tail_nan >= -2)
    last_element = lw.op("Gather", padded, lw.op("Max", lw.op("Sub", n, _int(lw, 1)), _int(lw, 0)), axis=0)
    return lw.op("Where", nan_range, last_element, lo), lw.op("Where", nan_range, last_element, hi)


def _last_position(lw: Lowering, flags: str, q_pre, guard) -> str:
    """Per channel, the last scan position s = q * pre + p at which the uint8 ``flags`` (the [pre, D]
    or [pre, D, post] view) is 1, or -1 if none; shaped like the keepdims reductions. ArgMax with
    select_last_index finds the last p per (channel, q), GatherElements whether it is flagged at all,
    and over q (``q_pre`` = q * pre, [1, 1, post]) the largest position wins. ``guard``: the rows to
    append for ORT's ArgMax, which fails over an empty axis (a zero row when pre is 0, else none)."""
    if guard is not None:
        flags = lw.op("Pad", flags, guard)
    last = lw.op("ArgMax", flags, axis=0, keepdims=1, select_last_index=1)
    found = lw.op("Cast", lw.op("GatherElements", flags, last, axis=0), to=TensorProto.BOOL)
    if q_pre is None:
        return lw.op("Where", found, last, _int(lw, -1))
    position = lw.op("Where", found, lw.op("Add", last, q_pre), _int(lw, -1))
    return lw.reduce("ReduceMax", position, [2], True)


def _per_axis_range(lw: Lowering, x3: str, dims, np_type, planes: bool, static_nonempty: bool):
    """Per channel (min, max), shaped [1, D, 1] (``planes``: x3 is [pre, D, post]) or [1, D] (x3 is
    [pre, D]: post is 1, and ORT broadcasts against a trailing 1 several times slower), of the flushed
    ``x3``, as TF's per-axis reduction finds them: a scalar scan over (post, pre), the element at scan
    position s = q * pre + p being x3[p, c, q], that takes the new element unless the accumulator is
    strictly better. So the range is the channel's last element in scan order (x3[pre-1, c, post-1])
    when that is a NaN; otherwise the extremes of the elements after the channel's last NaN, a zero
    extreme taking the sign of the channel's last zero (which lies after that NaN whenever the extreme
    is a zero). Per element: IsNaN, Equal, two uint8 Casts and ArgMaxes (the last NaN and the last zero),
    the comparison with the last NaN's position, two masks and reductions."""
    pre, depth, post = dims
    inf, ninf = lw.const(np.inf, np_type), lw.const(-np.inf, np_type)
    one = _int(lw, 1)
    axes = [0, 2] if planes else [0]
    p = lw.op("Reshape", lw.op("Range", _int(lw, 0), _scalar(lw, pre), one), _int(lw, [-1, 1, 1] if planes else [-1, 1]))
    q_pre = None
    position = p
    if planes:
        q = lw.op("Reshape", lw.op("Range", _int(lw, 0), _scalar(lw, post), one), _int(lw, [1, 1, -1]))
        q_pre = lw.op("Mul", q, pre)
        position = lw.op("Add", q_pre, p)  # [pre, 1, post]
    guard = None
    if not static_nonempty:
        extra = lw.op("Sub", one, lw.op("Min", pre, one))
        guard = lw.op("Concat", _int(lw, [0, 0, 0] if planes else [0, 0]), extra, _int(lw, [0, 0] if planes else [0]), axis=0)
    zero = lw.const(0, np_type)
    last_nan = _last_position(lw, lw.op("Cast", lw.op("IsNaN", x3), to=TensorProto.UINT8), q_pre, guard)
    last_zero = _last_position(lw, lw.op("Cast", lw.op("Equal", x3, zero), to=TensorProto.UINT8), q_pre, guard)
    live = lw.op("Greater", position, last_nan)
    lo = lw.reduce("ReduceMin", lw.op("Where", live, x3, inf), axes, True)
    hi = lw.reduce("ReduceMax", lw.op("Where", live, x3, ninf), axes, True)

    # x3[s % pre, c, s // pre] as a flat index; a gather of D elements
    c = lw.op("Reshape", lw.op("Range", _int(lw, 0), _scalar(lw, depth), one), _int(lw, [1, -1, 1] if planes else [1, -1]))
    row = lw.op("Mul", depth, post)
    flat = lw.op("Reshape", x3, _int(lw, [-1]))
    if not static_nonempty:  # an empty x3 has nothing to gather from (its output is empty anyway): a stand-in
        end = lw.op("Size", x3)
        flat = lw.op("Concat", flat, lw.const([0], np_type), axis=0)
    s_pre = lw.op("Max", pre, one)

    def flat_index(s):
        at_row = lw.op("Add", lw.op("Mul", lw.op("Mod", s, s_pre), row), lw.op("Mul", c, post))
        index = lw.op("Add", at_row, lw.op("Div", s, s_pre))
        return index if static_nonempty else lw.op("Min", index, end)

    kept_zero = lw.op("Gather", flat, flat_index(lw.op("Max", last_zero, _int(lw, 0))), axis=0)
    last = lw.op("Gather", flat, flat_index(lw.op("Max", lw.op("Sub", lw.op("Mul", pre, post), one), _int(lw, 0))), axis=0)
    lo = lw.where(lw.op("Equal", lo, zero), kept_zero, lo, np_type)
    hi = lw.where(lw.op("Equal", hi, zero), kept_zero, hi, np_type)
    nan_range = lw.op("IsNaN", last)
    return lw.op("Where", nan_range, last, lo), lw.op("Where", nan_range, last, hi)


def _keeps_input_nan(lw: Lowering, dims, np_type, planes: bool) -> str:
    """A [pre, 1, post] (``planes``) or [pre, 1] bool: where TF's per-axis, data-range, HALF_UP result keeps a NaN input's own
    NaN over the step's (``_qdq_eigen_order.keeps_input_nan``), from the run-time dims.

    Eigen's tiled executor runs blocks of cols = min(post, T) columns; when a row fits (cols = post) and
    D = 1, the block's rows = min(pre, ceil(T / cols)) lie one after another in memory and form one inner
    run, otherwise each block row is a run. Written as one formula: position f = q + p * post * merged
    in runs of R over a length L ((pre * post, rows * post) merged, else (post, cols)); a run's last
    len % W positions are its scalar tail, which keeps the step's NaN.
    """
    pre, depth, post = dims
    width = order.packet_width(np_type)
    one = _int(lw, 1)
    tile = _int(lw, [order.TILE_COEFFS[np.dtype(np_type)]])  # the tile TF's build uses
    cols = lw.op("Max", lw.op("Min", post, tile), one)
    merged = lw.op("And", lw.op("Equal", cols, post), lw.op("Equal", depth, one))
    rows = lw.op("Min", pre, lw.op("Div", lw.op("Sub", lw.op("Add", tile, cols), one), cols))
    length = lw.op("Where", merged, lw.op("Mul", pre, post), post)
    run = lw.op("Where", merged, lw.op("Max", lw.op("Mul", rows, post), one), cols)
    stride = lw.op("Mul", lw.op("Cast", merged, to=TensorProto.INT64), post)
    p = lw.op("Reshape", lw.op("Range", _int(lw, 0), _scalar(lw, pre), one), _int(lw, [-1, 1, 1] if planes else [-1, 1]))
    f = lw.op("Mul", p, stride)
    if planes:
        f = lw.op("Add", f, lw.op("Reshape", lw.op("Range", _int(lw, 0), _scalar(lw, post), one), _int(lw, [1, 1, -1])))
    at = lw.op("Mod", f, run)
    run_len = lw.op("Min", run, lw.op("Sub", length, lw.op("Sub", f, at)))
    return lw.op("Less", at, lw.op("Sub", run_len, lw.op("Mod", run_len, _int(lw, width))))


def _from_data(lw: Lowering, x: str, axis: int, rank, grid, np_type, half_up: bool) -> str:
    """The output for a range taken from the data (see the section comment above), computed on a flat
    (per tensor) or [pre, D(, post)] (per axis) view of x and reshaped back."""
    min_q, max_q = grid
    if axis == -1:
        flat = lw.flush(lw.op("Reshape", x, _int(lw, [-1])), np_type)
        mn, mx = _per_tensor_range(lw, flat, np_type)
        out, inv, _ = quantize_dequantize(lw, flat, mn, mx, min_q, max_q, np_type, False, half_up, flushed=True, parts=True)
        # a NaN range: every output is the step's NaN
        return lw.reshape_to(lw.op("Where", lw.op("IsNaN", inv), inv, out), lw.op("Shape", x))
    static = lw.shape(0)
    static_nonempty = static is not None and all(d > 0 for d in static)
    planes = not (axis == rank - 1 or (static is not None and all(d == 1 for d in static[axis + 1:])))
    pre = _int(lw, [1]) if axis == 0 else lw.reduce("ReduceProd", lw.dims_of(x, range(axis)), [0], True)
    depth = lw.dims_of(x, [axis])
    post = lw.reduce("ReduceProd", lw.dims_of(x, range(axis + 1, rank)), [0], True) if planes else _int(lw, [1])
    dims = (pre, depth, post)
    view = lw.op("Concat", pre, depth, post, axis=0) if planes else lw.op("Concat", pre, depth, axis=0)
    x3 = lw.flush(lw.reshape_to(x, view), np_type)
    mn, mx = _per_axis_range(lw, x3, dims, np_type, planes, static_nonempty)
    out, inv, rounded = quantize_dequantize(lw, x3, mn, mx, min_q, max_q, np_type, False, half_up, flushed=True, parts=True)
    step_nan = inv
    if half_up:  # where the input's NaN is kept: a NaN input there shows through
        own = lw.op("And", _keeps_input_nan(lw, dims, np_type, planes), lw.op("IsNaN", rounded))
        step_nan = lw.op("Where", own, rounded, inv)
    out = lw.op("Where", lw.op("IsNaN", inv), step_nan, out)
    return lw.reshape_to(out, lw.op("Shape", x))


# ---- a given range whose step is NaN
#
# The step (TF's inverse scale) is NaN when it comes from the max side and the max is NaN, or is 0/0
# (a max of 0 on a grid whose max_q is 0: the 1-bit signed grids); the min side never yields one. Then
# every output of that channel is NaN, and which NaN follows from TF's code path per element
# (``_qdq_eigen_order.keeps_input_nan`` with range_given): the input's own NaN for a NaN input, except
# in the scalar tail of each channel's pre * post elements (the last L % W, W = 8 float32 / 4 float64),
# which keeps the step's. ``quantize_dequantize(nan_step=True)`` gives the former everywhere at no cost
# per element; ``_given_range_tails`` writes the step's NaN into the tails. A constant range is checked
# at conversion time: only a NaN step there pays for either.


def _step_may_be_nan(constant, grid, np_type) -> bool:
    """False only for a constant range whose step (computed as TF does) has no NaN."""
    mn, mx = constant
    if mn is None or mx is None:
        return True
    signed, num_bits, narrow = grid
    inverse = reference.compute_range(
        np.asarray(mn, np_type).reshape(-1), np.asarray(mx, np_type).reshape(-1), signed, num_bits, narrow
    )[3]
    return bool(np.isnan(inverse).any())


def _given_range_tails(lw: Lowering, out: str, x: str, inv: str, axis: int, rank, np_type) -> str:
    """``out`` with each channel's scalar tail set to the step's NaN where the step is NaN.

    On the [pre, D, post] view (per tensor [1, 1, N]) the tail is the positions k = p * post + q in
    [L - L % W, L), L = pre * post, the same in every channel: a ScatterND of D * (L % W) < D * W values
    (GatherND of the old ones, Where the step is NaN). Per element: the ScatterND (one copy of the output)
    and two Reshapes (ORT runs Reshape without a copy); so a range given at run time costs 30 nodes per
    element (31 with HALF_UP) where it cost 27 (28) before, the rest being small per-channel nodes. A
    static shape whose L is a multiple of W has no tail: nothing is added there.
    """
    width = order.packet_width(np_type)
    static = lw.shape(0)
    if static is not None and all(d >= 0 for d in static):
        dims = [int(np.prod(static))] if axis == -1 else [int(np.prod(static[:axis])), static[axis], int(np.prod(static[axis + 1:]))]
        length = dims[0] if axis == -1 else dims[0] * dims[2]
        if length % width == 0:
            return out
    one = _int(lw, [1])
    if axis == -1:
        pre, depth, post = one, one, lw.op("Reshape", lw.op("Size", x), one)
    else:
        pre = one if axis == 0 else lw.reduce("ReduceProd", lw.dims_of(x, range(axis)), [0], True)
        depth = lw.dims_of(x, [axis])
        post = one if axis == rank - 1 else lw.reduce("ReduceProd", lw.dims_of(x, range(axis + 1, rank)), [0], True)
    length = lw.op("Mul", pre, post)
    start = lw.op("Sub", length, lw.op("Mod", length, _int(lw, [width])))
    k = lw.op("Range", _scalar(lw, start), _scalar(lw, length), _int(lw, 1))  # [t]
    cols = lw.op("Max", post, one)
    p, q = lw.op("Div", k, cols), lw.op("Mod", k, cols)
    c = lw.op("Range", _int(lw, 0), _scalar(lw, depth), _int(lw, 1))
    shape = lw.op("Concat", depth, lw.op("Shape", k), one, axis=0)  # [D, t, 1]
    spread = lambda v, view: lw.op("Expand", lw.op("Reshape", v, _int(lw, view)), shape)  # noqa: E731
    at = lw.op("Concat", spread(p, [1, -1, 1]), spread(c, [-1, 1, 1]), spread(q, [1, -1, 1]), axis=2)
    out3 = lw.reshape_to(out, lw.op("Concat", pre, depth, post, axis=0))
    inv = lw.op("Reshape", inv, _int(lw, [-1, 1]))  # [D, 1] (per tensor [1, 1])
    # Where returns the NaN step and the kept values bit for bit (the selected X is never a zero)
    tail = lw.op("Where", lw.op("IsNaN", inv), inv, lw.op("GatherND", out3, at))
    return lw.reshape_to(lw.op("ScatterND", out3, at, tail), lw.op("Shape", x))


def _lower_forward(ctx, node, version: int):
    lw = Lowering(ctx, node)
    lw.validate()  # the spec's checks (ort_ops.checks.quantize_dequantize): what TF rejects fails here
    np_type = NP_TYPES[lw.dtype(0)]  # T: float32 or float64 (the spec's types)
    attrs = lw.attrs
    signed, narrow, axis, range_given = attrs["signed_input"], attrs["narrow_range"], attrs["axis"], attrs["range_given"]
    if version == 3:
        half_up = False
        bits = lw.constant_value(3)
        if bits is None:
            lw.fail("num_bits must be a constant for the standard lowering (its range cannot be checked at run time)")
        num_bits = int(bits)
    else:
        half_up = attrs["round_mode"] == "HALF_UP"
        num_bits = attrs["num_bits"]
    min_q, max_q = reference.quantized_bounds(signed, num_bits, narrow)
    rank = _rank_for_axis(lw, axis, 0)
    constant = (lw.constant_value(1), lw.constant_value(2)) if range_given else (None, None)
    lw.take_over()
    x = lw.inputs[0]
    if constant[0] is not None and constant[1] is not None:
        out = _lean_constant_range(lw, x, *constant, axis, rank, (signed, num_bits, narrow), np_type, half_up)
        if out is not None:
            lw.emit(0, out)
            return
    if not range_given:
        lw.emit(0, _from_data(lw, x, axis, rank, (min_q, max_q), np_type, half_up))
        return
    mn, mx = lw.inputs[1], lw.inputs[2]
    if axis != -1:
        mn, mx = _per_axis_view(lw, mn, axis, rank), _per_axis_view(lw, mx, axis, rank)
    nan_step = _step_may_be_nan(constant, (signed, num_bits, narrow), np_type)
    out, inv, _ = quantize_dequantize(lw, x, mn, mx, min_q, max_q, np_type, range_given, half_up, parts=True, nan_step=nan_step)
    if nan_step:
        out = _given_range_tails(lw, out, x, inv, axis, rank, np_type)
    lw.emit(0, out)


def lower_v2(ctx, node):
    _lower_forward(ctx, node, 2)


def lower_v3(ctx, node):
    _lower_forward(ctx, node, 3)


def lower_v4(ctx, node):
    _lower_forward(ctx, node, 4)


def _lean_grad_bounds(lw: Lowering, mn, mx, axis: int, rank, np_type):
    """Constant bounds lo, hi with ``lo <= x <= hi`` on the unflushed x equal to TF's test on the flushed
    x against the flushed range: a zero bound (after the flush) becomes the largest subnormal of the
    side away from the range (a flushed x is >= 0 exactly when x > -FLT_MIN), a normal bound decides
    subnormal x like zero anyway. Then dx = flushed g * mask (9 nodes), whose product is never subnormal.
    """
    largest_subnormal = np.nextafter(np.finfo(np_type).tiny, np_type(0))
    lo = reference.flush(np.asarray(mn, np_type))
    hi = reference.flush(np.asarray(mx, np_type))
    lo = np.where(lo == 0, -largest_subnormal, lo).astype(np_type)
    hi = np.where(hi == 0, largest_subnormal, hi).astype(np_type)
    if axis != -1:
        view = [-1] + [1] * (rank - 1 - axis)
        lo, hi = lo.reshape(view), hi.reshape(view)
    return lw.const(lo, np_type), lw.const(hi, np_type)


def lower_v4_grad(ctx, node):
    lw = Lowering(ctx, node)
    lw.validate()
    t = lw.dtype(0)
    np_type = NP_TYPES[t]
    axis = lw.attrs["axis"]
    rank = _rank_for_axis(lw, axis, 1)
    constant = lw.constant_value(2), lw.constant_value(3)
    lw.take_over()
    g, x, mn, mx = lw.inputs
    if constant[0] is not None and constant[1] is not None:
        lo, hi = _lean_grad_bounds(lw, *constant, axis, rank, np_type)
        inside = lw.op("And", lw.op("GreaterOrEqual", x, lo), lw.op("LessOrEqual", x, hi))
        lw.emit(0, lw.op("Mul", lw.flush(g, np_type), lw.mask_as(inside, t)))
        lw.emit(1, lw.const(np.zeros_like(constant[0], np_type), np_type))
        lw.emit(2, lw.const(np.zeros_like(constant[1], np_type), np_type))
        return
    # denormals-are-zero on the inputs; only g's zero sign reaches the output
    g, x = lw.flush(g, np_type), lw.flush(x, np_type, keep_sign=False)
    lo, hi = lw.flush(mn, np_type, keep_sign=False), lw.flush(mx, np_type, keep_sign=False)
    if axis != -1:
        lo, hi = _per_axis_view(lw, lo, axis, rank), _per_axis_view(lw, hi, axis, rank)
    # TF multiplies by the mask (so -g*0 = -0 and inf*0 = NaN outside the range), using the given range.
    inside = lw.op("And", lw.op("LessOrEqual", lo, x), lw.op("LessOrEqual", x, hi))
    lw.emit(0, lw.op("Mul", g, lw.mask_as(inside, t)))
    lw.emit(1, lw.zeros_like(mn, np_type))
    lw.emit(2, lw.zeros_like(mx, np_type))


LOWERINGS = {
    "QuantizeAndDequantizeV2": lower_v2,
    "QuantizeAndDequantizeV3": lower_v3,
    "QuantizeAndDequantizeV4": lower_v4,
    "QuantizeAndDequantizeV4Grad": lower_v4_grad,
}
