"""Committed reference results (results/<name>/, not results/local/) come from a clean working tree only.

A row says `dirty=True` when the code that measured it had uncommitted changes: its `commit` then names code that
did not run, and a reader cannot cite it. A sweep into a reference folder is refused from a dirty tree unless
`--allow-dirty` says the rows may carry that mark. Where git cannot say (no git on PATH), the commit is unknown and
the tree's state too: the rows record `dirty` empty (never False), and a reference folder is refused likewise.
"""
from __future__ import annotations

from pathlib import Path

from ..measure.provenance import REPO_ROOT, git_state
from .config import ConfigError

RESULTS_DIR = REPO_ROOT / "results"
LOCAL_DIR = RESULTS_DIR / "local"


def is_reference_folder(out_dir: Path) -> bool:
    """True for a folder under the repository's results/ that is not under results/local/."""
    out = out_dir.resolve()
    return out.is_relative_to(RESULTS_DIR) and not out.is_relative_to(LOCAL_DIR) and out != RESULTS_DIR


def check_clean_tree(out_dir: Path, allow_dirty: bool) -> None:
    """Raises ConfigError (one line) when `out_dir` holds committed references and the code has uncommitted changes.

    results/ itself is left out of the check (experiments/measure/provenance.py), so a sweep's own rows never
    make the tree dirty.
    """
    if allow_dirty or not is_reference_folder(out_dir):
        return
    commit, dirty = git_state()
    if dirty is None:  # unknown is not clean: a reference row must cite code a reader can check out
        raise ConfigError(f"--out {out_dir} holds committed reference results, and git cannot say which code is "
                          f"running (commit {commit}: no git on PATH, or not a checkout), so no row could cite it; "
                          f"run where git works, write to results/local/, or pass --allow-dirty (rows then leave "
                          f"dirty empty)")
    if dirty:
        raise ConfigError(f"--out {out_dir} holds committed reference results, and the working tree has uncommitted "
                          f"changes (see git status), so no row could cite the code that ran; commit first, write to "
                          f"results/local/, or pass --allow-dirty (rows then say dirty=True)")
