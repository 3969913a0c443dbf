"""The resumable LoRA SFT loop behind `04_sft_warmup.py`.

State that a resume restores (ckpt_sft/last/, written atomically every `save_every` steps): the
adapter (or full weights), the optimizer, the LR scheduler, python/torch RNG states, the step and
the data cursor (epoch, batch index). The batches of an epoch derive from (seed, epoch), so a
resumed run sees exactly the batches an uninterrupted one would: no step is lost or repeated,
and on CPU its losses match. `logs/train.jsonl` is rewritten up to the resumed step first.
"""
from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from utils.checkpoint import is_checkpoint, load_checkpoint, read_state, save_checkpoint
from utils.tracking import MetricsLogger
from utils.run_config import WarmupConfig
from utils.sft import batches, sft_loss
from utils.traces import Example


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, final: float = 0.1) -> float:
    """LR factor: linear warmup to 1, then cosine decay to `final` at `total_steps` (1 = constant)."""
    if step < warmup_steps:
        return (step + 1) / max(warmup_steps, 1)
    progress = (step - warmup_steps) / max(total_steps - warmup_steps, 1)
    return final + (1 - final) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def lr_lambda(cfg: WarmupConfig) -> Callable[[int], float]:
    return lambda step: warmup_cosine(step, cfg.warmup_steps, cfg.steps, cfg.final_lr_ratio)


@dataclass
class LoopState:
    step: int = 0
    epoch: int = 0
    cursor: int = 0
    best_metric: float | None = None
    best_step: int | None = None
    history: list = field(default_factory=list)  # validation results


def save_weights(model, out_dir: Path) -> None:
    """An adapter (peft) or full-model directory, assembled aside and renamed into place."""
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)


class SftLoop:
    def __init__(self, model, examples: list[Example], cfg: WarmupConfig, seed: int, pad_id: int, out_dir: Path,
                 validate: Callable[[Path, int], dict] | None, config_sha: str):
        import torch

        self.torch, self.model, self.examples, self.cfg = torch, model, examples, cfg
        self.seed, self.pad_id, self.out, self.validate, self.config_sha = seed, pad_id, out_dir, validate, config_sha
        params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(cfg))
        self.state = LoopState()
        self.ckpt = out_dir / "ckpt_sft"
        self.logger = MetricsLogger(out_dir / "logs" / "train.jsonl")

    # ------------------------------------------------------------ checkpoints
    def save_last(self) -> None:
        save_checkpoint(self.ckpt / "last", self.model, self.opt, self.sched, dict(self.state.__dict__),
                        self.config_sha)

    def try_resume(self) -> bool:
        """Restore ckpt_sft/last if it belongs to this config; returns whether it resumed."""
        last = self.ckpt / "last"
        if not is_checkpoint(last) or read_state(last)[1] != self.config_sha:
            # a fresh start: drop what an earlier run (killed, or with another config) left behind
            shutil.rmtree(last, ignore_errors=True)
            self.logger.truncate(0)
            return False
        self.state = LoopState(**load_checkpoint(last, self.model, self.opt, self.sched))
        self.logger.truncate(self.state.step)
        return True

    # ------------------------------------------------------------ loop
    def _next_batch(self) -> list[Example]:
        epoch_batches = batches(self.examples, self.cfg.batch_size, self.seed, self.state.epoch)
        if self.state.cursor >= len(epoch_batches):
            self.state.epoch, self.state.cursor = self.state.epoch + 1, 0
            epoch_batches = batches(self.examples, self.cfg.batch_size, self.seed, self.state.epoch)
        batch = epoch_batches[self.state.cursor]
        self.state.cursor += 1
        return batch

    def _evaluate(self) -> None:
        if self.validate is None:
            return
        result = self.validate(self.ckpt / "eval_current", self.state.step)
        self.state.history.append({"step": self.state.step, **result})
        metric = result["accuracy"]
        if self.state.best_metric is None or metric > self.state.best_metric:
            self.state.best_metric, self.state.best_step = metric, self.state.step
            save_weights(self.model, self.ckpt / "best")

    def run(self, progress=None) -> LoopState:
        torch = self.torch
        if self.state.step == 0:
            torch.manual_seed(self.seed)
        self.model.train()
        while self.state.step < self.cfg.steps:
            loss = sft_loss(self.model, self._next_batch(), self.pad_id)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            grad = torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad], 1.0)
            self.opt.step()
            self.sched.step()
            self.state.step += 1
            self.logger.log({"step": self.state.step, "loss": round(loss.item(), 6),
                             "grad_norm": round(float(grad), 6), "lr": self.sched.get_last_lr()[0],
                             "epoch": self.state.epoch})
            if progress is not None:
                progress.update(1)
                progress.set_postfix(loss=f"{loss.item():.4f}")
            s = self.state.step
            if (self.cfg.eval_every and s % self.cfg.eval_every == 0) or s == self.cfg.steps:
                self.model.eval()
                self._evaluate()
                self.model.train()
            if s % self.cfg.save_every == 0 or s == self.cfg.steps:
                self.save_last()
        self.model.eval()
        save_weights(self.model, self.ckpt / "final")
        if not (self.ckpt / "best").exists():
            save_weights(self.model, self.ckpt / "best")
        return self.state
