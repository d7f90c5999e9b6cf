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


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value
