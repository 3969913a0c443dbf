"""01_prepare_dataset: write the unified train/val/test splits with rendered planner prompts.

Reads the raw files that 00_check_data validated (their hashes must still match its manifest),
carves missing splits, handles leakage and caps sizes (utils/data/prepare.py), and writes
outputs/<run_id>/01_prepare_dataset/{train,val,test}.jsonl. Each row is the unified schema
(id, question, answers, context, solution, meta) plus `prompt`, the rendered planner prompt.
A context longer than its token budget (`data.context_max_tokens`; 0 = what max_model_len leaves
after the context-free prompt and one planner turn) loses whole lines from the end, and a last
line says so (utils/agent/prompts.py `fit_context`); the row's `meta.context_cut` records what was
cut and the manifest counts the cut rows per split.
"""
import json
import shutil
import sys

from utils.agent.prompts import fit_context, render_planner
from utils.core.cli import parse_stage_args
from utils.core.io import read_records, write_jsonl
from utils.core.files import publish_dir
from utils.core.hashing import path_sha256
from utils.core.manifest import StageRun
from utils.core.models import load_tokenizer
from utils.core.config import repo_path
from utils.core.stages import StageError, model_dir, parent, run_main, stage_config, stage_dir
from utils.data.adapters import get_adapter
from utils.data.prepare import CONTEXT_CORPUS, PrepareError, context_to_corpus, prepare_splits

STAGE = "01_prepare_dataset"


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


def _fit(cfg, tok, row) -> int:
    """Cut the row's context to its budget in place; 1 if it was cut."""
    if not row.context:
        return 0
    t = cfg.model.templates
    budget = cfg.data.context_max_tokens or (
        cfg.model.engine.max_model_len - cfg.agent.max_new_tokens_planner
        - len(tok.encode(render_planner(t, row.question, "x", tok if t.use_chat_template else None))))
    if budget <= 0:
        raise StageError(f"row {row.id}: the planner prompt leaves no room for its context within "
                         f"model.engine.max_model_len={cfg.model.engine.max_model_len}; raise it or set "
                         f"data.context_max_tokens")
    row.context, cut = fit_context(row.context, lambda s: len(tok.encode(s, add_special_tokens=False)), budget)
    if cut:
        row.meta["context_cut"] = cut
    return int(cut is not None)


def _build_index(cfg, run, out, corpus) -> None:
    from utils.agent.retrieval import build_index

    tmp, final = out / "index.tmp", out / "index"
    shutil.rmtree(tmp, ignore_errors=True)
    info = build_index(cfg.agent.tool.retriever, corpus, tmp, embedding_model=cfg.agent.tool.embedding_model)
    publish_dir(tmp, final)
    run.add_output(final)
    run.metrics["index_docs"] = info["docs"]


def main(argv=None) -> int:
    cfg, _ = parse_stage_args(__doc__, argv)
    out = stage_dir(cfg, STAGE)
    with StageRun(STAGE, out, stage_config(cfg, STAGE)) as run:  # no run seed: nothing here is drawn
        _, checked = parent(run, cfg, "00_check_data")
        for path in checked["inputs"]:
            run.add_input(repo_path(path))
        tool = cfg.agent.tool if cfg.agent.tool.retriever != "none" else None  # its settings unread without it
        try:
            splits, stats = prepare_splits(_load_checked_raw(cfg, checked), cfg.data)
            if tool and tool.corpus == CONTEXT_CORPUS:
                corpus = out / "corpus.jsonl"
                write_jsonl(corpus, context_to_corpus(splits))
                run.add_output(corpus)
            elif tool:
                corpus = repo_path(cfg.data.path) / tool.corpus
        except PrepareError as exc:
            raise StageError(str(exc)) from None
        run.add_model(model_dir(cfg))
        tok = load_tokenizer(model_dir(cfg), cfg.model.trust_remote_code)
        chat = tok if cfg.model.templates.use_chat_template else None
        for split, rows in splits.items():
            if not rows:
                raise StageError(f"split '{split}' is empty after preparation ({stats})")
            run.metrics[f"context_cut_{split}"] = sum(_fit(cfg, tok, row) for row in rows)
            write_jsonl(out / f"{split}.jsonl", ({**row.to_json(), "prompt": render_planner(
                cfg.model.templates, row.question, row.context, chat)} for row in rows))
            run.add_output(out / f"{split}.jsonl")
            run.metrics[f"rows_{split}"] = len(rows)
        run.metrics.update(stats)
        if tool:
            _build_index(cfg, run, out, corpus)
    print(f"{STAGE}: wrote " + ", ".join(f"{s} {len(r)}" for s, r in splits.items()) + f" -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(STAGE, main))
