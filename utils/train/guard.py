"""The optimizer step both training loops share, guarded against non-finite values, the rule that
stops a run after too many skipped steps in a row (docs/ARCHITECTURE.md, "Training"), and when a
loop writes its resumable checkpoint (`SaveClock`)."""
from __future__ import annotations

import time

import torch

from utils.core.errors import StageError
from utils.train.world import SOLO, World


def finish_step(opt, model, loss: torch.Tensor, max_grad_norm: float, world: World = SOLO) -> tuple[int, float]:
    """After a batch's micro-batch backwards have filled the gradients (utils/train/update.py): (0, grad
    norm) once they are summed over ranks, clipped and stepped. `loss` is this rank's share of the
    batch's loss, detached: a non-finite sum over ranks (so every rank skips together), or a
    non-finite gradient, discards the gradients and leaves the weights and the optimizer untouched:
    (1, nan) or (1, the non-finite norm)."""
    if not torch.isfinite(world.sum(loss.detach().clone())):
        opt.zero_grad(set_to_none=True)
        return 1, float("nan")
    params = [p for p in model.parameters() if p.requires_grad]
    world.sum_grads(params)  # a rank without a gradient (nothing to train this step) adds zeros
    grad = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    if not torch.isfinite(grad):
        opt.zero_grad(set_to_none=True)
        return 1, float(grad)
    opt.step()
    return 0, float(grad)


class SkipStreak:
    """Counts skipped steps in a row; `limit` of them (0 = never) stop the run naming the steps,
    e.g. "steps 2-4: 3 optimizer steps in a row skipped for a non-finite reward, loss or gradient"."""

    def __init__(self, limit: int, what: str, causes: str, knob: str):
        self.limit, self.what, self.causes, self.knob, self.run = limit, what, causes, knob, 0

    def update(self, skipped: int, step: int) -> None:
        self.run = self.run + 1 if skipped else 0
        if self.run and self.run == self.limit:
            raise StageError(f"steps {step - self.run + 1}-{step}: {self.run} {self.what} in a row skipped for a "
                             f"non-finite {self.causes}; stopping ({self.knob}). The last good checkpoint is kept.")


class SaveClock:
    """When a trainer writes its resumable checkpoint: every N steps (`warmup.save_every`,
    `algorithm.rl.save_freq`), at the last step, when it stops early, and at least every
    `save_minutes` minutes of training (`warmup.save_minutes`, `algorithm.rl.save_minutes`), so that a
    pre-empted machine loses at most that much whatever a step costs (8-75 s on a real model on a CPU,
    so 10 steps were up to 12 minutes). A checkpoint written for the time is the one written for a
    step (same files, same atomic publish, same exact resume); only which steps get one changes, which
    is why the minutes stay out of a stage's hashed config (utils/core/stages.py `UNHASHED`).

    With several ranks every rank must save at the same step (the save gathers their generator states),
    so the ranks' clocks are pooled: one is late, all save."""

    def __init__(self, every: int, last: int, minutes: float, world=None):
        self.every, self.last, self.seconds, self.world = every, last, minutes * 60.0, world
        self.since = time.monotonic()

    def due(self, step: int, stopped: bool = False) -> bool:
        """Whether `step` (just finished) gets a checkpoint; the clock restarts when it does."""
        late = bool(self.seconds) and time.monotonic() - self.since >= self.seconds
        if self.seconds and self.world is not None and self.world.size > 1:
            late = any(self.world.gather(late))
        if late or stopped or step % self.every == 0 or step == self.last:
            self.since = time.monotonic()
            return True
        return False
