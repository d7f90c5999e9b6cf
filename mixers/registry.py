"""Name -> mixer class, so that configs, CSV columns and plot legends share one short key."""
from __future__ import annotations

import inspect
from collections.abc import Callable

from .base import TokenMixer

_MIXERS: dict[str, type[TokenMixer]] = {}


def register_mixer(name: str) -> Callable[[type[TokenMixer]], type[TokenMixer]]:
    """Class decorator that registers a `TokenMixer` under `name`.

    Raises on a duplicate name or a class that is not a `TokenMixer`: a silent overwrite would make two rows
    with the same `mixer` column measure different code.
    """

    def decorator(cls: type[TokenMixer]) -> type[TokenMixer]:
        if not (isinstance(cls, type) and issubclass(cls, TokenMixer)):
            raise TypeError(f"@register_mixer({name!r}) needs a subclass of mixers.TokenMixer, got {cls!r}")
        if name in _MIXERS:
            raise ValueError(f"mixer {name!r} is already registered by {_MIXERS[name].__module__}")
        _MIXERS[name] = cls
        cls.mixer_name = name
        return cls

    return decorator


def list_mixers() -> list[str]:
    """Registered mixer names, in registration order."""
    return list(_MIXERS)


def get_mixer_class(name: str) -> type[TokenMixer]:
    """The class registered as `name`; the error lists what is registered."""
    try:
        return _MIXERS[name]
    except KeyError:
        raise ValueError(f"unknown mixer {name!r}; registered mixers: {', '.join(_MIXERS)}") from None


def create_mixer(name: str, dim: int, num_heads: int, *, layer_idx: int = 0, **options) -> TokenMixer:
    """Builds the mixer registered as `name`.

    Args:
        name: registry key, e.g. `attention`, `swin`, `linear`, `mamba`.
        dim: channels C of the tokens.
        num_heads: attention heads (mixers without heads accept and ignore it); must divide `dim`.
        layer_idx: depth of the block, for mixers that alternate by layer (Swin shifts odd layers).
        **options: mixer-specific keyword options (`window_size`, `d_state`, ...).
    """
    cls = get_mixer_class(name)
    if num_heads < 1 or dim % num_heads:
        raise ValueError(f"dim={dim} is not divisible by num_heads={num_heads}; choose num_heads dividing {dim}")
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "dim", "num_heads", "layer_idx"}
    unknown = set(options) - accepted
    if unknown:
        raise ValueError(
            f"mixer {name!r} has no option(s) {', '.join(sorted(unknown))}; "
            f"it accepts: {', '.join(sorted(accepted)) or 'none'}"
        )
    return cls(dim, num_heads, layer_idx=layer_idx, **options)
