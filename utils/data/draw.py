"""Drawing a generated dataset's splits: disjoint, in a fixed order, with a bound on the draws.

The generated tasks (utils/data/synthetic.py, lookup.py, word_problems.py) each draw problems from a
seeded generator until every split is full; what makes two problems the same differs by task
(the question text, or a template and its numbers), so it is the caller's `key`.
"""
from __future__ import annotations

from utils.data.adapters import SPLITS


def draw_splits(sizes: dict[str, int], draw, key, too_few: str) -> dict[str, list]:
    """Each split's `sizes[split]` items from `draw()`, in the order train, val, test, keeping an
    item only if its `key` is not None and was not kept before (in any split), so the splits are
    disjoint; ValueError(`too_few`) once 50 draws an item (plus 1,000) did not fill them."""
    seen, out = set(), {}
    budget = 50 * sum(sizes.values()) + 1000  # the knobs may allow too few distinct problems
    for split in SPLITS:
        rows = []
        while len(rows) < sizes[split]:
            budget -= 1
            if budget < 0:
                raise ValueError(too_few)
            item = draw()
            k = key(item)
            if k is None or k in seen:
                continue
            seen.add(k)
            rows.append(item)
        out[split] = rows
    return out
