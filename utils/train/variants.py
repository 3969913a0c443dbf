"""Trainer variants: what red_paper's expert traces and process rewards add to a GRPO step, as
plug-ins the step calls at fixed points instead of branches on the config (docs/ARCHITECTURE.md,
"Training"). `active_variants` builds the ones a run's config turns on; plain GRPO has none.

A step (utils/train/grpo_trainer.py `GrpoTrainer.step`) calls each active variant's hooks in order:
1. `answers(row, answers)`: the answer scores dynamic sampling judges a group by;
2. `regroup(step)`: before the advantages, it may change the groups' rewards (`step.rewards`) and
   mark episodes whose place another sequence took (`step.replaced`);
3. `extend(step, adv)`: after them, extra training sequences (`step.extra`: (Example, advantage,
   group accuracy)) and per planner turn advantage bonuses (`step.bonus`, per episode);
4. `after_update(stats, skipped, state)`: what the next step needs, kept in the checkpointed
   TrainState;
5. `metrics(step, world)`: its logged metrics, gathered over the ranks so that every rank logs the
   same.
The defaults change nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from utils.reward.process import verifier_rewards
from utils.reward.scorers import is_correct
from utils.reward.spec import score_answer
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
    notes: dict = field(default_factory=dict)  # what a variant keeps between its hooks within the step


class StepVariant:
    def answers(self, row: dict, answers: list[float]) -> list[float]:
        return answers

    def regroup(self, step: StepData) -> None:
        pass

    def extend(self, step: StepData, adv) -> None:
        pass

    def after_update(self, stats: dict, skipped: int, state) -> None:
        pass

    def metrics(self, step: StepData, world) -> dict:
        return {}

    def close(self) -> None:
        pass


class ExpertTraces(StepVariant):
    """red_paper: a question with an expert trace (03's, `samples`: question id -> OfflineSample) has
    it in place of its group's last rollout, scored like a rollout (format 1: gold traces are
    well-formed by construction, tests/test_red_paper.py) and trained through the policy loss
    (utils/train/losses.py `red_paper_loss`, applied in utils/train/update.py `_rl_piece`), which needs the previous step's entropies."""

    def __init__(self, samples: dict, spec, n: int):
        self.samples, self.spec, self.n = samples, spec, n

    def _score(self, row: dict) -> tuple[float, dict]:
        sample = self.samples[row["id"]]
        return score_answer(self.spec, row["question"], sample.answer, row["answers"], 1.0, sample.n_tokens,
                            sample.subtasks)

    def answers(self, row: dict, answers: list[float]) -> list[float]:
        if row["id"] in self.samples:
            return answers[:-1] + [self._score(row)[1]["answer"]]
        return answers

    def regroup(self, step: StepData) -> None:
        experts = []
        for g, row in enumerate(step.rows):
            sample = self.samples.get(row["id"])
            if sample is None:
                continue
            i = g * self.n + self.n - 1
            reward, comps = self._score(row)
            step.rewards[i] = reward
            answers = [s["answer"] for s in step.scored[g * self.n:i]] + [comps["answer"]]
            experts.append((i, sample, sum(map(is_correct, answers)) / self.n))
        step.replaced |= {i for i, _, _ in experts}
        step.notes["experts"] = experts

    def extend(self, step: StepData, adv) -> None:
        step.extra += [(ex, adv[i].item(), acc) for i, sample, acc in step.notes["experts"] for ex in sample.examples]

    def after_update(self, stats: dict, skipped: int, state) -> None:
        if "red_paper/h_sft" in stats and not skipped:
            state.red_paper = {"h_sft": stats["red_paper/h_sft"], "h_rl": stats["red_paper/h_rl"]}

    def metrics(self, step: StepData, world) -> dict:
        accuracy = world.concat([a for _, _, a in step.notes["experts"]])
        if not accuracy:
            return {}
        return {"red_paper/offline_groups": len(accuracy), "red_paper/group_accuracy": sum(accuracy) / len(accuracy)}


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


def active_variants(alg, spec, offline: dict, prm=None) -> list[StepVariant]:
    """The variants a run's config turns on, in hook order: expert traces (algorithm.red_paper.offline,
    with the traces `offline` read), then process rewards (reward.process.source)."""
    out: list[StepVariant] = []
    if offline:
        out.append(ExpertTraces(offline, spec, alg.rl.n_samples))
    if spec.process.source != "none":
        out.append(ProcessRewards(spec.process.source, alg.rl, prm))
    return out
