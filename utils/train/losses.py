"""The loss maths of RED-GRPO: pure functions over tensors, registered by name (docs/ARCHITECTURE.md, "Training").

Shapes: B sequences, T tokens; `mask` is 1 on trained (generated) tokens and 0 on prompts,
injected results and padding. Nothing here reads trainer state.

Departures and choices, stated once:
- GRPO advantage uses the unbiased group std (as verl's GRPO does); a group of one sample, or a
  group whose rewards are all equal, gets advantage 0.
- RLOO's baseline is the mean of the *other* samples of the group (Ahmadian et al. 2024, "Back to
  Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in LLMs",
  arXiv 2402.14740): r_i − mean_{j≠i} r_j = n/(n−1)·(r_i − mean), unscaled.
- GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv 2507.18071) clips one
  ratio per *training sequence*, the geometric mean of its token ratios. Here a sequence is one
  trained segment sequence (a planner conversation or one executor call), not a whole episode;
  each carries its episode's advantage. The per-sequence loss is broadcast over the sequence's
  tokens and aggregated by the configured mode: `seq-mean-token-mean` is the paper's mean over
  sequences, `token-mean` weights a sequence by its length.
- Truncated importance sampling (TIS; Yao et al. 2025, "Your Efficient RL Framework Secretly
  Brings You Off-Policy RL Training") corrects for a sampler whose probabilities differ from the
  trainer's (bf16 engines): each token's policy loss is multiplied by the detached
  min(π_trainer_old / π_sampler, cap), per token for PPO-clip, per sequence (geometric mean) for
  GSPO. In fp32 on CPU the two agree to ~1e-6, so the weights are 1 here.
- The seq-mean aggregations average over *episodes*: an episode's trained tokens (its planner
  conversation and every executor call, each a sequence of its own) are pooled first, so an
  episode counts once however many subtasks it delegated. `seq-mean-token-sum-norm` divides each
  episode's token sum by a configured constant (Dr. GRPO), not by the batch's padded width.
- The KL to the reference is the k3 estimator, exp(ref - logp) - (ref - logp) - 1, from
  J. Schulman, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html).
- `red_paper` (Guan et al. 2025, "Recall-Extend Dynamics", arXiv 2508.16677, as its released code
  runs it; the paper's own equations could not be read here): an expert trace sits in its
  question's group and is trained through the policy loss with the ratio π / (π + (1 − π)·a),
  a the group's accuracy, unclipped; its advantage is scaled by a step-over-step entropy-change
  ratio clamped to [1, 7]. Assumptions where the code leaves a detail open or is broken: the
  entropy weight acts on the expert samples only (the code's buffer shuffle lands it on random
  ones); the accuracy-aware ratio is on by default (the code prints it but runs ratio = π); the
  expert sequence is aggregated like every rollout (the code divides every sequence's token sum
  by a constant 3000).
- RED's weights of the SFT term are in utils/train/red.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from utils.core.registry import Registry
from utils.core.schema import OFFLINE_SHIFTS

EPS = 1e-6

# ---------------------------------------------------------------- advantages


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of group_size={group_size} entries, got {tuple(rewards.shape)}")
    return rewards.view(-1, group_size)  # [G, n]


def adv_group(rewards: torch.Tensor, group_size: int, eps: float = EPS) -> torch.Tensor:
    """(r - mean_group) / (std_group + eps). rewards [B] ordered group by group -> [B]."""
    g = _grouped(rewards, group_size)
    if group_size == 1:
        return torch.zeros_like(rewards)
    centred = g - g.mean(dim=1, keepdim=True)
    return (centred / (g.std(dim=1, keepdim=True) + eps)).view(-1)


def adv_batch(rewards: torch.Tensor, group_size: int, eps: float = EPS) -> torch.Tensor:
    """(r - mean_group) / (std of the whole batch + eps) -> [B]."""
    g = _grouped(rewards, group_size)
    centred = (g - g.mean(dim=1, keepdim=True)).view(-1)
    std = rewards.std() if rewards.numel() > 1 else torch.zeros(())
    return centred / (std + eps)


def adv_none(rewards: torch.Tensor, group_size: int, eps: float = EPS) -> torch.Tensor:
    """r - mean_group, no std scaling (Dr. GRPO) -> [B]."""
    g = _grouped(rewards, group_size)
    return (g - g.mean(dim=1, keepdim=True)).view(-1)


def adv_rloo(rewards: torch.Tensor, group_size: int, eps: float = EPS) -> torch.Tensor:  # noqa: ARG001 - no std
    """r_i − mean of the group's other rewards (RLOO), no std scaling -> [B]; 0 for groups of one."""
    g = _grouped(rewards, group_size)
    if group_size == 1:
        return torch.zeros_like(rewards)
    others = (g.sum(dim=1, keepdim=True) - g) / (group_size - 1)  # [G, n]
    return (g - others).view(-1)


ADVANTAGES: Registry[Callable[..., torch.Tensor]] = Registry("advantage scaling", {
    "group": adv_group, "batch": adv_batch, "none": adv_none, "rloo": adv_rloo})

# ---------------------------------------------------------------- aggregation


@dataclass(frozen=True)
class Agg:
    """A loss aggregation: its registered name, plus what the seq-mean modes need. `episode` [B]:
    the episode each row belongs to (None: every row is its own), so that an episode counts once
    however many executor calls it made; `horizon`: the token-sum-norm modes' constant divisor.

    A micro-batch's share of a whole batch's aggregation (utils/train/update.py) carries the batch's
    normalisers instead: `total`, token-mean's token count over the whole batch, or `row_weight` [B],
    each row's weight in a seq-mean mode (1 / (its episode's tokens · live episodes), or 1 / (horizon ·
    live episodes)); the shares of all micro-batches sum to the whole batch's value."""
    name: str
    episode: torch.Tensor | None = None
    horizon: float | None = None
    total: torch.Tensor | None = None
    row_weight: torch.Tensor | None = None


def _per_episode(x: torch.Tensor, mask: torch.Tensor, episode: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(token sum, token count) per episode that has a trained token -> ([E], [E])."""
    sums, counts = (x * mask).sum(-1), mask.sum(-1)  # [B]
    if episode is not None:
        ids, inverse = torch.unique(episode, return_inverse=True)
        sums = torch.zeros(len(ids), dtype=sums.dtype, device=sums.device).index_add(0, inverse, sums)
        counts = torch.zeros(len(ids), dtype=counts.dtype, device=counts.device).index_add(0, inverse, counts)
    keep = counts > 0
    return sums[keep], counts[keep]


def agg_token_mean(x: torch.Tensor, mask: torch.Tensor, episode=None, horizon=None) -> torch.Tensor:  # noqa: ARG001
    """Mean over all trained tokens of the batch. x, mask [B, T] -> scalar."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def agg_seq_mean_token_mean(x: torch.Tensor, mask: torch.Tensor, episode=None, horizon=None) -> torch.Tensor:  # noqa: ARG001
    """Mean over episodes of each episode's token mean (its planner conversation and executor calls
    pooled). x, mask [B, T], episode [B] -> scalar; 0 without a trained token."""
    sums, counts = _per_episode(x, mask, episode)
    return (sums / counts).mean() if len(sums) else x.sum() * 0


def agg_seq_mean_token_sum_norm(x: torch.Tensor, mask: torch.Tensor, episode=None, horizon=None) -> torch.Tensor:
    """Mean over episodes of each episode's token sum divided by the constant `horizon` (Dr. GRPO:
    not by the batch's padded width, which changes from step to step) -> scalar."""
    if not horizon or horizon <= 0:
        raise ValueError("seq-mean-token-sum-norm divides by a constant: give a horizon > 0 "
                         "(algorithm.rl.loss_horizon)")
    sums, _ = _per_episode(x, mask, episode)
    return (sums / horizon).mean() if len(sums) else x.sum() * 0


def agg_token_sum_norm(x: torch.Tensor, mask: torch.Tensor, episode=None, horizon=None) -> torch.Tensor:  # noqa: ARG001
    """The batch's token sum divided by the constant `horizon`, every token weighted alike whatever its
    batch holds: how SRFT's, HPT's and ReLIFT's released verl trainers normalise their RL term
    (`loss_remove_token_mean=True`, a constant of 8,192 a micro-batch there) -> scalar."""
    if not horizon or horizon <= 0:
        raise ValueError("token-sum-norm divides by a constant: give a horizon > 0 (algorithm.rl.loss_horizon)")
    return (x * mask).sum() / horizon


AGGREGATIONS: Registry[Callable[..., torch.Tensor]] = Registry("loss aggregation", {
    "token-mean": agg_token_mean,
    "token-sum-norm": agg_token_sum_norm,
    "seq-mean-token-mean": agg_seq_mean_token_mean,
    "seq-mean-token-sum-norm": agg_seq_mean_token_sum_norm,
})


def advantages(name: str, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    return ADVANTAGES.get(name)(rewards, group_size)


def aggregate(agg: "str | Agg", x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`agg` by name (every row its own episode, no horizon) or as an `Agg`."""
    agg = Agg(agg) if isinstance(agg, str) else agg
    whole = AGGREGATIONS.get(agg.name)
    if agg.total is not None:  # token-mean's share: this piece's token sum over the whole batch's count
        return (x * mask).sum() / agg.total
    if agg.row_weight is not None:  # a seq-mean mode's share
        return ((x * mask).sum(-1) * agg.row_weight).sum()
    return whole(x, mask, agg.episode, agg.horizon)

# ---------------------------------------------------------------- policy loss, KL, entropy, SFT


def ppo_clip_tokens(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip_low: float,
                     clip_high: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(per-token loss, clipped-mask, ratio), all [B, T]: max(-A·r, -A·clip(r, 1-clip_low, 1+clip_high))."""
    ratio = torch.exp(logp - old_logp)  # [B, T]
    a = adv[:, None] if adv.dim() == 1 else adv  # [B, 1], or [B, T] with per-token (process) advantages
    unclipped = -a * ratio
    clipped = -a * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped, ratio


def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                  clip_low: float, clip_high: float, agg: "str | Agg",
                  is_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """PPO-clip with asymmetric clipping (clip-higher, DAPO).

    logp, old_logp, mask [B, T]; adv [B] (one advantage per sequence, broadcast over its tokens) or
    [B, T] (per token: process rewards);
    is_weight [B, T] or None: a detached per-token factor (truncated importance sampling).
    Per token: w·max(-A·r, -A·clip(r, 1-clip_low, 1+clip_high)), r = exp(logp - old_logp).
    Returns (scalar loss, {"clip_frac", "ratio_mean"}) with stats over trained tokens.
    """
    per_token, was_clipped, ratio = ppo_clip_tokens(logp, old_logp, adv, clip_low, clip_high)
    if is_weight is not None:
        per_token = per_token * is_weight
    with torch.no_grad():
        clip_frac = agg_token_mean(was_clipped.float(), mask)
        ratio_mean = agg_token_mean(ratio, mask)
    return aggregate(agg, per_token, mask), {"clip_frac": clip_frac.item(), "ratio_mean": ratio_mean.item()}


def _seq_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each sequence's mean over its trained tokens (0 for a sequence without any). [B, T] -> [B]."""
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def gspo_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
              clip_low: float, clip_high: float, agg: "str | Agg",
              is_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """GSPO: one ratio per sequence, s = exp(mean over its trained tokens of (logp - old_logp)),
    clipped at the sequence level: max(-A·s, -A·clip(s, 1-clip_low, 1+clip_high)), times the
    detached is_weight (constant over a sequence's tokens), broadcast over the sequence's tokens
    and aggregated by `agg`. Shapes as ppo_clip_loss; stats over sequences with a trained token."""
    s = torch.exp(_seq_mean(logp - old_logp, mask))  # [B]
    unclipped = -adv * s
    clipped = -adv * torch.clamp(s, 1 - clip_low, 1 + clip_high)
    per_seq = torch.maximum(unclipped, clipped)  # [B]
    per_token = per_seq[:, None].expand_as(mask)  # [B, T]
    if is_weight is not None:
        per_token = per_token * is_weight
    with torch.no_grad():
        live = (mask.sum(-1) > 0).float()  # [B]
        n = live.sum().clamp(min=1)
        clip_frac = ((clipped > unclipped).float() * live).sum() / n
        ratio_mean = (s * live).sum() / n
    return aggregate(agg, per_token, mask), {"clip_frac": clip_frac.item(), "ratio_mean": ratio_mean.item()}


def tis_weights(old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, cap: float,
                level: str) -> torch.Tensor:
    """Truncated importance weights min(π_old / π_sampler, cap), detached. old_logp, sampler_logp,
    mask [B, T] -> [B, T]: per token (`level` "token"), or each sequence's geometric-mean ratio
    broadcast over its tokens ("sequence")."""
    d = (old_logp - sampler_logp).detach()  # [B, T]
    if level == "sequence":
        d = _seq_mean(d, mask)[:, None].expand_as(mask)
    elif level != "token":
        raise ValueError(f"tis level must be token or sequence, got {level!r}")
    return torch.clamp(torch.exp(d), max=cap)


def unclipped_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                   clip_low: float, clip_high: float, agg: "str | Agg",  # noqa: ARG001 - no clip
                   is_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """−A·r per token, r = exp(logp − old_logp), never clipped: the RL term of SRFT's, HPT's and
    ReLIFT's released trainers (`loss_remove_clip=True`). Same shapes and stats as ppo_clip_loss
    (its clip_frac is 0)."""
    ratio = torch.exp(logp - old_logp)
    per_token = -(adv[:, None] if adv.dim() == 1 else adv) * ratio
    if is_weight is not None:
        per_token = per_token * is_weight
    with torch.no_grad():
        ratio_mean = agg_token_mean(ratio, mask)
    return aggregate(agg, per_token, mask), {"clip_frac": 0.0, "ratio_mean": ratio_mean.item()}


# name -> (loss function, the level its importance weights act at)
POLICY_LOSSES: Registry[tuple[Callable[..., tuple[torch.Tensor, dict]], str]] = Registry("policy loss", {
    "ppo_clip": (ppo_clip_loss, "token"),
    "gspo": (gspo_loss, "sequence"),
    "unclipped": (unclipped_loss, "token"),
})


def policy_loss(name: str, logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                clip_low: float, clip_high: float, agg: "str | Agg", sampler_logp: torch.Tensor | None = None,
                tis_cap: float = 0.0) -> tuple[torch.Tensor, dict]:
    """The registered policy loss `name`, with truncated importance sampling against the sampler's
    log-probs when tis_cap > 0 (stats gain "tis_weight_mean" and "tis_clip_frac", over trained tokens)."""
    fn, level = POLICY_LOSSES.get(name)
    weight, stats = None, {}
    if tis_cap > 0:
        if sampler_logp is None:
            raise ValueError("tis_cap > 0 needs the sampler's log-probs")
        raw = tis_weights(old_logp, sampler_logp, mask, float("inf"), level)
        weight = torch.clamp(raw, max=tis_cap)
        stats = {"tis_weight_mean": agg_token_mean(weight, mask).item(),
                 "tis_clip_frac": agg_token_mean((raw > tis_cap).float(), mask).item()}
    loss, loss_stats = fn(logp, old_logp, adv, mask, clip_low, clip_high, agg, is_weight=weight)
    return loss, {**loss_stats, **stats}


# ---------------------------------------------------------------- process rewards

def process_advantages(step_rewards: list[list[float | None]], group_size: int, gamma: float,
                       eps: float = EPS) -> list[list[float]]:
    """Per episode and planner turn, Σ_{j≥k} γ^(j−k)·r̃_j: the discounted sum of the group-normalised
    step rewards from turn k on (DeepSeekMath's process supervision, with a discount). r̃ = (r − mean)
    / (std + eps) over the step rewards of the episode's group (episodes i·n … i·n + n − 1), unbiased
    std as in the group advantage; a turn without a step reward (None) adds 0; a group with fewer
    than two step rewards, or all equal, gives 0 everywhere."""
    out = []
    for g in range(0, len(step_rewards), group_size):
        group = step_rewards[g:g + group_size]
        vals = torch.tensor([r for ep in group for r in ep if r is not None], dtype=torch.float64)
        mean = vals.mean().item() if len(vals) else 0.0
        std = vals.std().item() if len(vals) > 1 else 0.0
        for ep in group:
            norm = [0.0 if r is None or not std > eps else (r - mean) / (std + eps) for r in ep]
            acc, ret = 0.0, [0.0] * len(ep)
            for k in range(len(ep) - 1, -1, -1):
                acc = norm[k] + gamma * acc
                ret[k] = acc
            out.append(ret)
    return out


# ---------------------------------------------------------------- RED as its paper's code has it

def offline_ratio(logp: torch.Tensor, accuracy: torch.Tensor, shift: str) -> torch.Tensor:
    """The ratio an expert (offline) token is trained with, [B, T], from its log-prob under the policy
    and its group's accuracy a [B] (the share of correct answers in the group, the expert's included).

    RED's accuracy-aware policy shift: the behaviour probability of an expert token is taken as
    b = a + (1 − a)·π, so the ratio π / b = π / (π + (1 − π)·a) is near π (imitate, as if the
    expert's probability were 1) when the group is mostly right, and near 1 (close to on-policy, a
    weak pull) when it is mostly wrong. `none` is the ratio π alone (a
    behaviour probability of 1, the path the paper's released code runs). Nothing is detached: the
    gradient flows through numerator and denominator, as in that code."""
    p = torch.exp(logp)
    if shift == "none":
        return p
    if shift != "accuracy":
        raise ValueError(f"offline shift must be one of {', '.join(OFFLINE_SHIFTS)}, got {shift!r}")
    a = accuracy[:, None].to(p.dtype)
    return p / (p + (1 - p) * a).clamp(min=1e-12)


def red_paper_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                   offline: torch.Tensor, accuracy: torch.Tensor, clip_low: float, clip_high: float, agg: "str | Agg",
                   shift: str = "accuracy") -> tuple[torch.Tensor, dict]:
    """The policy loss with expert sequences inside the groups: rows where `offline` [B] (bool) is
    true are expert tokens, with per-token loss −A·offline_ratio (unclipped, as in the paper's code);
    the other rows are rollouts with PPO-clip. One aggregation (`agg`) over all trained tokens, so an
    expert sequence is length-normalised exactly like a rollout. Returns (loss, {"clip_frac",
    "ratio_mean" over rollout tokens, "offline_ratio_mean" over expert tokens})."""
    online_tokens, was_clipped, ratio = ppo_clip_tokens(logp, old_logp, adv, clip_low, clip_high)
    expert_ratio = offline_ratio(logp, accuracy, shift)
    off = offline[:, None]
    per_token = torch.where(off, -adv[:, None] * expert_ratio, online_tokens)
    with torch.no_grad():
        on_mask, off_mask = mask * (~off).float(), mask * off.float()
        stats = {"clip_frac": agg_token_mean(was_clipped.float(), on_mask).item(),
                 "ratio_mean": agg_token_mean(ratio, on_mask).item(),
                 "offline_ratio_mean": agg_token_mean(expert_ratio, off_mask).item()}
    return aggregate(agg, per_token, mask), stats


def red_paper_entropy_weight(h_sft: float, h_rl: float, prev_sft: float | None, prev_rl: float | None,
                             cap: float) -> float:
    """clamp(|(1 − H_sft/H_sft_prev) / (1 − H_rl/H_rl_prev)|, 1, cap): how fast the entropy on the
    expert tokens moves relative to the rollouts', step over step (no EMA, as in the paper's code);
    1 on the first step, when either previous entropy is missing or zero, or when nothing moved.
    It multiplies the expert samples' advantages."""
    if not prev_sft or not prev_rl:
        return 1.0
    num, den = 1.0 - h_sft / prev_sft, 1.0 - h_rl / prev_rl
    if den == 0.0:
        return 1.0 if num == 0.0 else cap
    ratio = abs(num / den)
    return min(max(ratio, 1.0), cap) if math.isfinite(ratio) else 1.0


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || ref): exp(d) - d - 1 with d = ref_logp - logp. [B, T] -> [B, T]."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Full-distribution entropy per position: logsumexp(z) - sum softmax(z)·z. [B, T, V] -> [B, T]."""
    logits = logits.float()
    logz = torch.logsumexp(logits, dim=-1)  # [B, T]
    p = torch.softmax(logits, dim=-1)
    return logz - (p * logits).sum(-1)


def sft_cross_entropy(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean negative log-likelihood of the target tokens. logp, mask [B, T] -> scalar."""
    return agg_token_mean(-logp, mask)


def gather_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of each next token: logits [B, T, V], ids [B, T] -> [B, T-1] for ids[:, 1:]."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [B, T-1, V]
    return logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
