"""HPT's switch (Lv et al. 2025, "Towards a Unified View of Large Language Model Post-Training",
arXiv 2509.04419; its released trainer's `unify_strategy: switch`): per question, when at most
`algorithm.hpt.gate` of its rollouts are fully correct (gate 0: none), its rollouts are removed from
the batch and its demonstration is trained with the SFT loss instead; every other question trains
GRPO as usual. The SFT term is a token mean over the switched demonstrations' own tokens, weighted
by α (`algorithm.sft.loss_coef`, 1 in configs/algorithms/hpt.yaml), beside the policy loss's token
mean, as the released code adds `sft_loss · sft_loss_coef` to its policy loss.

The demonstrations are 03's traces (utils/agent/traces.py `OfflineSample`), so only questions that
have one can switch: in the embedded default, the 96 of the warmup. A switched question's group
counts as carrying a signal for dynamic sampling, so the refill does not drop it before the switch
sees it. docs/METHODS.md names the departures from the paper's runs.
"""
from __future__ import annotations

from utils.reward.scorers import is_correct
from utils.train.variants import StepData, StepVariant

SETTINGS = {  # algorithm.hpt, read by the config's schema from this text (utils/core/method_files.py)
    "enabled": (False, "HPT's switch (method hpt, utils/train/methods/hpt.py): a question whose rollouts hold at "
                       "most `gate` fully correct answers and that has a demonstration (03's trace) trains that "
                       "demonstration with the SFT loss instead of its rollouts; the others train GRPO."),
    "gate": (0, "The most correct rollouts a question may have and still switch to its demonstration.",
             {"minimum": 0}),
}
METHOD = {"summary": "HPT: per question, SFT on its demonstration when no rollout is right, else GRPO",
          "demonstrations": True}


class DemoSwitch(StepVariant):
    """The step variant: `samples` maps a question id to its demonstration (an OfflineSample)."""

    def __init__(self, samples: dict, gate: int, n: int):
        self.samples, self.gate, self.n = samples, gate, n

    def _switches(self, row: dict, answers: list[float]) -> bool:
        return row["id"] in self.samples and sum(map(is_correct, answers)) <= self.gate

    def answers(self, row: dict, answers: list[float]) -> list[float]:
        """A group that will switch to its demonstration carries a signal: its answers as dynamic
        sampling reads them gain the demonstration's (correct) one in the last place."""
        return answers[:-1] + [1.0] if self._switches(row, answers) else answers

    def regroup(self, step: StepData) -> None:
        step.sft = []  # HPT's SFT rows are the switched questions' demonstrations, and only those
        switched = 0
        for g, row in enumerate(step.rows):
            answers = [s["answer"] for s in step.scored[g * self.n:(g + 1) * self.n]]
            if self._switches(row, answers):
                step.replaced |= set(range(g * self.n, (g + 1) * self.n))
                step.sft += self.samples[row["id"]].examples
                switched += 1
        step.notes["hpt"] = switched

    def metrics(self, step: StepData, world) -> dict:
        switched = world.concat([step.notes["hpt"]])  # every rank's count
        return {"hpt/switched_groups": sum(switched)}


def variants(alg, spec, offline: dict, state) -> list:  # noqa: ARG001 - the switch keeps no state
    """The step variants of an HPT run: the switch, over 03's demonstrations."""
    return [DemoSwitch(offline, alg.hpt.gate, alg.rl.n_samples)]
