"""Dataset adapters: each maps one source's native rows to the unified schema.

Unified row (`Row`): id, question, answers (list of str), context (str | None), solution (str | None),
meta (dict). Adapters are registered by name (`ADAPTERS`); an unknown name lists the valid ones.

Every read error names the file, the 1-based row (line for JSONL, element for a JSON array) and
the field, with what was expected and what was found (`DataError`). Native formats:
- synthetic_arith: JSONL {id, question, answer: int, steps: [{task, result}]} (utils/data/synthetic.py);
- synthetic_lookup: the same, lookup steps adding {search, fact} (utils/data/lookup.py);
- gsm8k: JSONL {question, answer: "worked solution ... #### 72"}; ids are <split>-<row>;
- finqa: the FinQA release's JSON array {id, pre_text, post_text, table, qa: {question, answer|exe_ans}}
  (JSONL with the same objects is accepted too);
- hotpotqa: a JSON array (the original release: context = [[title, [sentences]]]) or JSONL
  (the hub's form: context = {title: [...], sentences: [[...]]}), {_id|id, question, answer}.

`context` is the evidence as the model will read it, one block per line so that 01 can cut whole
lines from the end when it exceeds the token budget: FinQA's table first (as aligned rows, the
header row first), then its text before and after the table; HotpotQA's paragraphs as
`title: sentences`, in the file's order. `meta.steps` holds the gold decomposition read from the
dataset's own annotations (utils/data/decompose.py), or `meta.trace_error` says why there is none.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from utils.core.errors import StageError
from utils.core.io import DataError, read_records, require, type_name
from utils.core.registry import Registry
from utils.data.decompose import finqa_program_steps, gsm8k_annotation_steps, hotpot_bridge_hops, hotpot_bridge_steps

SPLIT_FILES = {"train": ("train",), "val": ("val", "dev", "validation"), "test": ("test",)}
SPLITS = tuple(SPLIT_FILES)


@dataclass
class Row:
    id: str
    question: str
    answers: list[str]
    context: str | None = None
    solution: str | None = None
    meta: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


def split_file(root: Path, split: str) -> Path | None:
    """The native file of `split` under `root` (.jsonl or .json, under any of its usual names)."""
    for stem in SPLIT_FILES[split]:
        for suffix in (".jsonl", ".json"):
            if (root / f"{stem}{suffix}").is_file():
                return root / f"{stem}{suffix}"
    return None


# ---------------------------------------------------------------- adapters

def _synthetic(path: Path, row: int, obj: dict, split: str) -> Row:
    rid = require(obj, "id", str, path, row)
    question = require(obj, "question", str, path, row)
    answer = require(obj, "answer", int, path, row)
    steps = require(obj, "steps", list, path, row)
    for j, step in enumerate(steps):
        require(step, "task", str, path, row, f"steps[{j}].")
        require(step, "result", int, path, row, f"steps[{j}].")
    solution = "\n".join(f"{s['task']}={s['result']}" for s in steps)
    return Row(rid, question, [str(answer)], None, solution, {"steps": steps, "n_steps": len(steps)})


def _synthetic_lookup(path: Path, row: int, obj: dict, split: str) -> Row:
    """synthetic_arith's row, whose lookup steps also name their search query and gold fact id."""
    out = _synthetic(path, row, obj, split)
    for j, step in enumerate(out.meta["steps"]):
        if "search" in step:
            require(step, "search", str, path, row, f"steps[{j}].")
            require(step, "fact", str, path, row, f"steps[{j}].")
    out.meta["facts"] = [s["fact"] for s in out.meta["steps"] if "fact" in s]
    return out


_GSM_CALC = re.compile(r"<<[^>]*>>")


def _gsm8k(path: Path, row: int, obj: dict, split: str) -> Row:
    question = require(obj, "question", str, path, row)
    answer = require(obj, "answer", str, path, row)
    if "####" not in answer:
        raise DataError(path, row, "answer", "expected a worked solution ending in '#### <number>', found no '####'")
    body, final = answer.rsplit("####", 1)
    lines = [_GSM_CALC.sub("", ln).strip() for ln in body.strip().splitlines() if ln.strip()]
    rid = str(obj.get("id", f"{split}-{row:05d}"))
    final = final.strip().replace(",", "")
    return Row(rid, question, [final], None, "\n".join(lines),
               {"solution_steps": lines, **_gold(gsm8k_annotation_steps(body, final))})


def _gold(found: tuple[list[tuple[str, str]], str | None]) -> dict:
    steps, reason = found
    if reason is not None:
        return {"trace_error": reason}
    return {"steps": [{"task": t, "result": r} for t, r in steps], "n_steps": len(steps)}


def table_text(table: list) -> list[str]:
    """A FinQA table as aligned rows: each column padded to its widest cell, cells split by ' | '."""
    rows = [[" ".join(str(c).split()) for c in r] if isinstance(r, list) else [" ".join(str(r).split())]
            for r in table]
    widths = [max((len(r[j]) for r in rows if j < len(r)), default=0) for j in range(max(map(len, rows), default=0))]
    return [" | ".join(c.ljust(widths[j]) for j, c in enumerate(r)).rstrip() for r in rows]


def _finqa(path: Path, row: int, obj: dict, split: str) -> Row:
    rid = require(obj, "id", str, path, row)
    qa = require(obj, "qa", dict, path, row)
    question = require(qa, "question", str, path, row, "qa.")
    if "exe_ans" in qa:
        ans = require(qa, "exe_ans", (int, float, str), path, row, "qa.")
    else:
        ans = require(qa, "answer", (int, float, str), path, row, "qa.")
    pre = require(obj, "pre_text", list, path, row)
    post = require(obj, "post_text", list, path, row)
    table = require(obj, "table", list, path, row)
    text = [" ".join(str(t).split()) for t in [*pre, *post] if str(t).strip()]
    context = "\n".join(table_text(table) + text) or None
    answers = [str(ans)] + ([str(qa["answer"])] if "exe_ans" in qa and qa.get("answer") not in (None, "") else [])
    program = qa.get("program")
    return Row(rid, question, answers, context, program if isinstance(program, str) else None,
               {"program": program, **_gold(finqa_program_steps(program, table, ans))})


def _hotpot_paragraphs(ctx: Any, path: Path, row: int) -> list[tuple[str, str]]:
    if isinstance(ctx, dict):  # hub form
        titles = ctx.get("title", [])
        sents = ctx.get("sentences", [])
        if not isinstance(titles, list) or not isinstance(sents, list):
            raise DataError(path, row, "context", "expected {title: [...], sentences: [[...]]}")
        pairs = list(zip(titles, sents))
    elif isinstance(ctx, list):  # original release
        pairs = []
        for j, item in enumerate(ctx):
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[1], list)):
                raise DataError(path, row, f"context[{j}]", "expected [title, [sentences]]")
            pairs.append((item[0], item[1]))
    else:
        raise DataError(path, row, "context", f"expected a list or an object, got {type_name(ctx)}")
    return [(str(title), " ".join("".join(map(str, s)).split())) for title, s in pairs]


def _hotpotqa(path: Path, row: int, obj: dict, split: str) -> Row:
    key = "_id" if "_id" in obj else "id"
    rid = require(obj, key, str, path, row)
    question = require(obj, "question", str, path, row)
    answer = require(obj, "answer", str, path, row)
    paragraphs = _hotpot_paragraphs(obj["context"], path, row) if "context" in obj else []
    context = "\n".join(f"{title}: {text}" for title, text in paragraphs) or None
    hops, _ = hotpot_bridge_hops(obj.get("type"), obj.get("supporting_facts"), paragraphs)
    gold = _gold(hotpot_bridge_steps(question, answer, obj.get("type"), obj.get("supporting_facts"), paragraphs))
    return Row(rid, question, [answer], context, None, {"type": obj.get("type"), "level": obj.get("level"),
                                                        **({"hop_titles": list(hops)} if hops else {}), **gold})


# the generated datasets' knobs (utils/data/synthetic.py), as their files' manifest.json records them
SHAPE_KNOBS = ("seed", "min_steps", "max_steps", "ops", "operand_max", "value_max")  # what a problem is
SIZE_KNOBS = ("n_train", "n_val", "n_test")  # how many were drawn


def stale_knobs(cfg, out_dir: Path, knobs: tuple[str, ...]) -> list[str]:
    """Generator `knobs` on which the files in `out_dir` (per their manifest.json) differ from `cfg`,
    e.g. after a config change without re-running `bash download.sh`. No manifest: nothing to compare."""
    path = out_dir / "manifest.json"
    if not path.is_file():
        return []
    made = json.loads(path.read_text()).get("config", {})
    return [f"{k}: files have {made.get(k)!r}, config has {getattr(cfg, k)!r}" for k in knobs
            if made.get(k) != getattr(cfg, k)]


def _generated_files(cfg, root: Path) -> list[str]:
    """The synthetic datasets' files, generated by download.sh from the data config: refused when
    they were generated with other problem knobs, a warning each when only the split sizes differ."""
    stale = stale_knobs(cfg, root, SHAPE_KNOBS)
    if stale:
        raise StageError(f"{root / 'manifest.json'}: the synthetic files were generated with other knobs "
                         f"({'; '.join(stale)}); regenerate them with `bash download.sh` (or `bash download.sh "
                         f"--data-config FILE` for another data config)")
    return [f"{root / 'manifest.json'}: split sizes differ from the config ({d}); the files' rows are used"
            for d in stale_knobs(cfg, root, SIZE_KNOBS)]


GENERATED_GSM8K = {"utils/data/word_problems.py": "word_problems", "utils/data/gsm_symbolic.py": "gsm_symbolic"}
WORD_PROBLEM_KNOBS = ("seed", "min_steps", "max_steps", "operand_max", "n_train", "n_val", "n_test")


def _generated_gsm8k_files(cfg, root: Path) -> list[str]:
    """GSM8K-format files a generator wrote (word_problems, gsm_symbolic: their manifest.json says
    which, and with what knobs) must be the config's: a knob that differs is refused, since the
    files would not change with it; a split size below the files' is allowed (01 keeps a seeded
    subsample of that many rows). Files with no manifest (GSM8K's own) are not checked."""
    path = root / "manifest.json"
    if not path.is_file():
        return []
    try:
        made = json.loads(path.read_text())
    except ValueError as exc:
        raise StageError(f"{path}: not valid JSON ({exc}); regenerate the files with `bash download.sh "
                         f"--dataset NAME`") from None
    dataset = GENERATED_GSM8K.get(made.get("generator"))
    if dataset is None:
        return []
    knobs = made.get("knobs") or {k: made.get("config", {}).get(k) for k in WORD_PROBLEM_KNOBS}
    stale = []
    for key, had in knobs.items():
        now = getattr(cfg, key)
        if key in SIZE_KNOBS and isinstance(had, int) and isinstance(now, int) and 0 < now <= had:
            continue
        if now != had:
            stale.append(f"data.{key} is {now!r}, the files have {had!r}")
    if stale:
        raise StageError(f"{path}: the {dataset} files were generated with other settings ({'; '.join(stale)}); "
                         f"regenerate them: bash download.sh --dataset {dataset} (another data config: add "
                         f"--data-config FILE)")
    return []


@dataclass(frozen=True)
class Adapter:
    """A dataset's parser of one native record into a `Row`, and an optional check of its files
    before any row is read (`check_files(data config, folder)`: raises StageError, or returns
    warnings), which 00 runs for every dataset that has one."""
    name: str
    parse: Callable[[Path, int, dict, str], Row]
    check_files: Callable[[Any, Path], list[str]] | None = None

    def file_warnings(self, cfg, root: Path) -> list[str]:
        return self.check_files(cfg, root) if self.check_files else []


ADAPTERS: Registry[Adapter] = Registry("dataset adapter", {a.name: a for a in (
    Adapter("synthetic_arith", _synthetic, _generated_files),
    Adapter("synthetic_lookup", _synthetic_lookup, _generated_files),
    Adapter("gsm8k", _gsm8k, _generated_gsm8k_files),
    Adapter("finqa", _finqa),
    Adapter("hotpotqa", _hotpotqa),
)})


def get_adapter(name: str) -> Adapter:
    return ADAPTERS.get(name)


def load_split(name: str, root: Path, split: str) -> tuple[Path, list[tuple[int, Row]]] | None:
    """(file, [(row number, Row)]) for one split, or None if the source has no file for it."""
    path = split_file(root, split)
    if path is None:
        return None
    adapter = get_adapter(name)
    return path, [(i, adapter.parse(path, i, obj, split)) for i, obj in read_records(path)]
