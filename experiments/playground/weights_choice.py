"""Which of a sweep's saved weights the playground shows: one file per mixer, at the rate the sweep chose.

A sweep folder may hold weights of several data sets and sizes, seeds, and, with a learning-rate grid, every grid
rate. The playground shows one image, so it takes the (data set, image size, patch size, channels) with the most
mixers; per mixer the rate the report chose (`experiments.lr_grid.choose_rates` over `runs.csv`'s grid rows, on
`val_accuracy`, never test accuracy) and then the lowest seed. Every file left out is counted under its true
reason. Imports no torch: headers and rows only.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from ..lr_grid import RateChoice, choose_rates, format_rate, rate_group, rate_of
from ..runs_csv import RunsFileError, read_rows
from ..train.weights import SavedWeights, WeightsError

REQUIRED_KEYS: tuple[str, ...] = ("mixer", "preset", "img_size", "patch_size")


@dataclass(frozen=True)
class WeightsChoice:
    """The files shown and why.

    Attributes:
        chosen: mixer -> the file shown.
        rates: mixer -> how its rate was chosen, for its label ("lr 3e-4, chosen on validation").
        group: (data set, image size, patch size, channels) of the chosen files.
        notes: one line per reason files were left out, with counts.
    """

    chosen: dict[str, SavedWeights]
    rates: dict[str, str]
    group: tuple[str, int, int, int]
    notes: tuple[str, ...]


def check_header(weights: SavedWeights) -> SavedWeights:
    """`weights` if its header describes a model the playground can rebuild and feed, else `WeightsError`.

    The file's own reader checks the format; this checks the values: a key that is an object with the mixer,
    preset and integer sizes, and one positive finite std and a finite mean per image channel (a std of 0 would
    divide by zero and send NaN to the page).
    """
    k, name = weights.key, weights.path
    if not isinstance(k, dict):
        raise WeightsError(f"{name}: damaged header: its key is a {type(k).__name__}, not an object of the point's "
                           "key columns; save the weights again with `python -m experiments.sweep --save-weights`")
    missing = [column for column in REQUIRED_KEYS if column not in k]
    if missing:
        raise WeightsError(f"{name}: damaged header: its key lacks {', '.join(missing)}; save the weights again "
                           "with `python -m experiments.sweep --save-weights`")
    for column in ("img_size", "patch_size"):
        value = k[column]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise WeightsError(f"{name}: damaged header: {column} is {value!r}, not a positive integer")
    if not isinstance(k["mixer"], str) or not isinstance(k["preset"], str):
        raise WeightsError(f"{name}: damaged header: mixer and preset must be names, got {k['mixer']!r}, "
                           f"{k['preset']!r}")
    if weights.in_chans not in (1, 3) or weights.num_classes < 1:
        raise WeightsError(f"{name}: damaged header: in_chans {weights.in_chans} (1 or 3 expected), num_classes "
                           f"{weights.num_classes}")
    for field, values in (("mean", weights.mean), ("std", weights.std)):
        if len(values) != weights.in_chans:
            raise WeightsError(f"{name}: damaged header: {len(values)} {field} value(s) for {weights.in_chans} "
                               "image channel(s); give one per channel")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
            raise WeightsError(f"{name}: damaged header: {field} {list(values)} is not all finite numbers")
    if min(weights.std) <= 0:
        raise WeightsError(f"{name}: damaged header: std {list(weights.std)} must be positive (it divides the image)")
    return weights


def _rate_choices(folder: Path) -> tuple[dict[tuple[str, ...], RateChoice], str | None]:
    """The sweep's rate choices from `folder/runs.csv`, and a note when that file cannot be read."""
    try:
        return choose_rates(read_rows(folder / "runs.csv")), None
    except (RunsFileError, OSError) as error:
        return {}, f"learning rates not read from runs.csv ({error}); the lowest rate of each mixer is shown"


def _rate_label(weights: SavedWeights, choice: RateChoice | None) -> str:
    rate = rate_of(str(weights.key.get("train", "")))
    if rate is None:
        return "lr: the recipe's default"
    if choice is None:
        return f"lr {format_rate(rate)}"
    return f"lr {format_rate(rate)}, chosen on validation among {len(choice.val_accuracy) + len(choice.failed)}"


def choose_weights(saved: list[SavedWeights], folder: Path) -> WeightsChoice:
    """One file per mixer of the largest (data set, size, patch, channels) group, at its chosen rate.

    Args:
        saved: every weights file's header in the folder (checked by `check_header`).
        folder: the sweep's folder, whose runs.csv holds the grid rows the rates are chosen from.
    """
    groups: dict[tuple, list[SavedWeights]] = defaultdict(list)
    for weights in saved:
        k = weights.key
        groups[(str(k.get("dataset")), int(k["img_size"]), int(k["patch_size"]), weights.in_chans)].append(weights)
    group = max(sorted(groups), key=lambda g: len({w.key["mixer"] for w in groups[g]}))
    choices, unread = _rate_choices(folder)
    left_out: Counter[str] = Counter()
    left_out["at another data set, image size or patch size (one image size at a time)"] = len(saved) - len(
        groups[group])
    at_rate: list[tuple[SavedWeights, RateChoice | None]] = []
    for weights in groups[group]:
        choice = choices.get(rate_group(weights.key))
        rate = rate_of(str(weights.key.get("train", "")))
        if choice is not None and rate is not None and not math.isclose(rate, choice.lr, rel_tol=1e-9):
            left_out["at a learning rate the sweep did not choose (chosen on validation accuracy)"] += 1
        else:
            at_rate.append((weights, choice))
    chosen: dict[str, SavedWeights] = {}
    rates: dict[str, str] = {}

    def order(item: tuple[SavedWeights, RateChoice | None]) -> tuple:
        weights = item[0]
        rate = rate_of(str(weights.key.get("train", ""))) or 0.0
        return int(weights.key.get("seed", 0) or 0), rate, weights.path.name

    for weights, choice in sorted(at_rate, key=order):
        mixer = str(weights.key["mixer"])
        if mixer not in chosen:
            chosen[mixer], rates[mixer] = weights, _rate_label(weights, choice)
            continue
        shown = chosen[mixer].key
        if weights.key.get("seed") != shown.get("seed"):
            left_out["other seeds (the lowest seed is shown)"] += 1
        elif rate_of(str(weights.key.get("train", ""))) != rate_of(str(shown.get("train", ""))):
            left_out["at other learning rates, no grid choice in runs.csv (the lowest rate is shown)"] += 1
        else:
            left_out["other settings of a mixer shown (preset, overrides or recipe)"] += 1
    notes = [f"{count} weights file(s) in {folder} not shown: {reason}" for reason, count in left_out.items() if count]
    if unread:
        notes.append(unread)
    return WeightsChoice(chosen, rates, group, tuple(notes))
