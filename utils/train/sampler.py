"""One RL step's rollouts and DAPO's dynamic sampling (`algorithm.rl.dynamic_sampling`, `refill`).

`DynamicSampler` rolls out a step's questions (n samples each) and scores them. With dynamic
sampling R > 0 a group whose answer scores are all equal has zero advantage and is dropped; the
batch is refilled from the question stream, at most R extra rounds, and the first Q groups with a
signal are kept (Q = questions_per_step). It takes the rollout, the reward spec and the question
stream (a function giving the stream's next k rows), never the trainer.

- **`refill: rounds`** (the default): round r+1 starts when round r's last group ends and draws as
  many questions as are still missing; its p-th question is the stream's p-th next one, seeded as
  episode (r+1)·Q·n + p·n + k of the step.
- **`refill: pipelined`**: each dropped group's replacement starts as soon as that group ends, on the
  rollout's one request stream: the i-th group of round r found without a signal draws the stream's
  next question and takes place i of round r+1, with the seeds place i has in rounds. So the same
  questions run with the same seeds, and the groups are read in (round, place) order, as rounds
  reads them. Given the same sampled tokens the step trains on the same batch
  (tests/test_dynamic_sampling.py checks it on a rule engine). On vLLM the tokens are not always the
  same: a replacement's prefill shares engine steps with other episodes' decoding, which moves logits
  in their last bits and now and then a sampled token, so a whole run trains differently (the
  default stays `rounds`; docs/PERFORMANCE.md has the measurement).

`time/rollout_refill` is the extra rounds' time (pipelined: from the first replacement's start to
the rollout's end). RED's accuracy is over every episode sampled in the step: a filtered batch has
lost its all-right groups. No group with a signal after R extra rounds stops the run.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from utils.core.errors import StageError
from utils.reward.scorers import is_correct
from utils.reward.spec import score_episodes
from utils.train.losses import advantages


@dataclass
class Group:
    """One question's n episodes and their scores."""
    row: dict
    episodes: list
    scored: list[dict]


@dataclass
class SampledBatch:
    """What a step trains on: the kept questions, their episodes and scores (group by group, n each),
    RED's accuracy over everything sampled (None without dynamic sampling: the trainer takes the
    batch's), and the sampling metrics (`train/dropped_groups`, ...; empty without it)."""
    rows: list[dict]
    episodes: list
    scored: list[dict]
    accuracy: float | None = None
    metrics: dict = field(default_factory=dict)


def has_signal(row: dict, scored: list[dict], variants) -> bool:
    """Whether a group's answer scores (as its variants see them) are not all equal."""
    answers = [s["answer"] for s in scored]
    for v in variants:
        answers = v.answers(row, answers)
    return len(set(answers)) > 1


class DynamicSampler:
    def __init__(self, rollout, spec, questions: Callable[[int], list[dict]], rl, seed: int):
        self.rollout, self.spec, self.questions, self.rl, self.seed = rollout, spec, questions, rl, seed

    def sample(self, rows: list[dict], step: int, first: int, variants=()) -> SampledBatch:
        """Roll out and score `rows` at `step` (`first`: the first episode's index); with dynamic
        sampling, drop and refill as the module says. `variants` decide a group's answers
        (red_paper's expert replaces its last rollout's)."""
        if not self.rl.dynamic_sampling:
            return SampledBatch(rows, *self._round(rows, step, first))
        if self.rl.refill == "pipelined":
            return self._pipelined(rows, step, first, variants)
        return self._rounds(rows, step, first, variants)

    def _round(self, rows: list[dict], step: int, first: int) -> tuple[list, list[dict]]:
        """One round: `rows`' episodes and their scores."""
        episodes = self.rollout.run(rows, n=self.rl.n_samples, seed=self.seed, step=step, first=first)
        return episodes, score_episodes(episodes, self.spec)

    def _rounds(self, rows: list[dict], step: int, first: int, variants) -> SampledBatch:
        rl, n = self.rl, self.rl.n_samples
        episodes, scored = self._round(rows, step, first)
        kept: list[Group] = []
        seen, dropped, rounds, refill = [], 0, 0, 0.0
        while True:
            seen += scored
            for g, row in enumerate(rows):
                group = Group(row, episodes[g * n:(g + 1) * n], scored[g * n:(g + 1) * n])
                if has_signal(row, group.scored, variants):
                    kept.append(group)
                else:
                    dropped += 1
            if len(kept) >= rl.questions_per_step or rounds == rl.dynamic_sampling:
                return self._batch(kept, seen, dropped, rounds, refill, step)
            rounds += 1
            t0 = time.time()
            rows = self.questions(rl.questions_per_step - len(kept))
            episodes, scored = self._round(rows, step, rounds * rl.questions_per_step * n)
            refill += time.time() - t0

    def _pipelined(self, rows: list[dict], step: int, first: int, variants) -> SampledBatch:
        rl, n = self.rl, self.rl.n_samples
        slots = [(0, p, row) for p, row in enumerate(rows)]  # (round, place, row) in the order rows started
        used = [len(rows)] + [0] * rl.dynamic_sampling  # places taken in each round
        verdicts: dict[int, tuple[list[dict], bool]] = {}
        refill_start = []

        def on_group(g: int, episodes) -> list[tuple[dict, int]]:
            r, _, row = slots[g]
            scored = score_episodes(episodes, self.spec)
            signal = has_signal(row, scored, variants)
            verdicts[g] = (scored, signal)
            if signal or r == rl.dynamic_sampling:
                return []
            (new,) = self.questions(1)
            place, used[r + 1] = used[r + 1], used[r + 1] + 1
            slots.append((r + 1, place, new))
            refill_start.append(time.time())
            return [(new, (r + 1) * rl.questions_per_step * n + place * n)]

        episodes = self.rollout.run(rows, n=n, seed=self.seed, step=step, first=first, on_group=on_group)
        done = time.time()
        kept, seen, dropped = [], [], 0
        for g in sorted(range(len(slots)), key=lambda g: slots[g][:2]):
            scored, signal = verdicts[g]
            seen += scored
            if signal:
                kept.append(Group(slots[g][2], episodes[g * n:(g + 1) * n], scored))
            else:
                dropped += 1
        refill = done - refill_start[0] if refill_start else 0.0
        return self._batch(kept, seen, dropped, max(r for r, _, _ in slots), refill, step)

    def _batch(self, kept: list[Group], seen: list[dict], dropped: int, rounds: int, refill: float,
               step: int) -> SampledBatch:
        """The first Q groups with a signal, in stream order, and the step's sampling metrics."""
        rl = self.rl
        if not kept:
            raise StageError(f"step {step + 1}: every group of {len(seen) // rl.n_samples} questions had equal answer "
                             f"scores (all right or all wrong) after {rounds} extra sampling rounds "
                             f"(algorithm.rl.dynamic_sampling={rl.dynamic_sampling}): nothing to train on; allow "
                             f"more rounds, or start from a policy whose samples disagree")
        kept = kept[:rl.questions_per_step]
        return SampledBatch([g.row for g in kept], [e for g in kept for e in g.episodes],
                            [s for g in kept for s in g.scored], batch_accuracy(seen),
                            {"train/dropped_groups": dropped, "train/sampling_rounds": rounds + 1,
                             "train/kept_groups": len(kept), "time/rollout_refill": refill})


def group_advantages(rewards: list[float], n: int, scaling: str) -> torch.Tensor:
    return advantages(scaling, torch.tensor(rewards, dtype=torch.float), n)


def batch_accuracy(scored: list[dict]) -> float:
    """RED's `acc`: the share of scored episodes whose answer is fully correct (an F1 of 0.5 counts 0)."""
    return sum(is_correct(s["answer"]) for s in scored) / max(len(scored), 1)


def zero_variance_fraction(rewards: list[float], n: int) -> float:
    groups = [rewards[i:i + n] for i in range(0, len(rewards), n)]
    return sum(max(g) - min(g) < 1e-9 for g in groups) / max(len(groups), 1)
