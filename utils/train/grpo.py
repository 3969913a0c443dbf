"""One RED-GRPO training step, as functions over explicit inputs (docs/ARCHITECTURE.md, "Training").

    1. roll out questions x n samples on the engine serving the current adapter
    2. score each episode with the reward spec
    3. group advantages; every segment of an episode (planner and executor) gets its advantage
    4. recompute log-probs of the sampled tokens with the trainer model
    5. draw an SFT batch
    6. one optimizer step on  L_GRPO − β·H_rl + w·α·L_SFT (+ kl_coef·KL); L_GRPO is the configured
       policy loss (PPO-clip, or GSPO's sequence-level ratio), optionally importance-weighted
       against the sampler (TIS)
    7. update the RED state
    8. give the new adapter to the engine

Departures from the seed, stated once: the PPO "old" log-probs are the trainer's, not the
sampler's: with one optimizer pass per batch (the default) the update's own, detached; with more,
a separate forward before the first pass. The sampler's log-probs are compared with them and the
mean absolute difference is logged as `rollout/logprob_mismatch`, so a stale sampler is visible
(on every `algorithm.rl.mismatch_every`-th step: training itself reads them only for TIS).
All policy log-probs (old, new, KL reference) are of the tempered distribution the rollout sampled
from, logits / T. The KL reference is the policy RL starts from: the SFT warmup adapter, frozen
(`add_reference`), not the bare base, which does not know the protocol; its log-probs are computed
once per step, before the update.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from utils.agent.episode import Episode, episode_sequences
from utils.agent.protocol import PLANNER
from utils.core.schema import TRAIN_ROLES
from utils.core.tensors import pad
from utils.reward.scorers import is_correct
from utils.train.losses import Agg, advantages, aggregate, k3_kl, policy_loss, red_paper_entropy_weight, red_paper_loss
from utils.train.policy import forward_logprobs, sft_terms
from utils.train.red import red_weights


@dataclass
class RlBatch:
    """Padded training sequences of one rollout batch. ids/mask/sampler_lp [S, T]; adv [S]; `episode`
    [S] the episode (or expert trace) each sequence came from; with red_paper, `offline` [S] marks
    expert sequences and `accuracy` [S] is their group's accuracy."""

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


def build_rl_batch(episodes: list[Episode], adv: torch.Tensor, pad_id: int, roles: str = "both",
                   offline: list[tuple] = (), turn_bonus: list[list[float]] | None = None) -> RlBatch | None:
    """Every trained sequence of the episodes (utils/agent/episode.py) whose role `roles` selects
    ("both", "planner", "executor"), each with its episode's advantage, then the `offline`
    (Example, advantage, group accuracy) expert sequences of red_paper; None if no sequence has a
    trained token. Expert sequences have no sampler: their sampler log-probs are 0. With
    `turn_bonus` (per episode, per planner turn: process rewards) the batch carries per-token
    advantages (`token_adv`)."""
    if roles not in TRAIN_ROLES:
        raise ValueError(f"roles must be {', '.join(TRAIN_ROLES[:-1])} or {TRAIN_ROLES[-1]}, got {roles!r}")
    bonus = turn_bonus or [[] for _ in episodes]
    seqs = [(ex, a, None, _token_advantages(ep, ex, a, b) if turn_bonus is not None else None, i)
            for i, (ep, a, b) in enumerate(zip(episodes, adv.tolist(), bonus)) for ex in episode_sequences(ep)]
    seqs += [(ex, a, acc, [a] * len(ex.ids), len(episodes) + j) for j, (ex, a, acc) in enumerate(offline)]
    seqs = [s for s in seqs if sum(s[0].mask) and roles in ("both", s[0].role)]
    if not seqs:
        return None
    ids, attn = pad([s[0].ids for s in seqs], pad_id, torch.long)
    mask, _ = pad([s[0].mask for s in seqs], 0, torch.float)
    sampled = all(s[0].logprobs is not None for s in seqs if s[2] is None)  # rollout sequences only
    lp = pad([s[0].logprobs or [0.0] * len(s[0].ids) for s in seqs], 0.0, torch.float)[0] if sampled else None
    token_adv = pad([s[3] for s in seqs], 0.0, torch.float)[0][:, 1:] if turn_bonus is not None else None
    # position t of ids is predicted from position t-1: shift the token-aligned mask and log-probs
    return RlBatch(ids, attn, mask[:, 1:], lp[:, 1:] if lp is not None else None, torch.tensor([s[1] for s in seqs]),
                   [s[0].role for s in seqs], torch.tensor([s[2] is not None for s in seqs]),
                   torch.tensor([s[2] or 0.0 for s in seqs]), token_adv, torch.tensor([s[4] for s in seqs]))


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
    ids, attn, mask = sft
    out = []
    for rows in torch.tensor_split(torch.arange(len(ids)), parts):
        width = int(attn[rows].sum(1).max()) if len(rows) else 0
        out.append((ids[rows, :width], attn[rows, :width], mask[rows, :width - 1]) if len(rows) else None)
    return out


def _agg(rl, batch: RlBatch) -> Agg:
    """The configured aggregation over this batch's episodes (utils/train/losses.py Agg)."""
    return Agg(rl.loss_agg, batch.episode, rl.loss_horizon)


@dataclass
class LossTerms:
    loss: torch.Tensor
    stats: dict
    logp: torch.Tensor | None = None  # this forward's rollout log-probs [S, T-1], detached


def _offline_policy_loss(logp, old_lp, ent, h_rl: float, batch: RlBatch, alg,
                         paper_state: dict) -> tuple[torch.Tensor, dict]:
    """red_paper's policy loss (utils/train/losses.py red_paper_loss) with the expert advantages
    scaled by the entropy-change weight; `h_rl` is the rollout tokens' entropy; stats carry this
    step's entropies for the next step's weight."""
    rl, off = alg.rl, batch.offline
    with torch.no_grad():
        h_sft = aggregate("token-mean", ent, batch.mask * off[:, None].float()).item()
    w = red_paper_entropy_weight(h_sft, h_rl, paper_state.get("h_sft"), paper_state.get("h_rl"),
                                 alg.red_paper.entropy_weight_max)
    adv = torch.where(off, batch.adv * w, batch.adv)
    pg, stats = red_paper_loss(logp, old_lp, adv, batch.mask, off, batch.accuracy, rl.clip_low, rl.clip_high,
                               _agg(rl, batch), alg.red_paper.policy_shift)
    return pg, {**stats, "entropy_weight": w, "h_sft": h_sft, "h_rl": h_rl}


def red_grpo_loss(model, batch: RlBatch, old_lp: torch.Tensor, sft: tuple | None, alg, red_state,
                  batch_accuracy: float, ref_lp: torch.Tensor | None = None, paper_state: dict | None = None) -> LossTerms:
    """L = L_GRPO − β·H_rl + w·α·L_SFT + kl_coef·KL, with every term's value in `stats`. `old_lp`
    [S, T-1] are the sampling policy's log-probs (None: this forward's own, detached, which is exact
    when the batch gets one optimizer pass); `ref_lp` the KL reference's (needed when kl_coef > 0);
    `stats["rollout/logprob_mismatch"]` is the mean |old − sampler| over trained rollout tokens.
    A batch with expert sequences (red_paper) uses `_offline_policy_loss` with `paper_state`, the
    previous step's entropies ({} on the first)."""
    rl = alg.rl
    logp, ent = forward_logprobs(model, batch.ids, batch.attn, with_entropy=True, temperature=rl.temperature)
    if old_lp is None:  # one pass per batch: the policy being updated is the one that sampled
        old_lp = logp.detach()
    offline = batch.offline is not None and bool(batch.offline.any())
    rollout_mask = batch.mask * (~batch.offline)[:, None].float() if offline else batch.mask
    h_rl = aggregate("token-mean", ent, rollout_mask)
    if offline:
        pg, pg_stats = _offline_policy_loss(logp, old_lp, ent, h_rl.item(), batch, alg, paper_state or {})
    else:
        adv = batch.token_adv if batch.token_adv is not None else batch.adv
        pg, pg_stats = policy_loss(rl.policy_loss, logp, old_lp, adv, batch.mask, rl.clip_low, rl.clip_high,
                                   _agg(rl, batch), sampler_logp=batch.sampler_lp, tis_cap=rl.tis_cap)
    loss = pg - rl.entropy_coef * h_rl
    stats = {"actor/pg_loss": pg.item(), "actor/rl_entropy": h_rl.item(), "actor/clip_frac": pg_stats["clip_frac"],
             "actor/ratio_mean": pg_stats["ratio_mean"]}
    if batch.sampler_lp is not None:  # a step that asked the sampler (algorithm.rl.mismatch_every)
        mismatch = ((old_lp - batch.sampler_lp).abs() * rollout_mask).sum() / rollout_mask.sum().clamp(min=1)
        stats["rollout/logprob_mismatch"] = mismatch.item()
    stats.update({f"actor/{k}": v for k, v in pg_stats.items() if k.startswith("tis_")})
    stats.update({f"red_paper/{k}": v for k, v in pg_stats.items()
                  if k in ("entropy_weight", "h_sft", "h_rl", "offline_ratio_mean")})
    if rl.kl_coef > 0:
        if ref_lp is None:
            raise ValueError("algorithm.rl.kl_coef > 0 needs the reference log-probs (add_reference)")
        kl = aggregate(_agg(rl, batch), k3_kl(logp, ref_lp), batch.mask)
        loss = loss + rl.kl_coef * kl
        stats["actor/kl"] = kl.item()
    if sft is not None:
        l_sft, h_sft = sft_terms(model, sft, with_entropy=True)
        w = red_weights(red_state, batch_accuracy, alg.red.G, alg.red.accuracy_aware_policy_shift,
                        alg.red.weight_min, alg.red.weight_max)
        loss = loss + w["red/final_weight"] * alg.sft.loss_coef * l_sft
        stats.update(w)
        stats.update({"actor/sft_loss": l_sft.item(), "actor/sft_entropy": h_sft.item()})
    stats["actor/loss"] = loss.item()
    return LossTerms(loss, stats, logp.detach())


def group_advantages(rewards: list[float], n: int, scaling: str) -> torch.Tensor:
    return advantages(scaling, torch.tensor(rewards, dtype=torch.float), n)


def batch_accuracy(scored: list[dict]) -> float:
    """RED's `acc`: the share of scored episodes whose answer is fully correct (an F1 of 0.5 counts 0)."""
    return sum(is_correct(s["answer"]) for s in scored) / max(len(scored), 1)


def zero_variance_fraction(rewards: list[float], n: int) -> float:
    groups = [rewards[i:i + n] for i in range(0, len(rewards), n)]
    return sum(max(g) - min(g) < 1e-9 for g in groups) / max(len(groups), 1)
