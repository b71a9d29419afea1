"""Seeded element values and shapes: ordinary numbers mixed with the values kernels get wrong.

Special values are subnormals, +-0, NaN, +-Inf, the largest finite value, and numbers that sit exactly on
or halfway between quantization grid points (small multiples of 1/2, 1/4 ...).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), BFLOAT16)
# Wrong element types to feed where a float is expected (and the other way round).
WRONG_DTYPES = FLOAT_DTYPES + (np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.uint8), np.dtype(np.bool_))
INT32_MAX = 2**31 - 1


def specials(dtype) -> np.ndarray:
    """+-0, +-Inf, NaN, the smallest subnormals, subnormals near the normal range, the smallest normals
    and the largest finite values of a float ``dtype``."""
    dtype = np.dtype(dtype)
    fi = ml_dtypes.finfo(dtype) if dtype == BFLOAT16 else np.finfo(dtype)
    tiny = float(fi.smallest_subnormal)
    values = [0.0, -0.0, np.inf, -np.inf, np.nan, tiny, -tiny, 3 * tiny, float(fi.tiny) / 2, -float(fi.tiny) / 3,
              float(fi.tiny), -float(fi.tiny), float(fi.max), -float(fi.max)]
    with np.errstate(all="ignore"):
        out = np.array(values, dtype=np.float64).astype(dtype)
    out[4] = np.array(np.nan, dtype)  # (bfloat16's conversion keeps NaN)
    return out


def floats(rng: np.random.Generator, shape, dtype, special_rate: float = 0.0, scale: float = 4.0) -> np.ndarray:
    """Values of a float ``dtype``: normal with ``scale``, a third of them on a grid of quarters (ties), and
    a ``special_rate`` share of special values."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    x = rng.normal(size=n) * scale
    on_grid = rng.random(n) < 0.33
    x[on_grid] = np.round(x[on_grid] * 4) / 4
    with np.errstate(all="ignore"):
        out = x.astype(dtype)
    if special_rate > 0 and n:
        pick = rng.random(n) < special_rate
        pool = specials(dtype)
        out[pick] = pool[rng.integers(0, len(pool), int(pick.sum()))]
    return out.reshape(shape)


def cast(rng: np.random.Generator, x: np.ndarray, dtype) -> np.ndarray:
    """``x`` as another element type (integer types get small integers; bool random bits)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f" or dtype == BFLOAT16:
        with np.errstate(all="ignore"):
            return np.asarray(x).astype(np.float64).astype(dtype)
    if dtype == np.bool_:
        return rng.random(np.shape(x)) < 0.5
    return rng.integers(-5, 6, size=np.shape(x)).astype(dtype)


def dim(rng: np.random.Generator, small: int = 5) -> int:
    """One dimension: mostly 1..small, sometimes 0 or 1."""
    r = rng.random()
    if r < 0.08:
        return 0
    if r < 0.3:
        return 1
    return int(rng.integers(1, small + 1))


def shape(rng: np.random.Generator, rank: int, small: int = 5, vector_axis=None) -> tuple:
    """A shape of ``rank`` dims; now and then one dim is long (the others 1) or huge with another dim 0.
    ``vector_axis`` (an index, negative allowed) sizes another input (per-channel ranges, batch-norm
    statistics), so it is never huge."""
    dims = [dim(rng, small) for _ in range(rank)]
    fixed = None if vector_axis is None or not rank else vector_axis % rank
    r = rng.random()
    if rank and r < 0.06:
        dims = [1] * rank
        dims[int(rng.integers(rank))] = int(rng.choice([1000, 4099, 65537]))
    elif rank >= 2 + (fixed is not None) and r < 0.1:
        free = [k for k in range(rank) if k != fixed]
        i, j = rng.choice(free, 2, replace=False)
        dims[i], dims[j] = int(rng.choice([INT32_MAX, 2**31, 2**40])), 0
    return tuple(dims)
