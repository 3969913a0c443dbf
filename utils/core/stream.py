"""The shuffled data streams of the training loops: deterministic, resumable, no hidden state.

Epoch e of a stream visits every item once, in the order `random.Random(f"{key}/{e}")` shuffles
them to; a `Cursor` (epoch, position) says where the stream is, and is what a checkpoint saves, so
a resumed run draws exactly the items an uninterrupted one would.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence, TypeVar

T = TypeVar("T")


@dataclass
class Cursor:
    epoch: int = 0
    position: int = 0


def rl_question_key(seed: int) -> str:
    """The stream key of an RL run's questions: the trainer draws each step's questions (and every
    dynamic-sampling refill) from it, and benchmarks/batch_mix.py replays it."""
    return f"{seed}/q"


def epoch_order(n: int, key: str, epoch: int) -> list[int]:
    order = list(range(n))
    random.Random(f"{key}/{epoch}").shuffle(order)
    return order


def take(items: Sequence[T], k: int, key: str, cursor: Cursor, within_epoch: bool = False) -> list[T]:
    """The next k items of the stream, advancing `cursor` in place. With `within_epoch`, a draw stops
    at the end of its epoch (the epoch's last batch may be short: SFT epochs); without, it runs on
    into the next epoch (RL question batches are always full)."""
    if not items:
        raise ValueError(f"stream '{key}' has no items")
    out: list[T] = []
    while len(out) < k:
        if cursor.position >= len(items):
            if within_epoch and out:
                break
            cursor.epoch, cursor.position = cursor.epoch + 1, 0
        order = epoch_order(len(items), key, cursor.epoch)
        m = min(k - len(out), len(items) - cursor.position)
        out += [items[i] for i in order[cursor.position:cursor.position + m]]
        cursor.position += m
    return out
