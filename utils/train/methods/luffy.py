"""LUFFY (Yan et al. 2025, "Learning to Reason under Off-Policy Guidance", arXiv 2504.14945), as its
released trainer runs it (exp_scripts/train.sh: one off-policy trace among eight samples,
`off_policy_reshape=p_div_p_0.1`, `loss_remove_clip=True`, `grpo_use_std=False`,
`loss_remove_token_mean=True`): a method in one file (utils/core/method_files.py), the example
docs/EXTENDING.md walks through.

- A question with a demonstration (03's trace) has it in place of its group's last rollout, scored
  like one (red_paper's `ExpertTraces`, utils/train/red_paper.py), so the group's advantage is taken
  over the union: a group whose rollouts all fail still learns, from the demonstration.
- Demonstration tokens are trained with −A·f(p), f(p) = p/(p + γ), LUFFY's policy shaping
  (γ = `algorithm.luffy.shape`, 0.1), unclipped: a low-probability token of the demonstration gets a
  larger gradient than p alone would give it.
- Rollout tokens with −A·r, r = π/π_old, unclipped as released (`clip_rollouts` false; true: PPO-clip
  as the paper's equation writes it).
- One aggregation over every trained token, the run's `algorithm.rl.loss_agg` as for every method
  here (the released script divides the token sum by a constant: token-sum-norm), and the advantage
  without the group's std (`adv_scaling: none`, configs/algorithms/luffy.yaml).
No SFT term, no KL. docs/METHODS.md names where this departs from the paper's runs.
"""
from __future__ import annotations

import torch

from utils.core.errors import StageError
from utils.train.batch import RlBatch
from utils.train.losses import aggregate, agg_token_mean, ppo_clip_tokens
from utils.train.red_paper import ExpertTraces

SETTINGS = {  # algorithm.luffy, read by the config's schema from this text
    "enabled": (False, "LUFFY (method luffy, utils/train/methods/luffy.py): demonstrations inside the groups, "
                       "trained with the shaped ratio p / (p + shape); rollouts by the unclipped ratio."),
    "shape": (0.1, "γ of the demonstrations' shaped ratio p / (p + γ) (the released 0.1).", {"minimum": 1e-6}),
    "clip_rollouts": (False, "PPO-clip the rollouts' ratio as the paper's equation does (the released script "
                             "turns the clip off: false)."),
}
METHOD = {"summary": "LUFFY: a demonstration in place of each group's last rollout, trained by the shaped ratio "
                     "p/(p + 0.1); rollouts by the unclipped ratio; no SFT term",
          "demonstrations": True, "demonstration_tokens": True}


def luffy_loss(part: RlBatch, logp: torch.Tensor, old_lp: torch.Tensor, agg, cfg, rl) -> tuple[torch.Tensor, dict, dict]:
    """LUFFY's policy loss on a micro-batch `part`: (loss, its stats, each stat's weight over this
    piece). Demonstration rows (`part.offline`) −A·p/(p + γ); the others −A·r, r = exp(logp − old_lp),
    clipped to [1 − clip_low, 1 + clip_high] PPO's way only under `cfg.clip_rollouts`; one aggregation
    `agg` over every trained token. `cfg`: the run's algorithm.luffy, `rl` its algorithm.rl."""
    off = part.offline if part.offline is not None else torch.zeros_like(part.adv, dtype=torch.bool)
    adv = part.adv[:, None]
    if cfg.clip_rollouts:
        online, clipped, ratio = ppo_clip_tokens(logp, old_lp, part.adv, rl.clip_low, rl.clip_high)
    else:
        ratio = torch.exp(logp - old_lp)
        online, clipped = -adv * ratio, torch.zeros_like(ratio, dtype=torch.bool)
    p = torch.exp(logp)
    shaped = p / (p + cfg.shape)
    per_token = torch.where(off[:, None], -adv * shaped, online)
    with torch.no_grad():
        on_mask, off_mask = part.mask * (~off).float()[:, None], part.mask * off.float()[:, None]
        stats = {"ratio_mean": agg_token_mean(ratio, on_mask).item(),
                 "clip_frac": agg_token_mean(clipped.float(), on_mask).item(),
                 "luffy/shaped_ratio_mean": agg_token_mean(shaped, off_mask).item()}
    weights = {"ratio_mean": on_mask.sum(), "clip_frac": on_mask.sum(), "luffy/shaped_ratio_mean": off_mask.sum()}
    return aggregate(agg, per_token, part.mask), stats, weights


class LuffyPiece:
    """LUFFY's policy loss as the update's piece loss (utils/train/method_variants.py `piece_loss`)."""

    def __init__(self, alg):
        self.cfg, self.rl = alg.luffy, alg.rl

    def prepare(self, model, batch, norms, memory, world, pieces: int) -> None:
        pass

    def loss(self, part: RlBatch, logp, old_lp, ent, h_rl: float, norms, agg, piece_state: dict, tally):  # noqa: ARG002
        return luffy_loss(part, logp, old_lp, agg, self.cfg, self.rl)


class Guidance(ExpertTraces):
    """The step variant: red_paper's demonstrations in the groups, logged under luffy/. A step with no
    demonstration at all would train unclipped GRPO under LUFFY's name, and is refused."""

    def regroup(self, step) -> None:
        if not self.samples:
            raise StageError("method luffy trains demonstrations inside the groups, and 03's traces hold none: "
                             "check 03_generate_sft_traces' output")
        super().regroup(step)

    def metrics(self, step, world) -> dict:
        accuracy = world.concat([a for _, _, a in step.notes["experts"]])
        return {"luffy/demo_groups": len(accuracy),
                "luffy/group_accuracy": sum(accuracy) / len(accuracy) if accuracy else 0.0}


def variants(alg, spec, offline: dict, state) -> list:  # noqa: ARG001 - LUFFY keeps no state
    """The step variants of a LUFFY run: its demonstrations in the groups."""
    return [Guidance(offline, spec, alg.rl.n_samples)]


def piece(alg, experts: bool) -> LuffyPiece:  # noqa: ARG001 - every micro-batch, demonstrations or not
    return LuffyPiece(alg)
