"""The update: one optimizer step's loss, L = L_GRPO − β·H_rl + w·α·L_SFT (+ kl_coef·KL), its forward and
backward in micro-batches, every term normalised by the whole batch on every rank
(docs/ARCHITECTURE.md, "Training" and "Memory of the update").

L_GRPO is the configured policy loss (PPO-clip, or GSPO's sequence-level ratio; utils/train/losses.py
POLICY_LOSSES), optionally importance-weighted against the sampler (TIS), or a method's own
(utils/train/method_variants.py `piece_loss`); w is RED's weight (utils/train/red.py). The step around it (roll
out, score, advantages, this update, the RED state, the engine's new adapter) is the loop's,
utils/train/grpo_trainer.py.

Micro-batches. An optimizer step's batch is cut into micro-batches of at most
`model.memory.micro_batch_tokens` tokens (utils/train/batch.py `micro_batches`), and each
micro-batch's graph is freed by its own backward, so the memory of an update does not grow with the
batch. Every normaliser of the loss (trained tokens, live episodes, rollout tokens, SFT target
tokens) is counted over the whole batch and every data-parallel rank *before* the loop
(`batch_norms`), and each micro-batch's loss is its rows' sum divided by those totals: the
accumulated gradient is the one-pass gradient of the whole batch, on one rank or several (the
ranks' gradients are then summed, not averaged). One finiteness decision, one clip and one
optimizer step per batch (utils/train/guard.py `finish_step`), and no collective inside the loop,
so ranks with different numbers of micro-batches stay in step.

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

from dataclasses import dataclass

import torch

from utils.core.schema import MemoryConfig
from utils.train.batch import RlBatch, cut_rows, micro_batches, offline_rows, take_rows
from utils.train.losses import POLICY_LOSSES, Agg, aggregate, k3_kl, policy_loss
from utils.train.method_variants import piece_loss
from utils.train.policy import forward_logprobs, policy_device, sft_terms
from utils.train.sft_weights import SFT_WEIGHTINGS
from utils.train.world import SOLO, World


class Tally:
    """A step's logged statistics, gathered over micro-batches and ranks.

    `add(key, value)` adds a share that is already normalised by the whole batch (a loss term, an
    entropy over all rollout tokens): the statistic is the sum of its shares. `add(key, value, weight)`
    adds a mean over `weight` items of this piece (a clip fraction over its tokens): the statistic
    is the weighted mean. `shared` values are the same on every piece and rank that sets them (RED's
    weights, a method's shared state): a rank that set none (it held no SFT row, or no row at all) logs
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


@dataclass
class Norms:
    """A batch's normalisers, counted over all its rows on every rank before any micro-batch's loss
    (0-dim tensors, each at least 1): trained tokens, trained rollout tokens (the entropy, the
    sampler mismatch), offline (demonstration) tokens, SFT target tokens, live sequences (GSPO's stats);
    `row_weight` [S]: each row's weight under a seq-mean aggregation; `experts`: whether any rank
    has an expert token."""
    tokens: torch.Tensor
    rollout: torch.Tensor
    expert: torch.Tensor
    sft: torch.Tensor
    sequences: torch.Tensor
    row_weight: torch.Tensor | None
    experts: bool
    trained: tuple[float, float] = (0.0, 0.0)  # (RL, SFT) tokens trained, every rank's, unclamped


def batch_norms(batch: RlBatch | None, sft_mask: torch.Tensor | None, rl, world: World = SOLO) -> Norms:
    """The normalisers of `batch` and its SFT batch's target mask, summed over ranks (one collective).
    A rank with no RL rows (`batch` None) adds its SFT tokens alone."""
    device = batch.mask.device if batch is not None else sft_mask.device if sft_mask is not None else "cpu"
    zero = torch.zeros((), device=device)
    sft = sft_mask.sum() if sft_mask is not None else zero
    if batch is None:
        tokens, roll, expert, seqs, episodes = [zero] * 5
    else:
        mask, off = batch.mask, offline_rows(batch)
        has_off = batch.offline is not None and bool(batch.offline.any())
        seq_tokens = mask.sum(-1)  # [S]
        episode = batch.episode if batch.episode is not None else torch.arange(len(seq_tokens), device=mask.device)
        ids, inverse = torch.unique(episode, return_inverse=True)
        ep_tokens = torch.zeros(len(ids), dtype=mask.dtype, device=mask.device).index_add(0, inverse, seq_tokens)
        tokens, roll = mask.sum(), (mask * (1 - off) if has_off else mask).sum()
        expert = (mask * off).sum() if has_off else zero
        seqs, episodes = (seq_tokens > 0).sum().to(mask.dtype), (ep_tokens > 0).sum().to(mask.dtype)
    counts = world.sum(torch.stack([tokens, roll, expert, sft, seqs, episodes]))
    tokens, roll, expert, sft, seqs, episodes = counts.clamp(min=1).unbind()
    row_weight = None
    if batch is not None and rl.loss_agg.startswith("seq-mean"):
        per_episode = ep_tokens if rl.loss_agg == "seq-mean-token-mean" else torch.full_like(ep_tokens, rl.loss_horizon)
        row_weight = torch.where(seq_tokens > 0, 1 / (per_episode[inverse].clamp(min=1) * episodes),
                                 torch.zeros_like(seq_tokens))
    return Norms(tokens, roll, expert, sft, seqs, row_weight, bool(counts[2] > 0),
                 (counts[0].item(), counts[3].item()))


def _agg(rl, batch: RlBatch, norms: Norms | None = None, rows=None) -> Agg:
    """The configured aggregation over this batch's episodes (utils/train/losses.py Agg); with the
    whole batch's `norms`, the share of the batch's `rows` (None: all of them)."""
    if norms is None:
        return Agg(rl.loss_agg, batch.episode, rl.loss_horizon)
    if norms.row_weight is None:  # a token mode: its share is this piece's token sum over the batch's divisor
        divisor = norms.tokens if rl.loss_agg == "token-mean" else norms.tokens.new_tensor(float(rl.loss_horizon))
        return Agg(rl.loss_agg, total=divisor)
    return Agg(rl.loss_agg, row_weight=norms.row_weight if rows is None else norms.row_weight[rows])


@dataclass
class LossTerms:
    loss: torch.Tensor  # this rank's share of the batch's loss, detached (its backwards have run)
    stats: dict
    logp: torch.Tensor | None = None  # this forward's log-probs [S, T-1] at trained tokens, detached


def _rl_piece(model, part: RlBatch, old_lp, ref_lp, alg, norms: Norms, rows, method, piece_state: dict, memory,
              tally: Tally, rl_coef: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """A micro-batch's share of c·L_GRPO − β·H_rl (+ kl_coef·KL), c the SFT weighting's coefficient of
    the policy loss (utils/train/sft_weights.py; 1 unless the weighting scales it), its stats added to `tally`: (share,
    this forward's log-probs [rows, T-1]). `old_lp` None: this forward's own, detached. `method`: a
    method's own policy loss (utils/train/method_variants.py `piece_loss`) or None for the registered
    one; `piece_state` the previous step's state it may read."""
    rl = alg.rl
    logp, ent = forward_logprobs(model, part.ids, part.attn, with_entropy=True, temperature=rl.temperature,
                                 need=part.mask > 0, entropy_grad=rl.entropy_coef != 0,
                                 chunk_mib=memory.logits_chunk_mib)
    if old_lp is None:  # one pass per batch: the policy being updated is the one that sampled
        old_lp = logp.detach()
    off = offline_rows(part)
    rollout_mask = part.mask * (1 - off) if norms.experts else part.mask
    h_rl = aggregate(Agg("token-mean", total=norms.rollout), ent, rollout_mask)
    agg = _agg(rl, part, norms, rows)
    if method is not None:  # a method's own policy loss (utils/train/method_variants.py piece_loss)
        pg, pg_stats, weights = method.loss(part, logp, old_lp, ent, h_rl.item(), norms, agg, piece_state, tally)
    else:
        adv = part.token_adv if part.token_adv is not None else part.adv
        pg, pg_stats = policy_loss(rl.policy_loss, logp, old_lp, adv, part.mask, rl.clip_low, rl.clip_high, agg,
                                   sampler_logp=part.sampler_lp, tis_cap=rl.tis_cap)
        sequence_level = POLICY_LOSSES.get(rl.policy_loss)[1] == "sequence"  # its stats are per sequence
        live = (part.mask.sum(-1) > 0).sum() if sequence_level else part.mask.sum()
        weights = {"clip_frac": live, "ratio_mean": live, "tis_weight_mean": part.mask.sum(),
                   "tis_clip_frac": part.mask.sum()}
    loss = (pg if rl_coef == 1.0 else rl_coef * pg) - rl.entropy_coef * h_rl
    tally.add("actor/pg_loss", pg.item())
    tally.add("actor/rl_entropy", h_rl.item())
    for k, v in pg_stats.items():
        name = k if "/" in k else f"actor/{k}"
        tally.add(name, v, weights[k].item())
    if part.sampler_lp is not None:  # a step that asked the sampler (algorithm.rl.mismatch_every)
        mismatch = ((old_lp - part.sampler_lp).abs() * rollout_mask).sum() / norms.rollout
        tally.add("rollout/logprob_mismatch", mismatch.item())
    if rl.kl_coef > 0:
        if ref_lp is None:
            raise ValueError("algorithm.rl.kl_coef > 0 needs the reference log-probs (add_reference)")
        kl = aggregate(agg, k3_kl(logp, ref_lp), part.mask)
        loss = loss + rl.kl_coef * kl
        tally.add("actor/kl", kl.item())
    return loss, logp.detach()


def _sft_piece(model, piece: tuple, norms: Norms, weight: float, memory, tally: Tally,
               token_weight: str = "none") -> torch.Tensor:
    """A micro-batch's share of w·α·L_SFT (the token-mean NLL over the whole SFT batch's targets, each
    token's weighted as `token_weight` says: utils/train/policy.py sft_terms); its NLL and entropy
    shares go to `tally` as actor/sft_loss and actor/sft_entropy."""
    l_sft, h_sft = sft_terms(model, piece, with_entropy=True, total=norms.sft, chunk_mib=memory.logits_chunk_mib,
                             token_weight=token_weight)
    tally.add("actor/sft_loss", l_sft.item())
    tally.add("actor/sft_entropy", h_sft.item())
    return weight * l_sft


def _pieces(batch: RlBatch | None, sft: tuple | None, budget: int) -> list[tuple[list | None, list | None]]:
    """The micro-batches of an update: (RL rows, SFT rows); one piece of everything when the whole
    batch fits `budget` tokens (0: always), else RL pieces, then SFT pieces. None: no such rows."""
    rl_len = batch.attn.sum(1).tolist() if batch is not None else []
    sft_len = sft[1].sum(1).tolist() if sft is not None else []
    if batch is None and sft is None:
        return []
    if budget <= 0 or sum(rl_len) + sum(sft_len) <= budget:
        return [(list(range(len(rl_len))) if batch is not None else None,
                 list(range(len(sft_len))) if sft is not None else None)]
    return [(r, None) for r in micro_batches(rl_len, budget)] + [(None, s) for s in micro_batches(sft_len, budget)]


def red_grpo_loss(model, batch: RlBatch | None, old_lp: torch.Tensor | None, sft: tuple | None, alg, red_state,
                  batch_accuracy: float, ref_lp: torch.Tensor | None = None, piece_state: dict | None = None,
                  world: World = SOLO, memory: MemoryConfig = MemoryConfig(), step: int = 0) -> LossTerms:
    """Forward and backward of L = c·L_GRPO − β·H_rl + w·α·L_SFT + kl_coef·KL over the batch (c and w
    from `algorithm.sft.weighting` at the 0-based `step`: 1 and RED's weight by default), in
    micro-batches of `memory.micro_batch_tokens` (utils/train/batch.py): the gradients accumulate in
    the parameters' .grad (the caller zeroes them first and steps after, guard.finish_step). Every
    term is normalised by the whole batch on every rank (`batch_norms`), so the gradient is the
    one-pass gradient whatever the cut. `old_lp` [S, T-1] are the sampling policy's log-probs (None:
    each forward's own, detached, exact when the batch gets one optimizer pass); `ref_lp` the KL
    reference's (needed when kl_coef > 0); `stats["rollout/logprob_mismatch"]` is the mean |old −
    sampler| over trained rollout tokens. A method's own policy loss (utils/train/method_variants.py
    `piece_loss`) reads `piece_state`, what it kept from the previous step ({} on the first). Returns this rank's share of the loss, the stats of the whole
    batch (every rank's) and the log-probs of this forward (None without RL rows).

    A data-parallel rank may hold no RL rows of the step (`batch` None), no SFT rows (`sft` None), or
    neither: it still makes every collective the others make, trains what it has, and logs the whole
    batch's stats, RED's weights included (`Tally`)."""
    norms = batch_norms(batch, sft[2] if sft is not None else None, alg.rl, world)
    tally = Tally()
    tally.shared.update({"train/tokens_rl": norms.trained[0], "train/tokens_sft": norms.trained[1]})
    mix = SFT_WEIGHTINGS.get(alg.sft.weighting)(alg, red_state, batch_accuracy, step)
    if sft is not None:
        tally.shared.update(mix.stats)
    pieces = _pieces(batch, sft, memory.micro_batch_tokens)
    method = piece_loss(alg, norms.experts)
    if method is not None:
        method.prepare(model, batch, norms, memory, world, len(pieces))
    logp_all = torch.zeros_like(batch.mask) if batch is not None else None
    total = torch.zeros((), device=policy_device(model))
    for rl_rows, sft_rows in pieces:
        loss = None
        if rl_rows is not None:
            whole = len(rl_rows) == len(batch.adv)
            part, o, r = (batch, old_lp, ref_lp) if whole else take_rows(batch, torch.tensor(rl_rows), old_lp, ref_lp)
            loss, logp = _rl_piece(model, part, o, r, alg, norms, None if whole else torch.tensor(rl_rows), method,
                                   piece_state or {}, memory, tally, mix.rl)
            logp_all[rl_rows, :logp.shape[1]] = logp
        if sft_rows is not None:
            piece = sft if len(sft_rows) == len(sft[0]) else cut_rows(sft_rows, *sft)
            term = _sft_piece(model, piece, norms, mix.sft, memory, tally, mix.token_weight)
            loss = term if loss is None else loss + term
        if loss.requires_grad:  # a piece without a trained token has nothing to give
            loss.backward()
        tally.add("actor/loss", loss.item())
        total = total + loss.detach()
    return LossTerms(total, tally.result(world), logp_all)
