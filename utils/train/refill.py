"""Dynamic sampling's refill without the wait between rounds (`algorithm.rl.refill: pipelined`).

DAPO's dynamic sampling drops a group whose answer scores are all equal and refills the batch from
the question stream, at most R extra rounds a step. In rounds (utils/train/grpo_trainer.py,
`refill: rounds`), round r+1 starts when round r's last group ends and draws as many questions as
round r dropped: it runs exactly when round r dropped any, and its p-th question is the stream's
p-th next one, seeded as episode (r+1)·Q·n + p·n + k of the step (Q questions a step, n samples).

Here each dropped group's replacement starts as soon as that group ends, on the rollout's one
request stream: the i-th group of round r found without a signal draws the stream's next question
and takes place i of round r+1, with the seeds place i has in rounds. So the same questions run
with the same seeds; the groups are then read in (round, place) order, as rounds reads them. Given
the same sampled tokens the step trains on the same batch (tests/test_dynamic_sampling.py checks it
on a rule engine). On vLLM the tokens are not always the same: a replacement's prefill now shares
engine steps with other episodes' decoding, which moves logits in their last bits and now and then
a sampled token, so a whole run trains differently (a numerics change: the default stays `rounds`
until the results are re-baselined; docs/PERFORMANCE.md has the measurement). `time/rollout_refill`
is the time from the first replacement's start to the rollout's end (in rounds: the extra rounds').
"""
from __future__ import annotations

import time

from utils.core.errors import StageError
from utils.reward.spec import score_episodes
from utils.train.grpo import batch_accuracy


def has_signal(row: dict, scored: list[dict], variants) -> bool:
    """Whether a group's answer scores (as its variants see them) are not all equal."""
    answers = [s["answer"] for s in scored]
    for v in variants:
        answers = v.answers(row, answers)
    return len(set(answers)) > 1


def sampled_batch(kept: list[tuple], seen: list[dict], dropped: int, rounds: int, refill: float, step: int,
                  rl) -> tuple:
    """(kept rows, their episodes, their scores, sampling metrics) of one step's dynamic sampling, from
    its (row, episodes, scores) groups with a signal in stream order, every score it saw, the groups
    it dropped, its extra rounds and the refill's seconds. No group with a signal stops the run."""
    if not kept:
        raise StageError(f"step {step + 1}: every group of {len(seen) // rl.n_samples} questions had equal answer "
                         f"scores (all right or all wrong) after {rounds} extra sampling rounds "
                         f"(algorithm.rl.dynamic_sampling={rl.dynamic_sampling}): nothing to train on; allow "
                         f"more rounds, or start from a policy whose samples disagree")
    kept = kept[:rl.questions_per_step]
    return ([r for r, _, _ in kept], [e for _, eps, _ in kept for e in eps], [s for _, _, sc in kept for s in sc],
            {"accuracy": batch_accuracy(seen), "train/dropped_groups": dropped, "train/sampling_rounds": rounds + 1,
             "train/kept_groups": len(kept), "time/rollout_refill": refill})


def pipelined_rollouts(trainer, rows: list[dict], first: int, variants=()) -> tuple:
    """(kept rows, their episodes, their scores, sampling metrics) of one step, as
    GrpoTrainer._rollouts returns them with `refill: rounds`."""
    rl, n, seed, step = trainer.alg.rl, trainer.alg.rl.n_samples, trainer.cfg.seed, trainer.state.step
    slots = [(0, p, row) for p, row in enumerate(rows)]  # (round, place, row) in the order rows started
    used = [len(rows)] + [0] * rl.dynamic_sampling  # places taken in each round
    verdicts: dict[int, tuple[list[dict], bool]] = {}
    refill_start = []

    def on_group(g: int, episodes) -> list[tuple[dict, int]]:
        r, _, row = slots[g]
        scored = score_episodes(episodes, trainer.spec)
        signal = has_signal(row, scored, variants)
        verdicts[g] = (scored, signal)
        if signal or r == rl.dynamic_sampling:
            return []
        (new,) = trainer.next_questions(1)
        place, used[r + 1] = used[r + 1], used[r + 1] + 1
        slots.append((r + 1, place, new))
        refill_start.append(time.time())
        return [(new, (r + 1) * rl.questions_per_step * n + place * n)]

    episodes = trainer.rollout.run(rows, n=n, seed=seed, step=step, first=first, on_group=on_group)
    done = time.time()
    kept, seen, dropped = [], [], 0
    for g in sorted(range(len(slots)), key=lambda g: slots[g][:2]):
        scored, signal = verdicts[g]
        seen += scored
        if signal:
            kept.append((slots[g][2], episodes[g * n:(g + 1) * n], scored))
        else:
            dropped += 1
    refill = done - refill_start[0] if refill_start else 0.0
    return sampled_batch(kept, seen, dropped, max(r for r, _, _ in slots), refill, step, rl)
