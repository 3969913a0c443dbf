"""The SFT step's compute floor and the timing of the step against it, for
benchmarks/sft_step_profile.py (whose docstring says what each figure means): the floor is the LoRA
model with its adapter merged and every weight frozen but the input embedding, so its backward
computes the same activation gradients without the rank-r products."""
from __future__ import annotations

import copy
import time

from utils.train.policy import sft_loss
from utils.train.sft_trainer import SftLoop


def merged_floor(model):
    """A copy of the LoRA `model` with the adapter merged into its weights and every parameter frozen
    but the input embedding (so a backward still runs through every layer): the floor's model."""
    floor = copy.deepcopy(model).merge_and_unload()
    for p in floor.parameters():
        p.requires_grad_(False)
    floor.get_input_embeddings().weight.requires_grad_(True)
    floor.train()
    return floor


def fwd_bwd(model, batch, pad_id: int) -> float:
    """Seconds of the batch's SFT loss and its backward; the gradients are dropped after."""
    t0 = time.perf_counter()
    sft_loss(model, batch, pad_id).backward()
    dt = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    return dt


def record_batches(loop: SftLoop, steps: int) -> list:
    """The loop's next `steps` batches, in the order its steps would take them."""
    state = copy.deepcopy(loop.state)
    batches = [loop._next_batch() for _ in range(steps)]
    loop.state = state
    return batches


def profile(loop: SftLoop, stock, other, floor, batches: list, rounds: int, pad_id: int) -> dict[str, list[float]]:
    """Per-batch seconds of the real step, the LoRA fwd+bwd (the config's forward, peft's, the other
    one) and the merged floor's, alternating."""
    times = {"step": [], "lora fwd+bwd": [], "peft fwd+bwd": [], "folded fwd+bwd": [], "merged fwd+bwd": []}
    queue = iter(b for _ in range(rounds) for b in batches)
    loop._next_batch = lambda: next(queue)  # the real step takes the recorded batches, in order
    for _ in range(rounds):
        for batch in batches:
            t0 = time.perf_counter()
            loop._update()
            loop.sched.step()
            times["step"].append(time.perf_counter() - t0)
            times["lora fwd+bwd"].append(fwd_bwd(loop.model, batch, pad_id))
            times["peft fwd+bwd"].append(fwd_bwd(stock, batch, pad_id))
            times["folded fwd+bwd"].append(fwd_bwd(other, batch, pad_id))
            times["merged fwd+bwd"].append(fwd_bwd(floor, batch, pad_id))
    return times
