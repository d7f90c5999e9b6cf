"""Each mixer's learning rate, chosen on the validation split of a learning-rate grid, never on the test split.

A sweep with `lr_grid` trains every setting (mixer, model, size, data set, recipe) once per grid rate at the grid
seed(s): those rows carry `lr_stage = "grid"`. The rate with the best mean `val_accuracy` over the grid seeds is the
setting's rate; its other seeds then run at that rate (`lr_stage = "seed"`), and the grid row at that rate is the
grid seed's row of the result. The sweep (which plans the seed stage) and the report (which keeps only the rows at
the chosen rates) both choose with `choose_rate`, so they cannot disagree.

Test accuracy (`accuracy`, and the per-epoch test maximum `best_accuracy`) never enters a choice. Imports only the
standard library, so the report can use it without torch.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .schema import KEY_COLUMNS

GRID_STAGE, SEED_STAGE = "grid", "seed"


@dataclass(frozen=True)
class RateChoice:
    """The rate a setting trains at, and the validation evidence for it.

    Attributes:
        lr: the chosen peak learning rate.
        val_accuracy: {rate: mean validation accuracy in [0, 1] over the grid seeds}, rates that gave one.
        failed: grid rates whose runs gave no validation accuracy (diverged, error, timeout).
    """

    lr: float
    val_accuracy: dict[float, float]
    failed: tuple[float, ...] = ()


def recipe_without_rate(train: str) -> str:
    """The recipe JSON of a row without its `lr`: what the settings of one grid share."""
    fields = json.loads(train or "{}")
    fields.pop("lr", None)
    return json.dumps(fields, sort_keys=True, separators=(",", ":"))


def rate_of(train: str) -> float | None:
    """The `lr` a row's recipe JSON sets, or None."""
    value = json.loads(train or "{}").get("lr")
    return float(value) if value is not None else None


def rate_group(row: Mapping[str, object]) -> tuple[str, ...]:
    """A row's setting: its key without the seed and the rate (one grid, and one result over seeds)."""
    return tuple(recipe_without_rate(str(row.get("train", ""))) if column == "train" else _cell(row.get(column))
                 for column in KEY_COLUMNS if column != "seed")


def _cell(value: object) -> str:
    # Rows read from runs.csv hold strings and the report's frame numbers: 16 and "16" must group together.
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "" if value is None else str(value)


def _finite(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def choose_rate(val_by_rate: Mapping[float, Iterable[object]]) -> RateChoice | None:
    """The rate with the highest mean validation accuracy (ties: the smaller rate, the more conservative).

    Args:
        val_by_rate: {rate: validation accuracies of its grid runs}; empty or non-numeric cells count as failed.

    Returns:
        The choice, or None when no rate gave a validation accuracy.
    """
    means, failed = {}, []
    for rate, values in val_by_rate.items():
        finite = [v for v in (_finite(x) for x in values) if v is not None]
        if finite:
            means[float(rate)] = sum(finite) / len(finite)
        else:
            failed.append(float(rate))
    if not means:
        return None
    best = max(means.values())
    lr = min(rate for rate, mean in means.items() if mean == best)
    return RateChoice(lr, dict(sorted(means.items())), tuple(sorted(failed)))


def choose_rates(grid_rows: Iterable[Mapping[str, object]]) -> dict[tuple[str, ...], RateChoice]:
    """Per setting (`rate_group`), the choice among its grid rows, read from `val_accuracy` only.

    Args:
        grid_rows: rows (any status; a grid row that is not ok counts as a failed rate); rows of another
            `lr_stage` are left out.
    """
    by_group: dict[tuple[str, ...], dict[float, list[object]]] = {}
    for row in grid_rows:
        rate = rate_of(str(row.get("train", "")))
        if rate is None or str(row.get("lr_stage", GRID_STAGE)) != GRID_STAGE:  # a seed row's val chose nothing
            continue
        value = row.get("val_accuracy") if str(row.get("status", "")) == "ok" else None
        by_group.setdefault(rate_group(row), {}).setdefault(rate, []).append(value)
    choices = {}
    for group, val_by_rate in by_group.items():
        choice = choose_rate(val_by_rate)
        if choice is not None:
            choices[group] = choice
    return choices


def format_rate(lr: float) -> str:
    """A rate as people write it: 0.0003 -> "3e-4", 0.002 -> "2e-3"."""
    mantissa, exponent = f"{lr:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
