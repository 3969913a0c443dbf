"""The resumable LoRA SFT loop behind `04_sft_warmup.py`.

State that a resume restores (ckpt_sft/last/, written atomically every `save_every` steps or `save_minutes`): the
adapter (or full weights), the optimizer, the LR scheduler, python/torch RNG states, the step and
the data cursor (utils/core/stream.py). The batches of an epoch derive from (seed, epoch), so a
resumed run sees exactly the batches an uninterrupted one would: no step is lost or repeated,
and on CPU its losses match. `logs/train.jsonl` is rewritten up to the resumed step first.
Under data parallelism (utils/train/world.py) every rank takes the same global batch and trains on
its shard; the loss is the shard's summed NLL over the global batch's target-token count, so the
summed gradients are the global batch's token mean. Each shard runs in micro-batches of
`model.memory.micro_batch_tokens`, a backward after each and one optimizer step per batch. Rank 0 alone logs, validates and saves; the
checkpoint holds every rank's RNG state, and every rank resumes from it.
With `patience` P, the loop stops after the P-th validation in a row that did not beat the best
(every rank stops: rank 0's verdict is summed over the ranks); a resumed run that had stopped stays
stopped. The lr schedule is the one for `steps` either way.
A non-finite loss or gradient skips the optimizer update (the step and the schedule still advance,
`skipped_nonfinite` is logged); `max_skips_in_a_row` skips in a row stop the run, naming the steps.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from utils.agent.episode import Example
from utils.core.checkpoint import is_checkpoint, resume_latest, save_checkpoint, save_weights
from utils.core.faults import fault_point
from utils.core.heap import release_freed_memory
from utils.core.schema import MemoryConfig, WarmupConfig
from utils.core.stream import Cursor, take
from utils.core.tracking import MetricsLogger, NullLogger
from utils.train.guard import SaveClock, SkipStreak, finish_step
from utils.train.policy import policy_device, sft_backward, sft_batch
from utils.train.schedule import warmup_cosine
from utils.train.world import SOLO, World


def lr_lambda(cfg: WarmupConfig) -> Callable[[int], float]:
    return lambda step: warmup_cosine(step, cfg.warmup_steps, cfg.steps, cfg.final_lr_ratio, cfg.decay_start)


@dataclass
class LoopState:
    step: int = 0
    data: Cursor = field(default_factory=Cursor)
    best_metric: float | None = None
    best_step: int | None = None
    history: list = field(default_factory=list)  # validation results
    tokens: int = 0  # target tokens trained so far, every step's whole batch (04's manifest `trained_tokens`)

    @classmethod
    def from_json(cls, d: dict) -> "LoopState":
        return cls(**{**d, "data": Cursor(**d["data"])})


class SftLoop:
    def __init__(self, model, examples: list[Example], cfg: WarmupConfig, seed: int, pad_id: int, out_dir: Path,
                 validate: Callable[[Path, int], dict] | None, config_sha: str, world: World = SOLO,
                 memory: MemoryConfig = MemoryConfig()):
        import torch

        self.torch, self.model, self.examples, self.cfg = torch, model, examples, cfg
        self.seed, self.pad_id, self.out, self.validate, self.config_sha = seed, pad_id, out_dir, validate, config_sha
        self.world, self.memory = world, memory
        params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(cfg))
        self.state = LoopState()
        self.ckpt = out_dir / "ckpt_sft"
        self.logger = MetricsLogger(out_dir / "logs" / "train.jsonl") if world.main else NullLogger()

    # ------------------------------------------------------------ checkpoints
    def save_last(self) -> None:
        rngs = self.world.gather(self.torch.get_rng_state())  # every rank takes part
        if self.world.main:
            save_checkpoint(self.ckpt / "last", self.model, self.opt, self.sched, asdict(self.state), self.config_sha,
                            rngs)

    def try_resume(self) -> bool:
        """Restore ckpt_sft/last if it belongs to this config; returns whether it resumed. Rank 0
        decides first (it clears what another config left); the other ranks then read what it kept."""
        last = self.ckpt / "last"
        if not self.world.main:
            self.world.barrier()
        state = resume_latest([last] if is_checkpoint(last) else [], self.config_sha, self.model, self.opt,
                              self.sched, self.logger, stale=last, rank=self.world.rank)
        if self.world.main:
            self.world.barrier()
        if state is not None:
            self.state = LoopState.from_json(state)
        return state is not None

    # ------------------------------------------------------------ loop
    def _next_batch(self) -> list[Example]:
        """The next batch of the epoch's (seed, epoch) shuffle; an epoch's last batch may be short."""
        return take(self.examples, self.cfg.batch_size, str(self.seed), self.state.data, within_epoch=True)

    def _evaluate(self) -> None:
        if self.validate is None:
            return
        release_freed_memory()  # the steps' freed activations, before the engine serves (utils/core/heap.py)
        result = self.validate(self.ckpt / "eval_current", self.state.step)
        self.state.history.append({"step": self.state.step, **result})
        metric = result["accuracy"]
        if self.state.best_metric is None or metric > self.state.best_metric:
            self.state.best_metric, self.state.best_step = metric, self.state.step
            save_weights(self.model, self.ckpt / "best")

    def _patience_spent(self) -> bool:
        """Whether `patience` validations in a row have not beaten the best (rank 0 holds the history;
        with several ranks its verdict is summed, so every rank calls this at the same steps)."""
        if not self.cfg.patience:
            return False
        best, history = self.state.best_step, self.state.history
        spent = best is not None and sum(r["step"] > best for r in history) >= self.cfg.patience
        if self.world.size > 1:
            spent = self.world.sum(self.torch.tensor([float(spent and self.world.main)])).item() > 0
        return spent

    def _update(self) -> tuple[float, float, int, int]:
        """One optimizer step on the next batch: (loss, grad norm, 1 if skipped as non-finite, the batch's
        target tokens). The loss
        is the token-mean NLL over the whole batch's target tokens; with several ranks each trains its
        shard (its summed NLL over that count) and the gradients are summed, in micro-batches of
        `model.memory.micro_batch_tokens` either way (utils/train/update.py)."""
        torch = self.torch
        batch = self._next_batch()
        device = policy_device(self.model)
        targets = sum(sum(e.mask[1:]) for e in batch)
        total = torch.tensor(float(max(targets, 1)), device=device)
        shard = self.world.shard(batch, length=lambda e: len(e.ids))
        self.opt.zero_grad(set_to_none=True)
        loss = torch.zeros((), device=device)
        if shard:  # a rank with fewer examples than ranks joins the step with nothing
            loss, _ = sft_backward(self.model, sft_batch(shard, self.pad_id, device), total, self.memory)
        fault_point("sft_step")  # the kill-anywhere test's cut (utils/core/faults.py)
        whole = self.world.sum(loss.detach().clone()).item() if self.world.size > 1 else loss.item()
        skipped, grad = finish_step(self.opt, self.model, loss, self.cfg.max_grad_norm, self.world)
        return whole, grad, skipped, targets

    def run(self, progress=None) -> LoopState:
        streak = SkipStreak(self.cfg.max_skips_in_a_row, "SFT steps", "loss or gradient", "warmup.max_skips_in_a_row")
        saves = SaveClock(self.cfg.save_every, self.cfg.steps, self.cfg.save_minutes, self.world)
        if self.state.step == 0:
            self.torch.manual_seed(self.seed + self.world.rank)  # dropout masks differ between ranks
        self.model.train()
        stopped = self._patience_spent()
        while self.state.step < self.cfg.steps and not stopped:
            t0 = time.perf_counter()
            loss, grad, skipped, tokens = self._update()
            self.sched.step()
            self.state.step += 1
            self.state.tokens += 0 if skipped else tokens
            self.logger.log({"step": self.state.step, "loss": round(loss, 6), "grad_norm": round(grad, 6),
                             "lr": self.sched.get_last_lr()[0], "epoch": self.state.data.epoch,
                             "skipped_nonfinite": skipped, "tokens": tokens,
                             "time/step": round(time.perf_counter() - t0, 4)})
            streak.update(skipped, self.state.step)
            if progress is not None:
                progress.update(1)
                progress.set_postfix(loss=f"{loss:.4f}")
            s = self.state.step
            validates = (self.cfg.eval_every and s % self.cfg.eval_every == 0) or s == self.cfg.steps
            if self.world.main and validates:
                self.model.eval()
                self._evaluate()
                self.model.train()
            stopped = bool(validates) and self._patience_spent()
            if saves.due(s, stopped):
                self.save_last()
        self.model.eval()
        if self.world.main:
            save_weights(self.model, self.ckpt / "final")
            if not (self.ckpt / "best").exists():
                save_weights(self.model, self.ckpt / "best")
        return self.state
