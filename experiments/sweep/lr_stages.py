"""The two stages of a sweep with a learning-rate grid: the grid, then the seeds at each setting's chosen rate.

Stage one is ordinary points (`SweepConfig.points`: every grid rate at the grid seeds, `lr_stage = "grid"`). The
seed points of a setting exist only once all its grid rows are in runs.csv: `seed_points` reads them, chooses the
rate on validation accuracy (`experiments.lr_grid.choose_rate`) and plans the other seeds at it
(`lr_stage = "seed"`). For a plan drawn before the grid ran, the seed points that wait on it are returned as
placeholders (`lr_stage = "seed?"`, at the grid's first rate: a rate does not change what a point costs).
"""
from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field

from ..lr_grid import RateChoice, choose_rate, format_rate, rate_group, rate_of
from ..measure.point import Point
from .config import SweepConfig


@dataclass
class SeedStage:
    """The seed points a sweep can plan now.

    Attributes:
        ready: seed points at a chosen rate.
        waiting: placeholders of seed points whose grid has rows missing.
        choices: (label of the setting, its choice) for every setting chosen.
        failed: labels of settings whose every grid rate failed (no seed points for them).
    """

    ready: list[Point] = field(default_factory=list)
    waiting: list[Point] = field(default_factory=list)
    choices: list[tuple[str, RateChoice]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def seed_points(config: SweepConfig, mixers: list[str], done: dict[tuple[str, ...], dict]) -> SeedStage:
    """The seed stage of every run of `config` with a learning-rate grid, given the rows in runs.csv.

    Args:
        config: the sweep.
        mixers: registered mixers (for runs that name none).
        done: the latest row per key (`runs_file.latest_by_key`).
    """
    stage = SeedStage()
    for run in config.run_configs():
        rest = tuple(s for s in run.seeds if s not in run.grid_seeds)
        if not run.lr_grid or not run.epochs or not rest:
            continue
        settings: dict[tuple[str, ...], list[Point]] = {}
        for point in run._grid(mixers):
            settings.setdefault(rate_group(asdict(point)), []).append(point)
        for members in settings.values():
            first = members[0]
            single = dataclasses.replace(
                run, seeds=rest, lr_grid=(), lr_grid_seeds=(), mixers=(first.mixer,), presets=(first.preset,),
                img_sizes=(first.img_size,), patch_sizes=(first.patch_size,), batch_sizes=(first.batch_size,))
            rows = [done.get(p.key) for p in members]
            if any(row is None for row in rows):
                placeholder = dataclasses.replace(single, train={**run.train, "lr": run.lr_grid[0]})
                stage.waiting += [dataclasses.replace(p, lr_stage="seed?") for p in placeholder._grid(mixers)]
                continue
            values: dict[float, list[object]] = {}
            for point, row in zip(members, rows):
                values.setdefault(rate_of(point.train), []).append(
                    row.get("val_accuracy") if row.get("status") == "ok" else None)
            choice = choose_rate(values)
            label = dataclasses.replace(first, lr_stage="").label()
            if choice is None:
                stage.failed.append(label)
                continue
            stage.choices.append((label, choice))
            chosen = dataclasses.replace(single, train={**run.train, "lr": choice.lr})
            stage.ready += [dataclasses.replace(p, lr_stage="seed") for p in chosen._grid(mixers)]
    return stage


def stage_lines(config: SweepConfig, points: list[Point], stage: SeedStage) -> list[str]:
    """What a sweep says about its two stages: their sizes (when `points`, the plan, holds the grid), the rates
    chosen so far, and the settings whose grid failed."""
    grid = [p for p in points if p.lr_stage == "grid"]
    lines = []
    if grid:
        rates = sorted({rate_of(p.train) for p in grid})
        lines.append(
            f"learning-rate grid: {len(grid)} points (rates {', '.join(format_rate(r) for r in rates)}), chosen per "
            f"setting on val_accuracy; then {len(stage.ready) + len(stage.waiting)} seed points at each setting's "
            f"rate ({len(stage.ready)} chosen from rows in runs.csv, {len(stage.waiting)} waiting on the grid, "
            "planned at its first rate: a rate does not change a point's cost)")
    for label, choice in stage.choices:
        curve = ", ".join(f"{format_rate(r)}: {100 * v:.1f}%" for r, v in choice.val_accuracy.items())
        lines.append(f"  chosen lr={format_rate(choice.lr)} for {label} (validation accuracy {curve})")
    lines += [f"  no rate: every grid run of {label} failed; its seeds are not run" for label in stage.failed]
    return lines
