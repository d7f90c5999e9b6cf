"""One point of a sweep: a configuration to build, measure and (optionally) train."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field

from ..lr_grid import format_rate
from ..schema import KEY_COLUMNS, MAX_BATCH
from .timing import TimingProtocol


@dataclass(frozen=True)
class Point:
    """Everything a worker needs to produce one row; the key fields identify the row in runs.csv."""

    mixer: str
    preset: str
    img_size: int
    patch_size: int
    batch_size: int
    device: str = "cpu"
    dtype: str = "float32"
    dataset: str = ""
    epochs: int = 0
    seed: int = 0
    overrides: str = "{}"  # JSON: ViTConfig overrides and "mixer_options", sorted keys
    train: str = "{}"  # JSON of TrainRecipe fields; "{}" when epochs is 0
    compile: str = ""  # torch.compile mode; "" runs eager
    timing_mode: str = "eager"  # eager | graphed (experiments/measure/graphed.py)
    # how to measure (not part of the key)
    timing: TimingProtocol = field(default_factory=TimingProtocol)
    measure_train_step: bool = True
    memory_limit_mb: int = 0
    num_threads: int = 0
    parallel: int = 1  # training points of this run that run at once, each on its own num_threads (CPU only)
    data_dir: str = ""
    data_path: str = ""
    timeout_s: float = 1800.0
    checkpoint_dir: str = ""  # where training checkpoints go, so a killed training point resumes
    erf_path: str = ""  # where a training point saves its effective receptive field maps (.npz); "" = none
    curve_path: str = ""  # where a training point writes its learning curve (.csv, schema.CURVE_COLUMNS); "" = none
    weights_path: str = ""  # where a training point saves its final weights (.safetensors); "" = none
    # "grid": a learning-rate grid run; "seed": a seed run at the rate the grid chose (experiments/lr_grid.py);
    # "seed?": a seed run whose rate the grid has yet to choose (a plan only); "" when the sweep has no grid
    lr_stage: str = ""
    lr_source: str = ""  # where the config's lr_by_mixer rate of this mixer was chosen; "" when it has none
    device_peak_tflops: float = 0.0  # the sweep's matmul calibration (experiments/measure/peak.py); 0 = none
    # a mixer timed beside this point, call for call, after its own measurements (experiments/measure/paired.py)
    paired_reference: str = ""

    @property
    def tokens(self) -> int:
        return (self.img_size // self.patch_size) ** 2

    @property
    def planned_batch(self) -> int:
        """The batch a cost prediction assumes: batch_size, or for max the most it may try (an upper bound)."""
        return self.timing.max_batch if self.batch_size == MAX_BATCH else self.batch_size

    @property
    def key(self) -> tuple[str, ...]:
        return point_key(asdict(self))

    @property
    def group(self) -> tuple[str, ...]:
        return point_group(asdict(self))

    def label(self) -> str:
        """One line for progress and plans; a training point names its seed, which is all that tells its seeds
        apart (a cost point runs once, with one seed, so it does not)."""
        extra = f" {self.overrides}" if self.overrides != "{}" else ""
        train = f" {self.dataset} x{self.epochs}ep seed {self.seed}" if self.epochs else ""
        compiled = f" compile={self.compile}" if self.compile else ""
        graphed = " graphed" if self.timing_mode == "graphed" else ""
        batch = "max" if self.batch_size == MAX_BATCH else self.batch_size
        return (
            f"{self.mixer}{self._rate_label()} {self.preset}{extra} {self.img_size}px/p{self.patch_size} "
            f"N={self.tokens} b{batch}{graphed} {self.dtype}{train}{compiled}"
        )

    def _rate_label(self) -> str:
        if self.lr_source:
            return f" lr={format_rate(json.loads(self.train)['lr'])}"
        if not self.lr_stage:
            return ""
        if self.lr_stage == "seed?":
            return " lr=chosen"
        return f" lr={format_rate(json.loads(self.train)['lr'])}"  # the label ends with the seed already


def wants_pairing(point: Point) -> bool:
    """Whether the point's worker times `paired_reference` beside it (experiments/measure/paired.py)."""
    return bool(point.paired_reference) and point.paired_reference != point.mixer


def reference_point(point: Point) -> Point:
    """The point with the reference mixer at its default options: the model overrides stay, `mixer_options`
    (the point's mixer's own) go, as for the reference row that ratios.py divides by."""
    overrides = json.loads(point.overrides)
    overrides.pop("mixer_options", None)
    return dataclasses.replace(point, mixer=point.paired_reference, overrides=canonical_json(overrides))


def canonical_json(value: dict) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def point_key(row: dict) -> tuple[str, ...]:
    """A row's identity as strings, so a point read back from CSV compares equal to one about to run."""
    return tuple(str(row.get(column, "")) for column in KEY_COLUMNS)


# Points that differ only in size: once one runs out of memory, the larger ones of its group are skipped.
GROUP_COLUMNS = tuple(c for c in KEY_COLUMNS if c not in ("img_size", "patch_size"))


def point_group(row: dict) -> tuple[str, ...]:
    return tuple(str(row.get(column, "")) for column in GROUP_COLUMNS)
