"""Reach: a generated task whose range is set directly, in patches, by a distance and a direction.

Each grayscale image holds two bright marks, each a small shape fully inside one patch, ``distance`` patches
apart along a ``direction``: ``horizontal`` (same patch row), ``vertical`` (same patch column) or ``diagonal``
(both, either diagonal). Label 1: the two marks have the same shape; label 0: different shapes. A faint
noise background and dimmer distractors (random 5-pixel patterns, never a mark shape) clutter the other patches,
so a mark is told by its brightness and shape, and its shape must meet the other mark's: the label needs
information from two tokens ``distance`` patches apart.

Why no single patch gives the label away. The first mark's shape is uniform over the shape set; the second
copies it (label 1) or is uniform over the other shapes (label 0), so each mark's shape alone is uniform in
both classes. Every shape has the same pixel count, so the ink of a patch or of the image says nothing; the
bucket (direction, distance) and the placement are drawn independently of the label and labels are balanced
within each bucket. Only the pair of shapes decides. `tests/test_reach.py` checks that no statistic of any
single patch (and no bucket) predicts the label better than chance.

Why a stamp sits at one fixed place in its patch (`ReachParams.jitter`, off). Until 2026-11-26 each stamp sat at
a random offset inside its patch. Telling a shape at any offset from another is then a nonlinear feature of one
patch that no single patch rewards (each mark's shape is uniform in both classes), so that feature and the relation
between the marks had to be learnt together, from nothing. The global mixers (attention, gla, linear attention)
escaped that plateau; swin's windows, the neighbourhood and the scans stayed at chance even at distance 1 with 8
times the default's budget (results/reach_long, made with jitter). With the stamp fixed, the patch embedding tells
the shapes apart linearly and the task asks only for the relation across the distance: every mixer learns it at
16 px while identity stays at chance (results/default_lr). Jitter stays an option, for that earlier task.

Why this design. Global attention sees both marks in one layer whatever the distance, so at short distance it
should learn the task in a few CPU minutes; mixers whose reach is local (windows), or runs along a scan order
(a horizontal neighbour is 1 step away in Vim's row-major scan, a vertical one ``grid`` steps), must carry the
shape across layers or steps. The per-sample bucket lets evaluation report accuracy per (direction, distance),
so one model trained on every distance gives a whole accuracy-vs-distance curve.

Generation is vectorised over images; it takes milliseconds per thousand images at 32-64 px, so nothing is
cached. Deterministic in ``seed``.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

__all__ = ["DEFAULT_DISTANCES", "DIRECTIONS", "SHAPES", "ReachParams", "ReachSet", "bucket_names", "generate_reach", "reach_params"]

DIRECTIONS: tuple[str, ...] = ("horizontal", "vertical", "diagonal")

# 3 x 3 shapes with 5 pixels each: equal ink, so no amount of brightness tells them apart.
SHAPES: np.ndarray = np.array(
    [
        [[0, 1, 0], [1, 1, 1], [0, 1, 0]],  # plus
        [[1, 0, 1], [0, 1, 0], [1, 0, 1]],  # cross
        [[1, 1, 1], [0, 1, 0], [0, 1, 0]],  # T
        [[1, 0, 0], [1, 0, 0], [1, 1, 1]],  # L
    ],
    dtype=bool,
)
MARK_SIZE = SHAPES.shape[-1]
# Every 5-of-9 pattern of the 3 x 3 cell: distractors draw from those that are no mark shape.
_PATTERNS = np.array([[(m >> i) & 1 for i in range(MARK_SIZE * MARK_SIZE)]
                      for m in range(1 << (MARK_SIZE * MARK_SIZE)) if bin(m).count("1") == 5], dtype=bool)
DISTRACTOR_AREA = 16  # patches per distractor
# Roughly doubling, so a curve spans short and long range with few buckets; a grid of g patches keeps d < g.
DEFAULT_DISTANCES: tuple[int, ...] = (1, 2, 3, 5, 7, 11, 15, 23, 31)
MARK_VALUE, DISTRACTOR_VALUE = 255, 120


@dataclasses.dataclass(frozen=True)
class ReachParams:
    """One reach task (lengths in patches unless named `_px`).

    Attributes:
        img_size: image side, px.
        patch_size: patch side, px; a mark lies fully inside one patch (needs patch_size >= 3).
        distances: mark separations along the direction, in patches (diagonal: along each axis).
        directions: subset of `DIRECTIONS`.
        num_shapes: shapes in play (2 to 4); with 2 the label is the XOR of two bits.
        num_distractors: dimmer random patterns (same ink as a mark, never a mark shape) in other patches.
        noise: background pixels are uniform in [0, noise].
        jitter: each stamp at a random offset inside its patch (the task of results made before 2026-11-26);
            False: centred in its patch (up to a pixel), the same place in every patch.
    """

    img_size: int
    patch_size: int
    distances: tuple[int, ...]
    directions: tuple[str, ...] = DIRECTIONS
    num_shapes: int = 2
    num_distractors: int = 4
    noise: int = 40
    jitter: bool = False

    def __post_init__(self) -> None:
        if self.patch_size < MARK_SIZE or self.img_size % self.patch_size:
            raise ValueError(f"reach needs a patch size >= {MARK_SIZE} that divides the image, got "
                             f"img_size={self.img_size}, patch_size={self.patch_size}")
        grid = self.grid
        if not self.distances or any(not 1 <= d < grid for d in self.distances):
            raise ValueError(f"reach distances must be in [1, {grid - 1}] on a {grid}x{grid} patch grid, "
                             f"got {list(self.distances)}")
        unknown = set(self.directions) - set(DIRECTIONS)
        if not self.directions or unknown:
            raise ValueError(f"reach directions must be among {', '.join(DIRECTIONS)}, got {list(self.directions)}")
        if not 2 <= self.num_shapes <= len(SHAPES):
            raise ValueError(f"reach num_shapes must be in [2, {len(SHAPES)}], got {self.num_shapes}")
        if not 0 <= self.num_distractors <= grid * grid - 2:
            raise ValueError(f"reach num_distractors must be in [0, {grid * grid - 2}], got {self.num_distractors}")
        if not isinstance(self.jitter, bool):
            raise ValueError(f"reach jitter must be True or False, got {self.jitter!r}")
        if not 0 <= self.noise < DISTRACTOR_VALUE:
            raise ValueError(f"reach noise must be in [0, {DISTRACTOR_VALUE}), got {self.noise}")

    @property
    def grid(self) -> int:
        return self.img_size // self.patch_size

    @property
    def buckets(self) -> list[tuple[str, int]]:
        """Every (direction, distance), in the order of `bucket_names`."""
        return [(direction, d) for direction in self.directions for d in self.distances]


def reach_params(img_size: int, patch_size: int, distances: tuple[int, ...] | None = None) -> ReachParams:
    """The task at one size: the `DEFAULT_DISTANCES` that fit on the patch grid, one distractor per 16 patches."""
    grid = img_size // patch_size if patch_size else 0
    if distances is None:
        distances = tuple(d for d in DEFAULT_DISTANCES if d < grid)
    # One distractor per DISTRACTOR_AREA patches, so clutter density is the same at every grid size.
    return ReachParams(img_size, patch_size, tuple(distances),
                       num_distractors=max(1, round(grid * grid / DISTRACTOR_AREA)))


def bucket_names(params: ReachParams) -> list[str]:
    """Bucket labels "direction:distance", as the per-bucket accuracy column spells them."""
    return [f"{direction}:{d}" for direction, d in params.buckets]


class ReachSet(NamedTuple):
    """Generated images with what evaluation and the tests need.

    Attributes:
        images: (n, H, W) uint8.
        labels: (n,) uint8, 1 when both marks have the same shape.
        buckets: (n,) int16 index into `bucket_names(params)`.
        marks: (n, 2, 2) int16 patch (row, column) of the two marks.
        shapes: (n, 2) uint8 shape index of each mark.
    """

    images: np.ndarray
    labels: np.ndarray
    buckets: np.ndarray
    marks: np.ndarray
    shapes: np.ndarray


_STEPS = {  # direction -> possible (row, column) unit steps; the sign picks which way the second mark lies
    "horizontal": ((0, 1), (0, -1)),
    "vertical": ((1, 0), (-1, 0)),
    "diagonal": ((1, 1), (1, -1), (-1, 1), (-1, -1)),
}


def generate_reach(params: ReachParams, n: int, *, seed: int = 0) -> ReachSet:
    """Generate ``n`` images, balanced over buckets and, within each bucket, over labels.

    Args:
        params: the task.
        n: number of images.
        seed: non-negative integer; the output depends on it alone.

    Returns:
        A `ReachSet`.
    """
    if n < 0 or seed < 0:
        raise ValueError(f"n and seed must be non-negative, got n={n}, seed={seed}")
    rng = np.random.default_rng(np.random.SeedSequence(entropy=seed, spawn_key=(0x7EAC,)))
    p, g, r = params.patch_size, params.grid, params.img_size
    buckets = params.buckets
    # Balanced: cycle (bucket, label) pairs, then shuffle; bucket and label are independent by construction.
    cell = np.arange(n) % (2 * len(buckets))
    cell = rng.permutation(cell)
    bucket, labels = cell // 2, (cell % 2).astype(np.uint8)

    directions = np.array([DIRECTIONS.index(direction) for direction, _ in buckets])[bucket]
    distance = np.array([d for _, d in buckets])[bucket]
    step = np.zeros((n, 2), np.int64)
    for index, name in enumerate(DIRECTIONS):
        rows = np.flatnonzero(directions == index)
        options = np.array(_STEPS[name])
        step[rows] = options[rng.integers(0, len(options), len(rows))]
    offset = step * distance[:, None]  # (n, 2) second mark minus first, in patches
    low = np.maximum(0, -offset)
    high = np.minimum(g - 1, g - 1 - offset)  # inclusive
    first = low + np.floor(rng.random((n, 2)) * (high - low + 1)).astype(np.int64)
    second = first + offset
    marks = np.stack([first, second], 1)  # (n, 2, 2) patch (row, col)

    shape_a = rng.integers(0, params.num_shapes, n)
    other = (shape_a + rng.integers(1, params.num_shapes, n)) % params.num_shapes  # uniform over the others
    shape_b = np.where(labels == 1, shape_a, other)
    shapes = np.stack([shape_a, shape_b], 1).astype(np.uint8)

    images = rng.integers(0, params.noise + 1, (n, r, r), dtype=np.uint8)
    # Distractors in distinct patches other than the marks': rank random keys, marks pushed to the end.
    keys = rng.random((n, g * g))
    mark_flat = marks[..., 0] * g + marks[..., 1]  # (n, 2)
    np.put_along_axis(keys, mark_flat, 2.0, axis=1)
    distractor_flat = np.argsort(keys, axis=1)[:, : params.num_distractors]
    distractor_patch = np.stack([distractor_flat // g, distractor_flat % g], -1)  # (n, k, 2)
    mark_shapes = SHAPES[: params.num_shapes].reshape(params.num_shapes, -1)
    pool = _PATTERNS[~(_PATTERNS[:, None] == mark_shapes[None]).all(-1).any(1)]
    table = np.concatenate([mark_shapes, pool])  # mark shapes first, so a mark's index is its shape
    distractor_shape = params.num_shapes + rng.integers(0, len(pool), (n, params.num_distractors))

    patches = np.concatenate([marks, distractor_patch], 1)  # (n, 2 + k, 2)
    stamp_shape = np.concatenate([shapes.astype(np.int64), distractor_shape], 1)  # (n, 2 + k)
    value = np.array([MARK_VALUE, MARK_VALUE] + [DISTRACTOR_VALUE] * params.num_distractors, np.uint8)
    # Drawn either way, so the rest of the image (noise, distractor shapes) is the same with and without jitter.
    jitter = rng.integers(0, p - MARK_SIZE + 1, patches.shape)
    inside = jitter if params.jitter else (p - MARK_SIZE) // 2
    corner = patches * p + inside  # (n, 2 + k, 2) px (row, col) of each stamp's top-left pixel
    dy, dx = np.nonzero(np.ones((MARK_SIZE, MARK_SIZE), bool))
    on = table[stamp_shape]  # (n, 2 + k, 9) which of the 3x3 pixels are ink
    rows = corner[..., 0, None] + dy  # (n, 2 + k, 9)
    cols = corner[..., 1, None] + dx
    image_index = np.broadcast_to(np.arange(n)[:, None, None], rows.shape)
    ink = np.broadcast_to(value[None, :, None], rows.shape)
    images[image_index[on], rows[on], cols[on]] = ink[on]
    return ReachSet(images, labels, bucket.astype(np.int16), marks.astype(np.int16), shapes)
