"""Drawing a generated dataset's splits (disjoint, in a fixed order, with a bound on the draws) and
writing them whole.

The generated tasks (utils/data/synthetic.py, lookup.py, word_problems.py) each draw problems from a
seeded generator until every split is full; what makes two problems the same differs by task
(the question text, or a template and its numbers), so it is the caller's `key`.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from utils.core.files import atomic_write_json, publish_dir
from utils.core.hashing import path_sha256
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


def up_to_date(out_dir: Path, digest: str) -> bool:
    """Whether `out_dir` already holds the files of the generator settings hashed as `digest`."""
    try:
        return json.loads((out_dir / "manifest.json").read_text()).get("config_sha256") == digest
    except (OSError, ValueError):
        return False


def publish_splits(out_dir: Path, splits: dict[str, list[dict]], manifest: dict) -> None:
    """Write each split as `<split>.jsonl` and `manifest` (plus the files' hashes and counts) into a
    folder beside `out_dir`, then move it into place whole (`publish_dir`): a killed writer never
    leaves half a dataset."""
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    files = {}
    for split, rows in splits.items():
        path = tmp / f"{split}.jsonl"
        path.write_text("".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows))
        files[path.name] = path_sha256(path)
    atomic_write_json(tmp / "manifest.json", {**manifest, "files": files,
                                              "counts": {s: len(r) for s, r in splits.items()}})
    publish_dir(tmp, out_dir)
