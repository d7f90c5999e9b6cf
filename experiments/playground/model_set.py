"""The models the playground shows: one ViT per mixer, untrained or loaded from a sweep's saved weights."""
from __future__ import annotations

import functools
import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from mixers import list_mixers
from models import ViT, create_vit

from ..measure.point import Point
from ..measure.run import build_model
from ..train.weights import SUFFIX, SavedWeights, WeightsError, read_weights
from .mixing import MixingMaps, MixingRows, mixing_maps, mixing_rows
from .weights_choice import check_header, choose_weights

# attention_naive is the same module with the same weights as attention: its map would repeat attention's.
DEFAULT_MIXERS: tuple[str, ...] = tuple(m for m in list_mixers() if m != "attention_naive")
# Untrained models: windows of 4 x 4 tokens, so an 8 x 8 grid shows four windows (and their shift at odd layers).
UNTRAINED_OPTIONS: dict[str, dict] = {"swin": {"window_size": 4}}
# The page draws N x N maps per head and the server keeps them: 32 x 32 tokens (1024) is the most it shows, and an
# image side of 1024 px the most it resizes to (a bigger --img-size would allocate gigabytes for nothing visible).
MAX_TOKENS = 1024
MAX_IMG_SIZE = 1024
MAX_HEADS = 8  # the heads offered for untrained models: powers of two up to this that divide the width
CACHED_MAPS = 8  # (image, layer, scale) whose maps are kept, per mixer: a click on one of them only reads a row
CACHED_IMAGES = 4  # images whose layer inputs are kept, per mixer
CACHED_GRADIENT_ROWS = 512  # gradient-fallback rows kept (one backward per output channel each: worth keeping)


def check_sizes(img_size: int, patch_size: int) -> None:
    """Raises ValueError, saying what to choose, for sizes the playground cannot show."""
    if patch_size < 1 or img_size < patch_size:
        raise ValueError(f"image size {img_size} px and patch size {patch_size} px: give a patch size >= 1 and an "
                         "image at least one patch wide")
    if img_size > MAX_IMG_SIZE or (img_size // patch_size) ** 2 > MAX_TOKENS:
        raise ValueError(f"image size {img_size} px with patch {patch_size} px is {(img_size // patch_size) ** 2} "
                         f"tokens; the playground shows at most {MAX_TOKENS} tokens and {MAX_IMG_SIZE} px: choose a "
                         "smaller --img-size or a larger --patch-size")


def untrained_options(mixer: str, side: int) -> dict | None:
    """Mixer options of an untrained model on a `side` x `side` grid, so local mixers look local on small grids.

    swin's windows are 4 x 4 tokens (`UNTRAINED_OPTIONS`); neighborhood's kernel is the largest odd side up to
    ``side // 2 + 1``, at most NAT's 7: 5 x 5 on the default 8 x 8 grid (39% of it), where 7 x 7 would cover 49
    of 64 cells and look global.
    """
    if mixer == "neighborhood":
        kernel = min(7, side // 2 + 1)
        return {"kernel_size": max(1, kernel - (1 - kernel % 2))}  # odd: a window centred on its query
    return UNTRAINED_OPTIONS.get(mixer)


@dataclass
class ModelSet:
    """One model per mixer, all on one image size, patch size and channel count, so they share one image.

    Attributes:
        models: mixer name -> model, in eval mode on the CPU.
        labels: mixer name -> one line naming its weights.
        img_size: the side every image is resized to, px.
        patch_size: patch side, px.
        in_chans: image channels the models read (1: the image is shown and fed in grayscale).
        mean: per-channel normalisation mean, on the [0, 1] scale.
        std: per-channel normalisation std.
        description: one line for the page's header.
        notes: what was left out and why (weights of other sizes, mixers without weights).
        rebuild: for untrained models, builds the same set with another number of heads; None for trained weights.
    """

    models: dict[str, ViT]
    labels: dict[str, str]
    img_size: int
    patch_size: int
    in_chans: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    description: str
    notes: tuple[str, ...] = ()
    rebuild: Callable[[int], ModelSet] | None = field(default=None, repr=False, compare=False)  # heads -> set
    _cache: OrderedDict = field(default_factory=OrderedDict, repr=False, compare=False)  # maps per (image, layer)
    _inputs: OrderedDict = field(default_factory=OrderedDict, repr=False, compare=False)  # layer inputs per image
    _gradients: OrderedDict = field(default_factory=OrderedDict, repr=False, compare=False)  # fallback rows per query

    @property
    def grid(self) -> tuple[int, int]:
        side = self.img_size // self.patch_size
        return side, side

    @property
    def depth(self) -> int:
        return min(len(m.blocks) for m in self.models.values())

    @property
    def heads(self) -> int:
        """The models' `num_heads` (that of the first model where weights of several shapes were loaded)."""
        return next(iter(self.models.values())).config.num_heads

    @property
    def heads_options(self) -> list[int]:
        """The head counts the page offers: 1, 2, 4, ... for untrained models (each a new set of models), only
        the loaded count for trained weights."""
        if self.rebuild is None:
            return [self.heads]
        dim = next(iter(self.models.values())).config.dim
        return [h for h in (2**i for i in range(MAX_HEADS.bit_length())) if h <= MAX_HEADS and dim % h == 0]

    def with_heads(self, heads: int) -> ModelSet:
        """The same untrained models built with `heads` heads (this set when it already has them).

        Raises:
            ValueError: trained weights (their heads are fixed), or a count the mixers refuse.
        """
        if heads == self.heads:
            return self
        if self.rebuild is None or heads not in self.heads_options:
            raise ValueError(f"{heads} heads: choose one of {self.heads_options}"
                             + ("" if self.rebuild else " (trained weights fix their heads)"))
        return self.rebuild(heads)

    @classmethod
    def untrained(cls, mixers: tuple[str, ...] = DEFAULT_MIXERS, *, img_size: int = 32, patch_size: int = 4,
                  preset: str = "micro", seed: int = 0, num_heads: int | None = None) -> ModelSet:
        """Freshly initialised models (each from `seed`): the patterns the architectures start with.

        Args:
            mixers: registry keys, one model each.
            img_size: image side, px.
            patch_size: patch side, px.
            preset: backbone preset.
            seed: initialisation seed of every model.
            num_heads: heads of every model; None: the preset's.
        """
        check_sizes(img_size, patch_size)
        models, labels = {}, {}
        overrides = {} if num_heads is None else {"num_heads": num_heads}
        side = img_size // patch_size if patch_size > 0 else 0
        for mixer in mixers:
            torch.manual_seed(seed)
            options = untrained_options(mixer, side)
            models[mixer] = create_vit(preset, mixer=mixer, img_size=img_size, patch_size=patch_size, num_classes=10,
                                       mixer_options=options, **overrides).eval()
            labels[mixer] = f"untrained {preset}, seed {seed}" + (f", {json.dumps(options)}" if options else "")
        heads = next(iter(models.values())).config.num_heads
        rebuild = functools.partial(cls.untrained, mixers, img_size=img_size, patch_size=patch_size, preset=preset,
                                    seed=seed)
        return cls(models, labels, img_size, patch_size, 3, (0.5,) * 3, (0.5,) * 3,
                   f"untrained {preset} models (seed {seed}, {heads} head{'s' if heads > 1 else ''}), {img_size} px "
                   f"images, patch {patch_size}", rebuild=lambda h: rebuild(num_heads=h))

    @classmethod
    def from_folder(cls, folder: Path) -> ModelSet:
        """The trained models saved by `python -m experiments.sweep --save-weights --out <folder>`.

        Weights of several sizes, data sets, rates and seeds may sit in one folder; `weights_choice.choose_weights`
        takes one file per mixer (the largest group of one image size, the rate the sweep chose on validation, the
        lowest seed); the notes say what it left out and why.

        Raises:
            WeightsError: no such folder, no weights in it, or a file that cannot be read or has a damaged header.
        """
        folder = Path(folder).expanduser()
        if not folder.is_dir():
            raise WeightsError(f"no folder {folder}: give the --out folder of a sweep run with --save-weights")
        files = sorted((folder / "weights").glob(f"*{SUFFIX}")) or sorted(folder.glob(f"*{SUFFIX}"))
        if not files:
            raise WeightsError(f"no weights in {folder} (looked for weights/*{SUFFIX}): run the sweep with "
                               f"`python -m experiments.sweep --save-weights --out {folder} ...` first")
        saved = [check_header(read_weights(path)) for path in files]
        choice = choose_weights(saved, folder)
        models, labels = {}, {}
        for mixer, weights in choice.chosen.items():
            models[mixer] = _load(weights)
            labels[mixer] = f"{weights.label()}, {choice.rates[mixer]}"
        dataset, img_size, patch_size, in_chans = choice.group
        check_sizes(img_size, patch_size)
        first = next(iter(choice.chosen.values()))
        return cls(models, labels, img_size, patch_size, in_chans, first.mean, first.std,
                   f"trained on {dataset}, {img_size} px images, patch {patch_size}, from {folder}", choice.notes)

    def prepare(self, image: np.ndarray) -> torch.Tensor:
        """An (H, W, 3) uint8 image as the models' input (1, in_chans, S, S): resized, channels, normalised."""
        tensor = torch.from_numpy(self.resize(image)).float().div(255).permute(2, 0, 1)  # (3, S, S)
        if self.in_chans == 1:
            tensor = tensor.mean(0, keepdim=True)  # (1, S, S)
        mean = torch.tensor(self.mean).view(-1, 1, 1)
        std = torch.tensor(self.std).view(-1, 1, 1)
        return ((tensor - mean) / std)[None]  # (1, in_chans, S, S)

    def resize(self, image: np.ndarray) -> np.ndarray:
        """The image as the models see it: the centre square, resized (bilinear) to S x S, RGB uint8."""
        h, w = image.shape[:2]
        side = min(h, w)
        top, left = (h - side) // 2, (w - side) // 2
        square = Image.fromarray(image[top:top + side, left:left + side])
        if side != self.img_size:
            square = square.resize((self.img_size, self.img_size), Image.BILINEAR)
        out = np.array(square.convert("RGB"))  # a writable copy: torch.from_numpy warns on read-only arrays
        if self.in_chans == 1:  # shown as the models read it
            out = np.repeat(np.asarray(square.convert("L"))[..., None], 3, axis=2)
        return out

    def layer_inputs(self, image: np.ndarray, mixer: str) -> list[torch.Tensor]:
        """The input of every block's mixer (its norm1 output, (1, N, C) each) for one image, in one forward."""
        model = self.models[mixer]
        inputs = []
        with torch.inference_mode():
            tokens = model.patch_embed(self.prepare(image)) + model.pos_embed  # (1, N, C)
            for block in model.blocks[:self.depth]:
                inputs.append(block.norm1(tokens))
                tokens = block(tokens, model.grid)
        return inputs

    def rows(self, image: np.ndarray, query: int, layer: int, *, scaled: bool = True, image_key: str | None = None,
             mixers: list[str] | None = None) -> dict[str, MixingRows]:
        """Each mixer's mixing row of token `query` at block `layer` (its input: that block's norm1 output).

        With `image_key`, the layer inputs and the whole maps of (image, layer, scale) are kept (the last
        `CACHED_MAPS` of them), so the next click on that image and layer only reads a row; the key must name one
        image for the life of this model set. `mixers` picks some of the models (default: all).
        """
        if not 0 <= layer < self.depth:
            raise ValueError(f"layer {layer} does not exist: the models have layers 0 to {self.depth - 1}")
        out = {}
        for mixer in self.models if mixers is None else mixers:
            model = self.models[mixer]
            block = model.blocks[layer]
            cached = self._cache.get((image_key, mixer, layer, scaled)) if image_key is not None else None
            if cached is None:
                inputs = self._inputs.get((image_key, mixer)) if image_key is not None else None
                if inputs is None:
                    inputs = self.layer_inputs(image, mixer)
                    if image_key is not None:
                        _remember(self._inputs, (image_key, mixer), inputs, CACHED_IMAGES * len(self.models))
                x = inputs[layer]
                cached = mixing_maps(block.mixer, x, model.grid, scaled=scaled) or x
                if image_key is not None:
                    _remember(self._cache, (image_key, mixer, layer, scaled), cached, CACHED_MAPS * len(self.models))
            if isinstance(cached, MixingMaps):
                out[mixer] = cached.row(query)
            else:  # the gradient fallback: one query at a time, from the cached layer input; each query kept
                key = (image_key, mixer, layer, query)
                rows = self._gradients.get(key) if image_key is not None else None
                if rows is None:
                    rows = mixing_rows(block.mixer, cached, model.grid, query, scaled=scaled)
                    if image_key is not None:
                        _remember(self._gradients, key, rows, CACHED_GRADIENT_ROWS)
                out[mixer] = rows
        return out


def _remember(cache: OrderedDict, key: tuple, value: object, limit: int) -> None:
    """Puts `value` in a least-recently-added cache of at most `limit` entries."""
    cache[key] = value
    while len(cache) > limit:
        cache.popitem(last=False)


def _load(weights: SavedWeights) -> ViT:
    """A model rebuilt from the key in the header, with the saved tensors loaded strictly."""
    k = weights.key
    point = Point(mixer=str(k["mixer"]), preset=str(k["preset"]), img_size=int(k["img_size"]),
                  patch_size=int(k["patch_size"]), batch_size=1, overrides=str(k.get("overrides", "{}")))
    try:
        model = build_model(point, num_classes=weights.num_classes, in_chans=weights.in_chans, device="cpu")
        model.load_state_dict(weights.state_dict(), strict=True)
    except (RuntimeError, ValueError, KeyError) as error:
        first = str(error).strip().splitlines()[0][:300]
        raise WeightsError(f"{weights.path}: does not fit the model its header names ({first})") from None
    return model.eval()
