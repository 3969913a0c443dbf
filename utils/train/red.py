"""RED (Recall-Extend Dynamics) weights of the SFT term: a pure state update and pure weights.

Part 1 compares changes of EMAs of the *same* estimator (full-distribution token entropy) on RL
tokens and SFT tokens: w_entropy = clamp(|ΔH_sft| / (|ΔH_rl| + eps), 1, G). Part 2 is
w_acc = G^(1 − 2·acc), acc the share of the step's rollouts that are fully correct. The trainer
(utils/train/grpo_trainer.py) folds a step's entropies into the state after that step's update, so
step t's weight uses the EMA change from step t−2 to t−1, and steps 1 and 2 use w_entropy = 1.
"""
from __future__ import annotations

from dataclasses import dataclass

from utils.train.losses import EPS


@dataclass
class RedState:
    """Checkpointable RED state: the entropy EMAs and their previous values."""

    ema_sft: float | None = None
    ema_rl: float | None = None
    prev_ema_sft: float | None = None
    prev_ema_rl: float | None = None
    steps: int = 0


def red_update(state: RedState, h_sft: float, h_rl: float, decay_sft: float, decay_rl: float) -> RedState:
    """A new state with this step's entropies folded into the EMAs (the first value seeds the EMA)."""
    def ema(old, x, decay):
        return x if old is None else decay * old + (1 - decay) * x
    return RedState(ema(state.ema_sft, h_sft, decay_sft), ema(state.ema_rl, h_rl, decay_rl),
                    state.ema_sft, state.ema_rl, state.steps + 1)


def red_weights(state: RedState, batch_accuracy: float, G: float, accuracy_aware: bool,
                weight_min: float, weight_max: float, eps: float = EPS) -> dict:
    """RED Part 1 and Part 2 from the state after the latest update.

    w_entropy = clamp(|ΔH_sft| / (|ΔH_rl| + eps), 1, G), ΔH the last step-to-step change of each EMA
    (1 while there is no change yet: the trainer's steps 1 and 2, since `state` holds the updates of
    the steps before this one); w_acc = G^(1 - 2·acc) if accuracy_aware else 1;
    final = clamp(w_entropy · w_acc, weight_min, weight_max).
    """
    if state.prev_ema_sft is None or state.prev_ema_rl is None:
        w_entropy = 1.0
    else:
        d_sft = abs(state.ema_sft - state.prev_ema_sft)
        d_rl = abs(state.ema_rl - state.prev_ema_rl)
        w_entropy = min(max(d_sft / (d_rl + eps), 1.0), max(G, 1.0))
    w_acc = G ** (1 - 2 * batch_accuracy) if accuracy_aware else 1.0
    final = min(max(w_entropy * w_acc, weight_min), weight_max)
    return {"red/entropy_weight": w_entropy, "red/accuracy_factor": w_acc, "red/final_weight": final,
            "red/batch_accuracy": batch_accuracy}
