"""A trained point's final weights, saved beside runs.csv so the playground can show what a model learnt.

One safetensors file per training point, named by the point key's hash like its checkpoints and ERF maps
(``<sweep>/weights/<hash>.safetensors``). Safetensors holds tensors and a string header, never code, so loading
a file someone hands you runs nothing of theirs (``torch.load`` of a pickle could). The header carries what is
needed to rebuild the model and feed it an image: the point's key columns, ``num_classes``, ``in_chans`` and the
data set's normalisation.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file
from torch import nn

FORMAT = "mixerbench-weights-1"  # bumped if the header changes, so an old file is refused with a message
SUFFIX = ".safetensors"

__all__ = ["FORMAT", "SavedWeights", "WeightsError", "read_weights", "save_weights"]


class WeightsError(ValueError):
    """A weights file that cannot be read; the message names the file and what to do."""


@dataclass(frozen=True)
class SavedWeights:
    """The header of one weights file (the tensors are read by `state_dict`).

    Attributes:
        path: the file.
        key: the point's key columns (mixer, preset, overrides, img_size, patch_size, dataset, seed, ...).
        num_classes: classifier outputs.
        in_chans: image channels.
        mean: per-channel mean the data set subtracted, on the [0, 1] scale.
        std: per-channel std it divided by.
    """

    path: Path
    key: dict[str, object]
    num_classes: int
    in_chans: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The tensors, on the CPU."""
        return load_file(self.path, device="cpu")

    def label(self) -> str:
        """One line naming the weights: file, mixer, data set, size and seed."""
        k = self.key
        return (f"{self.path.name}: {k.get('mixer')} {k.get('preset')} trained on {k.get('dataset')} "
                f"{k.get('img_size')}px/p{k.get('patch_size')} for {k.get('epochs')} epochs, seed {k.get('seed')}")


def save_weights(path: Path, model: nn.Module, key: dict[str, object], *, num_classes: int, in_chans: int,
                 mean: tuple[float, ...], std: tuple[float, ...]) -> None:
    """Writes `model`'s state dict with its header, atomically (a killed point leaves no half-written file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu", torch.float32).contiguous() for name, t in model.state_dict().items()}
    header = {"format": FORMAT, "key": json.dumps(key, sort_keys=True), "num_classes": str(num_classes),
              "in_chans": str(in_chans), "mean": json.dumps(list(mean)), "std": json.dumps(list(std))}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file(tensors, tmp, metadata=header)
    os.replace(tmp, path)


def read_weights(path: Path) -> SavedWeights:
    """The header of a weights file written by `save_weights`; raises `WeightsError` for anything else."""
    try:
        with safe_open(path, framework="pt") as handle:
            header = handle.metadata() or {}
    except (SafetensorError, OSError, ValueError) as error:
        raise WeightsError(f"{path}: not a readable safetensors file ({error})") from None
    if header.get("format") != FORMAT:
        raise WeightsError(f"{path}: not weights saved by `python -m experiments.sweep --save-weights` "
                           f"(format {header.get('format')!r}, expected {FORMAT!r})")
    try:
        return SavedWeights(path=Path(path), key=json.loads(header["key"]), num_classes=int(header["num_classes"]),
                            in_chans=int(header["in_chans"]), mean=tuple(json.loads(header["mean"])),
                            std=tuple(json.loads(header["std"])))
    except (KeyError, ValueError, TypeError) as error:
        raise WeightsError(f"{path}: damaged header ({type(error).__name__}: {error})") from None
