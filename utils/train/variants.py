"""Trainer variants: what red_paper's expert traces (utils/train/red_paper.py `ExpertTraces`) and
process rewards add to a GRPO step, as plug-ins the step calls at fixed points instead of branches
on the config (docs/ARCHITECTURE.md, "Training"). utils/train/method_variants.py `active_variants` builds
the ones a run's config turns on; plain GRPO has none.

A step (utils/train/grpo_trainer.py `GrpoTrainer.step`) calls each active variant's hooks in order:
1. `answers(row, answers)`: the answer scores dynamic sampling judges a group by;
2. `regroup(step)`: before the advantages, it may change the groups' rewards (`step.rewards`) and
   mark episodes whose place another sequence took (`step.replaced`);
3. `extend(step, adv)`: after them, extra training sequences (`step.extra`: (Example, advantage,
   group accuracy)) and per planner turn advantage bonuses (`step.bonus`, per episode);
4. `extra_step(trainer, step)`: an optimizer step of its own after the update (ReLIFT's SFT step
   on its full buffer), its stats; its `train/optimizer_steps` and `train/tokens_sft` add to the update's;
5. `after_update(stats, skipped, state)`: what the next step needs, kept in the checkpointed
   TrainState;
6. `metrics(step, world)`: its logged metrics, gathered over the ranks so that every rank logs the
   same.
Before the first step the trainer asks each `check(world)`, which refuses ranks it cannot run on.
The defaults change nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from utils.reward.process import verifier_rewards
from utils.train.losses import process_advantages


@dataclass
class StepData:
    """One step's rollouts as the variants see and change them."""
    rows: list[dict]
    episodes: list
    scored: list[dict]
    rewards: list[float]  # per episode, as the group advantages will read them
    replaced: set[int] = field(default_factory=set)  # episodes not trained: another sequence took their place
    extra: list[tuple] = field(default_factory=list)  # (Example, advantage, group accuracy) trained beside them
    bonus: list[list[float]] | None = None  # per episode, per planner turn: added to that turn's advantage
    sft: list | None = None  # the step's SFT examples, where a variant chooses them (HPT); None: the SFT stream
    notes: dict = field(default_factory=dict)  # what a variant keeps between its hooks within the step


class StepVariant:
    def answers(self, row: dict, answers: list[float]) -> list[float]:
        return answers

    def regroup(self, step: StepData) -> None:
        pass

    def extend(self, step: StepData, adv) -> None:
        pass

    def extra_step(self, trainer, step: StepData) -> dict:  # noqa: ARG002 - the default takes none
        return {}

    def after_update(self, stats: dict, skipped: int, state) -> None:
        pass

    def check(self, world) -> None:
        pass

    def metrics(self, step: StepData, world) -> dict:
        return {}

    def close(self) -> None:
        pass


class ProcessRewards(StepVariant):
    """reward.process: per episode and planner turn, process_weight × the discounted, group-normalised
    step rewards (utils/train/losses.py process_advantages) of the verifier, or of the judge `prm`
    (a JudgePRM, utils/reward/process.py), added to that turn's tokens' advantage."""

    def __init__(self, source: str, rl, prm=None):
        self.source, self.rl, self.prm = source, rl, prm

    def extend(self, step: StepData, adv) -> None:
        rl, n = self.rl, self.rl.n_samples
        if self.source == "verifier":
            steps = [verifier_rewards(ep, step.rows[i // n]) for i, ep in enumerate(step.episodes)]
        else:
            if self.prm is None:
                raise RuntimeError("reward.process.source judge: no judge engine (build_trainer starts one)")
            before = self.prm.unparsed
            steps = self.prm(step.episodes)
        step.bonus = [[rl.process_weight * b for b in ep] for ep in process_advantages(steps, n, rl.process_gamma)]
        scored = [r for ep in steps for r in ep if r is not None]
        stats = {"process/step_reward_mean": sum(scored) / len(scored) if scored else 0.0,
                 "process/steps_per_episode": len(scored) / max(len(step.episodes), 1)}
        if self.source == "judge":
            stats["process/judge_unparsed"] = (self.prm.unparsed - before) / max(len(scored), 1)
        step.notes["process"] = stats

    def metrics(self, step: StepData, world) -> dict:
        return world.mean(step.notes["process"])

    def close(self) -> None:
        if self.prm is not None:
            self.prm.engine.close()
