"""The examples' data, real and shipped with scikit-learn (no download):

* ``digits(size)``: the 1,797 labelled 8x8 handwritten digits of ``sklearn.datasets.load_digits`` (10 classes,
  about 180 each), scaled to [0, 1], upsampled to ``size`` x ``size`` by bilinear interpolation (pixel centres
  aligned, as ``tf.image.resize``'s default) and repeated over three channels, split once and for all into
  1,437 training and 360 held-out images (a seeded permutation, ``SPLIT_SEED``).
* ``photographs(batch, size)``: square crops of scikit-learn's two sample photographs (``load_sample_images``:
  a temple and a flower, 427x640), resized to ``size``, in [0, 1]: realistic full-size inputs of another kind.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

SPLIT_SEED = 0
HELD_OUT = 360
NUM_CLASSES = 10


@dataclasses.dataclass(frozen=True)
class Split:
    train_images: np.ndarray  # [1437, size, size, 3] float32 in [0, 1]
    train_labels: np.ndarray  # [1437] int32
    test_images: np.ndarray  # [360, size, size, 3], held out: never trained on
    test_labels: np.ndarray


def _interpolation(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in] bilinear weights with half-pixel centres, edges clamped."""
    centres = (np.arange(n_out) + 0.5) * n_in / n_out - 0.5
    centres = np.clip(centres, 0.0, n_in - 1)
    low = np.floor(centres).astype(int)
    high = np.minimum(low + 1, n_in - 1)
    frac = centres - low
    weights = np.zeros((n_out, n_in))
    weights[np.arange(n_out), low] += 1.0 - frac
    weights[np.arange(n_out), high] += frac
    return weights


@functools.lru_cache(maxsize=None)
def digits(size: int) -> Split:
    from sklearn.datasets import load_digits

    data = load_digits()
    grey = data.images / 16.0  # [n, 8, 8], 0..16 -> [0, 1]
    rows = _interpolation(8, size)
    up = np.einsum("ri,nij,cj->nrc", rows, grey, rows)
    images = np.repeat(np.clip(up, 0.0, 1.0)[..., None], 3, axis=-1).astype(np.float32)
    labels = data.target.astype(np.int32)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(labels))
    test, train = order[:HELD_OUT], order[HELD_OUT:]
    return Split(images[train], labels[train], images[test], labels[test])


def in_batches(run, images: np.ndarray, batch: int = 120) -> np.ndarray:
    """``run`` (a batch of images -> an array, e.g. logits) over ``images`` in batches of ``batch``, concatenated:
    the held-out set through TF or ONNX Runtime without holding all of its activations at once."""
    return np.concatenate([np.asarray(run(images[i:i + batch])) for i in range(0, len(images), batch)])


def photographs(batch: int, size: int, seed: int = 0) -> np.ndarray:
    """``batch`` square crops (side a third of the photograph's height or more, at seeded places), alternating
    between the two photographs, nearest-neighbour resized to ``size``: [batch, size, size, 3] float32 in [0, 1]."""
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    rng = np.random.default_rng(seed)
    out = []
    for i in range(batch):
        photo = photos[i % len(photos)]
        h, w = photo.shape[:2]
        side = int(rng.integers(min(h, w) // 3, min(h, w)))
        top, left = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
        rows = top + (np.arange(size) * side) // size
        cols = left + (np.arange(size) * side) // size
        out.append(photo[rows][:, cols])
    return np.stack(out).astype(np.float32) / 255.0
