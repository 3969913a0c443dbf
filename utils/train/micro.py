"""Micro-batches: a batch's forward and backward in pieces of bounded size, with the one-pass gradient
(docs/ARCHITECTURE.md, "Memory of the update").

An optimizer step's batch is cut into micro-batches of at most `model.memory.micro_batch_tokens`
tokens, sequences longest first, and each micro-batch's graph is freed by its own backward, so the
memory of an update no longer grows with the batch. Every normaliser of the loss (trained tokens,
live episodes, rollout tokens, SFT target tokens) is counted over the whole batch and every
data-parallel rank *before* the loop, and each micro-batch's loss is its rows' sum divided by
those totals: the accumulated gradient is the one-pass gradient of the whole batch, on one rank or
several (the ranks' gradients are then summed, not averaged). One finiteness decision, one clip
and one optimizer step per batch (utils/train/guard.py `finish_step`), and no collective inside the loop, so ranks
with different numbers of micro-batches stay in step.
"""
from __future__ import annotations

import torch

from utils.train.world import SOLO, World


def micro_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices of rows in micro-batches of at most `budget` tokens (their lengths' sum), filled in
    decreasing length, each listed in batch order; a row longer than `budget` goes alone. `budget` 0:
    one micro-batch of every row (none for no rows)."""
    if not lengths:
        return []
    if budget <= 0 or sum(lengths) <= budget:
        return [list(range(len(lengths)))]
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    out, current, used = [], [], 0
    for i in order:
        if current and used + lengths[i] > budget:
            out.append(sorted(current))
            current, used = [], 0
        current.append(i)
        used += lengths[i]
    out.append(sorted(current))
    return out


def cut_rows(rows: list[int], ids: torch.Tensor, attn: torch.Tensor, *per_token: torch.Tensor | None) -> tuple:
    """(ids, attn) of right-padded `rows`, cut to their longest sequence, then each [S, T-1] tensor of
    `per_token` at the same rows and positions (None stays None)."""
    idx = torch.tensor(rows, device=ids.device)
    width = int(attn[idx].sum(1).max())
    return (ids[idx, :width], attn[idx, :width], *(None if t is None else t[idx, :width - 1] for t in per_token))


class Tally:
    """A step's logged statistics, gathered over micro-batches and ranks.

    `add(key, value)` adds a share that is already normalised by the whole batch (a loss term, an
    entropy over all rollout tokens): the statistic is the sum of its shares. `add(key, value, weight)`
    adds a mean over `weight` items of this piece (a clip fraction over its tokens): the statistic
    is the weighted mean. `shared` values are the same on every piece and rank that sets them (RED's
    weights, red_paper's entropies): a rank that set none (it held no SFT row, or no row at all) logs
    the others'. A statistic with a single share in one process is that share, unchanged."""

    def __init__(self):
        self.parts: dict[str, list[tuple[float, float | None]]] = {}
        self.shared: dict[str, float] = {}

    def add(self, key: str, value: float, weight: float | None = None) -> None:
        self.parts.setdefault(key, []).append((float(value), None if weight is None else float(weight)))

    def result(self, world: World = SOLO) -> dict:
        sums = {}
        for key, parts in self.parts.items():
            weighted = parts[0][1] is not None
            if world.size == 1 and len(parts) == 1:
                sums[key] = (parts[0][0], None)
            elif weighted:
                sums[key] = (sum(v * w for v, w in parts), sum(w for _, w in parts))
            else:
                sums[key] = (sum(v for v, _ in parts), None)
        shared = self.shared
        if world.size > 1:
            merged: dict[str, tuple[float, float | None]] = {}
            shared = {}
            for rank_sums, rank_shared in world.gather((sums, self.shared)):
                for key, (num, den) in rank_sums.items():
                    old = merged.get(key, (0.0, None if den is None else 0.0))
                    merged[key] = (old[0] + num, None if den is None else old[1] + den)
                shared = {**rank_shared, **shared}  # the same on every rank that has them: the lowest rank's
            sums = merged
        out = {k: (num if den is None else (num / den if den else 0.0)) for k, (num, den) in sums.items()}
        return {**out, **shared}

