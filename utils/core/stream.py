"""The shuffled data streams of the training loops: deterministic, resumable, no hidden state.

Epoch e of a stream visits every item once, in the order `random.Random(f"{key}/{e}")` shuffles
them to; a `Cursor` (epoch, position) says where the stream is, and is what a checkpoint saves, so
a resumed run draws exactly the items an uninterrupted one would.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Hashable, Sequence, TypeVar

T = TypeVar("T")


@dataclass
class Cursor:
    epoch: int = 0
    position: int = 0


def rl_question_key(seed: int) -> str:
    """The stream key of an RL run's questions: the trainer draws each step's questions (and every
    dynamic-sampling refill) from it, and utils/eval/batch_mix.py replays it."""
    return f"{seed}/q"


def epoch_order(n: int, key: str, epoch: int, strata: Sequence[Hashable] | None = None) -> list[int]:
    """Epoch `epoch`'s visiting order of n items. With `strata` (a label per item), each label's items
    keep the order of the plain shuffle and the labels are interleaved in proportion to their sizes:
    the j-th of a label's m items sits at (j + 1/2) / m of the epoch (ties in a fixed per-epoch label
    order), so any run of consecutive items holds each label's share to within about two items."""
    order = list(range(n))
    rng = random.Random(f"{key}/{epoch}")
    rng.shuffle(order)
    if strata is None:
        return order
    groups: dict[Hashable, list[int]] = {}
    for i in order:
        groups.setdefault(strata[i], []).append(i)
    labels = sorted(groups, key=repr)
    rng.shuffle(labels)
    tie = {label: t for t, label in enumerate(labels)}
    placed = sorted(((j + 0.5) / len(g), tie[label], i) for label, g in groups.items() for j, i in enumerate(g))
    return [i for _, _, i in placed]


def take(items: Sequence[T], k: int, key: str, cursor: Cursor, within_epoch: bool = False,
         strata: Sequence[Hashable] | None = None) -> list[T]:
    """The next k items of the stream, advancing `cursor` in place. With `within_epoch`, a draw stops
    at the end of its epoch (the epoch's last batch may be short: SFT epochs); without, it runs on
    into the next epoch (RL question batches are always full). `strata` (one label per item) draws
    the labels in a fixed mix (`epoch_order`)."""
    if not items:
        raise ValueError(f"stream '{key}' has no items")
    if strata is not None and len(strata) != len(items):
        raise ValueError(f"stream '{key}': {len(strata)} strata labels for {len(items)} items")
    out: list[T] = []
    while len(out) < k:
        if cursor.position >= len(items):
            if within_epoch and out:
                break
            cursor.epoch, cursor.position = cursor.epoch + 1, 0
        order = epoch_order(len(items), key, cursor.epoch, strata)
        m = min(k - len(out), len(items) - cursor.position)
        out += [items[i] for i in order[cursor.position:cursor.position + m]]
        cursor.position += m
    return out
