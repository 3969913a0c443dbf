"""The RED-GRPO training loop: each step rolls out (utils/train/sampler.py), scores and takes group
advantages, builds the batch (utils/train/batch.py), updates (utils/train/update.py), folds the RED
state, hands the new adapter to the engine; around the steps, logging, checkpoints, resume and guards.

Checkpoints (`ckpt/step_N/`, every `save_freq` steps or `save_minutes`, last `keep_last` kept) are assembled under a
temporary name and renamed, and hold everything a resume restores: the adapter, the optimizer,
torch/python RNG states, the RED state, the question and SFT data cursors and the step (the RL
learning rate is a function of the step alone: constant, or a linear warmup over
`rl.lr_warmup_steps`). Rollout randomness derives from (seed, step,
index), so a resumed run on CPU reproduces an uninterrupted one. A non-finite reward, loss or
gradient skips the optimizer step (logged as `train/skipped_nonfinite`) and never reaches a
checkpoint; `rl.max_skips_in_a_row` skips in a row stop the run with an error naming the steps.

Under data parallelism (utils/train/world.py) each rank rolls out its contiguous block of the step's
questions on its own engine, so a question's samples (its GRPO group) never straddle ranks and each
episode is seeded as in one process. Every normaliser of the loss is counted over all ranks' sequences
before the update (utils/train/update.py `batch_norms`), each rank's loss is its share of the whole
batch's and the gradients are summed over ranks, so the step is the one-process step whatever each
rank holds; batch accuracy (RED's w_acc), the logged metrics and the entropies RED's state follows
are the whole step's, so every rank keeps the same state. The update runs in micro-batches of
`model.memory.micro_batch_tokens` (utils/train/update.py).
Rank 0 alone writes logs, episodes and checkpoints (with every rank's RNG state).
"""
from __future__ import annotations

import math
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from utils.agent.episode import dump_episodes
from utils.agent.rollout import Rollout
from utils.core.checkpoint import is_checkpoint, resume_latest, save_checkpoint, save_weights
from utils.core.errors import StageError
from utils.core.stream import rl_question_key, take
from utils.reward.scorers import is_correct
from utils.train.batch import build_rl_batch, minibatch_rows, sft_parts, take_rows
from utils.train.guard import SaveClock, SkipStreak, finish_step
from utils.train.method_variants import active_variants
from utils.train.policy import (batch_logprobs, dropout_active, policy_device, reference_logprobs, sft_backward,
                                sft_batch)
from utils.train.questions import rl_strata
from utils.train.red import RedState, red_update
from utils.train.sampler import (DynamicSampler, SampledBatch, batch_accuracy, group_advantages,
                                 zero_variance_fraction)
from utils.train.schedule import warmup_cosine
from utils.train.state import TrainState
from utils.train.update import Tally, red_grpo_loss
from utils.train.variants import StepData
from utils.train.world import SOLO, World


class GrpoTrainer:
    def __init__(self, cfg, model, engine, rollout: Rollout, spec, rows: list[dict], sft_examples: list,
                 pad_id: int, out_dir: Path, logger, config_sha: str, offline: dict | None = None,
                 world: World = SOLO):
        self.cfg, self.alg, self.model, self.engine, self.rollout = cfg, cfg.algorithm, model, engine, rollout
        self.spec, self.rows, self.sft_examples, self.pad_id = spec, rows, sft_examples, pad_id
        self.strata = rl_strata(rows, out_dir) if cfg.algorithm.rl.stratify else None  # gold lengths, mixed evenly
        self.offline = offline or {}  # demonstrations: question id -> OfflineSample (utils/agent/traces.py)
        self.prm = None  # reward.process.source judge: a JudgePRM (utils/reward/process.py), set by build_trainer
        self.out, self.logger, self.config_sha, self.world = out_dir, logger, config_sha, world
        self.device = policy_device(model)
        params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=self.alg.rl.lr, weight_decay=self.alg.rl.weight_decay)
        self.state = TrainState()
        for variant in self.variants():  # each refuses the ranks it cannot run on
            variant.check(world)
        if self.alg.rl.dynamic_sampling and world.size > 1:
            raise StageError(f"algorithm.rl.dynamic_sampling={self.alg.rl.dynamic_sampling} needs one rank (this "
                             f"run has {world.size}): its refill rounds draw questions from a stream the ranks "
                             f"would have to share; set algorithm.rl.dynamic_sampling=0")
        self.last_rollout: SampledBatch | None = None
        self.ckpt_dir = out_dir / "ckpt"
        self.policy_dir = out_dir / ("policy" if world.main else f"policy_rank{world.rank}")  # one per engine

    def variants(self) -> list:
        """The step's active variants (utils/train/variants.py), from the config (utils/train/method_variants.py), the
        demonstrations (`offline`) and the judge (`prm`) as they are now."""
        return active_variants(self.alg, self.spec, self.offline, self.prm, self.state)

    # ------------------------------------------------------------ checkpoints
    def save(self) -> Path:
        final = self.ckpt_dir / f"step_{self.state.step}"
        rngs = self.world.gather(torch.get_rng_state())  # every rank takes part; rank 0 writes
        if self.world.main:
            save_checkpoint(final, self.model, self.opt, None, asdict(self.state), self.config_sha, rngs)
            for old in self.checkpoints()[:-self.alg.rl.keep_last]:
                shutil.rmtree(old)
        return final

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.ckpt_dir.is_dir():
            return []
        found = [p for p in self.ckpt_dir.glob("step_*") if is_checkpoint(p)]
        return sorted(found, key=lambda p: int(p.name.split("_")[1]))

    def try_resume(self) -> bool:
        """Restore the newest checkpoint of this config. Rank 0 decides first (it clears what another
        config left); the other ranks then read what it kept."""
        if not self.world.main:
            self.world.barrier()
        state = resume_latest(self.checkpoints(), self.config_sha, self.model, self.opt, None, self.logger,
                              stale=self.ckpt_dir, rank=self.world.rank)
        if self.world.main:
            self.world.barrier()
        if state is not None:
            self.state = TrainState.from_json(state)
        return state is not None

    def next_questions(self, k: int) -> list[dict]:
        """The RL question stream's next k rows (every rank's share; utils/core/stream.py)."""
        return take(self.rows, k, rl_question_key(self.cfg.seed), self.state.questions, strata=self.strata)

    def _sft_examples(self) -> list:
        """The next SFT batch (this rank's shard of it)."""
        batch = take(self.sft_examples, self.alg.sft.batch_size, f"{self.cfg.seed}/s", self.state.sft)
        return self.world.shard(batch, length=lambda e: len(e.ids))

    def sync_policy(self) -> float:
        """Give the current adapter to the engine; returns seconds."""
        t0 = time.time()
        target = self.policy_dir / f"step_{self.state.step}"
        save_weights(self.model, target)
        self.engine.set_adapter(target)
        for old in self.policy_dir.glob("step_*"):
            if old != target:
                shutil.rmtree(old, ignore_errors=True)
        return time.time() - t0

    # ------------------------------------------------------------ one step
    def _set_lr(self) -> float:
        """The coming step's learning rate: rl.lr, ramped linearly over the first rl.lr_warmup_steps
        steps (step s of N trains at lr · s / N), then constant, or from rl.lr_decay_start down a
        cosine to rl.final_lr_ratio · lr at the last step (the warmup's schedule)."""
        rl = self.alg.rl
        lr = rl.lr * warmup_cosine(self.state.step, rl.lr_warmup_steps, rl.steps, rl.final_lr_ratio, rl.lr_decay_start)
        for group in self.opt.param_groups:
            group["lr"] = lr
        return lr

    def _finish(self, loss: torch.Tensor) -> tuple[int, float]:
        """One finiteness decision, clip and step after the batch's backwards (`loss`: this rank's share)."""
        return finish_step(self.opt, self.model, loss, self.alg.rl.max_grad_norm, self.world)

    def sft_only_step(self) -> dict:
        """Method `sft`: the same optimizer on α·L_SFT alone, no rollouts (the no-RL ablation); the token
        mean is over every rank's shard."""
        t0 = time.time()
        shard = self._sft_examples()
        batch = sft_batch(shard, self.pad_id, self.device) if shard else None
        local = batch[2].sum() if batch is not None else torch.zeros((), device=self.device)
        trained = self.world.sum(local.clone())
        total = trained.clamp(min=1)
        self.opt.zero_grad(set_to_none=True)
        tally = Tally()
        loss = torch.zeros((), device=self.device)
        if batch is not None:  # a rank with fewer examples than ranks joins the step with nothing
            coef = self.alg.sft.loss_coef
            loss, h_sft = sft_backward(self.model, batch, total, self.cfg.model.memory, coef, with_entropy=True)
            tally.add("actor/sft_loss", loss.item() / max(coef, 1e-12))
            tally.add("actor/sft_entropy", h_sft.item())
        skipped, _ = self._finish(loss)
        stats = {k: round(v, 6) for k, v in tally.result(self.world).items()}
        self.state.step += 1
        timings = {"time/update": time.time() - t0, "time/weight_sync": self.sync_policy()}
        return {"step": self.state.step, **stats, "train/skipped_nonfinite": skipped, "train/optimizer_steps": 1 - skipped,
                "train/tokens_sft": 0.0 if skipped else trained.item(), **timings}

    def _fixed_logprobs(self, batch) -> tuple:
        """(old, reference) log-probs of the batch: the policy the sampler served and, when the KL term
        is on, the frozen reference; in eval mode, so dropout does not perturb them.

        Before the first optimizer pass the policy being updated is the one that sampled, so the old
        log-probs are the first pass's own, detached (update.red_grpo_loss; `_update` keeps them for
        the later passes): None here, and no separate forward. They are computed here when that does
        not hold: with minibatches (`ppo_minibatches` > 1) every part after the first is trained on a
        policy that has already moved, and a model with dropout on, whose train-mode forward is not
        its eval-mode one, needs them once it takes several passes."""
        rl = self.alg.rl
        need_old = rl.ppo_minibatches > 1 or (rl.ppo_epochs > 1 and dropout_active(self.model))
        need_ref = rl.kl_coef > 0
        if batch is None or not (need_old or need_ref):
            return None, None
        self.model.eval()
        old_lp = ref_lp = None
        memory, need = self.cfg.model.memory, batch.mask > 0
        if need_old:
            old_lp = batch_logprobs(self.model, batch.ids, batch.attn, need, rl.temperature, memory)
        if need_ref:
            ref_lp = reference_logprobs(self.model, batch.ids, batch.attn, rl.temperature, need, memory)
        self.model.train()
        return old_lp, ref_lp

    def _update(self, batch, old_lp, accuracy: float, ref_lp=None, chosen_sft: list | None = None) -> tuple[dict, int]:
        """The optimizer step(s) on L_GRPO − β·H + w·α·L_SFT, then the RED state update: (stats, skipped).
        `chosen_sft`: this rank's SFT examples where a variant chose them, else the SFT stream's."""
        sft = None
        if self.alg.sft.enabled and (self.sft_examples or chosen_sft is not None):
            shard = self._sft_examples() if chosen_sft is None else chosen_sft
            sft = sft_batch(shard, self.pad_id, self.device) if shard else None
        stats, skipped = {}, 0
        red = RedState(**self.state.red)
        anyone = batch is not None or sft is not None
        if self.world.size > 1:  # a step trains if any rank has sequences to train on
            anyone = self.world.sum(torch.tensor([float(anyone)])).item() > 0
        parts = self.alg.rl.ppo_minibatches
        rows = minibatch_rows(batch, parts) if batch is not None and parts > 1 else None
        sfts = sft_parts(sft, parts)
        trained = [0, 0.0, 0.0]  # optimizer steps taken, RL and SFT tokens they trained
        for _ in range(self.alg.rl.ppo_epochs):
            if not anyone:
                break
            done = []  # this pass's stats, one dict per optimizer step
            for k in range(parts):
                self.opt.zero_grad(set_to_none=True)
                if batch is None or (rows is not None and not len(rows[k])):  # no RL rows: its SFT rows, if any
                    part = (None, None, None)
                else:
                    part = (batch, old_lp, ref_lp) if rows is None else take_rows(batch, rows[k], old_lp, ref_lp)
                terms = red_grpo_loss(self.model, *part[:2], sfts[k], self.alg, red, accuracy, part[2],
                                      self.state.piece_state, self.world, self.cfg.model.memory, self.state.step)
                if old_lp is None and terms.logp is not None:
                    old_lp = terms.logp
                step_stats = terms.stats
                skipped, grad = self._finish(terms.loss)
                if not skipped:
                    step_stats["actor/grad_norm"] = grad
                    trained = [a + b for a, b in zip(trained, (1, step_stats["train/tokens_rl"],
                                                               step_stats["train/tokens_sft"]))]
                done.append(step_stats)
                if skipped:
                    break
            stats = done[0] if len(done) == 1 else _mean_stats(done)  # each the whole batch's, every rank's
            if skipped:
                break
        stats.update(zip(COUNTS, trained))
        if "actor/sft_entropy" in stats and "actor/rl_entropy" in stats and not skipped:  # some rank trained SFT
            # rows and some RL rows (a variant can switch every question to its demonstration): every rank folds
            red = red_update(red, stats["actor/sft_entropy"], stats["actor/rl_entropy"],
                             self.alg.red.sft_entropy_ema_decay, self.alg.red.rl_entropy_ema_decay)
        self.state.red = asdict(red)
        return stats, skipped

    def step(self) -> dict:
        rl, timings = self.alg.rl, {}
        lr = self._set_lr()
        if not rl.enabled:
            return self.sft_only_step()
        t0 = time.time()
        first, rows = self.world.block(self.next_questions(rl.questions_per_step))
        self.rollout.spec = replace(self.rollout.spec, logprobs=self.asks_sampler())
        variants = self.variants()
        sampled = self.sampler().sample(rows, self.state.step, first * rl.n_samples, variants)
        rows, episodes, scored = sampled.rows, sampled.episodes, sampled.scored
        self.last_rollout = sampled  # what benchmarks/step_profile.py replays
        timings["time/rollout"] = time.time() - t0
        t0 = time.time()
        rewards = [s["reward"] for s in scored]
        everyone = self.world.concat(scored)  # the whole step's episodes, every rank's
        accuracy = batch_accuracy(everyone) if sampled.accuracy is None else sampled.accuracy
        data = StepData(rows, episodes, scored, list(rewards))
        for v in variants:
            v.regroup(data)
        adv = group_advantages(data.rewards, rl.n_samples, rl.adv_scaling)
        if not all(math.isfinite(r) for r in data.rewards):
            adv = adv * float("nan")  # a broken reward poisons the loss: the step is skipped, never guessed
        timings["time/scoring"] = time.time() - t0
        t0 = time.time()
        for v in variants:
            v.extend(data, adv)
        kept = [i for i in range(len(episodes)) if i not in data.replaced]
        batch = build_rl_batch([episodes[i] for i in kept], adv[kept], self.pad_id, rl.train_roles, data.extra,
                               [data.bonus[i] for i in kept] if data.bonus is not None else None,
                               [is_correct(scored[i]["answer"]) for i in kept])
        batch = batch.to(self.device) if batch is not None else None
        old_lp, ref_lp = self._fixed_logprobs(batch)
        timings["time/logprobs"] = time.time() - t0
        t0 = time.time()
        stats, skipped = self._update(batch, old_lp, accuracy, ref_lp, data.sft)
        for v in variants:  # a variant's own optimizer step after the update: its counts add to the update's
            extra = v.extra_step(self, data)
            stats.update({**extra, **{k: stats[k] + extra[k] for k in COUNTS if k in extra}})
        for v in variants:
            v.after_update(stats, skipped, self.state)
            stats.update(v.metrics(data, self.world))
        mismatch = stats.pop("rollout/logprob_mismatch", None)
        timings["time/update"] = time.time() - t0
        self.state.step += 1
        timings["time/weight_sync"] = self.sync_policy()
        if rl.dump_freq and self.state.step % rl.dump_freq == 0:
            dumped = self.world.concat(episodes)
            if self.world.main:
                dump_episodes(dumped, self.out / "episodes" / f"step_{self.state.step}.jsonl")
        return _step_metrics(self.state.step, everyone, [s["reward"] for s in everyone], accuracy, rl.n_samples,
                             skipped, None if mismatch is None else float(mismatch),
                             {**stats, **sampled.metrics, **timings, **({"actor/lr": lr} if rl.lr_warmup_steps or rl.final_lr_ratio != 1 else {})})

    def asks_sampler(self) -> bool:
        """Whether this step's rollouts carry the sampler's log-probs: TIS weighs every step's tokens
        with them; otherwise only the mismatch check reads them, on every `mismatch_every`-th step
        from the first. Which tokens are sampled does not depend on it."""
        rl = self.alg.rl
        return rl.tis_cap > 0 or (rl.mismatch_every > 0 and self.state.step % rl.mismatch_every == 0)

    def sampler(self) -> DynamicSampler:
        """This step's sampler (utils/train/sampler.py): the rollout, the reward spec and the RL question
        stream as they are now."""
        return DynamicSampler(self.rollout, self.spec, self.next_questions, self.alg.rl, self.cfg.seed)

    def close(self) -> None:
        """Shut the sampling engine and, with a judge PRM, the judge's."""
        self.engine.close()
        for v in self.variants():
            v.close()

    def train(self, progress=None) -> list[dict]:
        history = []
        streak = SkipStreak(self.alg.rl.max_skips_in_a_row, "optimizer steps", "reward, loss or gradient",
                            "algorithm.rl.max_skips_in_a_row")
        if self.state.step == 0:
            torch.manual_seed(self.cfg.seed + self.world.rank)  # dropout masks differ between ranks
        self.sync_policy()
        saves = SaveClock(self.alg.rl.save_freq, self.alg.rl.steps, self.alg.rl.save_minutes, self.world)
        while self.state.step < self.alg.rl.steps:
            self.model.train()
            metrics = self.step()
            self.logger.log(metrics)
            history.append(metrics)
            streak.update(metrics["train/skipped_nonfinite"], self.state.step)
            if progress is not None:
                progress.update(1)
                progress.set_postfix({k.split("/")[-1]: f"{metrics[k]:.3f}" for k in
                                      ("critic/rewards/mean", "train/accuracy", "actor/sft_loss") if k in metrics})
            if saves.due(self.state.step):
                self.save()
        self.model.eval()
        return history


COUNTS = ("train/optimizer_steps", "train/tokens_rl", "train/tokens_sft")  # a step's sums (08's compute table)


def _mean_stats(steps: list[dict]) -> dict:
    """Each key's mean over the optimizer steps of one pass that logged it."""
    keys = dict.fromkeys(k for d in steps for k in d)
    return {k: sum(d[k] for d in steps if k in d) / sum(k in d for d in steps) for k in keys}


def _step_metrics(step: int, scored: list[dict], rewards: list[float], accuracy: float, group: int, skipped: int,
                  mismatch: float | None, extra: dict) -> dict:
    """One step's metrics line, rounded to 6 significant digits (not decimals: the sampler/trainer
    mismatch is ~1e-7 when on-policy); no mismatch on a step that did not ask the sampler."""
    n = len(scored)
    metrics = {
        "step": step, "critic/rewards/mean": sum(rewards) / n,
        "train/accuracy": accuracy, "answer_f1/mean": sum(s["answer"] for s in scored) / n,
        "format_scores/mean": sum(s["format"] for s in scored) / n,
        "train/zero_variance_groups": zero_variance_fraction(rewards, group),
        "train/skipped_nonfinite": skipped, **({"rollout/logprob_mismatch": mismatch} if mismatch is not None else {}),
        "rollout/turns_per_episode": sum(s["turns"] for s in scored) / n,
        "rollout/tokens_planner": sum(s["tokens_planner"] for s in scored) / n,
        "rollout/tokens_executor": sum(s["tokens_executor"] for s in scored) / n,
        "rollout/answered": sum(s["status"] == "answered" for s in scored) / n,
        **extra,
    }
    return {k: (float(f"{v:.6g}") if isinstance(v, float) and math.isfinite(v) else v) for k, v in metrics.items()}
