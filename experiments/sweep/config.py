"""Sweep configurations: frozen dataclasses, loaded from TOML files and validated field by field.

A config file holds the fields of `SweepConfig`; its optional `[[runs]]` tables each override some of them, and
the sweep is the union of every run's grid (the embedded default measures cost on a grid of sizes and trains at
one size). A config file without a `name` is named after its file (`mine.toml` runs into results/local/mine/).

What command-line flags do (`apply_flags`, printed per run by `--dry-run`):

- Flags that name the grid (`--mixers`, `--presets`, `--img-sizes`, `--patch-sizes`, `--batch-sizes`) without
  `--config` build a sweep of their own: ONE run of that grid on the default config's top-level fields (sizes,
  patches, timing), none of its `[[runs]]`. It measures cost only, unless `--epochs N` (N > 0, with
  `--dataset`) asks it to train. Its folder is results/local/custom/ unless `--out` says otherwise.
- With `--config X` (or with no grid flag, on the default config), flags change the config's runs:
  - grid flags and how-to-measure flags (`--device`, `--dtype`, `--timeout-s`, `--memory-limit-mb`,
    `--num-threads`, `--compile`, `--paired-reference`) apply to every run, replacing what a run sets itself;
  - training flags (`--epochs`, `--dataset`, `--data-dir`, `--data-path`, `--seeds`, `--parallel`) apply to the
    runs that train (epochs > 0 in the file), so `--epochs 2` shortens the training and leaves the cost runs cost runs;
    in a config where nothing trains they apply to every run (a cost config asked to train);
  - `--out` and `--launcher` are the sweep's, not a run's.
- Seeds multiply training points only: a cost point (epochs 0) measures time and memory, which do not depend
  on the values of the initial weights, so it runs once, with the first seed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..measure.graphed import TIMING_MODES
from ..measure.point import Point, canonical_json
from ..measure.timing import TimingProtocol
from ..schema import CURVES_DIR, MAX_BATCH

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CONFIG_DIR = Path(__file__).parent.parent / "configs"
DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "bfloat16", "float16")
LAUNCHERS = ("local", "submitit")
# torch.compile modes; "" and "none" run eager (stored as "" so rows written before the field keep their keys).
COMPILE_MODES = ("", "none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the field and what to do."""


@dataclass(frozen=True)
class SweepConfig:
    """One sweep: the grid of points and how to measure them.

    Every list field is crossed with the others: mixers x presets x img_sizes x patch_sizes x batch_sizes, and
    x seeds for training points (a cost point runs with the first seed only).
    """

    name: str = "custom"
    description: str = ""
    out: str = ""  # default: results/local/<name> (your runs, git-ignored); results/<name> holds committed references
    mixers: tuple[str, ...] = ()  # empty: every registered mixer
    presets: tuple[str, ...] = ("micro",)
    img_sizes: tuple[int, ...] = (32,)
    patch_sizes: tuple[int, ...] = (4,)
    batch_sizes: tuple[int, ...] = (1,)  # "max" in a file or on the command line: the largest that fits (0 here)
    seeds: tuple[int, ...] = (0,)
    device: str = "cpu"
    dtype: str = "float32"
    epochs: int = 0
    dataset: str = ""
    data_dir: str = ""
    data_path: str = ""
    measure_train_step: bool = True
    erf: bool = False  # training points save effective receptive field maps to <out>/erf/<key hash>.npz
    # Per-point limit in seconds, and a limit: a point past it is a timeout row. 0 (not given): each point's limit
    # is chosen from its predicted cost on this machine, at least 30 minutes (experiments/sweep/machine.py).
    timeout_s: float = 0.0
    memory_limit_mb: int = 0  # CPU only: cap on what one point may allocate, 0 = none
    num_threads: int = 0  # 0 = torch's default
    # CPU training points that run at once, each in its own process on num_threads threads (given explicitly): on
    # a 2-core machine, two one-thread trainings finish sooner than one on two threads. Cost points always run one
    # at a time, so their timings stay quiet; a training row's latency is then read beside another training.
    parallel: int = 1
    compile: str = ""  # torch.compile mode for the timed model; "" or "none": eager
    # A mixer (e.g. "attention") timed beside every other point, call for call, so each row's ratio to it holds on
    # a machine whose speed drifts (experiments/measure/paired.py); "": none. Eager and compiled timing only.
    paired_reference: str = ""
    timing_modes: tuple[str, ...] = ("eager",)  # eager and/or graphed (CUDA graph replay), a key like compile
    launcher: str = "local"
    overrides: dict = field(default_factory=dict)  # {"*" or mixer: {ViT field or "mixer_options": value}}
    timing: dict = field(default_factory=dict)  # TimingProtocol fields
    train: dict = field(default_factory=dict)  # TrainRecipe fields
    # Learning rates to try per setting, chosen on validation (experiments/lr_grid.py, experiments/sweep/lr_stages.py):
    # the grid runs at lr_grid_seeds (default: the first seed), then the other seeds at the chosen rate.
    lr_grid: tuple[float, ...] = ()
    lr_grid_seeds: tuple[int, ...] = ()
    # Each mixer's learning rate, chosen elsewhere (a committed grid run), and where it came from: {mixer: rate}
    # replaces train.lr for that mixer; a mixer not named trains at train.lr. `lr_source` must say where the rates
    # were chosen (e.g. "results/default_lr"), so every table can name it.
    lr_by_mixer: dict = field(default_factory=dict)
    lr_source: str = ""
    # In a [[runs]] table: the name of another run of this config whose learning-rate grid chooses this run's rate
    # for each mixer (tune once per mixer and data set at one size, train the other sizes at that rate). The run's
    # points wait for that grid's rows, like the seeds of a grid (experiments/sweep/lr_stages.py).
    lr_from: str = ""
    runs: tuple[dict, ...] = ()

    def __post_init__(self) -> None:
        check_fields(self, "")

    @property
    def out_dir(self) -> Path:
        # Committed reference results live in results/<name>/; a run that does not say --out must not resume
        # from them (it would find every point done and measure nothing on this machine).
        return Path(self.out or f"results/local/{self.name}")

    def run_configs(self) -> list[SweepConfig]:
        """The config of each `[[runs]]` table (fields of this config overridden), or this config alone."""
        if not self.runs:
            return [self]
        configs = []
        for index, run in enumerate(self.runs):
            where = f"runs[{index}]"
            unknown = set(run) - (RUN_FIELDS | {"name"})
            if unknown:
                raise ConfigError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}; valid: "
                                  f"{', '.join(sorted(RUN_FIELDS))}")
            try:
                changes = {k: _as_field(k, v, where) for k, v in run.items() if k != "name"}
                configs.append(dataclasses.replace(self, runs=(), **changes))
            except ConfigError as error:
                message = str(error)
                raise ConfigError(message if message.startswith(where) else f"{where}: {message}") from None
        return configs

    def points(self, available_mixers: list[str]) -> list[Point]:
        """Every point of every run, ascending in token count within each mixer; validated."""
        return union_points(self.run_points(available_mixers))

    def run_points(self, available_mixers: list[str]) -> list[list[Point]]:
        """The points of each run, in the order of `run_configs` (two runs may share a point); validated.
        A run with `lr_from` has none here: its points wait on the other run's grid."""
        self.check_lr_from(available_mixers)
        return [config._grid(available_mixers) for config in self.run_configs()]

    def check_lr_from(self, available_mixers: list[str]) -> None:
        """Refuses an `lr_from` that names no run with a grid of one size, or one whose grid lacks a mixer."""
        names, runs = self.run_names(), self.run_configs()
        for name, run in zip(names, runs):
            if not run.lr_from:
                continue
            where = f"run {name}: lr_from = {run.lr_from!r}"
            if not self.runs or run.lr_from not in names or run.lr_from == name:
                others = ", ".join(n for n in names if n != name) or "none"
                raise ConfigError(f"{where} names no other run of this config (its runs: {others})")
            source = runs[names.index(run.lr_from)]
            if not (source.epochs and source.lr_grid):
                raise ConfigError(f"{where}: that run has no learning-rate grid to choose from; give it lr_grid")
            if source.lr_from:
                raise ConfigError(f"{where}: that run takes its rates from another run; name the one with the grid")
            if len(source.img_sizes) * len(source.patch_sizes) * len(source.batch_sizes) != 1:
                raise ConfigError(f"{where}: that run's grid covers several sizes, so it chooses several rates per "
                                  "mixer; give it one img_size, patch_size and batch_size")
            if run.overrides != source.overrides:
                raise ConfigError(f"{where}: that run builds other models (its overrides differ), and a rate chosen "
                                  "for one model is not another's; give both runs the same overrides")
            missing = sorted({(m, p) for m in run.mixers or available_mixers for p in run.presets}
                             - {(m, p) for m in source.mixers or available_mixers for p in source.presets})
            if missing:
                raise ConfigError(f"{where}: that run's grid has no {missing[0][0]} ({missing[0][1]}) to choose "
                                  "its rate; add it to that run or leave it out of this one")

    def run_names(self) -> list[str]:
        """A name per run: its table's `name`, else `runs[i]`; the config's own name when it has no runs."""
        if not self.runs:
            return [self.name]
        return [str(run.get("name") or f"runs[{index}]") for index, run in enumerate(self.runs)]

    def _grid(self, available_mixers: list[str]) -> list[Point]:
        check_override_mixers(self, available_mixers)
        mixers = self.mixers or tuple(available_mixers)
        unknown = [m for m in mixers if m not in available_mixers]
        if unknown:
            raise ConfigError(f"mixers: unknown mixer(s) {', '.join(unknown)}; registered: {', '.join(available_mixers)}")
        if self.paired_reference and self.paired_reference not in available_mixers:
            raise ConfigError(f"paired_reference: unknown mixer {self.paired_reference!r}; registered: "
                              f"{', '.join(available_mixers)}")
        bad = [(i, p) for i, p in itertools.product(self.img_sizes, self.patch_sizes) if i % p]
        if bad:
            pairs = ", ".join(f"{i}px/patch {p}" for i, p in bad)
            raise ConfigError(f"patch_sizes: patch size does not divide the image for {pairs}; "
                              "choose image sizes that are multiples of every patch size")
        self._check_training()
        self._check_models(mixers)
        timing = TimingProtocol(**self.timing)
        checkpoints = self.out_dir / "checkpoints"
        points = [
            Point(
                mixer=mixer, preset=preset, img_size=img, patch_size=patch, batch_size=batch,
                device=self.device, dtype=self.dtype, dataset=self.dataset if self.epochs else "",
                epochs=self.epochs, seed=seed, overrides=canonical_json(self.model_overrides(mixer)),
                timing=timing, measure_train_step=self.measure_train_step, memory_limit_mb=self.memory_limit_mb,
                num_threads=self.num_threads, parallel=self.parallel if self.epochs else 1, data_dir=self.data_dir,
                data_path=self.data_path, train=train,
                timeout_s=self.timeout_s, compile="" if self.compile == "none" else self.compile, lr_stage=stage,
                lr_source=self.lr_source if self.epochs and mixer in self.lr_by_mixer else "",
                timing_mode=mode, paired_reference=self.paired_reference,
            )
            for mixer in mixers
            for preset, img, patch, batch, (seed, train, stage), mode in itertools.product(
                self.presets, self.img_sizes, self.patch_sizes, self.batch_sizes, self._trainings(mixer),
                self.timing_modes,
            )
        ]
        if not self.epochs:
            return points
        # A training point checkpoints (experiments/train/device_trainer.py) under a folder named by its key, so a
        # rerun resumes it; its learning curve and receptive field maps are named by the same hash, so the report
        # can match them to their row.
        erf, curves = self.out_dir / "erf", self.out_dir / CURVES_DIR
        return [dataclasses.replace(p, checkpoint_dir=str(checkpoints / _digest(p.key)),
                                    curve_path=str(curves / f"{_digest(p.key)}.csv"),
                                    erf_path=str(erf / f"{_digest(p.key)}.npz") if self.erf else "")
                for p in points]

    @property
    def grid_seeds(self) -> tuple[int, ...]:
        """The seeds a learning-rate grid runs at."""
        return self.lr_grid_seeds or self.seeds[:1]

    def _trainings(self, mixer: str) -> list[tuple[int, str, str]]:
        """(seed, recipe JSON, lr_stage) of the points of one setting of `mixer`: its seeds (at its rate from
        `lr_by_mixer`, if named there), or its learning-rate grid (the seeds at the chosen rate come later:
        experiments/sweep/lr_stages.py)."""
        if not self.epochs:  # time and memory do not depend on the initial weights' values: one seed
            return [(self.seeds[0], "{}", "")]
        if self.lr_from:  # planned once the other run's grid has chosen (lr_stages.seed_points)
            return []
        if not self.lr_grid:
            recipe = {**self.train, "lr": self.lr_by_mixer[mixer]} if mixer in self.lr_by_mixer else self.train
            return [(seed, canonical_json(recipe), "") for seed in self.seeds]
        return [(seed, canonical_json({**self.train, "lr": lr}), "grid")
                for lr in self.lr_grid for seed in self.grid_seeds]

    def _check_training(self) -> None:
        if self.epochs == 0:
            if self.lr_grid:
                raise ConfigError("lr_grid: a learning-rate grid needs training (epochs > 0)")
            return
        if self.lr_by_mixer:
            _check_lr_by_mixer(self)
        if self.lr_from and (self.lr_grid or self.lr_by_mixer or "lr" in self.train):
            raise ConfigError("lr_from takes each mixer's rate from another run's grid: remove lr_grid, "
                              "lr_by_mixer and train.lr from this run (or lr_from)")
        if self.lr_grid:
            _check_lr_grid(self)
        if not self.dataset:
            raise ConfigError("dataset: epochs > 0 needs a data set (e.g. --dataset pathfinder)")
        if "epochs" in self.train:
            raise ConfigError("train: set epochs as a top-level field (or --epochs), not inside [train]")
        if self.dtype == "float16":
            raise ConfigError("dtype: training supports float32 and bfloat16 (float16 would need a loss scaler)")
        from ..train.recipe import TrainRecipe

        try:
            TrainRecipe(epochs=self.epochs, **self.train)
        except (TypeError, ValueError) as error:
            raise ConfigError(f"train: {error}") from None

    def _check_models(self, mixers: tuple[str, ...]) -> None:
        """Builds each (mixer, preset) once on the meta device, so bad overrides fail before anything runs."""
        from ..measure.run import build_model

        for mixer, preset in itertools.product(mixers, self.presets):
            probe = Point(mixer=mixer, preset=preset, img_size=self.patch_sizes[0], patch_size=self.patch_sizes[0],
                          batch_size=1, overrides=canonical_json(self.model_overrides(mixer)))
            try:
                build_model(probe, device="meta")
            except (TypeError, ValueError) as error:
                raise ConfigError(f"overrides for {mixer} ({preset}): {error}") from None
            except RuntimeError as error:  # a mixer that does not check an option's range (a user's own)
                raise ConfigError(f"overrides for {mixer} ({preset}): its options do not build "
                                  f"({str(error).splitlines()[0] if str(error) else 'RuntimeError'})") from None

    def model_overrides(self, mixer: str) -> dict:
        return {**self.overrides.get("*", {}), **self.overrides.get(mixer, {})}


def _check_lr_grid(config: SweepConfig) -> None:
    """A grid chooses on validation accuracy, so the recipe must hold a validation split out."""
    if any(not (isinstance(lr, float) and math.isfinite(lr) and 0 < lr <= MAX_LR) for lr in config.lr_grid):
        raise ConfigError(f"lr_grid must hold learning rates > 0 and <= {MAX_LR:g}, got {list(config.lr_grid)}")
    if "lr" in config.train:
        raise ConfigError("train.lr: the rate comes from lr_grid; remove lr from [train] (or lr_grid)")
    if not config.train.get("val_fraction"):
        raise ConfigError("lr_grid chooses each rate on a validation split: set train.val_fraction (e.g. 0.1)")
    from ..train.recipe import TrainRecipe

    for lr in config.lr_grid:
        try:
            TrainRecipe(epochs=config.epochs, **{**config.train, "lr": lr})
        except (TypeError, ValueError) as error:
            raise ConfigError(f"lr_grid: {error}") from None


def _check_lr_by_mixer(config: SweepConfig) -> None:
    if config.lr_grid:
        raise ConfigError("lr_by_mixer names each mixer's rate and lr_grid chooses it: give one of them")
    bad = {m: lr for m, lr in config.lr_by_mixer.items()
           if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (math.isfinite(lr) and lr > 0)}
    if bad:
        mixer, lr = next(iter(bad.items()))
        raise ConfigError(f"lr_by_mixer.{mixer} must be a learning rate > 0, got {lr!r}")
    if not config.lr_source.strip():
        raise ConfigError("lr_by_mixer: say where the rates were chosen in lr_source (e.g. lr_source = "
                          "\"results/default_lr\", a committed grid run), so the tables can name it")
    from ..train.recipe import TrainRecipe

    for mixer, lr in config.lr_by_mixer.items():
        try:
            TrainRecipe(epochs=config.epochs, **{**config.train, "lr": float(lr)})
        except (TypeError, ValueError) as error:
            raise ConfigError(f"lr_by_mixer.{mixer}: {error}") from None


def union_points(run_points: list[list[Point]]) -> list[Point]:
    """The points of every run once (the first run's where two share a key), ascending in token count within
    each mixer."""
    points: dict[tuple[str, ...], Point] = {}
    for points_of_run in run_points:
        for point in points_of_run:
            points.setdefault(point.key, point)
    return sorted(points.values(), key=lambda p: (*p.group, p.tokens, p.img_size))


def _digest(key: tuple[str, ...]) -> str:
    return hashlib.sha1("\x1f".join(key).encode()).hexdigest()[:16]


_TYPES = {f.name: f.type for f in dataclasses.fields(SweepConfig)}
RUN_FIELDS = set(_TYPES) - {"runs", "name", "description", "out", "launcher"}


def _as_field(name: str, value: object, where: str) -> object:
    """Checks and converts a value read from TOML or the command line to the field's type."""
    kind = _TYPES[name]
    prefix = f"{where}: " if where else ""
    if name == "batch_sizes":
        value = _batch_sizes(value, prefix)
    if kind == "tuple[int, ...]":
        values = value if isinstance(value, (list, tuple)) else [value]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise ConfigError(f"{prefix}{name} must be a list of integers, got {value!r}")
        return tuple(values)
    if kind == "tuple[float, ...]":
        values = value if isinstance(value, (list, tuple)) else [value]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise ConfigError(f"{prefix}{name} must be a list of numbers, got {value!r}")
        return tuple(float(v) for v in values)
    if kind == "tuple[str, ...]":
        values = value if isinstance(value, (list, tuple)) else [value]
        if not all(isinstance(v, str) for v in values):
            raise ConfigError(f"{prefix}{name} must be a list of strings, got {value!r}")
        return tuple(values)
    expected = {"str": str, "int": int, "float": (int, float), "bool": bool, "dict": dict}.get(kind)
    # bool is an int subclass: `timeout_s = true` is a typo, not a request for 1 s.
    if expected and (not isinstance(value, expected) or (kind in ("int", "float") and isinstance(value, bool))):
        raise ConfigError(f"{prefix}{name} must be of type {kind}, got {value!r}")
    if kind == "float" and isinstance(value, int) and abs(value) > LIMITS.get(name, 2**53):
        raise ConfigError(f"{prefix}{name} must be <= {LIMITS.get(name, 2**53):,}, got {value:,}")
    return float(value) if kind == "float" else value


# A config's name is a folder name (results/local/<name>): one plain path component, never a path.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}")


# Upper bounds on numbers far past any machine: a typo such as img_sizes = [10**30] is refused with the bound
# instead of failing every point (or overflowing a C integer inside torch, or building a 10**30-block model).
LIMITS: dict[str, int] = {
    "img_sizes": 65_536,  # px: 4096^2 tokens at patch 16
    "patch_sizes": 65_536,
    "batch_sizes": 1 << 20,
    "epochs": 100_000,
    "timeout_s": 30 * 86_400,  # s; a time limit past 30 days is a typo, and poll() overflows on huge values
    "memory_limit_mb": 1 << 30,  # MiB, 1 PiB
    "num_threads": 4096,
    "parallel": 4096,
}
MAX_SEED = 2**32 - 1  # numpy's legacy seeding (np.random.seed, in training) takes 0 .. 2**32 - 1
# A learning rate past this is a typo (AdamW trains at ~1e-4 .. 1e-2); 1e300 makes every step non-finite.
MAX_LR = 10.0
MAX_OVERRIDE_INT = 65_536  # any integer in `overrides` (dim, depth, heads, window sizes, state sizes)
# The grid lists a point is a product of: an empty one would run nothing and exit 0. (`mixers` is left out: its
# empty value is documented to mean every registered mixer.)
GRID_LISTS = ("presets", "img_sizes", "patch_sizes", "batch_sizes", "seeds")


def _batch_sizes(value: object, prefix: str) -> object:
    """Batch sizes with "max" as `MAX_BATCH`; a literal 0 is refused, so "max" is always written as such."""
    values = value if isinstance(value, (list, tuple)) else [value]
    if any(v == MAX_BATCH and not isinstance(v, bool) for v in values):
        raise ConfigError(f"{prefix}batch_sizes must be >= 1, or \"max\" for the largest that fits; got {value!r}")
    return [MAX_BATCH if v == "max" else v for v in values]


def batch_size_arg(text: str) -> int | str:
    """argparse type of --batch-sizes: a positive integer, or "max" (converted with the config's fields)."""
    import argparse

    if text == "max":
        return text
    try:
        return int(text)  # the range is checked with the config's fields, in one message
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid batch size {text!r}: give an integer >= 1 or max") from None


def check_fields(config: SweepConfig, where: str) -> None:
    """Refuses a field of `config` that cannot run, with one message naming it (`where` names the run)."""
    prefix = f"{where}: " if where else ""
    if not isinstance(config.name, str) or not _PLAIN_NAME.fullmatch(config.name) or ".." in config.name:
        raise ConfigError(f"{prefix}name names the results folder, so it must be letters, digits, '_', '-' and '.' "
                          f"(no '/' or '..', no leading '.', at most 100), got {config.name!r}")
    _check_numbers(config, prefix)
    for name in GRID_LISTS:
        values = getattr(config, name)
        if not values:
            raise ConfigError(f"{prefix}{name} must not be empty: a sweep is the product of its lists, so an empty "
                              "one would run nothing; give at least one value")
    for name in ("img_sizes", "patch_sizes", "batch_sizes"):
        values = getattr(config, name)
        if any(v < 1 and not (name == "batch_sizes" and v == MAX_BATCH) for v in values):
            raise ConfigError(f"{prefix}{name} must be >= 1, got {list(values)}")
    if any(not 0 <= s <= MAX_SEED for s in config.seeds):  # else every point would fail on the same seed
        raise ConfigError(f"{prefix}seeds must be integers in 0 .. {MAX_SEED} (what numpy's seeding takes), "
                          f"got {list(config.seeds)}")
    if any(not 0 <= s <= MAX_SEED for s in config.lr_grid_seeds):
        raise ConfigError(f"{prefix}lr_grid_seeds must be integers in 0 .. {MAX_SEED} (what numpy's seeding takes), "
                          f"got {list(config.lr_grid_seeds)}")
    if config.device not in DEVICES:
        raise ConfigError(f"{prefix}device must be one of {', '.join(DEVICES)}, got {config.device!r}")
    if config.dtype not in DTYPES:
        raise ConfigError(f"{prefix}dtype must be one of {', '.join(DTYPES)}, got {config.dtype!r}")
    if config.launcher not in LAUNCHERS:
        raise ConfigError(f"{prefix}launcher must be one of {', '.join(LAUNCHERS)}, got {config.launcher!r}")
    if config.compile not in COMPILE_MODES:
        raise ConfigError(f"{prefix}compile must be one of {', '.join(repr(m) for m in COMPILE_MODES)}, "
                          f"got {config.compile!r}")
    if not config.timing_modes or set(config.timing_modes) - set(TIMING_MODES):
        raise ConfigError(f"{prefix}timing_modes must list one or more of {', '.join(TIMING_MODES)}, got "
                          f"{list(config.timing_modes)}")
    if config.paired_reference and "graphed" in config.timing_modes:
        raise ConfigError(f"{prefix}paired_reference times eager and compiled calls, not CUDA graph replays: drop "
                          "\"graphed\" from timing_modes or the reference")
    if config.epochs < 0:
        raise ConfigError(f"{prefix}epochs must be >= 0, got {config.epochs}")
    if not (math.isfinite(config.timeout_s) and config.timeout_s >= 0):
        raise ConfigError(f"{prefix}timeout_s must be a finite number of seconds > 0 (or 0: chosen per point from "
                          f"its predicted cost), got {config.timeout_s}")
    if config.memory_limit_mb < 0:
        raise ConfigError(f"{prefix}memory_limit_mb must be >= 0 (0: no cap), got {config.memory_limit_mb}")
    if config.num_threads < 0:
        raise ConfigError(f"{prefix}num_threads must be >= 0 (0: chosen from the free cores), got {config.num_threads}")
    if config.parallel < 1:
        raise ConfigError(f"{prefix}parallel must be >= 1 (training points run at once), got {config.parallel}")
    if config.parallel > 1 and config.epochs and (config.device != "cpu" or config.num_threads < 1):
        raise ConfigError(f"{prefix}parallel {config.parallel} runs CPU training points side by side, each on its own "
                          "threads: set device = \"cpu\" and num_threads (e.g. --num-threads 1), or parallel = 1")
    _check_tables(config, prefix)
    _check_overrides(config, prefix)
    if config.memory_limit_mb and config.device == "cuda":
        raise ConfigError(f"{prefix}memory_limit_mb caps CPU memory only; leave it at 0 with device cuda")
    for name, value in config.timing.items():
        kind = _TIMING_TYPES.get(name)
        if kind is not None and (isinstance(value, bool) or not isinstance(value, kind)
                                 or (isinstance(value, float) and not math.isfinite(value))):
            expected = "an integer" if kind is int else "a finite number"
            raise ConfigError(f"{prefix}timing.{name} must be {expected}, got {value!r}")
    try:
        TimingProtocol(**config.timing)
    except TypeError as error:
        valid = ", ".join(f.name for f in dataclasses.fields(TimingProtocol))
        raise ConfigError(f"{prefix}timing: {error}; valid: {valid}") from None
    except ValueError as error:
        raise ConfigError(f"{prefix}{error}") from None


_TIMING_TYPES = {f.name: int if f.type == "int" else (int, float) for f in dataclasses.fields(TimingProtocol)}


def _check_numbers(config: SweepConfig, prefix: str) -> None:
    """Numeric fields hold numbers of their type, never booleans (`timeout_s = true` is a typo, not 1 s), and
    stay under `LIMITS`."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.type == "tuple[int, ...]":
            if any(isinstance(v, bool) or not isinstance(v, int) for v in value):
                raise ConfigError(f"{prefix}{f.name} must be a list of integers, got {list(value)!r}")
        elif f.type in ("int", "float"):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                    f.type == "int" and not isinstance(value, int)):
                what = "an integer" if f.type == "int" else "a number"
                raise ConfigError(f"{prefix}{f.name} must be {what}, got {value!r}")
        else:
            continue
        limit = LIMITS.get(f.name)
        largest = max(value, default=0) if isinstance(value, tuple) else value
        finite = isinstance(largest, int) or math.isfinite(largest)  # inf and nan: refused below, by name
        if limit is not None and finite and largest > limit:
            shown = f"{largest:,}" if isinstance(largest, int) else f"{largest:g}"
            raise ConfigError(f"{prefix}{f.name} must be <= {limit:,}, got {shown}; "
                              "that is far past what any machine runs, so it is taken for a typo")


def _check_overrides(config: SweepConfig, prefix: str) -> None:
    """Override values are data a ViT can take: no booleans where a number goes, no huge integers."""
    for mixer, table in config.overrides.items():
        for name, value in _leaves(table):
            where = f"{prefix}overrides.{mixer}.{name}"
            if isinstance(value, bool) and name in _VIT_NUMBERS:
                raise ConfigError(f"{where} must be a number, got {value!r}")
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_OVERRIDE_INT:
                raise ConfigError(f"{where} must be at most {MAX_OVERRIDE_INT:,} in size, got {value:,}; "
                                  "that is far past what any machine builds, so it is taken for a typo")


_VIT_NUMBERS = ("dim", "depth", "num_heads", "mlp_ratio", "drop_path_rate")


def _leaves(table: dict, path: str = "") -> list[tuple[str, object]]:
    """(dotted name, value) of every non-table value under `table`."""
    leaves = []
    for key, value in table.items():
        name = f"{path}{key}"
        leaves += _leaves(value, f"{name}.") if isinstance(value, dict) else [(name, value)]
    return leaves


def check_override_mixers(config: SweepConfig, available_mixers: list[str]) -> None:
    """An override names "*" or a registered mixer: `[overrides.mambaa]` would otherwise be ignored.

    Registered, not selected: one file may hold overrides for every mixer and `--mixers` pick a few.
    """
    unknown = [key for key in config.overrides if key != "*" and key not in available_mixers]
    if unknown:
        raise ConfigError(f"overrides.{unknown[0]}: no mixer {unknown[0]!r} is registered; an override table is "
                          f"named \"*\" (every mixer) or one of {', '.join(available_mixers)}")
    unknown = [key for key in config.lr_by_mixer if key not in available_mixers]
    if unknown:
        raise ConfigError(f"lr_by_mixer.{unknown[0]}: no mixer {unknown[0]!r} is registered; name one of "
                          f"{', '.join(available_mixers)}")


def _check_tables(config: SweepConfig, prefix: str) -> None:
    """The nested tables hold tables: `overrides` maps "*" or a mixer to a table of ViT fields."""
    bad = [key for key, value in config.overrides.items() if not isinstance(value, dict)]
    if bad:
        raise ConfigError(f"{prefix}overrides.{bad[0]!r} must be a table of ViT fields (e.g. "
                          f"[overrides.\"{bad[0]}\"] depth = 2), got {config.overrides[bad[0]]!r}")


def config_from_dict(values: dict, source: str) -> SweepConfig:
    """Builds a validated config; every error names `source` and the field."""
    unknown = set(values) - set(_TYPES)
    if unknown:
        raise ConfigError(f"{source}: unknown field(s) {', '.join(sorted(unknown))}; valid fields: "
                          f"{', '.join(sorted(_TYPES))}")
    try:
        runs = values.get("runs", [])
        if not isinstance(runs, (list, tuple)) or not all(isinstance(run, dict) for run in runs):
            raise ConfigError(f"runs must be a list of tables ([[runs]] sections of fields), got {runs!r}")
        converted = {k: _as_field(k, v, source) if k != "runs" else tuple(v) for k, v in values.items()}
        return SweepConfig(**converted)
    except ConfigError as error:
        message = str(error)
        raise ConfigError(message if message.startswith(source) else f"{source}: {message}") from None


# Flags that name the grid: without --config they build a sweep of their own (module docstring).
GRID_FIELDS = ("mixers", "presets", "img_sizes", "patch_sizes", "batch_sizes")
# Flags about training: on a config, they go to the runs that train.
TRAINING_FIELDS = ("epochs", "dataset", "data_dir", "data_path", "seeds", "parallel")
# Flags about the whole sweep, not about any one run.
SWEEP_FIELDS = ("out", "launcher")
# The name (and results/local/ folder) of a sweep built from flags alone.
FLAG_SWEEP_NAME = "custom"


def flag_to_option(name: str) -> str:
    return "--" + name.replace("_", "-")


def flag_built_values(default_values: dict, flags: dict) -> dict:
    """A sweep of the grid the flags name: the default config's top-level fields (not its runs) with `flags`.

    Raises:
        ConfigError: `--dataset` (or its data flags) without `--epochs N > 0`: a flag-built sweep trains only when
            told how long.
    """
    values = {k: v for k, v in default_values.items() if k not in ("runs", "name", "description")}
    values = {**values, **flags, "name": FLAG_SWEEP_NAME, "description": "built from command-line flags"}
    epochs = values.get("epochs", 0)
    asked = [flag_to_option(k) for k in ("dataset", "data_dir", "data_path") if k in flags]
    if asked and not (isinstance(epochs, int) and epochs > 0):
        raise ConfigError(f"{', '.join(asked)} asks for training, but a sweep built from flags measures cost only "
                          "unless --epochs N (N > 0) says how long to train; add --epochs")
    return values


def _trains(table: dict, top: dict) -> bool:
    epochs = table.get("epochs", top.get("epochs", 0))
    return isinstance(epochs, int) and not isinstance(epochs, bool) and epochs > 0


def apply_flags(values: dict, flags: dict) -> tuple[dict, list[list[str]]]:
    """`values` (a config's raw fields) with command-line `flags` applied by the rule of the module docstring.

    Returns:
        The raw fields, and per run (one entry when the config has no `[[runs]]`) the flags it took.
    """
    runs = values.get("runs")
    if not isinstance(runs, list) or not runs or not all(isinstance(r, dict) for r in runs):
        # One run (or a malformed list, which config_from_dict refuses): the flags are its fields.
        return {**values, **flags}, [[k for k in flags if k not in SWEEP_FIELDS]]
    sweep = {k: v for k, v in flags.items() if k in SWEEP_FIELDS}
    every = {k: v for k, v in flags.items() if k not in SWEEP_FIELDS and k not in TRAINING_FIELDS}
    training = {k: v for k, v in flags.items() if k in TRAINING_FIELDS}
    training_runs = [i for i, run in enumerate(runs) if _trains(run, values)]
    targets = training_runs or list(range(len(runs)))  # nothing trains: a cost config asked to train
    new_runs, taken = [], []
    for index, run in enumerate(runs):
        run_flags = {**every, **(training if index in targets else {})}
        new_runs.append({**run, **run_flags})
        taken.append(list(run_flags))
    return {**values, **sweep, "runs": new_runs}, taken


def describe_runs(config: SweepConfig, available_mixers: list[str], run_points: list[list[Point]],
                  taken: list[list[str]]) -> list[str]:
    """One line per run for `--dry-run`: what it does, how many points, and which flags it took.

    Args:
        config: the sweep.
        available_mixers: the registry's mixers (a run without `mixers` runs them all).
        run_points: `config.run_points(available_mixers)`, computed once (each run builds its models to check them).
        taken: per run, the flags it took (`apply_flags`).
    """
    lines = []
    for name, run, points, flags in zip(config.run_names(), config.run_configs(), run_points, taken):
        what = f"trains on {run.dataset} for {run.epochs} epochs" if run.epochs else "cost only"
        seeds = len(run.seeds) if run.epochs else 1  # a cost point runs once, with the first seed
        sizes = [len(run.mixers or available_mixers), len(run.presets), len(run.img_sizes), len(run.patch_sizes),
                 len(run.batch_sizes)]
        factors = [_count(n, noun) for n, noun in zip(sizes, ("mixer", "preset", "image size", "patch size",
                                                              "batch size"))]
        if run.epochs and run.lr_from:  # every point waits for the other run's grid
            factors.append(_count(len(run.seeds), "seed"))
            what += (f", every mixer at the rate run {run.lr_from}'s learning-rate grid chooses for it on validation "
                     "(its points wait on that grid, listed below once planned)")
        elif run.epochs and run.lr_grid:  # the grid first; the other seeds wait for each setting's chosen rate
            factors += [_count(len(run.lr_grid), "rate"), _count(len(run.grid_seeds), "seed")]
            what += (f"; a learning-rate grid first, then seeds {', '.join(map(str, run.seeds))} at each setting's "
                     "rate chosen on validation (listed below once planned)")
        else:
            factors.append(_count(seeds, "seed"))
        options = ", ".join(flag_to_option(k) for k in flags) or "none"
        count = math.prod(sizes) * len(run.seeds) if run.epochs and run.lr_from else len(points)
        lines.append(f"run {name}: {what}, {count} points ({' x '.join(factors)}); flags taken: {options}")
    return lines


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def named_configs() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))


def load_config(name_or_path: str) -> tuple[dict, str]:
    """The raw fields of a named config (experiments/configs/NAME.toml) or a TOML file path, and its source."""
    path = Path(name_or_path)
    if not path.suffix:
        path = CONFIG_DIR / f"{name_or_path}.toml"
    if not path.exists():
        raise ConfigError(f"no config {name_or_path!r}; named configs: {', '.join(named_configs())}, or give a .toml path")
    if not path.is_file():
        raise ConfigError(f"--config {path} is not a file; give a .toml file or a named config")
    try:
        values = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML ({error})") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text (byte {error.start}); TOML files are UTF-8, save it so") from None
    except OSError as error:
        raise ConfigError(f"--config {path}: cannot read it ({error.strerror or error})") from None
    # Unnamed configs would all share results/local/custom/ and resume from each other's rows: name it after its file.
    values.setdefault("name", name_from_stem(path.stem))
    return values, path.name


def name_from_stem(stem: str) -> str:
    """A config name from a file name: letters, digits and underscores ("my sweep.v2" -> "my_sweep_v2")."""
    return re.sub(r"\W+", "_", stem, flags=re.ASCII).strip("_") or FLAG_SWEEP_NAME
