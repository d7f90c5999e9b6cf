"""A results folder holds one machine's rows: resuming it on another CPU or GPU model is refused.

The machine is no key column, so a sweep resumed elsewhere would fill the points left with another machine's
timings, and the folder's tables (crossovers, ratios to attention, MFU) would set the two side by side as if one
machine had measured them. The CPU changes between sessions of one project (an AMD EPYC one day, an Intel Xeon with
another vector unit the next), so this happens by accident, not by choice; `--allow-mixed-machines` is the choice.

The machine is the device's model as rows record it (`device_name`): for CPU rows the CPU model with its family
and model numbers and vector instructions (a VM's bare "AMD EPYC" named a Zen 3 and a Zen 5 alike), the GPU model
for CUDA rows. Rows written before those details were recorded name the model alone, so they never match a machine
now: which of the machines behind the bare name measured them cannot be told. The host CPU beside a GPU is not
compared, though eager batch-1 GPU latency leans on it (the launches).
"""
from __future__ import annotations

from pathlib import Path

from ..measure.point import Point
from .config import ConfigError


def machine_name(device: str) -> str | None:
    """This machine's name for `device` as rows record it (the CPU or GPU model); None where it has no such device."""
    import torch

    from ..measure.provenance import device_name

    if device != "cpu" and not torch.cuda.is_available():
        return None
    return device_name(torch.device(device))


def check_same_machine(pending: list[Point], rows: dict[tuple[str, ...], dict[str, str]], out_dir: Path) -> None:
    """Raises ConfigError (one line) when a point left to run would join rows that another machine measured.

    Only rows that stay and say something of the machine count: a row this sweep replaces (a failed point it
    retries) and an error row (no timing) do not.

    Args:
        pending: the points this sweep would run (its resume has skipped the rest).
        rows: the folder's current row of each point, by key.
        out_dir: the folder, named in the message.
    """
    replaced = {p.key for p in pending}
    kept = [row for key, row in rows.items() if key not in replaced and row.get("status") != "error"]
    for device in sorted({p.device for p in pending}):
        theirs = sorted({r.get("device_name", "") for r in kept if r.get("device") == device} - {""})
        here = machine_name(device)
        if here is None or all(name == here for name in theirs):
            continue
        left = sum(p.device == device for p in pending)
        raise ConfigError(f"--out {out_dir}: its {device} rows were measured on {' and '.join(theirs)}, and this "
                          f"machine is {here}; its {left} point{'s' if left != 1 else ''} left would set the two "
                          f"side by side in one table; resume it where its rows were measured, give this machine "
                          f"its own --out, or pass --allow-mixed-machines (each row keeps its device_name)")
