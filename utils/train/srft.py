"""SRFT (Fu et al. 2025, "SRFT: A Single-Stage Method with Supervised and Reinforcement Fine-Tuning for
Reasoning", arXiv 2506.19767), as the HPT authors' released trainer runs it (`offline_loss_type:
srft`): one step trains three terms on one batch, each weighted by the entropy H of its sequence
(the token mean over the sequence's trained tokens, detached).

- Demonstrations inside the groups: a question with a demonstration (03's trace) has it in place of
  its group's last rollout, scored like one (red_paper's `ExpertTraces`, utils/train/red_paper.py),
  so its advantage A is its group's over the union; its tokens are trained with −A·p/(p + γ), LUFFY's
  shaped off-policy ratio (γ = `algorithm.srft.shape`, 0.1), unclipped.
- The same demonstrations are the step's SFT examples (`StepData.sft`), each token's NLL weighted by
  α·sg(exp(−H)) (utils/train/sft_weights.py `srft`; α = 0.5).
- Rollouts: REINFORCE on log p with the advantage c·sg(exp(H)) when the episode's answer is right
  (c = `algorithm.srft.positive_coef`, 0.1) and `algorithm.srft.negative_coef` when it is wrong, in
  place of the group advantage: −1 in method srft, the paper's equation and the released SRFT
  script's (`loss_remove_clip=True`); 0 in method srft_clamped, the released loss with its clamp on
  (the config's default, which no released script uses): max(−A·log p, −A·clamp(log p, min=0.8)) is
  then the constant 0.8 for A = −1, so a wrong rollout adds no gradient while its tokens stay in the
  token mean's count.

The policy loss is one token mean over the demonstration and rollout tokens (`srft_loss`), the SFT
term its own token mean over the demonstrations, the two added. docs/METHODS.md names where this
departs from the paper and from the released code.
"""
from __future__ import annotations

import torch

from utils.train.batch import RlBatch
from utils.train.losses import aggregate, agg_token_mean
from utils.train.red_paper import ExpertTraces
from utils.train.variants import StepData


def sequence_entropy(ent: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[S]: each row's mean token entropy over its masked tokens, detached (0 for a row with none)."""
    ent, mask = ent.detach(), mask.detach()
    return (ent * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def rollout_advantages(correct: torch.Tensor, h: torch.Tensor, positive_coef: float,
                       negative_coef: float) -> torch.Tensor:
    """[S]: SRFT's advantage of a rollout sequence: positive_coef·exp(H) when its episode answered right,
    negative_coef when it did not (`correct` [S] bool, `h` [S] its entropy)."""
    return torch.where(correct, positive_coef * torch.exp(h), torch.full_like(h, negative_coef))


def srft_loss(part: RlBatch, logp: torch.Tensor, ent: torch.Tensor, agg, cfg) -> tuple[torch.Tensor, dict, dict]:
    """SRFT's policy loss on a micro-batch `part`: (loss, its stats, the weight of each stat over this
    piece). Demonstration rows (`part.offline`) −A·p/(p + γ) with their group advantage A; the
    others −A'·log p with A' from `rollout_advantages`; one aggregation `agg` over every trained
    token. `cfg`: the run's `algorithm.srft` (c, the wrong rollouts' advantage, γ)."""
    if part.correct is None:
        raise ValueError("SRFT's rollout advantages need the batch's per-row answer correctness (RlBatch.correct)")
    off = part.offline if part.offline is not None else torch.zeros_like(part.adv, dtype=torch.bool)
    h = sequence_entropy(ent, part.mask)
    on_adv = rollout_advantages(part.correct, h, cfg.positive_coef, cfg.negative_coef)
    p = torch.exp(logp)
    shaped = p / (p + cfg.shape)
    per_token = torch.where(off[:, None], -part.adv[:, None] * shaped, -on_adv[:, None] * logp)
    with torch.no_grad():
        on_mask, off_mask = part.mask * (~off).float()[:, None], part.mask * off.float()[:, None]
        right = on_mask * part.correct.float()[:, None]
        stats = {"positive_adv": agg_token_mean(on_adv[:, None].expand_as(logp), right).item(),
                 "offline_ratio_mean": agg_token_mean(shaped, off_mask).item()}
    weights = {"positive_adv": right.sum(), "offline_ratio_mean": off_mask.sum()}
    return aggregate(agg, per_token, part.mask), stats, weights


class SrftPiece:
    """SRFT's policy loss as the update's piece loss (utils/train/method_variants.py `piece_loss`)."""

    def __init__(self, cfg):
        self.cfg = cfg

    def prepare(self, model, batch, norms, memory, world, pieces: int) -> None:
        pass

    def loss(self, part: RlBatch, logp, old_lp, ent, h_rl: float, norms, agg, piece_state: dict, tally):  # noqa: ARG002
        pg, stats, weights = srft_loss(part, logp, ent, agg, self.cfg)
        return pg, *({f"srft/{k}": v for k, v in d.items()} for d in (stats, weights))


class DemoGroups(ExpertTraces):
    """SRFT's step variant: red_paper's expert traces in the groups (the policy loss's demonstration
    rows), and the same demonstrations as the step's SFT examples."""

    def regroup(self, step: StepData) -> None:
        super().regroup(step)
        step.sft = [ex for _, sample, _ in step.notes["experts"] for ex in sample.examples]
