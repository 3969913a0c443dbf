"""Raw-data checks behind `00_check_data.py`.

Hard errors (the stage exits non-zero): unreadable files, schema and type errors, empty or
duplicate ids, empty questions or answers, gold answers the scorer cannot parse, a missing train
split. Warnings (listed in summary.json and the manifest): missing val/test splits (01 carves
them), duplicate questions inside a split, and leakage, i.e. the same normalised question in two
splits. Every message names the file, the row and the field.
"""
from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from utils.core.io import DataError
from utils.data.adapters import SPLITS, Row, load_split
from utils.reward.scorers import gold_parseable



def normalize_question(text: str) -> str:
    """Case- and whitespace-insensitive; unlike SQuAD answer normalisation it keeps punctuation,
    which carries meaning in questions ("37+27-5" is not "3+72-75")."""
    return " ".join(str(text).lower().split()).strip(" ?.!")


@dataclass
class CheckReport:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    files: dict[str, Path] = field(default_factory=dict)
    rows: dict[str, list[tuple[int, Row]]] = field(default_factory=dict)
    leaked: dict[str, list[str]] = field(default_factory=dict)  # "train/test" -> ids in the first split

    @property
    def ok(self) -> bool:
        return not self.errors


def _check_rows(path: Path, split: str, rows: list[tuple[int, Row]], scorer: str, rep: CheckReport,
                seen_ids: dict[str, str]) -> None:
    questions: dict[str, int] = {}
    for i, row in rows:
        where = f"{path}, row {i}"
        if not row.id.strip():
            rep.errors.append(f"{where}, field 'id': empty id")
        elif row.id in seen_ids:
            rep.errors.append(f"{where}, field 'id': duplicate id '{row.id}' (first at {seen_ids[row.id]})")
        else:
            seen_ids[row.id] = where
        if not row.question.strip():
            rep.errors.append(f"{where}, field 'question': empty question")
        if not row.answers or not any(a.strip() for a in row.answers):
            rep.errors.append(f"{where}, field 'answers': no non-empty answer")
        elif not any(gold_parseable(scorer, a) for a in row.answers):
            rep.errors.append(f"{where}, field 'answers': scorer '{scorer}' cannot parse {row.answers[0]!r}")
        q = normalize_question(row.question)
        if q in questions:
            rep.warnings.append(f"{where}, field 'question': same question as row {questions[q]} of {split}")
        else:
            questions[q] = i


def _check_leakage(rep: CheckReport) -> None:
    norm = {s: {normalize_question(r.question): (i, r) for i, r in rows} for s, rows in rep.rows.items()}
    for a, b in (("train", "test"), ("train", "val"), ("val", "test")):
        if a not in norm or b not in norm:
            continue
        shared = sorted(set(norm[a]) & set(norm[b]))
        if not shared:
            continue
        rep.leaked[f"{a}/{b}"] = [norm[a][q][1].id for q in shared]
        first_a, first_b = norm[a][shared[0]][0], norm[b][shared[0]][0]
        rep.warnings.append(f"leakage: {len(shared)} question(s) of {rep.files[b]} also in {rep.files[a]} "
                            f"(first: {rep.files[b]}, row {first_b} = {rep.files[a]}, row {first_a}, "
                            f"field 'question')")


def check_dataset(name: str, root: Path, scorer: str) -> CheckReport:
    rep = CheckReport()
    if not root.is_dir():
        rep.errors.append(f"{root}: dataset directory not found (run `bash download.sh` for the default, "
                          f"or point data.path at the native files)")
        return rep
    seen_ids: dict[str, str] = {}
    for split in SPLITS:
        try:
            loaded = load_split(name, root, split)
        except DataError as exc:
            rep.errors.append(str(exc))
            continue
        if loaded is None:
            (rep.errors if split == "train" else rep.warnings).append(
                f"{root}: no {split} file (looked for {split}.jsonl/.json and its aliases)"
                + ("" if split == "train" else "; 01_prepare_dataset will carve it from another split"))
            continue
        path, rows = loaded
        rep.files[split], rep.rows[split] = path, rows
        _check_rows(path, split, rows, scorer, rep, seen_ids)
    _check_leakage(rep)
    return rep


def _lengths(values: list[int]) -> dict:
    if not values:
        return {}
    return {"min": min(values), "mean": round(statistics.fmean(values), 2), "max": max(values)}


def summarize(rep: CheckReport, n_samples: int = 3) -> dict:
    splits = {}
    for split, rows in rep.rows.items():
        only = [r for _, r in rows]
        steps = Counter(r.meta.get("n_steps") for r in only if "n_steps" in r.meta)
        splits[split] = {
            "file": str(rep.files[split]), "rows": len(only),
            "question_chars": _lengths([len(r.question) for r in only]),
            "answers_per_row": _lengths([len(r.answers) for r in only]),
            "with_context": sum(r.context is not None for r in only),
            "with_solution": sum(r.solution is not None for r in only),
            **({"n_steps": {str(k): v for k, v in sorted(steps.items())}} if steps else {}),
            "samples": [r.to_json() for r in only[:n_samples]],
        }
    return {"ok": rep.ok, "errors": rep.errors, "warnings": rep.warnings, "splits": splits,
            "leakage": {k: len(v) for k, v in rep.leaked.items()}}
