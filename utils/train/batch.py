"""The RL batch: the trained sequences of a step's episodes as padded rows, and their slicing into
minibatches (whole episodes), SFT parts and micro-batches (docs/ARCHITECTURE.md, "Training").

`build_rl_batch` turns episodes (utils/agent/episode.py) into an `RlBatch`: every planner
conversation and executor call with a trained token, each with its episode's advantage (per token
with process rewards), then red_paper's expert sequences. `micro_batches` cuts a step's rows into
pieces of at most `model.memory.micro_batch_tokens` tokens, longest first, so that the update's
memory does not grow with the batch (utils/train/update.py gives each piece its share).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from utils.agent.episode import Episode, Example, episode_sequences
from utils.agent.protocol import PLANNER
from utils.core.schema import TRAIN_ROLES
from utils.core.tensors import pad


@dataclass
class RlBatch:
    """Padded training sequences of one rollout batch. ids/mask/sampler_lp [S, T]; adv [S]; `episode`
    [S] the episode (or expert trace) each sequence came from; with red_paper, `offline` [S] marks
    expert sequences and `accuracy` [S] is their group's accuracy; `correct` [S] whether the
    sequence's episode answered right (SRFT's rollout advantage reads it; expert sequences: true)."""

    ids: torch.Tensor
    attn: torch.Tensor
    mask: torch.Tensor  # over next-token positions: [S, T-1]
    sampler_lp: torch.Tensor | None  # [S, T-1]; None on a step that did not ask the sampler (mismatch_every)
    adv: torch.Tensor  # [S]
    roles: list[str]
    offline: torch.Tensor | None = None  # [S] bool
    accuracy: torch.Tensor | None = None  # [S]
    token_adv: torch.Tensor | None = None  # [S, T-1]: with process rewards, per-token advantages
    episode: torch.Tensor | None = None  # [S] long
    correct: torch.Tensor | None = None  # [S] bool

    def to(self, device) -> "RlBatch":
        """The batch with every tensor on `device` (the policy's)."""
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)
                                if isinstance(getattr(self, f.name), torch.Tensor)})


def _token_advantages(ep: Episode, ex, adv: float, bonus: list[float]) -> list[float]:
    """Per token of `ex`: the episode's advantage, plus on a planner conversation turn k's `bonus[k]`
    over that turn's generated tokens (each turn's tokens start where its context ends)."""
    out = [adv] * len(ex.ids)
    if ex.role == PLANNER:
        for seg, b in zip((s for s in ep.segments if s.role == PLANNER), bonus):
            start = len(seg.context_ids)
            out[start:start + len(seg.gen_ids)] = [adv + b] * len(seg.gen_ids)
    return out


@dataclass
class _Sequence:
    """One trained sequence on its way into an RlBatch: the example, its advantage, its group's
    accuracy (expert sequences of red_paper only; None for rollouts), its per-token advantages
    (process rewards) and the episode (or expert trace) it came from."""
    ex: Example
    adv: float
    accuracy: float | None
    token_adv: list[float] | None
    episode: int


def build_rl_batch(episodes: list[Episode], adv: torch.Tensor, pad_id: int, roles: str = "both",
                   offline: list[tuple] = (), turn_bonus: list[list[float]] | None = None,
                   correct: list[bool] | None = None) -> RlBatch | None:
    """Every trained sequence of the episodes (utils/agent/episode.py) whose role `roles` selects
    ("both", "planner", "executor"), each with its episode's advantage, then the `offline`
    (Example, advantage, group accuracy) expert sequences of red_paper; None if no sequence has a
    trained token. Expert sequences have no sampler: their sampler log-probs are 0. With
    `turn_bonus` (per episode, per planner turn: process rewards) the batch carries per-token
    advantages (`token_adv`). `correct` (per episode) fills the batch's `correct`."""
    if roles not in TRAIN_ROLES:
        raise ValueError(f"roles must be {', '.join(TRAIN_ROLES[:-1])} or {TRAIN_ROLES[-1]}, got {roles!r}")
    bonus = turn_bonus or [[] for _ in episodes]
    seqs = [_Sequence(ex, a, None, _token_advantages(ep, ex, a, b) if turn_bonus is not None else None, i)
            for i, (ep, a, b) in enumerate(zip(episodes, adv.tolist(), bonus)) for ex in episode_sequences(ep)]
    seqs += [_Sequence(ex, a, acc, [a] * len(ex.ids), len(episodes) + j) for j, (ex, a, acc) in enumerate(offline)]
    seqs = [s for s in seqs if sum(s.ex.mask) and roles in ("both", s.ex.role)]
    if not seqs:
        return None
    ids, attn = pad([s.ex.ids for s in seqs], pad_id, torch.long)
    mask, _ = pad([s.ex.mask for s in seqs], 0, torch.float)
    sampled = all(s.ex.logprobs is not None for s in seqs if s.accuracy is None)  # rollout sequences only
    lp = pad([s.ex.logprobs or [0.0] * len(s.ex.ids) for s in seqs], 0.0, torch.float)[0] if sampled else None
    token_adv = pad([s.token_adv for s in seqs], 0.0, torch.float)[0][:, 1:] if turn_bonus is not None else None
    right = (torch.tensor([s.accuracy is not None or bool(correct[s.episode]) for s in seqs])
             if correct is not None else None)
    # position t of ids is predicted from position t-1: shift the token-aligned mask and log-probs
    return RlBatch(ids, attn, mask[:, 1:], lp[:, 1:] if lp is not None else None, torch.tensor([s.adv for s in seqs]),
                   [s.ex.role for s in seqs], torch.tensor([s.accuracy is not None for s in seqs]),
                   torch.tensor([s.accuracy or 0.0 for s in seqs]), token_adv, torch.tensor([s.episode for s in seqs]),
                   right)


def minibatch_rows(batch: RlBatch, parts: int) -> list[torch.Tensor]:
    """Row indices of `parts` minibatches of whole episodes: an episode's planner and executor
    sequences stay together, consecutive episodes go together, as even as the count allows; a part
    that got no episode is empty (a rank with fewer episodes than parts still takes every step)."""
    episode = batch.episode if batch.episode is not None else torch.arange(len(batch.adv))
    return [torch.isin(episode, chunk).nonzero().squeeze(1) for chunk in torch.tensor_split(episode.unique(), parts)]


def take_rows(batch: RlBatch, rows: torch.Tensor, *per_token: torch.Tensor | None) -> tuple:
    """(the batch's `rows` cut to their longest sequence, then the same rows and token columns of each
    [S, T-1] tensor in `per_token`; None stays None)."""
    width = int(batch.attn[rows].sum(1).max())  # right padded: the longest kept sequence's length

    def cut(t):
        if t is None:
            return None
        t = t[rows]
        if t.dim() == 1:
            return t
        return t[:, :width] if t.shape[1] == batch.ids.shape[1] else t[:, :width - 1]

    part = replace(batch, roles=[batch.roles[i] for i in rows.tolist()],
                   **{f.name: cut(getattr(batch, f.name)) for f in fields(batch)
                      if isinstance(getattr(batch, f.name), torch.Tensor)})
    return (part, *(cut(t) for t in per_token))


def sft_parts(sft: tuple | None, parts: int) -> list[tuple | None]:
    """An `sft_batch` (ids, attn, mask) in `parts` consecutive row ranges, each cut to its longest
    example; None for a range with no example (or when there is no SFT batch)."""
    if sft is None or parts == 1:
        return [sft] * parts
    return [cut_rows(rows.tolist(), *sft) if len(rows) else None
            for rows in torch.tensor_split(torch.arange(len(sft[0])), parts)]


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


def offline_rows(batch: RlBatch) -> torch.Tensor:
    """[S, 1]: 1.0 on expert rows (red_paper), else 0."""
    if batch.offline is None:
        return torch.zeros(len(batch.adv), 1, device=batch.mask.device)
    return batch.offline[:, None].float()
