"""Which NaN, or which signed zero, QuantizeAndDequantize keeps when the choice is one of order.

Values never depend on these rules; only the bits of a NaN or the sign of a zero do. TF's CPU kernel
leaves them to Eigen's evaluation order, so this module states that order explicitly (matched
against TF 2.21 on inputs full of NaNs of both signs and of signed zeros):

* the per-tensor data range: Eigen's vectorized full reduction (``eigen_extreme``);
* the per-axis data range: Eigen's generic reduction over dims {0, 2} of [pre, depth, post], a plain
  scalar scan in (post, pre) order with ``std::min(t, acc)`` / ``std::max(t, acc)``
  (``per_axis_extremes``);
* the final ``rounded * inverse`` when both are NaN (the input is NaN and the range's max is NaN):
  whether the product carries the input's NaN or the step's NaN follows from which of TF's code
  paths computes that element (``keeps_input_nan``).
"""
from __future__ import annotations

import numpy as np

_PACKET = {np.dtype(np.float32): 8, np.dtype(np.float64): 4}  # AVX packet widths in TF's build

# Eigen's tiled executor cuts the per-axis, data-range, HALF_UP expression into blocks of this many
# coefficients (kTaskSize over the expression's cost per coefficient: fixed by the expression type).
TILE_COEFFS = {np.dtype(np.float32): 11428, np.dtype(np.float64): 5714}


def packet_width(dtype) -> int:
    return _PACKET[np.dtype(dtype)]


# ---- per-tensor range: Eigen's vectorized full reduction (single-threaded order).
# Lane-wise comparisons in the operand orders of Eigen's MinReducer/MaxReducer (PropagateFast);
# each returns ``a`` or ``b`` per lane.
def _pick_greater_else_second(a, b):
    return np.where(a > b, a, b)  # MAXPS(a, b), std::max(b, a)


def _pick_less_else_second(a, b):
    return np.where(a < b, a, b)  # MINPS(a, b); also std::min(b, a)


MAX_OPS = {
    # reduce one scalar t into the accumulator: std::max(t, acc)
    "scalar": lambda acc, t: _pick_greater_else_second(acc, t),
    # reduce a packet p into the packet accumulator: std::max(acc, p)
    "packet": lambda acc, p: _pick_greater_else_second(p, acc),
    # horizontal fold of the packet's upper half onto its lower half: MAXPS(upper, lower)
    "fold": lambda lower, upper: _pick_greater_else_second(upper, lower),
    # final combine of the scalar and the packet result: std::max(scalar, packet)
    "final": lambda scalar, packet: _pick_greater_else_second(packet, scalar),
}
MIN_OPS = {
    "scalar": lambda acc, t: _pick_less_else_second(acc, t),
    "packet": lambda acc, p: _pick_less_else_second(p, acc),
    "fold": lambda lower, upper: _pick_less_else_second(upper, lower),
    "final": lambda scalar, packet: _pick_less_else_second(packet, scalar),
}


def eigen_extreme(v, ops, init):
    """The min (or max) of the 1-D ``v`` the way Eigen's single-threaded full reduction finds it:
    4 packet accumulators over blocks of 4 packets (folded into the first in order), the remaining
    whole packets, the scalar tail, a horizontal fold, and a final combine."""
    width = _PACKET[v.dtype]
    n = v.shape[0]
    whole4 = (n // (4 * width)) * 4 * width
    whole = (n // width) * width
    start = np.full(width, init, dtype=v.dtype)
    packet = start
    if whole4:
        blocks = v[:whole4].reshape(-1, 4, width)
        accs = []
        for k in range(4):
            acc = start
            for row in blocks[:, k, :]:
                acc = ops["packet"](acc, row)
            accs.append(acc)
        packet = ops["packet"](ops["packet"](ops["packet"](accs[0], accs[1]), accs[2]), accs[3])
    for row in v[whole4:whole].reshape(-1, width):
        packet = ops["packet"](packet, row)
    scalar = np.asarray(init, dtype=v.dtype)
    for value in v[whole:]:
        scalar = ops["scalar"](scalar, value)
    while packet.shape[0] > 1:
        half = packet.shape[0] // 2
        packet = ops["fold"](packet[:half], packet[half:])
    return ops["final"](scalar, packet[0])


def per_tensor_extremes(values):
    """(min, max) of a 1-D array; the order emulation runs only when order can matter: with NaNs
    present, or when an extreme is a zero (whose sign depends on which zero wins)."""
    if not np.isnan(values).any():
        lo, hi = values.min(), values.max()
        if lo != 0 and hi != 0:
            return lo, hi
    return eigen_extreme(values, MIN_OPS, np.inf), eigen_extreme(values, MAX_OPS, -np.inf)


# ---- per-axis range: a scalar scan in (post, pre) order.
def _scan_extreme(seq, is_max: bool):
    """The result of ``acc = std::min(t, acc)`` (or max) over ``seq`` from +-inf.

    Both operations return ``t`` unless ``acc`` strictly wins, so a NaN ``t`` is kept and a NaN
    ``acc`` is dropped at the next element: the result is the last element if it is NaN, else the
    extreme of the elements after the last NaN, where a tie between +0 and -0 goes to the later one.
    """
    nan_at = np.flatnonzero(np.isnan(seq))
    if nan_at.size and nan_at[-1] == seq.size - 1:
        return seq[-1]
    tail = seq[nan_at[-1] + 1 :] if nan_at.size else seq
    best = tail.max() if is_max else tail.min()
    if best == 0:
        zeros = np.flatnonzero(tail == 0)
        best = tail[zeros[-1]]
    return best


def per_axis_extremes(x3):
    """Per-channel (min, max) of a [pre, depth, post] array over dims 0 and 2, as TF finds them."""
    pre, depth, post = x3.shape
    ordered = np.transpose(x3, (1, 2, 0)).reshape(depth, post * pre)  # the scan order per channel
    lo = np.array([_scan_extreme(row, False) for row in ordered], dtype=x3.dtype).reshape(depth)
    hi = np.array([_scan_extreme(row, True) for row in ordered], dtype=x3.dtype).reshape(depth)
    return lo, hi


# ---- which NaN ``rounded * inverse`` keeps when both are NaN.
def _tail_of_runs(length: int, run: int, width: int):
    """For positions 0..length-1 cut into runs of ``run``: True where Eigen's inner loop handles the
    position with a scalar step (the last ``run % width`` of each run) rather than a packet."""
    pos = np.arange(length) % run
    run_len = np.minimum(run, length - (np.arange(length) // run) * run)
    return pos >= run_len - run_len % width


def keeps_input_nan(pre: int, depth: int, post: int, dtype, *, per_axis: bool, range_given: bool, round_mode: str):
    """A [pre, post] mask (the same for every channel), or a bool for all positions: True where
    TF's result keeps the input's NaN, False where it keeps the step's.

    TF's packet code keeps the input's NaN and its scalar code the step's, except where noted:
    - a given range (the clamped expression, evaluated flat per channel): the input's, but the
      step's on the scalar tail of each channel's pre*post elements;
    - per tensor, data range: the step's everywhere;
    - per axis, data range, HALF_TO_EVEN: the step's everywhere;
    - per axis, data range, HALF_UP: Eigen's tiled executor. Its blocks are [rows, cols] of the
      [pre, post] channel view with cols = min(post, T) and rows = min(pre, ceil(T / cols))
      (T = TILE_COEFFS); each block row is an inner run, and a block's rows merge into one run when
      they are contiguous in memory (depth 1 and whole rows). Each run's scalar tail keeps the step's.
    """
    if not range_given and (not per_axis or round_mode == "HALF_TO_EVEN"):
        return False
    width = packet_width(dtype)
    if range_given:
        flat = ~_tail_of_runs(pre * post, max(pre * post, 1), width)
        return flat.reshape(pre, post)
    tile = TILE_COEFFS[np.dtype(dtype)]
    cols = min(post, tile)
    if cols < post or depth > 1:
        return np.broadcast_to(~_tail_of_runs(post, max(cols, 1), width), (pre, post))
    rows = min(pre, -(-tile // max(cols, 1)))
    flat = ~_tail_of_runs(pre * post, max(rows * post, 1), width)
    return flat.reshape(pre, post)
