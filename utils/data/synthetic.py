"""Writes the synthetic datasets' native files: train/val/test JSONL with gold decompositions.

`synthetic_arith` (below) and `synthetic_lookup` (utils/data/lookup.py, which adds corpus.jsonl,
the search tool's corpus) share `write_dataset`.

Native row: {"id", "question", "answer", "steps": [{"task": "12+7", "result": 19}, ...]}.
Splits are disjoint: every question text is unique across the whole dataset. Only questions
reserved by `arith.is_task_question` are drawn, so none is in the base model's pretraining text. Generation is
deterministic from the data config (seed and difficulty knobs), and the files are written into a
temporary directory that is renamed into place, so a half-written dataset is never visible.
"""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

from utils.data.arith import is_task_question, make_problem
from utils.data.draw import draw_splits
from utils.data.lookup import generate_lookup
from utils.core.files import atomic_write_json, publish_dir
from utils.core.hashing import config_sha256, path_sha256
from utils.core.schema import DataConfig

def generate_rows(cfg: DataConfig) -> dict[str, list[dict]]:
    sizes = {"train": cfg.n_train, "val": cfg.n_val, "test": cfg.n_test}
    for split, n in sizes.items():
        if isinstance(n, float):
            raise ValueError(f"data.n_{split}={n}: the synthetic task draws a count of questions, not a fraction")
    if cfg.min_steps > cfg.max_steps:
        raise ValueError(f"data.min_steps ({cfg.min_steps}) > data.max_steps ({cfg.max_steps})")
    rng = random.Random(cfg.seed)

    def draw():
        return make_problem(rng, rng.randint(cfg.min_steps, cfg.max_steps), tuple(cfg.ops), cfg.operand_max,
                            cfg.value_max)

    # only reserved questions: the other half of all chains is the base model's pretraining text
    drawn = draw_splits(sizes, draw, lambda p: p.question if is_task_question(p.question) else None,
                        f"cannot draw {sum(sizes.values())} distinct problems with operand_max={cfg.operand_max}, "
                        f"steps {cfg.min_steps}-{cfg.max_steps}; raise the knobs")
    return {split: [{"id": f"{split}-{i:05d}", "question": p.question, "answer": p.answer,
                     "steps": [{"task": t, "result": r} for t, r in p.steps]} for i, p in enumerate(problems)]
            for split, problems in drawn.items()}


def write_dataset(cfg: DataConfig, out_dir: Path) -> dict:
    """Generate and write the splits plus a manifest; returns the manifest."""
    from utils.core.config import to_dict

    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if cfg.name == "synthetic_lookup":
        rows, corpus = generate_lookup(cfg)
    else:
        rows, corpus = generate_rows(cfg), None
    files = {f"{split}.jsonl": items for split, items in rows.items()}
    if corpus is not None:
        files["corpus.jsonl"] = corpus
    for name, items in files.items():
        (tmp / name).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in items))
    manifest = {"stage": "make_synthetic", "status": "completed", "config": to_dict(cfg),
                "config_sha256": config_sha256(to_dict(cfg)),
                "counts": {s: len(r) for s, r in rows.items()},
                "files": {name: path_sha256(tmp / name) for name in files}}
    atomic_write_json(tmp / "manifest.json", manifest)
    publish_dir(tmp, out_dir)
    return manifest
