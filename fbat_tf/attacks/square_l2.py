"""The pieces of the Square Attack's L2 form (Andriushchenko et al., 2020), which
`square.Square(eps, norm="l2")` puts together, as the public reference (fra31/auto-attack,
`attack_single_run`'s L2 branch) runs it. ε is in [0, 1]-pixel units and ‖·‖ over all of one
image's pixels unless said "per channel" (over the image's rows and columns, one channel).

    eta(5)                                   # the 5×5 pattern a window gets: unit L2 norm
    start(start_signs, start_flips, 32, 32)  # the start's direction: a grid of eta(6) tiles
    query_side(0.8, 32, 32)                  # 29: √(0.8 · 32 · 32), made odd

The start: a grid of s×s tiles, s = H // 5, from row and column (H − 5s) // 2 on, H // s tiles
down and W // s across, each `eta(s)` (transposed or not, a coin per tile) times a sign per
example and channel; then x_best = clip(x + ε·δ/‖δ‖, 0, 1). Where the last tiles run past the
image's border they are cut there (the reference fails to broadcast them, e.g. for H = 12, 14
or 24).

A query with side s (`query_side`) takes two random s×s windows W1 and W2. Per example and
channel c, W1's new content is eta(s) (transposed or not, a coin per query for the batch) times a
random sign, plus δ on W1 normalized per channel, rescaled per channel to the norm
√(max(ε² − ‖δ‖², 0)/C + ‖δ on W1 ∪ W2, channel c‖²): the mass of both windows, and an equal share
per channel of what the clip left of the budget, moves into W1. W2 is zeroed, W1 written, and the
candidate is clip(x + ε·δ/‖δ‖, 0, 1): on the sphere of radius ε before the clip, which only
shortens δ (x ∈ [0, 1]), so every point lies in C.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import tensorflow as tf

# The reference's guard against dividing by a zero norm (added to the norm).
TINY = 1e-12


def eta(side: int) -> np.ndarray:
    """The reference's `eta(side)` before its random transposition, [side, side] float64 of unit
    L2 norm: its top side // 2 rows hold a rectangle pattern, the other rows minus one.

    In a rectangle of h rows and `side` columns the reference adds 1/(k + 1)² on the square of
    side 2k + 1 centred on (h // 2, side // 2), cut to the rectangle, for k < K = side // 2 + 1:
    a pixel at Chebyshev distance d from the centre holds Σ_{m=d+1}^{K} 1/m². Each rectangle is
    normalized to unit norm, then the whole."""
    levels = side // 2 + 1
    # tails[d] = Σ_{m=d+1}^{K} 1/m²
    tails = np.cumsum(1.0 / np.arange(levels, 0, -1, dtype=np.float64) ** 2)[::-1]

    def rectangle(height: int) -> np.ndarray:
        rows = np.abs(np.arange(height) - height // 2)[:, None]
        cols = np.abs(np.arange(side) - side // 2)[None, :]
        values = tails[np.maximum(rows, cols)]
        return values / np.linalg.norm(values) if height else values

    pattern = np.concatenate([rectangle(side // 2), -rectangle(side - side // 2)])
    return pattern / np.linalg.norm(pattern)


def query_side(p: float, height: int, width: int) -> int:
    """The L2 form's square side for a fraction p of the pixels: max(round(√(p·H·W)), 3),
    plus 1 if even, capped at the shorter side (Python's round, like torch's, halves to even)."""
    side = max(int(round(math.sqrt(p * height * width))), 3)
    return min(side + 1 - side % 2, height, width)


def grid(height: int, width: int) -> tuple[int, int, int, int]:
    """The start's tiles: (side s = H // 5, offset (H − 5s) // 2 of the first from the top and
    from the left, tiles down H // s, tiles across W // s)."""
    side = height // 5
    if side == 0 or width < side:
        raise ValueError(
            f"Square's L2 start needs images of at least 5 rows and H // 5 columns, got "
            f"{height}×{width}"
        )
    return side, (height - 5 * side) // 2, height // side, width // side


class Draws(NamedTuple):
    """Every random draw of one L2 search on a batch of n examples."""

    start_signs: tf.Tensor  # [n, tiles down, tiles across, C] ±1: a start tile's sign
    start_flips: tf.Tensor  # [tiles down, tiles across] bool: the tile's pattern transposed
    signs: tf.Tensor  # [n, queries, C] ±1: window 1's pattern sign per example and channel
    corners: tf.Tensor  # [queries, 2, 2] int32: (top, left) of window 1, then of window 2
    flips: tf.Tensor  # [queries] bool: window 1's pattern transposed, one for the batch


def draws(seed: tf.Tensor, shape: tf.TensorShape, sides: list[int]) -> Draws:
    """`Draws` for a batch of `shape` and the square side at every query, all from the
    stateless seed and before the search (an XLA-compiled search would draw other numbers). As
    the reference's random_int(0, H − s), a corner is in {0, ..., H − s − 1} (0 when s = H)."""
    _, height, width, channels = shape
    _, _, down, across = grid(height, width)
    seeds = tf.unstack(tf.random.experimental.stateless_split(seed, 5))

    def bits(shape: list[int], bits_seed: tf.Tensor) -> tf.Tensor:
        return tf.random.stateless_uniform(shape, bits_seed, 0, 2, dtype=tf.int32)

    uniform = tf.random.stateless_uniform([len(sides), 2, 2], seeds[3], dtype=tf.float32)
    room = tf.constant([[height, width]], tf.float32) - tf.constant(sides, tf.float32)[:, None]
    return Draws(
        start_signs=tf.cast(2 * bits([shape[0], down, across, channels], seeds[0]) - 1, tf.float32),
        start_flips=tf.equal(bits([down, across], seeds[1]), 1),
        signs=tf.cast(2 * bits([shape[0], len(sides), channels], seeds[2]) - 1, tf.float32),
        corners=tf.cast(uniform * room[:, None, :], tf.int32),
        flips=tf.equal(bits([len(sides)], seeds[4]), 1),
    )


def start(start_signs: tf.Tensor, start_flips: tf.Tensor, height: int, width: int) -> tf.Tensor:
    """The start's direction δ0 [n, H, W, C] (not yet normalized): the `grid` of eta(s) tiles,
    each transposed where `start_flips` says and times its `start_signs`; 0 off the tiles."""
    side, offset, down, across = grid(height, width)
    pattern = eta(side)

    def layout(length: int, tiles: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # Per row (column): its tile, its place in the tile, and whether a tile covers it.
        position = np.arange(length) - offset
        tile = position // side
        covered = (position >= 0) & (tile < tiles)
        return np.clip(tile, 0, tiles - 1), position % side, covered

    row_tile, row_in, row_covered = layout(height, down)
    col_tile, col_in, col_covered = layout(width, across)
    covered = (row_covered[:, None] & col_covered[None, :]).astype(np.float32)
    plain = pattern[row_in[:, None], col_in[None, :]].astype(np.float32) * covered
    transposed = pattern[col_in[None, :], row_in[:, None]].astype(np.float32) * covered
    flips = tf.gather(tf.gather(start_flips, row_tile, axis=0), col_tile, axis=1)
    signs = tf.gather(tf.gather(start_signs, row_tile, axis=1), col_tile, axis=2)
    return tf.where(flips, transposed, plain)[None, :, :, None] * signs


def pattern_table(sides: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(eta of each distinct side in `sides`, at the top left of a [size, size] array of zeros
    (size: the largest side), float32 [k, size, size]; each query's row of it, int32)."""
    distinct = sorted(set(sides))
    size = max(distinct, default=1)
    table = np.zeros([len(distinct), size, size], np.float32)
    for row, side in enumerate(distinct):
        table[row, :side, :side] = eta(side)
    row_of = {side: row for row, side in enumerate(distinct)}
    return table, np.asarray([row_of[side] for side in sides], np.int32)


def window(side: tf.Tensor, top: tf.Tensor, left: tf.Tensor, height: int, width: int, dtype):
    """1 on the side×side window with top-left corner (top, left), else 0: [H, W]."""
    rows, cols = tf.range(height), tf.range(width)
    in_rows = tf.logical_and(rows >= top, rows < top + side)
    in_cols = tf.logical_and(cols >= left, cols < left + side)
    return tf.cast(tf.logical_and(in_rows[:, None], in_cols[None, :]), dtype)


def placed(padded: tf.Tensor, flip: tf.Tensor, top: tf.Tensor, left: tf.Tensor, mask: tf.Tensor):
    """A `pattern_table` row, transposed if `flip`, with its top left at (top, left) of an image
    of the shape of `mask` (its window, [H, W]) and 0 off the window."""
    size = padded.shape[0]
    height, width = mask.shape
    padded = tf.where(flip, tf.transpose(padded), padded)
    rows = tf.clip_by_value(tf.range(height) - top, 0, size - 1)
    cols = tf.clip_by_value(tf.range(width) - left, 0, size - 1)
    return tf.gather(tf.gather(padded, rows, axis=0), cols, axis=1) * mask


def channel_norms(v: tf.Tensor) -> tf.Tensor:
    """‖v‖ per example and channel over the rows and columns, [n, 1, 1, C]."""
    return tf.sqrt(tf.reduce_sum(tf.square(v), axis=[1, 2], keepdims=True))


def image_norms(v: tf.Tensor) -> tf.Tensor:
    """‖v‖ per example over all its pixels, [n, 1, 1, 1]."""
    return tf.sqrt(tf.reduce_sum(tf.square(v), axis=[1, 2, 3], keepdims=True))


def on_sphere(x: tf.Tensor, delta: tf.Tensor, eps: tf.Tensor) -> tf.Tensor:
    """clip(x + ε·δ/‖δ‖, 0, 1): the reference's x + normalize(δ)·ε, clipped."""
    return tf.clip_by_value(x + delta / (TINY + image_norms(delta)) * eps, 0.0, 1.0)


def candidate(
    x: tf.Tensor,
    x_best: tf.Tensor,
    eps: tf.Tensor,
    signs: tf.Tensor,
    pattern: tf.Tensor,
    window_1: tf.Tensor,
    window_2: tf.Tensor,
) -> tf.Tensor:
    """One query's candidate for rows of clean inputs `x` [n, H, W, C] at their kept points
    `x_best`, with window 1's `pattern` [H, W] (placed, 0 off the window), its `signs` [n, C],
    and the windows' masks [H, W]: see the module docstring."""
    delta = x_best - x
    window_1 = window_1[None, :, :, None]
    union = tf.maximum(window_1, window_2[None, :, :, None])
    old = delta * window_1
    new = pattern[None, :, :, None] * signs[:, None, None, :] + old / (TINY + channel_norms(old))
    left = tf.maximum(tf.square(eps) - tf.square(image_norms(delta)), 0.0) / x.shape[-1]
    norm = tf.sqrt(left + tf.square(channel_norms(delta * union)))
    new = new / (TINY + channel_norms(new)) * norm
    return on_sphere(x, delta * (1.0 - union) + new, eps)
