"""How a step weighs its SFT term against its policy loss (`algorithm.sft.weighting`): one registered
function a scheme, from (the algorithm config, RED's state, the step's batch accuracy, the step's
0-based index) to an `SftWeight`: the policy loss's coefficient, the SFT term's, how each SFT
token's NLL is weighted (utils/train/policy.py sft_terms), and what the step logs. utils/train/update.py applies it; a
new scheme is an entry here (its name is read by the schema from this file) and its test.

- `red` (red, fixed_sft, matched_sft, sft): L_GRPO + w·α·L_SFT, w RED's final weight
  (utils/train/red.py; G = 1 makes it 1, so α alone), logged as red/*.
- `chord` (CHORD, Zhang et al. 2025, "On-Policy RL Meets Off-Policy Experts", arXiv 2508.11408, as
  Trinity-RFT's `mix_chord` policy loss runs it): (1 − μ)·L_GRPO + μ·α·L_SFT. μ rises linearly from 0
  to `mu_peak` over `mu_warmup_steps`, falls on a half cosine to `mu_valley` over `mu_decay_steps`,
  then stays there. With `phi` (CHORD-φ) each demonstration token's NLL is multiplied by
  sg(p·(1 − p)), p the token's probability, and still divided by the token count. Only the policy
  loss takes (1 − μ): the entropy bonus and the KL stay as they are, as Trinity adds them outside
  its policy loss. docs/METHODS.md names where this departs from the paper's runs.
- `srft` (SRFT, Fu et al. 2025, arXiv 2506.19767, as the HPT authors' released trainer runs it):
  L_policy + α·L_SFT, each demonstration token's NLL multiplied by sg(exp(−H)), H the mean entropy
  of its own sequence (α = 0.5 in configs/algorithms/srft.yaml: the released 0.5·exp(−H)). Its
  policy loss on the rollouts is SRFT's own (utils/train/srft.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from utils.core.registry import Registry
from utils.train.red import RedState, red_weights


@dataclass(frozen=True)
class SftWeight:
    rl: float  # the policy loss's coefficient
    sft: float  # the SFT term's
    token_weight: str = "none"  # each SFT token's NLL × sg(p·(1 − p)) (phi) or sg(exp(−H_seq)) (entropy)
    stats: dict = field(default_factory=dict)


def red(alg, red_state: RedState, batch_accuracy: float, step: int) -> SftWeight:  # noqa: ARG001
    w = red_weights(red_state, batch_accuracy, alg.red.G, alg.red.accuracy_aware_policy_shift,
                    alg.red.weight_min, alg.red.weight_max)
    return SftWeight(1.0, w["red/final_weight"] * alg.sft.loss_coef, stats=w)


def chord_mu(step: int, warmup: int, decay: int, peak: float, valley: float) -> float:
    """CHORD's μ at 0-based step `step`: 0 → peak linearly over `warmup` steps, then a half cosine from
    peak to valley over `decay` steps, then valley."""
    if step < warmup:
        return peak * step / warmup
    t = step - warmup
    if t >= decay:
        return valley
    return valley + (peak - valley) * 0.5 * (1 + math.cos(math.pi * t / decay))


def chord(alg, red_state: RedState, batch_accuracy: float, step: int) -> SftWeight:  # noqa: ARG001
    c = alg.chord
    mu = chord_mu(step, c.mu_warmup_steps, c.mu_decay_steps, c.mu_peak, c.mu_valley)
    if not 0.0 <= mu <= 1.0:
        raise ValueError(f"algorithm.chord: μ = {mu} at step {step} is outside [0, 1] (mu_peak {c.mu_peak}, "
                         f"mu_valley {c.mu_valley})")
    return SftWeight(1.0 - mu, mu * alg.sft.loss_coef, "phi" if c.phi else "none",
                     {"chord/mu": mu, "chord/sft_weight": mu * alg.sft.loss_coef})


def srft(alg, red_state: RedState, batch_accuracy: float, step: int) -> SftWeight:  # noqa: ARG001
    return SftWeight(1.0, alg.sft.loss_coef, "entropy")


SFT_WEIGHTINGS: Registry[Callable[..., SftWeight]] = Registry("SFT weighting", {
    "red": red,
    "chord": chord,
    "srft": srft,
})
