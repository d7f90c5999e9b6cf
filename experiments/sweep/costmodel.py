"""What a point will cost before it runs: analytic work and bytes per point, and per-mixer rates fitted to rows.

The work of a point comes from the model itself (a meta-device build, no memory): its analytic MACs
(`model.macs()`), the bytes of its token activations (N x dim per block) and the bytes of what its mixer
materialises beyond them (attention_naive's N x N scores and probabilities, Swin's window scores, the selective
scan's expanded state). Nothing about the device is typed in: the rates that turn work into time and memory are
fitted, per mixer, to measured rows (a runs.csv of that device, or a short calibration run there), as

    time_ms = overhead + MACs / MAC-rate + token bytes / bandwidth + mixer bytes / bandwidth'
    peak_mb = base + a x token bytes of one layer (x depth for training) + b x mixer bytes of one layer (x depth)

with every coefficient >= 0, least squares on the relative error (so a 1 ms point weighs as much as a 1 s one).
"""
from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from ..measure.point import Point

ELEM_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MiB = 2**20

# Quantities a row measures and the planner predicts, with the features each is fitted on.
TARGETS = ("latency_ms", "train_step_ms", "peak_mem_mb", "train_peak_mem_mb", "overhead_s")
TRAIN_TARGETS = ("train_step_ms", "train_peak_mem_mb")  # measured at the row's train_batch_used


@dataclass(frozen=True)
class Work:
    """The analytic work of one point (whole batch), from a meta-device model."""

    tokens: int
    batch: int
    macs: float  # forward MACs of the batch
    token_bytes: float  # N x dim x depth x batch x element size: activations the blocks write
    mixer_bytes: float  # what the mixer materialises beyond its tokens, all layers, whole batch
    layer_token_bytes: float  # one layer's share of token_bytes (the live set at inference)
    layer_mixer_bytes: float  # one layer's share of mixer_bytes
    params: int


def _mixer_elements(mixer: str, module: object, grid: tuple[int, int]) -> float:
    """Elements one layer's mixer materialises for one image beyond its (N, dim) inputs and outputs.

    Mixers not named here materialise nothing beyond O(N x dim), which the token bytes already cover.
    """
    n = grid[0] * grid[1]
    heads = getattr(module, "num_heads", 1)
    if mixer == "attention_naive":
        return 2.0 * heads * n * n  # scores and probabilities, (heads, N, N) each
    if mixer == "swin":
        return 2.0 * heads * module.window_pairs(grid)  # scores and probabilities of every window, per head
    if mixer == "mamba":
        return 2.0 * module.d_inner * module.d_state * n  # two directions' discretised (L, D, N) terms
    return 0.0


@lru_cache(maxsize=256)
def _model_of(mixer: str, preset: str, overrides: str, patch_size: int) -> tuple[object, int]:
    """A meta-device model of one setting at its smallest image (grid 1 x 1), and its trainable parameters less
    the position embedding (the one part that grows with the grid). Building is the slow part of a plan (about
    0.1 s, most of it initialising on the meta device), so a setting is built once for every size it is asked at."""
    from ..measure.run import build_model

    model = build_model(Point(mixer=mixer, preset=preset, img_size=patch_size, patch_size=patch_size, batch_size=1,
                              overrides=overrides), device="meta")
    params = sum(p.numel() for p in model.parameters() if p.requires_grad) - model.pos_embed.numel()
    return model, params


@lru_cache(maxsize=4096)
def _work_of(mixer: str, preset: str, overrides: str, img_size: int, patch_size: int) -> tuple[float, ...]:
    from models import resolve_img_size

    model, grid_free_params = _model_of(mixer, preset, overrides, patch_size)
    grid = resolve_img_size(img_size, patch_size)
    tokens, depth, dim = grid[0] * grid[1], model.config.depth, model.config.dim
    mixer_elems = [_mixer_elements(mixer, block.mixer, grid) for block in model.blocks]
    params = grid_free_params + tokens * dim  # the position embedding, (1, N, dim)
    return (float(model.macs(grid)), float(tokens * dim * depth), float(sum(mixer_elems)),
            float(max(mixer_elems, default=0.0)), float(params), float(depth))


def work(point: Point) -> Work:
    macs, token_elems, mixer_elems, layer_mixer, params, depth = _work_of(
        point.mixer, point.preset, point.overrides, point.img_size, point.patch_size)
    b, elem = point.planned_batch, ELEM_BYTES[point.dtype]
    return Work(tokens=point.tokens, batch=b, macs=macs * b, token_bytes=token_elems * elem * b,
                mixer_bytes=mixer_elems * elem * b, layer_token_bytes=token_elems / depth * elem * b,
                layer_mixer_bytes=layer_mixer * elem * b, params=int(params))


def features(target: str, w: Work) -> np.ndarray:
    """The regressors of one target: time is work over rates plus a fixed cost; memory is bytes times factors."""
    if target in ("latency_ms", "train_step_ms"):
        return np.array([1.0, w.macs, w.token_bytes, w.mixer_bytes])
    if target == "peak_mem_mb":
        return np.array([1.0, w.layer_token_bytes, w.layer_mixer_bytes])
    if target == "overhead_s":  # build, counting (fvcore traces every op), memory reads: grows with the model
        return np.array([1.0, w.macs, w.token_bytes + w.mixer_bytes])
    return np.array([1.0, w.token_bytes, w.mixer_bytes, 4.0 * w.params])  # training keeps every layer, grads


def analytic_memory_mb(target: str, w: Work) -> float:
    """Uncalibrated memory: inference holds about four (N, dim) tensors and one layer's mixer intermediates;
    a training step saves about sixteen (N, dim) tensors per block (norms, qkv, MLP hidden) and every layer's
    mixer intermediates, plus fp32 gradients."""
    if target == "peak_mem_mb":
        return (4 * w.layer_token_bytes + w.layer_mixer_bytes) / MiB
    return (16 * w.token_bytes + w.mixer_bytes + 4.0 * w.params) / MiB


def nonnegative_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares of the relative error with coefficients >= 0, by trying every set of active columns
    (at most four columns here, so sixteen small solves)."""
    scale = 1.0 / np.maximum(np.abs(y), 1e-12)
    xs, ys = x * scale[:, None], y * scale
    norms = np.linalg.norm(xs, axis=0)
    usable = [j for j in range(x.shape[1]) if norms[j] > 0]
    best, best_err = np.zeros(x.shape[1]), math.inf
    for k in range(1, len(usable) + 1):
        for active in itertools.combinations(usable, k):
            cols = list(active)
            coef, *_ = np.linalg.lstsq(xs[:, cols] / norms[cols], ys, rcond=None)
            coef = coef / norms[cols]
            if (coef < 0).any():
                continue
            err = float(np.sum((xs[:, cols] @ coef - ys) ** 2))
            if err < best_err - 1e-12 * max(1.0, err) or (math.isclose(err, best_err) and k < np.count_nonzero(best)):
                best, best_err = np.zeros(x.shape[1]), err
                best[cols] = coef
    return best


@dataclass
class Fit:
    coef: np.ndarray
    rows: int
    scope: str  # "mixer" (fitted to this mixer's rows) or "pooled" (all mixers' rows, too few of its own)
    sizes: frozenset[tuple[int, int]] = frozenset()  # the (tokens, batch) it was fitted at

    def reaches(self, w: Work) -> bool:
        """Whether this fit may predict `w`: a fit of one size is a constant (the fixed cost alone fits it
        exactly), which says nothing about another size, so it answers only at its own."""
        return self.rows >= 2 or (w.tokens, w.batch) in self.sizes


@dataclass
class CostModel:
    """Per-mixer fits of each target to measured rows; `predict` answers for any point."""

    fits: dict[tuple[str, str], Fit] = field(default_factory=dict)  # (group, target) -> fit
    sources: list[str] = field(default_factory=list)  # what it was calibrated from, for the printout

    @staticmethod
    def group(point_or_row: Point | dict) -> str:
        """Rates are fitted per mixer, device, dtype and compile mode (compiled and eager code run differently),
        graphed timing apart from eager (no launch floor), and a scan implementation named in the overrides apart
        from the one `auto` picks (mamba through the Triton scan is a series of its own)."""
        get = (lambda k: getattr(point_or_row, k, "")) if isinstance(point_or_row, Point) else point_or_row.get
        graphed = "|graphed" if get("timing_mode") == "graphed" else ""
        scan = json_loads(get("overrides") or "").get("mixer_options", {}).get("scan_impl", "auto")
        named = f"|scan={scan}" if scan != "auto" else ""
        return "|".join(str(get(k) or "") for k in ("mixer", "device", "dtype", "compile")) + graphed + named

    @classmethod
    def fitted(cls, samples: Iterable[tuple[Point, dict]], sources: list[str] | None = None) -> CostModel:
        """Fits every target of every group that has measured values; `samples` pairs a point with its row."""
        model = cls(sources=list(sources or []))
        by_target: dict[str, list[tuple[str, Work, float]]] = {t: [] for t in TARGETS}
        samples = list(samples)
        # A calibration run is a stand-in: once a group has rows of real points at two sizes or more, those
        # alone are fitted (same protocol, same process start as the points still to come).
        real: dict[str, set[int]] = {}
        for point, row in samples:
            if not row.get("calibration"):
                real.setdefault(cls.group(point), set()).add(point.tokens * point.batch_size)
        samples = [(p, r) for p, r in samples if not (r.get("calibration") and len(real.get(cls.group(p), ())) >= 2)]
        for point, row in samples:
            w = work(point)
            # a batch-max row's training step searched its own batch, often smaller than the inference's
            train_batch = int(_number(row.get("train_batch_used")) or point.batch_size)
            w_train = w if train_batch == point.batch_size else work(replace(point, batch_size=train_batch))
            group = cls.group(point)
            for target in TARGETS:
                value = _number(row.get(target))
                if value is not None and value > 0:
                    by_target[target].append((group, w_train if target in TRAIN_TARGETS else w, value))
        for target, items in by_target.items():
            pooled: dict[str, list] = {}
            for group, w, value in items:
                pooled.setdefault(group.split("|", 1)[1], []).append((w, value))
            for group in {g for g, _, _ in items}:
                own = [(w, v) for g, w, v in items if g == group]
                model.fits[(group, target)] = _fit(target, own, "mixer")
            for rest, pairs in pooled.items():
                model.fits[("*|" + rest, target)] = _fit(target, pairs, "pooled")
        return model

    def fit_for(self, point: Point, target: str) -> Fit | None:
        found = self._own_or_pooled(point, target)
        if found is None and point.timing_mode == "graphed":
            return self._own_or_pooled(replace(point, timing_mode="eager"), target)
        return found

    def borrows_eager(self, point: Point, target: str) -> bool:
        """True for a graphed point whose group has no graphed rows yet but eager ones: it is predicted from the
        eager rows, an upper bound on its time (a graph replays without eager's launch floor) and the same memory."""
        return (point.timing_mode == "graphed" and self._own_or_pooled(point, target) is None
                and self._own_or_pooled(replace(point, timing_mode="eager"), target) is not None)

    def _own_or_pooled(self, point: Point, target: str) -> Fit | None:
        """The group's own fit where it has three sizes or more, else the fit pooled over every mixer of the same
        device, dtype and mode where that has, else the own fit; a named scan with neither falls back to the pool
        without its name (None when there is nothing)."""
        group = self.group(point)
        own = self.fits.get((group, target))
        if own and own.rows >= 3:
            return own
        pooled = self.fits.get(("*|" + group.split("|", 1)[1], target))
        found = pooled if pooled and pooled.rows >= 3 else own
        if found is None and "|scan=" in group:
            unnamed = self.fits.get(("*|" + group.split("|", 1)[1].split("|scan=")[0], target))
            return unnamed if unnamed and unnamed.rows >= 3 else None
        return found

    def predict(self, point: Point, target: str) -> float | None:
        fit = self.fit_for(point, target)
        if fit is not None and not fit.reaches(work(point)):
            fit = None
        if fit is None:
            return analytic_memory_mb(target, work(point)) if "mem" in target else None
        value = float(features(target, work(point)) @ fit.coef)
        return value / MiB if "mem" in target else value

    @property
    def calibrated(self) -> bool:
        return any(f.rows for f in self.fits.values())


def _fit(target: str, pairs: list[tuple[Work, float]], scope: str) -> Fit:
    x = np.array([features(target, w) for w, _ in pairs])
    y = np.array([v * (MiB if "mem" in target else 1.0) for _, v in pairs])
    sizes = frozenset((w.tokens, w.batch) for w, _ in pairs)
    return Fit(coef=nonnegative_fit(x, y), rows=len(sizes), scope=scope, sizes=sizes)


def _number(value: object) -> float | None:
    if value in (None, ""):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def point_from_row(row: dict) -> Point:
    """The point a runs.csv row measured (key columns only, enough for its work)."""
    return Point(mixer=row["mixer"], preset=row["preset"], img_size=int(row["img_size"]),
                 patch_size=int(row["patch_size"]),
                 # a max-batch row measured at the batch it found
                 batch_size=int(row["batch_size"]) or int(float(row.get("batch_used") or 0)), device=row["device"],
                 dtype=row["dtype"], dataset=row.get("dataset", ""), epochs=int(row.get("epochs") or 0),
                 seed=int(row.get("seed") or 0), overrides=row.get("overrides") or "{}",
                 train=row.get("train") or "{}", compile=row.get("compile") or "",
                 timing_mode=row.get("timing_mode") or "eager")


def json_loads(text: str) -> dict:
    return json.loads(text) if text else {}
