"""Token mixers: one file per mixer, one registry.

Each built-in mixer module is imported explicitly here (no directory scanning), so a broken mixer fails loudly.
To add a mixer, write `mixers/<name>.py` with a `@register_mixer("<name>")` class and add its import below.
"""
from . import flop_formulas  # noqa: F401  (FLOP formulas some torch releases lack; before any counter)
from .base import Grid, TokenMixer
from .registry import create_mixer, get_mixer_class, list_mixers, register_mixer

from . import attention  # noqa: E402,F401  (registers "attention")
from . import attention_naive  # noqa: E402,F401  (registers "attention_naive")
from . import swin  # noqa: E402,F401  (registers "swin")
from . import linear  # noqa: E402,F401  (registers "linear")
from . import mamba  # noqa: E402,F401  (registers "mamba")
from . import neighborhood  # noqa: E402,F401  (registers "neighborhood")
from . import vmamba  # noqa: E402,F401  (registers "vmamba")
from . import gla  # noqa: E402,F401  (registers "gla")
from . import mamba2  # noqa: E402,F401  (registers "mamba2")
from . import identity  # noqa: E402,F401  (registers "identity")

__all__ = ["Grid", "TokenMixer", "create_mixer", "get_mixer_class", "list_mixers", "register_mixer"]
