"""The positive control of the reach task: a bucket that a mixer's first layer(s) already cover must be learnt.

Two marks one patch apart sit inside every built-in mixer's first receptive field at its default windows and
kernels, so a mixer that stays below `CONTROL_ACCURACY` there did not learn the task at all (too few samples, a bad
rate), and its other buckets say nothing about how far it sees. The report then writes "under-trained" beside its
row instead of reading a distance effect into them.

`CONTROLS` is the one place that says which buckets count for which mixer, and why. A mixer it does not know (one a
user added) gets no control, and the report says so rather than guess its reach.

The negative control is the other side: a mixer that mixes nothing (`identity`) must stay at chance, since the label
is decided by two tokens together. Where it beats chance, the task as set up can be solved without relating tokens
(a max over the tokens does that: results/reach_pool), and no mixer's reach in that setting is a finding.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pandas as pd

# The accuracy (%) a mixer must reach on each of its control buckets, as the issue states it (issue 32).
CONTROL_ACCURACY = 90.0
UNDER_TRAINED = "under-trained"

# Mixers that relate no tokens, and why each must stay at chance on reach.
NEGATIVE_CONTROLS: dict[str, str] = {"identity": "mixes nothing, and the label needs two tokens together"}
# Points above chance (%) of a negative control's mean over every bucket that make a setting solvable without mixing:
# several standard errors of a test accuracy over thousands of images, far below what any learnt shortcut gives.
NEGATIVE_MARGIN = 5.0
SOLVABLE_WITHOUT_MIXING = "solvable without mixing"


@dataclass(frozen=True)
class Control:
    """The buckets ("direction:distance") that count as a mixer's positive control, and why they do.

    Attributes:
        buckets: the control buckets.
        why: what covers them, in a few words for the summary.
        option: a mixer option the coverage depends on ("" for none), with its default and the least value that
            still covers the buckets.
    """

    buckets: tuple[str, ...]
    why: str
    option: str = ""
    default: int = 0
    least: int = 0


_GLOBAL = Control(("horizontal:1",), "global: every token mixes with every other in the first layer")
CONTROLS: dict[str, Control] = {
    "attention": _GLOBAL,
    "attention_naive": _GLOBAL,
    "linear": _GLOBAL,
    "gla": _GLOBAL,
    # A bidirectional scan over the row-major sequence: the left neighbour is the previous token.
    "mamba": Control(("horizontal:1",), "global: a bidirectional scan, the neighbour is the adjacent token"),
    "mamba2": Control(("horizontal:1",), "global: a bidirectional scan, the neighbour is the adjacent token"),
    "vmamba": Control(("horizontal:1",), "global: four scans, the row-wise ones make the neighbour adjacent"),
    # Plain windows (layer 0) and windows shifted by half a window (layer 1): a pair one column apart shares a
    # window in one of the two whenever the window is at least 2 wide.
    "swin": Control(("horizontal:1",), "its first two layers (plain and shifted windows) hold every pair one "
                    "column apart", option="window_size", default=7, least=2),
    # A neighbourhood of side k >= 3 around each query holds its left and right neighbours.
    "neighborhood": Control(("horizontal:1",), "its first layer's neighbourhood holds both horizontal neighbours",
                            option="kernel_size", default=7, least=3),
}


def control_of(mixer: str, overrides: str) -> tuple[Control | None, str]:
    """The control buckets of one mixer as configured, or None and the reason there is none.

    Args:
        mixer: the registry name.
        overrides: the row's `overrides` JSON (its `mixer_options` may set the window or kernel).
    """
    control = CONTROLS.get(mixer)
    if control is None:
        return None, f"no positive control known for {mixer!r} (add it to experiments/report/control.py CONTROLS)"
    if not control.option:
        return control, ""
    try:
        options = json.loads(overrides or "{}").get("mixer_options", {}) or {}
        value = int(options.get(control.option, control.default))
    except (ValueError, TypeError, AttributeError):
        return None, f"overrides {overrides!r} unreadable, so its {control.option} is unknown"
    if value < control.least:
        return None, f"{control.option} = {value} covers no neighbour (needs >= {control.least})"
    return control, ""


def control_verdicts(summary: pd.DataFrame, setting: list[str]) -> pd.DataFrame:
    """Per setting and mixer of a reach summary: the control buckets' mean accuracies and a verdict.

    Args:
        summary: `reach.reach_summary` (one row per setting, mixer and bucket, mean `accuracy` in %).
        setting: the columns that pick a setting (the mixer excluded).

    Returns:
        The setting columns, `mixer`, `control` (the buckets and their mean accuracy), `verdict` ("passes",
        `UNDER_TRAINED`, or "no control") and `reason`.
    """
    records = []
    for values, sub in summary.groupby([*setting, "mixer"], sort=False, dropna=False):
        record = dict(zip([*setting, "mixer"], values if isinstance(values, tuple) else (values,)))
        # `mixer` may name one variant of a registered mixer ("swin (window_size 4)", reach.name_variants).
        registry = str(sub["registry"].iloc[0]) if "registry" in sub else record["mixer"]
        if registry in NEGATIVE_CONTROLS:
            records.append({**record, **_negative_verdict(registry, sub)})
            continue
        control, reason = control_of(registry, str(sub["overrides"].iloc[0]) if "overrides" in sub else "{}")
        if control is None:
            records.append({**record, "control": "", "verdict": "no control", "reason": reason})
            continue
        accuracies = {}
        for bucket in control.buckets:
            direction, distance = bucket.rsplit(":", 1)
            here = sub[(sub["direction"] == direction) & (sub["distance"] == int(distance))]
            accuracies[bucket] = float(here["accuracy"].mean()) if len(here) else math.nan
        shown = "; ".join(f"{b.replace(':', ' ')}: {a:.1f}%" if math.isfinite(a) else f"{b.replace(':', ' ')}: "
                          "not measured" for b, a in accuracies.items())
        if not any(math.isfinite(a) for a in accuracies.values()):
            records.append({**record, "control": shown, "verdict": "no control",
                            "reason": "control bucket not measured"})
            continue
        failed = [b for b, a in accuracies.items() if math.isfinite(a) and a < CONTROL_ACCURACY]
        records.append({**record, "control": shown, "verdict": UNDER_TRAINED if failed else "passes",
                        "reason": (f"below {CONTROL_ACCURACY:.0f}% on a bucket it covers ({control.why})" if failed
                                   else control.why)})
    return pd.DataFrame.from_records(records)


def _negative_verdict(mixer: str, sub: pd.DataFrame) -> dict[str, str]:
    """A negative control's verdict from its bucket rows (mean `accuracy` and `chance` in %)."""
    mean = float(sub["accuracy"].mean())
    level = float(sub["chance"].iloc[0]) if "chance" in sub else math.nan
    if not (math.isfinite(mean) and math.isfinite(level)):
        return {"control": "", "verdict": "no control", "reason": "accuracy or chance unknown"}
    shown = f"every bucket: {mean:.1f}% (chance {level:.0f}%)"
    if mean >= level + NEGATIVE_MARGIN:
        return {"control": shown, "verdict": SOLVABLE_WITHOUT_MIXING,
                "reason": f"a negative control above chance by {NEGATIVE_MARGIN:.0f}+ points: it "
                          f"{NEGATIVE_CONTROLS[mixer]}, so no mixer's reach in this setting is a finding"}
    return {"control": shown, "verdict": "at chance", "reason": f"negative control: it {NEGATIVE_CONTROLS[mixer]}"}


def task_of(setting: list[str]) -> list[str]:
    """The setting columns that pick the task itself: the recipe (`train`: each mixer's own rate) and the budget
    (`epochs`) left out, so one negative control speaks for every mixer trained on the same images and head."""
    return [k for k in setting if k not in ("train", "epochs")]


def solvable_without_mixing(verdicts: pd.DataFrame, setting: list[str]) -> set[tuple]:
    """The tasks (values of `task_of(setting)`) where a negative control beat chance."""
    if verdicts.empty:
        return set()
    failed = verdicts[verdicts["verdict"] == SOLVABLE_WITHOUT_MIXING]
    return {tuple(row[c] for c in task_of(setting)) for row in failed.to_dict("records")}


def under_trained(verdicts: pd.DataFrame, setting: list[str]) -> set[tuple]:
    """The (setting values..., mixer) that failed their control."""
    failed = verdicts[verdicts["verdict"] == UNDER_TRAINED] if not verdicts.empty else verdicts
    return {tuple(row[c] for c in [*setting, "mixer"]) for row in failed.to_dict("records")}
