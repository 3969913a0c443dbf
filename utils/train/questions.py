"""The pool of train rows an RL run draws its questions from, and how the stream mixes them.

`algorithm.rl.min_subtasks` / `max_subtasks` keep the rows whose gold decomposition (`meta.steps`)
has that many subtasks; `algorithm.rl.stratify` draws the pool's gold lengths in a fixed mix
(utils/core/stream.py `epoch_order`), so a step's batch accuracy does not move with how many long
chains its questions happened to hold. SFT traces are not affected (traces.*).
"""
from __future__ import annotations

from pathlib import Path

from utils.core.errors import StageError


def gold_length(row: dict) -> int | None:
    """The number of subtasks in the row's gold decomposition, or None when it has none."""
    steps = (row.get("meta") or {}).get("steps")
    return len(steps) if isinstance(steps, list) else None


def rl_questions(rows: list[dict], cfg, path: Path) -> list[dict]:
    """The train rows RL samples questions from: all, or with algorithm.rl.min_subtasks > 0 or
    max_subtasks > 0 those whose gold decomposition has that many subtasks (rows without one are
    left out). With algorithm.rl.stratify every row left must carry a decomposition."""
    rl = cfg.algorithm.rl
    lo, hi = rl.min_subtasks, rl.max_subtasks
    if hi and hi < lo:
        raise StageError(f"algorithm.rl.max_subtasks={hi} is below algorithm.rl.min_subtasks={lo}: no question fits")
    kept = rows
    if lo > 0 or hi > 0:
        kept = [r for r in rows if (n := gold_length(r)) is not None and n >= lo and (not hi or n <= hi)]
        if not kept:
            bounds = f"{lo}" + (f" to {hi}" if hi else " or more")
            raise StageError(f"{path}: no row has a gold decomposition of {bounds} subtasks "
                             f"(algorithm.rl.min_subtasks={lo}, max_subtasks={hi}); set both to 0 to use every row")
    if rl.stratify:
        rl_strata(kept, path)
    return kept


def rl_strata(rows: list[dict], path: Path) -> list[int]:
    """Each row's gold length: the stream's strata under algorithm.rl.stratify."""
    out = []
    for i, row in enumerate(rows):
        n = gold_length(row)
        if n is None:
            raise StageError(f"{path}: row {i + 1} (id {row.get('id')!r}): field meta.steps is missing or not a "
                             "list; algorithm.rl.stratify draws questions by gold length and needs it on every "
                             "row (set algorithm.rl.min_subtasks=1 to leave such rows out)")
        out.append(n)
    return out
