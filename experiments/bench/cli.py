"""What the benchmark command lines share: a parser whose errors are one line, and argument types that refuse
sizes a benchmark cannot run (zero, negative, not finite) before torch is asked to."""
from __future__ import annotations

import argparse
import math
from collections.abc import Callable


class Parser(argparse.ArgumentParser):
    """An `ArgumentParser` that reports a bad argument in one line with exit status 2, without the usage dump,
    and never takes an abbreviation of one flag for another."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def int_at_least(minimum: int, maximum: int = 2**31 - 1) -> Callable[[str], int]:
    """An argparse type: an integer in [minimum, maximum]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be in {minimum} .. {maximum}, got {value}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its own messages
    return parse


def positive_number(unit: str = "") -> Callable[[str], float]:
    """An argparse type: a finite number > 0 (of `unit`, which the message names: "minutes")."""
    what = f"a finite number of {unit} > 0" if unit else "a finite number > 0"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if not (math.isfinite(value) and value > 0):  # 0, negative or NaN would run nothing, or run for ever
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


positive_float = positive_number()
