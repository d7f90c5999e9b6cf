"""The order mixers are listed in, in every table, figure legend and summary line of a report.

Display order only, never a ranking by any measurement. Its own module because nearly every part of the report
sorts by it (the rate choice as well as the cost curves), so it must import nothing of theirs.
"""
from __future__ import annotations

# Built-in mixers in display order; a mixer a user adds sorts after them, alphabetically.
BUILTIN_MIXERS: tuple[str, ...] = ("attention", "attention_naive", "swin", "linear", "mamba")


def mixer_rank(name: str) -> tuple[int, str]:
    """Sort key that puts the built-in mixers first, in their fixed order (a series split by implementation,
    "mamba (torch_stream)", beside its mixer)."""
    base = name.split(" (", 1)[0]
    return (BUILTIN_MIXERS.index(base) if base in BUILTIN_MIXERS else len(BUILTIN_MIXERS), name)
