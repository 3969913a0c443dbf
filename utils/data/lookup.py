"""Writes the `synthetic_lookup` dataset: questions whose operands exist only in a generated corpus.

The corpus (`corpus.jsonl`, `{id, title, text}`) lists two facts about each of `CRATES` crates, its
weight `w` and its price `p`: `{"id": "c41:w", "title": "c41", "text": "w=23"}`, which the
executor reads as `c41: w=23`. A question combines one to three looked-up values with at most one
constant, e.g. `c41:w+c23:p-5` ("the weight of crate c41 plus the price of crate c23, minus
5"). The notation is compact on purpose: the tiny base model is pretrained on arithmetic only, so
digits are what it copies reliably (names are a letter and two digits, no longer than the numbers
it was pretrained on), and every character of the notation is one its pretraining
text used (a character it never saw, such as ".", has an untrained output row, and sampling then
scatters probability over all the other unseen characters), and a planner turn must fit its
token budget. The gold
decomposition looks up every value first (a step with a `search` query and the `fact` it needs),
then works the arithmetic left to right:

    c41:w   (search "c41:w", fact c41:w) -> 23
    c23:p   (search "c23:p", fact c23:p) -> 12
    23+12    -> 35
    35-5     -> 30

Every crate has both facts, so a search for one also finds the other (a distractor beside the gold
fact), and every other crate's fact of the same kind competes on the attribute word: retrieval
can fail, most of all when the query names the wrong crate. Knobs: `min_steps` and `max_steps`
bound the subtasks (2 to 6), `operand_max` the facts' values and the constant, `value_max` every
running value (never negative). The splits are disjoint; all share the corpus.
"""
from __future__ import annotations

import random

from utils.data.draw import draw_splits
from utils.core.schema import DataConfig

CRATES = 90  # every name from c10 to c99
ATTRIBUTES = ("w", "p")  # weight, price


def make_corpus(rng: random.Random, value_max: int) -> dict[str, int]:
    """fact id ("c41:w") -> value, for CRATES distinct crate names ("c" and two digits)."""
    names = rng.sample([f"c{n}" for n in range(10, 100)], CRATES)
    return {f"{n}:{a}": rng.randint(1, value_max) for n in names for a in ATTRIBUTES}


def corpus_rows(facts: dict[str, int]) -> list[dict]:
    rows = []
    for fid, value in facts.items():
        name, attr = fid.split(":")
        rows.append({"id": fid, "title": name, "text": f"{attr}={value}"})
    return rows


def _shapes(cfg: DataConfig) -> list[tuple[int, int]]:
    """(lookups, constants) pairs whose subtask count (2·lookups + constants − 1) is within the knobs."""
    lo, hi = max(cfg.min_steps, 2), min(cfg.max_steps, 6)
    return [(n, c) for n in (1, 2, 3) for c in (0, 1) if lo <= 2 * n + c - 1 <= hi]


def make_question(rng: random.Random, facts: dict[str, int], shape: tuple[int, int], cfg: DataConfig) -> dict | None:
    """One question with its gold steps, or None if a running value leaves [0, value_max]."""
    n_lookups, n_consts = shape
    ids = rng.sample(sorted(facts), n_lookups)
    operands = [("fact", f) for f in ids] + [("const", rng.randint(1, min(9, cfg.operand_max)))
                                             for _ in range(n_consts)]
    rng.shuffle(operands)
    ops = [rng.choice(cfg.ops) for _ in range(len(operands) - 1)]
    texts = [f if kind == "fact" else str(f) for kind, f in operands]
    question = texts[0] + "".join(op + t for op, t in zip(ops, texts[1:]))
    steps = [{"task": t, "result": facts[f], "search": t, "fact": f}
             for (kind, f), t in zip(operands, texts) if kind == "fact"]
    values = [facts[f] if kind == "fact" else f for kind, f in operands]
    value = values[0]
    for op, v in zip(ops, values[1:]):
        nxt = value + v if op == "+" else value - v
        if not 0 <= nxt <= cfg.value_max:
            return None
        steps.append({"task": f"{value}{op}{v}", "result": nxt})
        value = nxt
    return {"question": question, "answer": value, "steps": steps}


def generate_lookup(cfg: DataConfig) -> tuple[dict[str, list[dict]], list[dict]]:
    """The splits and the corpus rows, deterministic from the data config."""
    if set(cfg.ops) - {"+", "-"}:
        raise ValueError(f"data.ops={cfg.ops}: synthetic_lookup uses + and - only")
    shapes = _shapes(cfg)
    if not shapes:
        raise ValueError(f"data.min_steps/max_steps ({cfg.min_steps}-{cfg.max_steps}) allow no synthetic_lookup "
                         "question: it has 2 to 6 subtasks")
    rng = random.Random(cfg.seed)
    facts = make_corpus(rng, cfg.operand_max)
    sizes = {"train": cfg.n_train, "val": cfg.n_val, "test": cfg.n_test}
    drawn = draw_splits(sizes, lambda: make_question(rng, facts, rng.choice(shapes), cfg),
                        lambda q: None if q is None else q["question"],
                        f"cannot draw {sum(sizes.values())} distinct lookup questions; raise value_max")
    out = {split: [{"id": f"{split}-{i:05d}", **q} for i, q in enumerate(qs)] for split, qs in drawn.items()}
    return out, corpus_rows(facts)
