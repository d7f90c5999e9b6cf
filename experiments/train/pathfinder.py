"""Pathfinder: a procedurally generated long-range task (Linsley et al. 2018; LRA's Pathfinder and Path-X).

Each grayscale image holds dashed contours: chains of short straight "paddles" separated by gaps, with a bounded
turning angle between consecutive paddles. Two marker discs sit at contour ends. Label 1: both markers are the two
ends of ONE contour. Label 0: they sit on ends of two DIFFERENT contours. Distractor contours clutter the scene, so
only tracing the path from one marker decides the label.

The drawing (and why it has no shortcut) is in `pathfinder_draw`.

Parameters, as this module reads the LRA table:

- ``paddle_length``: length of one dash, px; ``paddle_margin``: the gap between dashes, px (a range such as
  Path-X's "2-3" is drawn once per image, uniformly); centres of consecutive paddles are ``length + margin`` apart.
- ``paddle_thickness``: stroke width, px. Paddles are butt-capped rectangles rendered with box-filter coverage
  (antialiased), so a 0.5 px stroke peaks at half intensity and the gaps stay open.
- ``marker_radius``: radius of the marker discs, px; a marker is centred on the contour's end point.
- ``seed_distance``: minimum distance between the two markers, px.
- ``continuity``: smoothness, as Linsley's generator uses it (``get_coords_cmf`` in drewlinsley/pathfinder): the
  turn ``d`` between consecutive paddles has density proportional to ``cos(continuity * d) ** 2`` on
  ``|d| < pi / (2 * continuity)``, so the largest turn is 90 degrees at continuity 1.0 and 50 degrees at 1.8, and
  small turns are the most likely. (Reading the value as a maximum turn in radians, 1.8 = 103 degrees, draws
  zig-zags that look nothing like the LRA images; higher continuity must mean smoother, since the original notes
  "expect occasional failures at high values".) A turn is redrawn when the paddle would leave the image or come
  near another stroke.
- ``num_distractors x distractor_length``: "5 x 4" means 5 distractor contours of 4 paddles each.

Variants:

- ``lra``: the LRA settings, contour length 14, defined at 32, 64, 128 (Path-X) and 256 px. Any other size >= 32
  uses the parameters of the nearest defined size (nearest in log2; ties go to the smaller), drawn natively at the
  requested size; ``pathfinder_params`` reports which (``defined_at``).
- ``scaled``: one scene description for every size, equal to ``lra`` at 32 px. With ``k = sqrt(R / 32)``, pixel
  lengths (paddle, gap, thickness, marker) and paddle counts (contour length, distractor count and length) scale
  by ``k``, so a contour's pixel length scales with ``R`` (same share of the image) while it holds ``k`` times more
  paddles, and ink density stays about constant (the minimum marker distance, a length, scales by ``k`` too).
  Higher resolution is then a longer-range problem, not the same problem drawn finer.

Chunks of fixed size run in parallel processes. The chunk seeds derive from ``(seed, chunk index)`` only, so
the output does not depend on the number of workers.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .pathfinder_draw import PathfinderParams, draw_scenes, render_scenes

__all__ = [
    "GENERATOR_VERSION",
    "LRA_PARAMS",
    "VARIANTS",
    "PathfinderParams",
    "PathfinderSet",
    "default_cache_dir",
    "generate_pathfinder",
    "generate_pathfinder_set",
    "load_pathfinder",
    "pathfinder_cache_path",
    "pathfinder_params",
]

# Bumped whenever the drawing changes, so stale cache files are never read.
GENERATOR_VERSION = 1
VARIANTS: tuple[str, ...] = ("lra", "scaled")
MIN_IMG_SIZE = 32


# resolution -> (paddle_length, paddle_margin, thickness, marker_radius, seed_distance, continuity, distractors)
LRA_PARAMS: dict[int, tuple[float, tuple[float, float], float, float, float, float, tuple[int, int]]] = {
    32: (2.0, (1.0, 1.0), 0.5, 1.5, 7.0, 1.0, (5, 4)),
    64: (5.0, (1.0, 1.0), 1.0, 2.5, 12.0, 1.8, (5, 4)),
    128: (5.0, (2.0, 3.0), 1.5, 3.0, 20.0, 1.8, (8, 4)),
    256: (5.0, (3.0, 3.0), 2.0, 5.0, 27.0, 1.8, (7, 4)),
}
_LRA_CONTOUR_LENGTH = 14


def pathfinder_params(img_size: int, variant: str = "lra") -> PathfinderParams:
    """The scene description of a variant at a resolution.

    Args:
        img_size: image side in pixels, at least 32.
        variant: ``lra`` (LRA table, nearest defined size) or ``scaled`` (lengths and counts grow with resolution).

    Returns:
        The parameters; ``defined_at`` says which LRA row they come from (``img_size`` for ``scaled``).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown pathfinder variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    if int(img_size) != img_size or img_size < MIN_IMG_SIZE:
        raise ValueError(
            f"pathfinder img_size must be an integer >= {MIN_IMG_SIZE} (a 14-paddle contour does not fit in "
            f"less), got {img_size}; LRA defines {', '.join(map(str, LRA_PARAMS))} px"
        )
    img_size = int(img_size)
    if variant == "lra":
        defined = min(LRA_PARAMS, key=lambda r: (abs(math.log2(img_size / r)), r))
        paddle, margin, thick, marker, seed_d, cont, (nd, ld) = LRA_PARAMS[defined]
        return PathfinderParams(
            img_size, _LRA_CONTOUR_LENGTH, paddle, margin, thick, marker, seed_d, cont, nd, ld, variant, defined
        )
    paddle, margin, thick, marker, seed_d, cont, (nd, ld) = LRA_PARAMS[32]
    k = math.sqrt(img_size / 32)
    return PathfinderParams(
        img_size=img_size,
        contour_length=round(_LRA_CONTOUR_LENGTH * k),
        paddle_length=paddle * k,
        paddle_margin=(margin[0] * k, margin[1] * k),
        paddle_thickness=thick * k,
        marker_radius=marker * k,
        seed_distance=seed_d * k,
        continuity=cont,
        num_distractors=round(nd * k),
        distractor_length=round(ld * k),
        variant=variant,
        defined_at=img_size,
    )


class PathfinderSet(NamedTuple):
    """Generated images with what the tests and plots need to audit them.

    Attributes:
        images: (n, H, W) uint8, white strokes on black.
        labels: (n,) uint8, 1 when the markers are joined by one contour.
        markers: (n, 2, 2) float32 marker centres, (x, y) in pixels.
        distractors: (n,) uint8 distractor contours actually drawn.
    """

    images: np.ndarray
    labels: np.ndarray
    markers: np.ndarray
    distractors: np.ndarray


def _chunk_size(img_size: int) -> int:
    # bounded memory per chunk (the occupancy grid is (chunk, 2R, 2R) bytes); a function of the size only,
    # so the data do not depend on how many workers ran
    return int(min(512, max(16, 2**23 // (img_size * img_size))))


def _generate_chunk(p: PathfinderParams, n: int, seed: int, index: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(np.random.SeedSequence(entropy=seed, spawn_key=(index,)))
    labels = rng.permutation(np.arange(n) % 2).astype(np.uint8)  # balanced within each chunk
    scenes = draw_scenes(p, n, rng)
    images = render_scenes(p, scenes, labels)
    second = np.where(labels[:, None] == 1, scenes["c1"][:, -1], scenes["c2"][:, 0])
    markers = np.stack([scenes["c1"][:, 0], second], 1).astype(np.float32)
    return images, labels, markers, scenes["drawn"].sum(1).astype(np.uint8)


def generate_pathfinder_set(
    n: int, img_size: int, *, variant: str = "lra", seed: int = 0, workers: int | None = None
) -> PathfinderSet:
    """Generate ``n`` Pathfinder images with their marker positions, deterministic in ``seed``.

    Args:
        n: number of images; labels are balanced (the counts differ by at most one).
        img_size: image side in pixels (>= 32).
        variant: ``lra`` or ``scaled`` (see the module docstring).
        seed: non-negative integer; chunk ``i`` draws from ``SeedSequence(seed, spawn_key=(i,))``.
        workers: processes; None uses one per CPU core up to the number of chunks, 1 runs in this process.

    Returns:
        A ``PathfinderSet`` of images, labels, marker centres and distractor counts.
    """
    p = pathfinder_params(img_size, variant)
    if n < 0 or seed < 0:
        raise ValueError(f"n and seed must be non-negative, got n={n}, seed={seed}")
    size = _chunk_size(p.img_size)
    jobs = [(p, min(size, n - s), seed, i) for i, s in enumerate(range(0, n, size))]
    if not jobs:
        r = p.img_size
        return PathfinderSet(
            np.zeros((0, r, r), np.uint8), np.zeros(0, np.uint8), np.zeros((0, 2, 2), np.float32), np.zeros(0, np.uint8)
        )
    workers = min(os.cpu_count() or 1, len(jobs)) if workers is None else max(1, min(workers, len(jobs)))
    if workers == 1:
        parts = [_generate_chunk(*job) for job in jobs]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            parts = list(pool.map(_generate_chunk, *zip(*jobs, strict=True)))
    return PathfinderSet(*(np.concatenate(arrays) for arrays in zip(*parts, strict=True)))


def generate_pathfinder(
    n: int, img_size: int, *, variant: str = "lra", seed: int = 0, workers: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Generate ``n`` Pathfinder images, deterministic in ``seed``, without touching the disk.

    Args:
        n: number of images; labels are balanced.
        img_size: image side in pixels (>= 32).
        variant: ``lra`` or ``scaled``.
        seed: non-negative integer.
        workers: processes (None: one per core).

    Returns:
        images (n, H, W) uint8 and labels (n,) uint8.
    """
    data = generate_pathfinder_set(n, img_size, variant=variant, seed=seed, workers=workers)
    return data.images, data.labels


def default_cache_dir() -> Path:
    """``$MIXERBENCH_CACHE/pathfinder`` when that variable is set, else ``.cache/pathfinder`` in the cwd."""
    root = os.environ.get("MIXERBENCH_CACHE")
    return (Path(root) if root else Path.cwd() / ".cache") / "pathfinder"


def pathfinder_cache_path(
    n: int, img_size: int, *, variant: str = "lra", seed: int = 0, cache_dir: str | Path | None = None
) -> Path:
    """The cache file for one request; its name hashes every parameter, the seed, the count and the version."""
    p = pathfinder_params(img_size, variant)
    key = json.dumps(
        {"params": dataclasses.asdict(p), "seed": seed, "n": n, "version": GENERATOR_VERSION}, sort_keys=True
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return folder / f"pathfinder_{variant}_{p.img_size}px_n{n}_seed{seed}_{digest}.npz"


def load_pathfinder(
    n: int,
    img_size: int,
    *,
    variant: str = "lra",
    seed: int = 0,
    cache_dir: str | Path | None = None,
    workers: int | None = None,
) -> PathfinderSet:
    """Pathfinder images from the cache, generating and caching them on a miss.

    Args:
        n: number of images.
        img_size: image side in pixels (>= 32).
        variant: ``lra`` or ``scaled``.
        seed: non-negative integer.
        cache_dir: folder of the .npz files (default: ``default_cache_dir()``).
        workers: processes for generation on a miss.

    Returns:
        A ``PathfinderSet``, identical to ``generate_pathfinder_set`` with the same arguments.
    """
    path = pathfinder_cache_path(n, img_size, variant=variant, seed=seed, cache_dir=cache_dir)
    if path.exists():
        try:
            with np.load(path) as f:
                return PathfinderSet(*(f[name] for name in PathfinderSet._fields))
        except (OSError, KeyError, ValueError):
            pass  # a truncated or foreign file: regenerate over it
    data = generate_pathfinder_set(n, img_size, variant=variant, seed=seed, workers=workers)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:  # a file object keeps np.savez from appending a second .npz
        np.savez(f, **data._asdict())
    os.replace(tmp, path)  # atomic: concurrent runs never read a half-written file
    return data
