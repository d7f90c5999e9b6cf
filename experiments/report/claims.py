"""Published claims beside what a sweep measured: one row per claim, reference and batch, with a verdict.

A claims file (experiments/report/claims/<name>.toml, or any TOML path) quotes a paper's factor or saving;
the measured side comes from the sweep's runs.csv alone, like every other table of the report.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd

from . import tables as report_tables
from .claims_setting import CLAIMS_DIR, SETTING_FIELDS, claims_path, claims_setting
from .flags import DIRTY, is_dirty

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

NO_VERDICT = "none (launch-bound batch)"


class ClaimsError(ValueError):
    """A claims file that cannot be read; the message says what to fix."""


def load_claims(name_or_path: str) -> tuple[str, list[dict]]:
    """(source, claims) of a named claims file or a TOML path."""
    path = claims_path(name_or_path)
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in CLAIMS_DIR.glob("*.toml")))
        raise ClaimsError(f"no claims file {name_or_path!r}; named ones: {known}, or give a .toml path")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ClaimsError(f"{path}: not valid UTF-8 TOML ({error})") from None
    except OSError as error:
        raise ClaimsError(f"{path}: cannot read it ({error.strerror or error})") from None
    claims = data.get("claims")
    if not isinstance(claims, list) or not claims:
        raise ClaimsError(f"{path}: needs one or more [[claims]] tables")
    unknown = set(data) - {"source", "claims", *SETTING_FIELDS}
    if unknown or not isinstance(data.get("source", ""), str):
        raise ClaimsError(f"{path}: a claims file holds source = \"...\", [[claims]] tables and the setting's "
                          f"{', '.join(SETTING_FIELDS)}; "
                          f"{'unknown field(s) ' + ', '.join(sorted(unknown)) if unknown else 'source is not text'}")
    for index, claim in enumerate(claims):
        if not isinstance(claim, dict):
            raise ClaimsError(f"{path}: claims[{index}] must be a [[claims]] table, got {claim!r}")
        missing = {"text", "metric", "mixer", "references", "img_size"} - set(claim)
        if missing or ("factor" in claim) == ("saving" in claim):
            raise ClaimsError(f"{path}: claims[{index}] needs text, metric, mixer, references, img_size and "
                              f"exactly one of factor or saving (missing: {', '.join(sorted(missing)) or 'none'})")
        problem = _claim_problem(claim)
        if problem:
            raise ClaimsError(f"{path}: claims[{index}] {problem}")
    return str(data.get("source", "")), claims


# Costs where lower is better, so that reference / mixer is the mixer's advantage.
METRICS = ("latency_ms", "peak_mem_mb", "peak_mem_total_mb", "peak_mem_reserved_mb", "train_step_ms",
           "train_peak_mem_mb", "gmacs", "gflops", "params")
# A claim may name its own source (a second paper's claim beside the file's) and what differs from its models.
_FIELDS = ("text", "metric", "mixer", "references", "img_size", "factor", "saving", "differences", "source")


def _claim_problem(claim: dict) -> str:
    """What is wrong with one claim's fields (names and types), or "" when nothing is."""
    def number(value: object) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    unknown = set(claim) - set(_FIELDS)
    if unknown:
        return f"has unknown field(s) {', '.join(sorted(unknown))}; valid: {', '.join(_FIELDS)}"
    if not all(isinstance(claim[k], str) and claim[k] for k in ("text", "mixer")):
        return "text and mixer must be non-empty text"
    if claim["metric"] not in METRICS:
        return f"metric must be one of {', '.join(METRICS)} (a cost, lower is better), got {claim['metric']!r}"
    references = claim["references"]
    if not isinstance(references, list) or not references or not all(isinstance(r, str) for r in references):
        return f"references must be a list of mixer names, got {references!r}"
    size = claim["img_size"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        return f"img_size must be a positive integer (pixels), got {size!r}"
    if "factor" in claim and not (number(claim["factor"]) and claim["factor"] > 0):
        return f"factor must be a number > 0 (reference / mixer), got {claim['factor']!r}"
    if "saving" in claim and not (number(claim["saving"]) and claim["saving"] < 1):
        return f"saving must be a number < 1 (1 - mixer / reference), got {claim['saving']!r}"
    return ""


def verdict(measured: float, claimed: float) -> str:
    """How a measured advantage (a factor > 1 or a saving > 0 means the mixer wins) compares with the claim."""
    if measured >= claimed:
        return "holds"
    if (claimed > 1 and measured > 1) or (claimed < 1 and measured > 0):
        return "same direction, smaller"
    return "does not hold"


def claims_table(runs: pd.DataFrame, claims: list[dict], verdict_min_batch: int = 1,
                 differences: tuple[str, ...] = ()) -> pd.DataFrame:
    """One row per claim x reference mixer x batch size found in `runs` (ok rows only).

    Rows below `verdict_min_batch` are kept with the verdict "none (launch-bound batch)"; `differences` (or a
    claim's own) say what differs from the paper's models, and `flags` marks a comparison of dirty rows.
    """
    ok = runs[runs["status"] == "ok"]
    ok = ok.assign(_dirty=is_dirty(ok) if "dirty" in ok else False)
    rows = []
    for claim in claims:
        metric, size = claim["metric"], claim["img_size"]
        if metric not in ok:  # a runs.csv older than the metric's column
            continue
        at_size = ok[ok["img_size"] == size]
        for reference in claim["references"]:
            for batch in sorted(set(at_size["batch_size"])):
                here = at_size[at_size["batch_size"] == batch].set_index("mixer")[metric]
                if claim["mixer"] not in here or reference not in here:
                    continue
                mine, theirs = float(here[claim["mixer"]]), float(here[reference])
                if not (math.isfinite(mine) and math.isfinite(theirs)):
                    continue  # a row without this metric (written before its column existed)
                dirty = at_size[(at_size["batch_size"] == batch) & at_size["mixer"].isin([claim["mixer"], reference])]
                if "factor" in claim:
                    claimed, measured, kind = claim["factor"], theirs / mine, "factor"
                else:
                    claimed, measured, kind = claim["saving"], 1 - mine / theirs, "saving"
                rows.append({
                    "claim": claim["text"], "metric": metric, "img_size": size, "batch_size": int(batch),
                    "mixer": claim["mixer"], "reference": reference, "mixer_value": mine,
                    "reference_value": theirs, "kind": kind, "claimed": claimed, "measured": measured,
                    "verdict": verdict(measured, claimed) if batch >= verdict_min_batch else NO_VERDICT,
                    "source": claim.get("source", ""),
                    "differences": "; ".join(claim.get("differences", differences)),
                    "flags": DIRTY if dirty["_dirty"].any() else "",
                })
    return pd.DataFrame(rows)


def _display(numeric: pd.DataFrame) -> pd.DataFrame:
    def advantage(kind: str, value: float) -> str:
        if kind == "factor":
            return f"{value:.2f}x"
        return f"{100 * value:.1f}% less" if value >= 0 else f"{-100 * value:.1f}% more"

    return pd.DataFrame({
        "Claim": numeric["claim"],
        "Batch": numeric["batch_size"],
        "Against": numeric["reference"],
        "Mixer": [report_tables.fmt_number(v) for v in numeric["mixer_value"]],
        "Reference": [report_tables.fmt_number(v) for v in numeric["reference_value"]],
        "Claimed": [advantage(k, v) for k, v in zip(numeric["kind"], numeric["claimed"])],
        "Measured": [advantage(k, v) for k, v in zip(numeric["kind"], numeric["measured"])],
        "Verdict": numeric["verdict"],
        "Models differ in": numeric["differences"].replace("", report_tables.MISSING),
        "Flags": numeric["flags"].replace("", report_tables.MISSING),
    })


def write_claims(runs: pd.DataFrame, name_or_path: str, tables_dir: Path) -> tuple[list[Path], str]:
    """Writes tables/claims.{csv,md,tex}; returns the files and a Markdown section for the summary."""
    source, claims = load_claims(name_or_path)
    context = claims_setting(name_or_path)
    numeric = claims_table(runs, claims, context.verdict_min_batch, context.differences)
    if numeric.empty:
        raise ClaimsError(f"no ok rows of runs.csv match the claims of {name_or_path!r} (mixers and image size)")
    caption = f"Published claims beside this sweep's measurements. Source of the claims: {source}"
    paths = report_tables.write_table(numeric, _display(numeric), tables_dir / "claims", caption)
    sources = dict.fromkeys([source, *(c["source"] for c in claims if c.get("source"))])
    unmeasured = [c for c in claims if c["text"] not in set(numeric["claim"])]
    section = [
        "## Published claims",
        "",
        *(f"- quoted from: {s}" for s in sources),
        *([f"- the paper's setting: {context.setting}"] if context.setting else []),
        *(f"- differs from the paper's models: {d}" for d in context.differences),
        *([f"- verdicts from batch {context.verdict_min_batch} up, where neither model is launch-bound; smaller "
           "batches are shown without one"] if context.verdict_min_batch > 1 else []),
        "- measured values come from runs.csv: median latency in ms; memory in MiB as the metric says "
        "(`peak_mem_total_mb`: the allocator's peak with weights and input; `peak_mem_reserved_mb`: the reserved "
        "peak; `peak_mem_mb`: above the baseline). A factor is reference / mixer, a saving 1 - mixer / reference. "
        "Verdict: holds (measured >= claimed), same direction, smaller, or does not hold.",
        *(f"- not measured in this sweep: \"{c['text']}\" (no ok rows of {c['mixer']} and a reference at "
          f"{c['img_size']} px with `{c['metric']}`)" for c in unmeasured),
        "",
        report_tables.to_markdown(_display(numeric)),
        "",
    ]
    return paths, "\n".join(section)
