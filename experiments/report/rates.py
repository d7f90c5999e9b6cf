"""The report's view of a learning-rate grid: only the rows at each setting's chosen rate enter accuracy tables and
figures, and the summary says which rate each mixer got and what the grid's validation accuracy was.

The choice is `experiments.lr_grid.choose_rates`, the one the sweep used to plan the seeds, reading
`val_accuracy` of the grid rows (`lr_stage = "grid"`) only. Rows of sweeps without a grid pass through unchanged.
"""
from __future__ import annotations

import math

import pandas as pd

from ..lr_grid import (GRID_STAGE, SEED_STAGE, RateChoice, choose_rates, format_rate, rate_group, rate_of,
                       recipe_without_rate)
from ..schema import KEY_COLUMNS
from .mixer_order import mixer_rank
from .stats import ALPHA, beats_chance, chance


def grid_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows of learning-rate grids."""
    if "lr_stage" not in runs:
        return runs.iloc[0:0]
    return runs[runs["lr_stage"].astype(str) == GRID_STAGE]


def rate_choices(runs: pd.DataFrame) -> dict[tuple[str, ...], RateChoice]:
    """Per setting with a grid, its chosen rate."""
    return choose_rates(grid_rows(runs).to_dict("records"))


def named_rows(runs: pd.DataFrame) -> pd.Series:
    """True for rows whose rate the config named per mixer (`lr_by_mixer`, with its `lr_source`)."""
    if "lr_source" not in runs:
        return pd.Series(False, index=runs.index)
    return runs["lr_source"].fillna("").astype(str).str.strip() != ""


def without_named_rates(runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` with the rate taken out of `train` in every training row of a recipe some row names rates per mixer
    for: the mixers the config did not name trained at the recipe's own rate, which is their rate in `lr` too."""
    named = named_rows(runs)
    if not named.any():
        return runs
    shared = {recipe_without_rate(str(t)) for t in runs.loc[named, "train"]}
    bare = [recipe_without_rate(str(t)) for t in runs["train"]]
    # A grid's own rows keep their rate: `at_chosen_rates` reads it to choose (a run with lr_from shares the recipe).
    stages = runs["lr_stage"].fillna("").astype(str) if "lr_stage" in runs else pd.Series("", index=runs.index)
    trains = zip(runs["train"], bare, runs["epochs"], stages)
    return runs.assign(train=[b if b in shared and epochs > 0 and stage not in (GRID_STAGE, SEED_STAGE) else t
                              for t, b, epochs, stage in trains])


def at_chosen_rates(runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` less the grid rows at rates not chosen; rows of a chosen setting, and rows at a rate named per mixer,
    get their rate in `lr` and a recipe without it in `train`, so mixers trained at different rates share one
    table row layout and figure."""
    runs = without_named_rates(runs)
    choices = rate_choices(runs)
    if not choices:
        return runs
    groups = [rate_group(row) for row in runs.to_dict("records")]
    rates = [rate_of(str(t)) for t in runs["train"]]
    keep = [g not in choices or choices[g].lr == r for g, r in zip(groups, rates)]
    chosen = pd.Series([g in choices for g in groups], index=runs.index)
    out = runs.assign(lr=[r if c else v for r, c, v in zip(rates, chosen, runs["lr"])])
    out["train"] = [recipe_without_rate(str(t)) if c else t for t, c in zip(out["train"], chosen)]
    return out[keep]


def named_rate_lines(runs: pd.DataFrame) -> list[str]:
    """A summary section for rates named per mixer in the config: each mixer's rate and where it was chosen."""
    named = runs[named_rows(runs) & (runs["epochs"] > 0)]
    if named.empty:
        return []
    lines = ["## Learning rate per mixer (taken from a grid run, chosen there on validation)", "",
             "These points train at a peak learning rate chosen on validation by the grid named beside each mixer "
             "(`lr_source`): a committed run the config names per mixer (`lr_by_mixer`), or another run of this "
             "sweep, at another size (`lr_from`).", ""]
    for (mixer, source), rows in sorted(named.groupby(["mixer", "lr_source"]),
                                        key=lambda item: (mixer_rank(item[0][0]), item[0])):
        rates = ", ".join(format_rate(float(r)) for r in sorted(rows["lr"].dropna().unique()))
        lines.append(f"- {mixer}: lr {rates} (from {source}; {len(rows)} point{'s' * (len(rows) != 1)})")
    return lines + [""]


def rate_lines(runs: pd.DataFrame) -> list[str]:
    """A summary section: the rate each mixer got, the grid's validation accuracy per rate, and the seeds (or, for
    rates the config named per mixer, where they came from)."""
    grid = grid_rows(runs)
    choices = rate_choices(runs)
    if not choices:
        return named_rate_lines(runs)
    named = named_rate_lines(runs)  # runs with lr_from, beside the grid they take their rates from
    seeds = sorted({int(s) for s in grid["seed"]})
    lines = ["## Learning rate per mixer (chosen on validation, never on test)", "",
             f"Each setting trained once per rate of its grid at seed(s) {', '.join(map(str, seeds))}, on the "
             "training split less a held-out validation split; the rate with the best mean validation accuracy "
             "(ties: the smaller rate) is the one every table and figure uses, and the other seeds ran at it. "
             "The grid's own run at that rate is the grid seed's row. Test accuracy chooses nothing.", ""]
    first, ok_at_rate = {}, {}  # per setting: its first grid row; per (setting, rate): its first ok grid row
    for row in grid.to_dict("records"):
        first.setdefault(rate_group(row), row)
        if row["status"] == "ok":
            ok_at_rate.setdefault((rate_group(row), rate_of(str(row["train"]))), row)
    ordered = sorted(choices.items(), key=lambda item: (mixer_rank(first[item[0]]["mixer"]), item[0]))
    for group, choice in ordered:
        row = first[group]
        curve = ", ".join(f"{format_rate(r)}: {100 * v:.1f}%" for r, v in choice.val_accuracy.items())
        failed = f"; failed: {', '.join(format_rate(r) for r in choice.failed)}" if choice.failed else ""
        val = int(row["val_samples"]) if math.isfinite(float(row.get("val_samples", math.nan))) else "?"
        epochs = int(row["epochs"])
        chosen = ok_at_rate.get((group, choice.lr))  # its validation images size the chance test
        n_val = int(chosen["val_samples"]) if chosen and math.isfinite(float(chosen["val_samples"])) else 0
        note = grid_edge_note(choice, chance(str(row["dataset"])), n_val)
        lines.append(f"- {row['mixer']} ({row['dataset']}, {int(row['img_size'])} px, patch {int(row['patch_size'])}, "
                     f"{epochs} epoch{'s' * (epochs != 1)}):"
                     f" lr {format_rate(choice.lr)} (validation accuracy {curve}{failed}; {val} validation images)"
                     f"{note}")
    return lines + [""] + named


def grid_edge_note(choice: RateChoice, level: float | None = None, val_samples: int = 0) -> str:
    """A warning when the chosen rate is the grid's largest or smallest: the best rate may lie beyond the grid, so
    the mixer may be under-tuned beside one whose best lies inside it. Empty where the choice cannot be beaten (100%
    validation accuracy) or another rate of the grid ties with it. Where no rate beats chance (`level`, on
    `val_samples` images), the note says the choice is noise instead, wherever it lies."""
    best = choice.val_accuracy[choice.lr]
    if level is not None and val_samples and not beats_chance(best, val_samples, level):
        return (f"; no rate beats chance ({100 * level:.0f}%, one-sided binomial test on the validation images, "
                f"p >= {ALPHA}): the choice is noise")
    rates = sorted([*choice.val_accuracy, *choice.failed])
    if len(rates) < 2 or rates[0] < choice.lr < rates[-1]:
        return ""
    if best >= 1.0 or sum(v == best for v in choice.val_accuracy.values()) > 1:
        return ""
    side, beyond = ("largest", "above") if choice.lr == rates[-1] else ("smallest", "below")
    return f"; **the grid's {side} rate: its best may lie {beyond} it** (extend the grid)"


# The budget rule of a grid swept over epochs, fixed before any such run (experiments/configs/default_lr.toml): the
# fewest epochs at which the best mixer, at its best rate, reaches this validation accuracy.
BUDGET_TARGET = 0.9


def budget_lines(runs: pd.DataFrame, target: float = BUDGET_TARGET) -> list[str]:
    """A summary section for grids run at several epoch budgets of one setting: the fewest epochs at which the best
    mixer (at its chosen rate) reaches `target` validation accuracy, and every mixer's rate and validation there.

    Settings that differ only in mixer, model overrides and epochs form one budget sweep (mixers carry their own
    overrides, as parameter-matched models do). Read from validation only, like the rate choice.
    """
    choices = rate_choices(runs)
    if not choices:
        return []
    first = {}
    for row in grid_rows(runs).to_dict("records"):
        first.setdefault(rate_group(row), row)
    sweeps: dict[tuple, dict[int, dict[str, RateChoice]]] = {}
    columns = [c for c in KEY_COLUMNS if c not in ("seed", "mixer", "overrides", "epochs")]
    for group, choice in choices.items():
        row = first[group]
        setting = tuple(recipe_without_rate(str(row["train"])) if c == "train" else str(row.get(c, ""))
                        for c in columns)
        sweeps.setdefault(setting, {}).setdefault(int(row["epochs"]), {})[str(row["mixer"])] = choice
    lines = []
    for setting, by_epochs in sweeps.items():
        if len(by_epochs) < 2:
            continue
        best = {e: max(max(c.val_accuracy.values()) for c in by_mixer.values()) for e, by_mixer in by_epochs.items()}
        reached = [e for e in sorted(by_epochs) if best[e] >= target]
        budget = reached[0] if reached else max(by_epochs)
        verdict = (f"{budget} epochs: the fewest at which the best mixer reaches {100 * target:.0f}% validation "
                   f"accuracy" if reached else
                   f"{budget} epochs: no budget reached {100 * target:.0f}% validation accuracy, so the largest")
        lines += [f"## Training budget by rule (epochs {', '.join(map(str, sorted(by_epochs)))})", "",
                  "The rule, fixed before the run: train for the fewest epochs at which the best mixer, at its best "
                  f"rate, reaches {100 * target:.0f}% validation accuracy (the largest budget if none does); every "
                  f"mixer then trains at the rate its grid chose at that budget. Here: {verdict}.", "",
                  "| epochs | best validation accuracy | " + " | ".join(
                      sorted(by_epochs[budget], key=mixer_rank)) + " |",
                  "|--:|--:|" + "--:|" * len(by_epochs[budget])]
        for e in sorted(by_epochs):
            cells = [by_epochs[e].get(m) for m in sorted(by_epochs[budget], key=mixer_rank)]
            shown = [f"{format_rate(c.lr)}: {100 * c.val_accuracy[c.lr]:.1f}%" if c else "" for c in cells]
            lines.append(f"| {e}{' (chosen)' if e == budget else ''} | {100 * best[e]:.1f}% | " + " | ".join(shown)
                         + " |")
        lines.append("")
    return lines
