"""One RED-GRPO training step, as functions over explicit inputs (docs/ARCHITECTURE.md, "Training").

    1. roll out questions x n samples on the engine serving the current adapter
    2. score each episode with the reward spec
    3. group advantages; every segment of an episode (planner and executor) gets its advantage
    4. recompute log-probs of the sampled tokens with the trainer model
    5. draw an SFT batch
    6. one optimizer step on  L_GRPO − β·H_rl + w·α·L_SFT (+ kl_coef·KL); L_GRPO is the configured
       policy loss (PPO-clip, or GSPO's sequence-level ratio), optionally importance-weighted
       against the sampler (TIS); its forward and backward run in micro-batches, every term
       normalised by the whole batch on every rank (`batch_norms`, utils/train/micro.py)
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

from utils.agent.episode import Episode, Example, episode_sequences
from utils.agent.protocol import PLANNER
from utils.core.schema import TRAIN_ROLES, MemoryConfig
from utils.core.tensors import pad
from utils.reward.scorers import is_correct
from utils.train.losses import Agg, advantages, aggregate, k3_kl, policy_loss, red_paper_entropy_weight, red_paper_loss
from utils.train.micro import Tally, cut_rows, micro_batches
from utils.train.policy import forward_logprobs, policy_device, sft_terms
from utils.train.red import red_weights
from utils.train.world import SOLO, World


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
    # position t of ids is predicted from position t-1: shift the token-aligned mask and log-probs
    return RlBatch(ids, attn, mask[:, 1:], lp[:, 1:] if lp is not None else None, torch.tensor([s.adv for s in seqs]),
                   [s.ex.role for s in seqs], torch.tensor([s.accuracy is not None for s in seqs]),
                   torch.tensor([s.accuracy or 0.0 for s in seqs]), token_adv, torch.tensor([s.episode for s in seqs]))


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


@dataclass
class Norms:
    """A batch's normalisers, counted over all its rows on every rank before any micro-batch's loss
    (0-dim tensors, each at least 1): trained tokens, trained rollout tokens (the entropy, the
    sampler mismatch), expert tokens (red_paper), SFT target tokens, live sequences (GSPO's stats);
    `row_weight` [S]: each row's weight under a seq-mean aggregation; `experts`: whether any rank
    has an expert token."""
    tokens: torch.Tensor
    rollout: torch.Tensor
    expert: torch.Tensor
    sft: torch.Tensor
    sequences: torch.Tensor
    row_weight: torch.Tensor | None
    experts: bool


def _offline(batch: RlBatch) -> torch.Tensor:
    """[S, 1]: 1.0 on expert rows (red_paper), else 0."""
    if batch.offline is None:
        return torch.zeros(len(batch.adv), 1, device=batch.mask.device)
    return batch.offline[:, None].float()


def batch_norms(batch: RlBatch | None, sft_mask: torch.Tensor | None, rl, world: World = SOLO) -> Norms:
    """The normalisers of `batch` and its SFT batch's target mask, summed over ranks (one collective).
    A rank with no RL rows (`batch` None) adds its SFT tokens alone."""
    if batch is None:
        counts = torch.zeros(6, device=sft_mask.device if sft_mask is not None else "cpu")
        if sft_mask is not None:
            counts[3] = sft_mask.sum()
        counts = world.sum(counts)
        return Norms(*counts[:5].clamp(min=1).unbind(), None, bool(counts[2] > 0))
    mask, off = batch.mask, _offline(batch)
    has_off = batch.offline is not None and bool(batch.offline.any())
    rollout = mask * (1 - off) if has_off else mask
    seq_tokens = mask.sum(-1)  # [S]
    episode = batch.episode if batch.episode is not None else torch.arange(len(seq_tokens), device=mask.device)
    ids, inverse = torch.unique(episode, return_inverse=True)
    ep_tokens = torch.zeros(len(ids), dtype=mask.dtype, device=mask.device).index_add(0, inverse, seq_tokens)
    zero = mask.sum() * 0
    counts = torch.stack([mask.sum(), rollout.sum(), (mask * off).sum() if has_off else zero,
                          sft_mask.sum() if sft_mask is not None else zero,
                          (seq_tokens > 0).sum().to(mask.dtype), (ep_tokens > 0).sum().to(mask.dtype)])
    counts = world.sum(counts)
    tokens, roll, expert, sft, seqs, episodes = counts.clamp(min=1).unbind()
    row_weight = None
    if rl.loss_agg != "token-mean":
        per_episode = ep_tokens if rl.loss_agg == "seq-mean-token-mean" else torch.full_like(ep_tokens, rl.loss_horizon)
        row_weight = torch.where(seq_tokens > 0, 1 / (per_episode[inverse].clamp(min=1) * episodes),
                                 torch.zeros_like(seq_tokens))
    return Norms(tokens, roll, expert, sft, seqs, row_weight, bool(counts[2] > 0))


def _agg(rl, batch: RlBatch, norms: Norms | None = None, rows=None) -> Agg:
    """The configured aggregation over this batch's episodes (utils/train/losses.py Agg); with the
    whole batch's `norms`, the share of the batch's `rows` (None: all of them)."""
    if norms is None:
        return Agg(rl.loss_agg, batch.episode, rl.loss_horizon)
    if norms.row_weight is None:
        return Agg(rl.loss_agg, total=norms.tokens)
    return Agg(rl.loss_agg, row_weight=norms.row_weight if rows is None else norms.row_weight[rows])


@dataclass
class LossTerms:
    loss: torch.Tensor  # this rank's share of the batch's loss, detached (its backwards have run)
    stats: dict
    logp: torch.Tensor | None = None  # this forward's log-probs [S, T-1] at trained tokens, detached


def _paper_weight(h_sft: float, h_rl: float, batch: RlBatch, alg, paper_state: dict) -> tuple[torch.Tensor, dict]:
    """red_paper's advantages [S], the expert rows' scaled by the entropy-change weight of this step's
    expert and rollout entropies (over the whole batch), and the stats the next step reads."""
    w = red_paper_entropy_weight(h_sft, h_rl, paper_state.get("h_sft"), paper_state.get("h_rl"),
                                 alg.red_paper.entropy_weight_max)
    return torch.where(batch.offline, batch.adv * w, batch.adv), {"entropy_weight": w, "h_sft": h_sft, "h_rl": h_rl}


def _rl_piece(model, part: RlBatch, old_lp, ref_lp, alg, norms: Norms, rows, paper, paper_state: dict, memory,
              tally: Tally) -> tuple[torch.Tensor, torch.Tensor]:
    """A micro-batch's share of L_GRPO − β·H_rl (+ kl_coef·KL), its stats added to `tally`: (share,
    this forward's log-probs [rows, T-1]). `old_lp` None: this forward's own, detached. `paper`:
    red_paper's (expert entropy, rollout entropy) over the whole batch, or None to take this piece's
    (the whole batch in one piece), `paper_state` the previous step's."""
    rl = alg.rl
    logp, ent = forward_logprobs(model, part.ids, part.attn, with_entropy=True, temperature=rl.temperature,
                                 need=part.mask > 0, entropy_grad=rl.entropy_coef != 0,
                                 chunk_mib=memory.logits_chunk_mib)
    if old_lp is None:  # one pass per batch: the policy being updated is the one that sampled
        old_lp = logp.detach()
    off = _offline(part)
    rollout_mask = part.mask * (1 - off) if norms.experts else part.mask
    h_rl = aggregate(Agg("token-mean", total=norms.rollout), ent, rollout_mask)
    agg = _agg(rl, part, norms, rows)
    if norms.experts:
        with torch.no_grad():
            h_sft = aggregate(Agg("token-mean", total=norms.expert), ent, part.mask * off).item()
        adv, paper_stats = _paper_weight(*(paper or (h_sft, h_rl.item())), part, alg, paper_state)
        tally.shared.update({f"red_paper/{k}": v for k, v in paper_stats.items()})
        pg, pg_stats = red_paper_loss(logp, old_lp, adv, part.mask, part.offline, part.accuracy, rl.clip_low,
                                      rl.clip_high, agg, alg.red_paper.policy_shift)
        weights = {"clip_frac": rollout_mask.sum(), "ratio_mean": rollout_mask.sum(),
                   "offline_ratio_mean": (part.mask * off).sum()}
    else:
        adv = part.token_adv if part.token_adv is not None else part.adv
        pg, pg_stats = policy_loss(rl.policy_loss, logp, old_lp, adv, part.mask, rl.clip_low, rl.clip_high, agg,
                                   sampler_logp=part.sampler_lp, tis_cap=rl.tis_cap)
        live = (part.mask.sum(-1) > 0).sum() if rl.policy_loss == "gspo" else part.mask.sum()
        weights = {"clip_frac": live, "ratio_mean": live, "tis_weight_mean": part.mask.sum(),
                   "tis_clip_frac": part.mask.sum()}
    loss = pg - rl.entropy_coef * h_rl
    tally.add("actor/pg_loss", pg.item())
    tally.add("actor/rl_entropy", h_rl.item())
    for k, v in pg_stats.items():
        name = f"red_paper/{k}" if k == "offline_ratio_mean" else f"actor/{k}"
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


def _sft_piece(model, piece: tuple, norms: Norms, weight: float, memory, tally: Tally) -> torch.Tensor:
    """A micro-batch's share of w·α·L_SFT (the token-mean NLL over the whole SFT batch's targets); its
    NLL and entropy shares go to `tally` as actor/sft_loss and actor/sft_entropy."""
    l_sft, h_sft = sft_terms(model, piece, with_entropy=True, total=norms.sft, chunk_mib=memory.logits_chunk_mib)
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


def _paper_entropies(model, batch: RlBatch | None, norms: Norms, memory, world: World) -> tuple[float, float]:
    """red_paper's (expert, rollout) token-mean entropies over the whole batch and every rank, from a
    no-grad pass, for a batch in several micro-batches: every piece's expert advantages need them.
    A rank with no RL rows adds nothing (but takes part)."""
    if batch is None:
        sums = world.sum(torch.zeros(2))
        return (sums[0] / norms.expert.cpu()).item(), (sums[1] / norms.rollout.cpu()).item()
    sums = torch.zeros(2, device=batch.mask.device)
    off = _offline(batch)
    with torch.no_grad():
        for rows in micro_batches(batch.attn.sum(1).tolist(), memory.micro_batch_tokens):
            ids, attn, mask, o = cut_rows(rows, batch.ids, batch.attn, batch.mask, off.expand_as(batch.mask))
            _, ent = forward_logprobs(model, ids, attn, with_entropy=True, need=mask > 0,
                                      chunk_mib=memory.logits_chunk_mib)
            sums += torch.stack([(ent * mask * o).sum(), (ent * mask * (1 - o)).sum()])
    sums = world.sum(sums)
    return (sums[0] / norms.expert).item(), (sums[1] / norms.rollout).item()


def red_grpo_loss(model, batch: RlBatch | None, old_lp: torch.Tensor | None, sft: tuple | None, alg, red_state,
                  batch_accuracy: float, ref_lp: torch.Tensor | None = None, paper_state: dict | None = None,
                  world: World = SOLO, memory: MemoryConfig = MemoryConfig()) -> LossTerms:
    """Forward and backward of L = L_GRPO − β·H_rl + w·α·L_SFT + kl_coef·KL over the batch, in
    micro-batches of `memory.micro_batch_tokens` (utils/train/micro.py): the gradients accumulate in
    the parameters' .grad (the caller zeroes them first and steps after, guard.finish_step). Every
    term is normalised by the whole batch on every rank (`batch_norms`), so the gradient is the
    one-pass gradient whatever the cut. `old_lp` [S, T-1] are the sampling policy's log-probs (None:
    each forward's own, detached, exact when the batch gets one optimizer pass); `ref_lp` the KL
    reference's (needed when kl_coef > 0); `stats["rollout/logprob_mismatch"]` is the mean |old −
    sampler| over trained rollout tokens. A batch with expert sequences (red_paper) scales their
    advantages by the entropy-change weight of the whole batch's entropies, with `paper_state` the
    previous step's ({} on the first). Returns this rank's share of the loss, the stats of the whole
    batch (every rank's) and the log-probs of this forward (None without RL rows).

    A data-parallel rank may hold no RL rows of the step (`batch` None), no SFT rows (`sft` None), or
    neither: it still makes every collective the others make, trains what it has, and logs the whole
    batch's stats, RED's weights included (utils/train/micro.py `Tally`)."""
    norms = batch_norms(batch, sft[2] if sft is not None else None, alg.rl, world)
    tally = Tally()
    weight = 0.0
    if sft is not None:
        w = red_weights(red_state, batch_accuracy, alg.red.G, alg.red.accuracy_aware_policy_shift,
                        alg.red.weight_min, alg.red.weight_max)
        tally.shared.update(w)
        weight = w["red/final_weight"] * alg.sft.loss_coef
    pieces = _pieces(batch, sft, memory.micro_batch_tokens)
    paper = None
    if norms.experts and (len(pieces) > 1 or world.size > 1):
        paper = _paper_entropies(model, batch, norms, memory, world)
    logp_all = torch.zeros_like(batch.mask) if batch is not None else None
    total = torch.zeros((), device=policy_device(model))
    for rl_rows, sft_rows in pieces:
        loss = None
        if rl_rows is not None:
            whole = len(rl_rows) == len(batch.adv)
            part, o, r = (batch, old_lp, ref_lp) if whole else take_rows(batch, torch.tensor(rl_rows), old_lp, ref_lp)
            loss, logp = _rl_piece(model, part, o, r, alg, norms, None if whole else torch.tensor(rl_rows), paper,
                                   paper_state or {}, memory, tally)
            logp_all[rl_rows, :logp.shape[1]] = logp
        if sft_rows is not None:
            piece = sft if len(sft_rows) == len(sft[0]) else cut_rows(sft_rows, *sft)
            term = _sft_piece(model, piece, norms, weight, memory, tally)
            loss = term if loss is None else loss + term
        if loss.requires_grad:  # a piece without a trained token has nothing to give
            loss.backward()
        tally.add("actor/loss", loss.item())
        total = total + loss.detach()
    return LossTerms(total, tally.result(world), logp_all)


def group_advantages(rewards: list[float], n: int, scaling: str) -> torch.Tensor:
    return advantages(scaling, torch.tensor(rewards, dtype=torch.float), n)


def batch_accuracy(scored: list[dict]) -> float:
    """RED's `acc`: the share of scored episodes whose answer is fully correct (an F1 of 0.5 counts 0)."""
    return sum(is_correct(s["answer"]) for s in scored) / max(len(scored), 1)


def zero_variance_fraction(rewards: list[float], n: int) -> float:
    groups = [rewards[i:i + n] for i in range(0, len(rewards), n)]
    return sum(max(g) - min(g) < 1e-9 for g in groups) / max(len(groups), 1)
