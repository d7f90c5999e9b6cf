"""Summary sections on what a row can be cited for: the device peak MFU divides by, the timing regimes, rows
kept apart or read anew, flags, the launch floor; and the headline's MFU table."""
from __future__ import annotations

import pandas as pd

from . import tables as report_tables
from .crossover import curve_keys
from .mixer_order import mixer_rank
from .flags import flag_lines
from .identity import split_lines
from .legacy_rows import reread_lines
from .regimes import launch_floor_lines

TIMING_TEXT = {
    "eager": "eager (on a GPU, k back-to-back calls between two CUDA events, k from `latency_calls_per_sample`; "
             "rows without it synchronised after every call; on a CPU one synchronised call per sample)",
    "graphed": "graphed (one CUDA graph captured and replayed: no Python and no kernel launches between kernels)",
}


def _distinct(column: pd.Series) -> str:
    values = sorted({str(v).strip() for v in column.dropna()} - {"", "nan"})
    return ", ".join(values) if values else "(not recorded)"


def extra_summary_lines(runs: pd.DataFrame, curves: pd.DataFrame) -> list[str]:
    """Markdown lines appended to summary.md."""
    peaks = runs.dropna(subset=["device_peak_tflops"])
    peak_text = "; ".join(
        f"{device} {dtype}: {', '.join(f'{v:.4g}' for v in sorted(set(rows['device_peak_tflops'])))} TFLOP/s"
        for (device, dtype), rows in peaks.groupby(["device_name", "dtype"])) if len(peaks) else \
        "(not recorded: rows measured before the calibration have no MFU)"
    lines = [
        "## Rate, regimes and row identity",
        "",
        "- device peak (a dense matmul timed at the sweep's start, in the sweep's dtype; MFU divides by it): "
        + peak_text,
        "- achieved TFLOP/s: inference 2 x analytic MACs x batch / latency; training step: FlopCounterMode's "
        "forward + backward FLOPs on the meta device x batch / step time (the optimizer is not counted)",
        "- timing: " + "; ".join(TIMING_TEXT.get(m, m) for m in sorted(set(runs["timing_mode"]))),
        f"- triton: {_distinct(runs['triton_version'])}; mamba-ssm: {_distinct(runs['mamba_ssm_version'])}",
        "- memory: `Peak mem. inference` is above the baseline (weights and input excluded); `Peak mem. total` is "
        "the allocator's peak with weights and input, as a user's GPU sees it, and `reserved` the caching "
        "allocator's peak",
        *split_lines(runs),
        *reread_lines(runs),
        "",
    ]
    return lines + flag_lines(runs, curve_keys(curves)) + launch_floor_lines(runs)


def headline_mfu_lines(runs: pd.DataFrame) -> list[str]:
    """The headline's MFU: per mixer and curve, MFU at the largest N that ran; a line saying why when none."""
    ok = runs[(runs["status"] == "ok")]
    if not ok["mfu"].notna().any():
        if not (runs["device"] == "cuda").any():
            return []
        return ["MFU: not recorded in these rows (measured before the device peak calibration); a rerun of the "
                "sweep records it in every row.", ""]
    rows = ok.dropna(subset=["mfu"])
    largest = rows.loc[rows.groupby(["mixer", "batch_size", "timing_mode", "overrides"])["tokens"].idxmax()]
    largest = largest.sort_values(["mixer", "batch_size"], key=lambda s: s.map(mixer_rank) if s.name == "mixer" else s)
    table = pd.DataFrame({
        "Mixer": largest["mixer"], "Overrides": largest["overrides"],
        "Batch": largest["batch_size"].map(report_tables.batch_text), "Timing": largest["timing_mode"],
        "Tokens N": largest["tokens"].map(lambda n: f"{n:,}"),
        "TFLOP/s": largest["achieved_tflops"].map(report_tables.fmt_number),
        "MFU (%)": (100 * largest["mfu"]).map(report_tables.fmt_number),
        "Train MFU (%)": (100 * largest["train_mfu"]).map(report_tables.fmt_number),
    })
    peak = ", ".join(f"{v:.4g}" for v in sorted(set(rows["device_peak_tflops"].dropna())))
    return [f"MFU at the largest N that ran (achieved FLOP/s over the measured matmul peak, {peak} TFLOP/s):", "",
            report_tables.to_markdown(table)]
