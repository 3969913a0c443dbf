"""Learning-rate schedules shared by the tiny-arith pretraining and the SFT warmup."""
from __future__ import annotations

import math


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, final: float) -> float:
    """LR factor: linear warmup to 1, then cosine decay to `final` at `total_steps` (1 = constant)."""
    if step < warmup_steps:
        return (step + 1) / max(warmup_steps, 1)
    progress = (step - warmup_steps) / max(total_steps - warmup_steps, 1)
    return final + (1 - final) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
