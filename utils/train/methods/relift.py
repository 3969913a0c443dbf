"""ReLIFT (Ma et al. 2025, "Learning What Reinforcement Learning Can't: Interleaved Online Fine-Tuning
for Hardest Questions", arXiv 2506.07527), as its released trainer runs it: RL by default; a question
none of whose rollouts is right goes, with its demonstration, into a buffer, newest first; once the
buffer holds `algorithm.relift.buffer_size` questions, the newest that many leave it and their
demonstrations take one SFT optimizer step of their own after the step's RL update (token-mean NLL
× α, the same optimizer and learning rate); the older ones wait.

Here only questions with a demonstration can enter (03's traces: the 96 of the warmup), and a
question enters whether dynamic sampling dropped its group (seen through the `answers` hook, which
the sampler calls on every group it judges) or the step kept it (`regroup`). The buffer lives in
the checkpointed TrainState (`methods["relift"]`), so a resumed run keeps it. docs/METHODS.md names the
departures from the paper's runs.
"""
from __future__ import annotations

from utils.core.errors import StageError
from utils.reward.scorers import is_correct
from utils.train.policy import sft_backward, sft_batch
from utils.train.variants import StepData, StepVariant

SETTINGS = {  # algorithm.relift, read by the config's schema from this text (utils/core/method_files.py)
    "enabled": (False, "ReLIFT (method relift, utils/train/methods/relift.py): questions with a demonstration and no "
                       "right rollout wait in a buffer; when it holds buffer_size, their demonstrations take an SFT "
                       "optimizer step of their own after the RL update."),
    "buffer_size": (4, "Questions the buffer holds before its SFT step (a choice for this testbed, where about one "
                       "judged question in twenty has a demonstration).", {"minimum": 1}),
}
METHOD = {"summary": "ReLIFT: GRPO; questions no rollout solves wait in a buffer, and when it is full their "
                     "demonstrations take an SFT step of their own", "demonstrations": True}


class HardBuffer(StepVariant):
    """The step variant: `samples` maps a question id to its demonstration (an OfflineSample); `state`
    is the trainer's TrainState, whose `methods["relift"]` list (question ids, newest first) is the
    buffer."""

    def __init__(self, samples: dict, size: int, n: int, state):
        self.samples, self.size, self.n, self.state = samples, size, n, state
        self.failed: list[str] = []  # this step's questions with a demonstration and no right rollout
        self.judged: set[str] = set()  # this step's questions dynamic sampling judged (their groups noted then)

    def _note(self, row: dict, answers: list[float]) -> None:
        if row["id"] in self.samples and not any(map(is_correct, answers)):
            self.failed.append(row["id"])

    def answers(self, row: dict, answers: list[float]) -> list[float]:
        self._note(row, answers)
        self.judged.add(row["id"])
        return answers  # the group is judged as GRPO judges it

    def regroup(self, step: StepData) -> None:
        for g, row in enumerate(step.rows):  # the kept groups dynamic sampling did not already judge
            if row["id"] not in self.judged:
                self._note(row, [s["answer"] for s in step.scored[g * self.n:(g + 1) * self.n]])
        buffer = self.failed + self.state.methods.get("relift", [])  # a question that fails again may wait twice, as released
        self.failed, self.judged = [], set()
        step.sft = []  # no SFT term inside the RL update
        if len(buffer) >= self.size:
            taken, buffer = buffer[:self.size], buffer[self.size:]
            step.notes["relift_demos"] = [ex for q in taken for ex in self.samples[q].examples]
        self.state.methods["relift"] = buffer
        step.notes["relift"] = len(buffer)

    def extra_step(self, trainer, step: StepData) -> dict:
        return demo_step(trainer, step.notes["relift_demos"]) if "relift_demos" in step.notes else {}

    def check(self, world) -> None:
        if world.size > 1:
            raise StageError(f"algorithm.relift needs one rank (this run has {world.size}): each rank's buffer would "
                             f"fill at its own step, and its SFT step would leave the others behind")

    def metrics(self, step: StepData, world) -> dict:
        return {"relift/buffer": step.notes["relift"], "relift/sft_step": float("relift_demos" in step.notes)}


def demo_step(trainer, examples: list) -> dict:
    """ReLIFT's SFT step on the buffered demonstrations `examples`, after the step's RL update: its own
    optimizer step on α × their token-mean NLL (utils/train/policy.py sft_backward), through the
    trainer's finiteness check and clip; its stats."""
    batch = sft_batch(examples, trainer.pad_id, trainer.device)
    coef = trainer.alg.sft.loss_coef
    trainer.opt.zero_grad(set_to_none=True)
    loss, entropy = sft_backward(trainer.model, batch, batch[2].sum().clamp(min=1), trainer.cfg.model.memory, coef,
                                 with_entropy=True)
    skipped, _ = trainer._finish(loss)
    return {"relift/sft_loss": loss.item() / max(coef, 1e-12), "relift/sft_entropy": entropy.item(),
            "relift/sft_examples": len(examples), "relift/sft_skipped": skipped,
            "train/optimizer_steps": 1 - skipped, "train/tokens_sft": 0.0 if skipped else batch[2].sum().item()}


def variants(alg, spec, offline: dict, state) -> list:  # noqa: ARG001
    """The step variants of a ReLIFT run: the buffer, kept in `state`."""
    return [HardBuffer(offline, alg.relift.buffer_size, alg.rl.n_samples, state)]
