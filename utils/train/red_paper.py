"""red_paper in one place: the paper's expert traces trained through the policy loss, beside the
rollouts (docs/METHODS.md). Its pure maths (the off-policy ratio, the loss, the entropy-change
weight) are in utils/train/losses.py; its rows are marked in the RL batch (utils/train/batch.py
`RlBatch.offline`, `.accuracy`); its config check is utils/core/loader.py `check_minibatches`.

- `ExpertTraces`, the step variant: a question with an expert trace (03's) has it in place of its
  group's last rollout, scored like one, and the next step's entropies are kept in the trainer's
  checkpointed state (`TrainState.piece_state`).
- `expert_loss`: the loss of a micro-batch with expert rows, their advantages scaled by the
  entropy-change weight; `paper_entropies`: the whole batch's expert and rollout entropies, which
  every micro-batch's weight needs (a no-grad pass, summed over ranks).
"""
from __future__ import annotations

import torch

from utils.reward.scorers import is_correct
from utils.reward.spec import score_answer
from utils.train.batch import RlBatch, cut_rows, micro_batches, offline_rows
from utils.train.losses import Agg, aggregate, red_paper_entropy_weight, red_paper_loss
from utils.train.policy import forward_logprobs
from utils.train.variants import StepData, StepVariant
from utils.train.world import World


def _paper_weight(h_sft: float, h_rl: float, batch: RlBatch, alg, piece_state: dict) -> tuple[torch.Tensor, dict]:
    """red_paper's advantages [S], the expert rows' scaled by the entropy-change weight of this step's
    expert and rollout entropies (over the whole batch), and the stats the next step reads."""
    w = red_paper_entropy_weight(h_sft, h_rl, piece_state.get("h_sft"), piece_state.get("h_rl"),
                                 alg.red_paper.entropy_weight_max)
    return torch.where(batch.offline, batch.adv * w, batch.adv), {"entropy_weight": w, "h_sft": h_sft, "h_rl": h_rl}


def expert_loss(part: RlBatch, logp, old_lp, ent, h_rl: float, norms, agg, alg, paper, piece_state: dict,
                tally) -> tuple[torch.Tensor, dict, dict]:
    """red_paper's policy loss on a micro-batch `part` that holds expert rows: (loss, its stats, the
    weight of each stat over this piece). The expert rows' advantages are scaled by the entropy-change
    weight of the whole batch's expert and rollout entropies (`paper`, from `paper_entropies`; None:
    this piece's own, its expert tokens' and `h_rl`, when it is the whole batch), against `piece_state`,
    the previous step's; that weight and the entropies go to `tally.shared` for the next step
    (`ExpertTraces.after_update`)."""
    off = offline_rows(part)
    rollout_mask = part.mask * (1 - off)
    if paper is None:
        with torch.no_grad():
            paper = aggregate(Agg("token-mean", total=norms.expert), ent, part.mask * off).item(), h_rl
    adv, paper_stats = _paper_weight(*paper, part, alg, piece_state)
    tally.shared.update({f"red_paper/{k}": v for k, v in paper_stats.items()})
    rl = alg.rl
    pg, stats = red_paper_loss(logp, old_lp, adv, part.mask, part.offline, part.accuracy, rl.clip_low, rl.clip_high,
                               agg, alg.red_paper.policy_shift)
    weights = {"clip_frac": rollout_mask.sum(), "ratio_mean": rollout_mask.sum(),
               "offline_ratio_mean": (part.mask * off).sum()}
    return pg, stats, weights


def paper_entropies(model, batch: RlBatch | None, norms, memory, world: World) -> tuple[float, float]:
    """red_paper's (expert, rollout) token-mean entropies over the whole batch and every rank, from a
    no-grad pass, for a batch in several micro-batches: every piece's expert advantages need them.
    A rank with no RL rows adds nothing (but takes part)."""
    sums = torch.zeros(2, device=norms.expert.device)
    rows_of = micro_batches(batch.attn.sum(1).tolist(), memory.micro_batch_tokens) if batch is not None else []
    off = offline_rows(batch) if batch is not None else None
    with torch.no_grad():
        for rows in rows_of:
            ids, attn, mask, o = cut_rows(rows, batch.ids, batch.attn, batch.mask, off.expand_as(batch.mask))
            _, ent = forward_logprobs(model, ids, attn, with_entropy=True, need=mask > 0,
                                      chunk_mib=memory.logits_chunk_mib)
            sums += torch.stack([(ent * mask * o).sum(), (ent * mask * (1 - o)).sum()])
    sums = world.sum(sums)
    return (sums[0] / norms.expert).item(), (sums[1] / norms.rollout).item()


class ExpertPiece:
    """red_paper's policy loss as the update's piece loss (utils/train/method_variants.py `piece_loss`):
    `prepare` takes the whole batch's entropies first when the batch is cut in pieces or ranks."""

    def __init__(self, alg):
        self.alg, self.paper = alg, None

    def prepare(self, model, batch, norms, memory, world, pieces: int) -> None:
        if pieces > 1 or world.size > 1:
            self.paper = paper_entropies(model, batch, norms, memory, world)

    def loss(self, part: RlBatch, logp, old_lp, ent, h_rl: float, norms, agg, piece_state: dict, tally):
        pg, stats, weights = expert_loss(part, logp, old_lp, ent, h_rl, norms, agg, self.alg, self.paper,
                                         piece_state, tally)
        named = lambda d: {f"red_paper/{k}" if k == "offline_ratio_mean" else k: v for k, v in d.items()}
        return pg, named(stats), named(weights)


class ExpertTraces(StepVariant):
    """red_paper: a question with an expert trace (03's, `samples`: question id -> OfflineSample) has
    it in place of its group's last rollout, scored like a rollout (format 1: gold traces are
    well-formed by construction, tests/test_red_paper.py) and trained through the policy loss
    (utils/train/losses.py `red_paper_loss`, through `expert_loss` below), which needs the previous step's entropies."""

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
            state.piece_state = {"h_sft": stats["red_paper/h_sft"], "h_rl": stats["red_paper/h_rl"]}

    def metrics(self, step: StepData, world) -> dict:
        accuracy = world.concat([a for _, _, a in step.notes["experts"]])
        if not accuracy:
            return {}
        return {"red_paper/offline_groups": len(accuracy), "red_paper/group_accuracy": sum(accuracy) / len(accuracy)}
