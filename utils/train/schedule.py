"""Learning-rate schedules shared by the tiny-arith pretraining, the SFT warmup and the RL stage."""
from __future__ import annotations

import math


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, final: float, decay_start: int = 0) -> float:
    """LR factor: linear warmup to 1, flat until `decay_start` (0 = no flat stretch), then cosine decay
    to `final` at `total_steps` (final 1 = constant)."""
    if step < warmup_steps:
        return (step + 1) / max(warmup_steps, 1)
    start = max(warmup_steps, decay_start)
    if step < start:
        return 1.0
    progress = (step - start) / max(total_steps - start, 1)
    return final + (1 - final) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
