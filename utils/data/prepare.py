"""Split preparation behind `01_prepare_dataset.py`: carve missing splits, handle leakage, cap sizes.

Everything is deterministic from `data.seed` (not the run seed, so every seed of a comparison is
scored on the same test items). The order of operations:
1. a missing test split is carved from val if there is one, else from train; a missing val split
   is carved from train (`n_test`/`n_val` rows);
2. leakage (`data.on_leakage`): drop_from_train removes train rows whose question is in val or
   test, and val rows whose question is in test; warn keeps them; error stops;
3. caps: `n_train`/`n_val`/`n_test` > 0 keep a seeded subsample of that many rows, in file order.
A size may be a fraction in (0, 1) instead of a count: of the split it is carved from (n_val of
train, n_test of val or train), or of the split it caps; it rounds to at least one row.
"""
from __future__ import annotations

import random

from utils.data.adapters import Row
from utils.data.checks import normalize_question
from utils.core.schema import DataConfig


class PrepareError(ValueError):
    pass


def rows_for(n: int | float, total: int, what: str) -> int:
    """data.n_<what> as a row count out of `total`: a count as is, a fraction in (0, 1) of `total`."""
    if isinstance(n, float):
        if not 0 < n < 1:
            raise PrepareError(f"data.n_{what}={n}: a fraction must lie strictly between 0 and 1 (or give a count)")
        return max(1, round(n * total))
    return n


def _carve(rows: list[Row], n: int | float, rng: random.Random, what: str) -> tuple[list[Row], list[Row]]:
    if n <= 0:
        raise PrepareError(f"the source has no {what} split and data.n_{what} is {n}; set it > 0 to carve one")
    n = rows_for(n, len(rows), what)
    if n >= len(rows):
        raise PrepareError(f"cannot carve {n} {what} rows from {len(rows)}; lower data.n_{what} "
                           f"or give a fraction (data.n_{what}=0.1 carves a tenth)")
    picked = set(rng.sample(range(len(rows)), n))
    return [r for i, r in enumerate(rows) if i not in picked], [r for i, r in enumerate(rows) if i in picked]


def _drop_leaks(rows: list[Row], held: list[Row]) -> tuple[list[Row], int]:
    banned = {normalize_question(r.question) for r in held}
    kept = [r for r in rows if normalize_question(r.question) not in banned]
    return kept, len(rows) - len(kept)


def _cap(rows: list[Row], n: int | float, rng: random.Random, what: str) -> list[Row]:
    if n <= 0:
        return rows
    n = rows_for(n, len(rows), what)
    if len(rows) <= n:
        return rows
    keep = set(rng.sample(range(len(rows)), n))
    return [r for i, r in enumerate(rows) if i in keep]


def prepare_splits(raw: dict[str, list[Row]], cfg: DataConfig) -> tuple[dict[str, list[Row]], dict]:
    """Returns the final splits and stats about what was carved, dropped and capped."""
    rng = random.Random(cfg.seed)
    splits = {k: list(v) for k, v in raw.items()}
    stats: dict = {"carved": {}, "dropped_leaked": {}, "capped": {}}
    if "train" not in splits:
        raise PrepareError("the source has no train split")
    if "test" not in splits:
        src = "val" if "val" in splits else "train"
        splits[src], splits["test"] = _carve(splits[src], cfg.n_test, rng, "test")
        stats["carved"]["test"] = f"{len(splits['test'])} rows from {src}"
    if "val" not in splits:
        splits["train"], splits["val"] = _carve(splits["train"], cfg.n_val, rng, "val")
        stats["carved"]["val"] = f"{len(splits['val'])} rows from train"
    for src, held in (("train", ["val", "test"]), ("val", ["test"])):
        kept, dropped = _drop_leaks(splits[src], [r for h in held for r in splits[h]])
        if dropped and cfg.on_leakage == "error":
            raise PrepareError(f"{dropped} {src} question(s) also appear in {'/'.join(held)} "
                               f"(data.on_leakage=error; see 00_check_data's summary.json)")
        if cfg.on_leakage == "drop_from_train":
            splits[src] = kept
            stats["dropped_leaked"][src] = dropped
    for split, n in (("train", cfg.n_train), ("val", cfg.n_val), ("test", cfg.n_test)):
        before = len(splits[split])
        splits[split] = _cap(splits[split], n if split not in stats["carved"] else 0, rng, split)
        if len(splits[split]) < before:
            stats["capped"][split] = f"{before} -> {len(splits[split])}"
    return splits, stats


CONTEXT_CORPUS = "@context"  # agent.tool.corpus: the rows' own context paragraphs become the search corpus


def context_to_corpus(splits: dict[str, list[Row]]) -> list[dict]:
    """The CoDA setting for datasets whose rows carry their evidence (HotpotQA's paragraphs): every
    context line `title: text` of every split becomes a passage (one per title, the first seen),
    the rows lose their context (the executor must search for it), and a row whose gold hops name
    their paragraphs (`meta.hop_titles`) gets each hop's search (its subtask) and gold fact."""
    corpus: dict[str, dict] = {}
    for rows in splits.values():
        for row in rows:
            for line in (row.context or "").split("\n"):
                title, sep, text = line.partition(": ")
                if sep and text.strip() and title not in corpus:
                    corpus[title] = {"id": title, "title": title, "text": text}
            row.context = None
            hops = row.meta.get("hop_titles")
            if hops and len(hops) == len(row.meta.get("steps", [])):
                for step, title in zip(row.meta["steps"], hops):
                    step.update(search=step["task"], fact=title)
                row.meta["facts"] = list(hops)
    if not corpus:
        raise PrepareError(f"agent.tool.corpus={CONTEXT_CORPUS}: no row has a context line 'title: text' to search")
    return list(corpus.values())
