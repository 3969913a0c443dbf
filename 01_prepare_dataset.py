"""01_prepare_dataset: write the unified train/val/test splits with rendered planner prompts.

Reads the raw files that 00_check_data validated (their hashes must still match its manifest),
carves missing splits, handles leakage and caps sizes (utils/prepare.py), and writes
outputs/<run_id>/01_prepare_dataset/{train,val,test}.jsonl. Each row is the unified schema
(id, question, answers, context, solution, meta) plus `prompt`, the rendered planner prompt.
"""
import json
import sys

from utils.cli import parse_stage_args
from utils.data_adapters import get_adapter, read_records
from utils.manifest import StageRun, atomic_write_text, path_sha256
from utils.prepare import PrepareError, prepare_splits
from utils.prompts import render_planner
from utils.run_config import repo_path
from utils.stages import StageError, config_slice, parent, run_main, stage_dir

STAGE = "01_prepare_dataset"
CONFIG_KEYS = ("data", "model.templates", "model.path")


def _load_checked_raw(cfg, parent_manifest) -> dict:
    raw = {}
    files = parent_manifest["inputs"]
    for path_str, digest in files.items():
        path = repo_path(path_str)
        if not path.is_file() or path_sha256(path) != digest:
            raise StageError(f"{path} changed since 00_check_data validated it; re-run 00_check_data.py")
    summary = json.loads((stage_dir(cfg, "00_check_data") / "summary.json").read_text())
    adapter = get_adapter(cfg.data.name)
    for split, info in summary["splits"].items():
        path = repo_path(info["file"])
        raw[split] = [adapter.parse(path, i, obj, split) for i, obj in read_records(path)]
    return raw


def _tokenizer(cfg):
    if not cfg.model.templates.use_chat_template:
        return None
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(repo_path(cfg.model.path))


def main(argv=None) -> int:
    cfg, _ = parse_stage_args(__doc__, argv)
    out = stage_dir(cfg, STAGE)
    with StageRun(STAGE, out, config_slice(cfg, CONFIG_KEYS), cfg.seed) as run:
        _, checked = parent(run, cfg, "00_check_data")
        for path in checked["inputs"]:
            run.add_input(repo_path(path))
        try:
            splits, stats = prepare_splits(_load_checked_raw(cfg, checked), cfg.data)
        except PrepareError as exc:
            raise StageError(str(exc)) from None
        tok = _tokenizer(cfg)
        for split, rows in splits.items():
            if not rows:
                raise StageError(f"split '{split}' is empty after preparation ({stats})")
            lines = []
            for row in rows:
                item = row.to_json()
                item["prompt"] = render_planner(cfg.model.templates, row.question, row.context, tok)
                lines.append(json.dumps(item, sort_keys=True, ensure_ascii=False) + "\n")
            atomic_write_text(out / f"{split}.jsonl", "".join(lines))
            run.add_output(out / f"{split}.jsonl")
            run.metrics[f"rows_{split}"] = len(rows)
        run.metrics.update(stats)
    print(f"{STAGE}: wrote " + ", ".join(f"{s} {len(r)}" for s, r in splits.items()) + f" -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(STAGE, main))
