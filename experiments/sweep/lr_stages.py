"""The two stages of a sweep with a learning-rate grid: the grid, then the seeds at each setting's chosen rate.

A run may instead take each mixer's rate from another run's grid (`lr_from`: tuned at one size, trained at the
others): its points too wait for that grid, and then carry the rate and where it came from (`lr_source`).

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
    """The seed stage of every run of `config` with a learning-rate grid, and the points of every run that takes
    its rates from another run's grid (`lr_from`), given the rows in runs.csv.

    Args:
        config: the sweep.
        mixers: registered mixers (for runs that name none).
        done: the latest row per key (`runs_file.latest_by_key`).
    """
    stage = SeedStage()
    # run name -> {(mixer, preset): the setting's choice, None while its grid waits on rows, or "failed"}
    chosen: dict[str, dict[tuple[str, str], RateChoice | str | None]] = {}
    runs = list(zip(config.run_names(), config.run_configs()))
    first_named: dict[str, SweepConfig] = {}
    for name, run in runs:
        first_named.setdefault(name, run)  # as check_lr_from reads a name (run names may repeat)
    for name, run in runs:
        if not run.lr_grid or not run.epochs:
            continue
        rest = tuple(s for s in run.seeds if s not in run.grid_seeds)
        settings: dict[tuple[str, ...], list[Point]] = {}
        for point in run._grid(mixers):
            settings.setdefault(rate_group(asdict(point)), []).append(point)
        for members in settings.values():
            first = members[0]
            rows = [done.get(p.key) for p in members]
            choice = _choose(members, rows)
            chosen.setdefault(name, {})[(first.mixer, first.preset)] = choice
            label = dataclasses.replace(first, lr_stage="").label()
            if choice is None:
                if rest:
                    placeholder = _single(run, first, rest, run.lr_grid[0])
                    stage.waiting += [dataclasses.replace(p, lr_stage="seed?") for p in placeholder._grid(mixers)]
            elif choice == "failed":
                stage.failed.append(label)
            else:
                stage.choices.append((label, choice))
                if rest:
                    at_rate = _single(run, first, rest, choice.lr)
                    stage.ready += [dataclasses.replace(p, lr_stage="seed") for p in at_rate._grid(mixers)]
    for name, run in runs:
        if run.lr_from and run.epochs:
            _taken_from(first_named[run.lr_from], run, name, chosen.get(run.lr_from, {}), mixers, stage)
    return stage


def _single(run: SweepConfig, point: Point, seeds: tuple[int, ...], lr: float) -> SweepConfig:
    """`run` narrowed to the setting of `point`, at `seeds` and rate `lr`, without a grid."""
    return dataclasses.replace(
        run, seeds=seeds, lr_grid=(), lr_grid_seeds=(), mixers=(point.mixer,), presets=(point.preset,),
        img_sizes=(point.img_size,), patch_sizes=(point.patch_size,), batch_sizes=(point.batch_size,),
        train={**run.train, "lr": lr})


def _choose(members: list[Point], rows: list[dict | None]) -> RateChoice | str | None:
    """The choice of one setting from its grid rows: None while a row is missing, "failed" if every rate failed."""
    if any(row is None for row in rows):
        return None
    values: dict[float, list[object]] = {}
    for point, row in zip(members, rows):
        value = row.get("val_accuracy") if row.get("status") == "ok" else None
        values.setdefault(rate_of(point.train), []).append(value)
    return choose_rate(values) or "failed"


def _taken_from(source: SweepConfig, run: SweepConfig, name: str, chosen: dict, mixers: list[str],
                stage: SeedStage) -> None:
    """Adds the points of `run` (named `name`), whose rates `source`'s grid chooses per mixer, to `stage`."""
    where = f"{source.img_sizes[0]} px, patch {source.patch_sizes[0]}"
    for mixer in run.mixers or mixers:
        for preset in run.presets:
            choice = chosen.get((mixer, preset))
            narrowed = dataclasses.replace(run, mixers=(mixer,), presets=(preset,), lr_from="")
            if choice is None:  # the grid waits on rows: placeholders at its first rate
                placeholder = dataclasses.replace(narrowed, train={**run.train, "lr": source.lr_grid[0]})
                stage.waiting += [dataclasses.replace(p, lr_stage="seed?") for p in placeholder._grid(mixers)]
            elif choice == "failed":
                stage.failed.append(f"{mixer} {preset} of run {name} (taken from run {run.lr_from})")
            else:
                at_rate = dataclasses.replace(
                    narrowed, lr_by_mixer={mixer: choice.lr},
                    lr_source=f"run {run.lr_from} of this sweep (its grid at {where}, chosen on validation)")
                stage.ready += at_rate._grid(mixers)


def stage_lines(config: SweepConfig, points: list[Point], stage: SeedStage) -> list[str]:
    """What a sweep says about its two stages: their sizes (when `points`, the plan, holds the grid), the rates
    chosen so far, and the settings whose grid failed."""
    grid = [p for p in points if p.lr_stage == "grid"]
    lines = []
    if grid:
        rates = sorted({rate_of(p.train) for p in grid})
        lines.append(
            f"learning-rate grid: {len(grid)} points (rates {', '.join(format_rate(r) for r in rates)}), chosen per "
            f"setting on val_accuracy; then {len(stage.ready) + len(stage.waiting)} points at the chosen rates "
            f"(the other seeds, and runs that take a grid's rate with lr_from): {len(stage.ready)} chosen from rows "
            f"in runs.csv, {len(stage.waiting)} waiting on the grid, planned at its first rate (a rate does not "
            "change a point's cost)")
    for label, choice in stage.choices:
        curve = ", ".join(f"{format_rate(r)}: {100 * v:.1f}%" for r, v in choice.val_accuracy.items())
        lines.append(f"  chosen lr={format_rate(choice.lr)} for {label} (validation accuracy {curve})")
    lines += [f"  no rate: every grid run of {label} failed; its seeds are not run" for label in stage.failed]
    return lines
