"""What a claims file says beyond its claims: the paper's setting, what differs from the paper's models, and from
which batch a verdict is given (below it both models sit on their launch floors, and a ratio compares floors).

    setting = "batch inference at 1248 px, total GPU memory; ..."
    differences = ["Vim-Ti: middle cls token, ...", "ours: ..."]   # also per claim
    verdict_min_batch = 16
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


# Named claims files: `--claims vim_1248` reads claims/vim_1248.toml here.
CLAIMS_DIR = Path(__file__).parent / "claims"

# The file-level fields beside `source` and `[[claims]]` (claims.load_claims accepts them).
SETTING_FIELDS = ("setting", "differences", "verdict_min_batch")


@dataclass(frozen=True)
class ClaimsSetting:
    setting: str = ""
    differences: tuple[str, ...] = field(default_factory=tuple)
    verdict_min_batch: int = 1


def claims_setting(name_or_path: str) -> ClaimsSetting:
    """The file-level fields of a claims file (read after `claims.load_claims` has checked it)."""
    data = tomllib.loads(claims_path(name_or_path).read_text(encoding="utf-8"))
    return ClaimsSetting(str(data.get("setting", "")), tuple(str(d) for d in data.get("differences", [])),
                         int(data.get("verdict_min_batch", 1)))


def claims_path(name_or_path: str) -> Path:
    """The file a claims name stands for: a path as given, or a bare name (no suffix) in `CLAIMS_DIR`."""
    path = Path(name_or_path)
    return CLAIMS_DIR / f"{name_or_path}.toml" if not path.suffix else path
