"""Collecting evaluated runs and comparing them (the logic behind `08_compare_runs.py`).

An *evaluation* is one `07_evaluate/<checkpoint>/` directory: its metrics.json, its per-item
scores (samples/predictions.jsonl) and its manifest. Evaluations are grouped by *run* (the run
directory, with a trailing `seed_<s>` folded into the seed) and *method*. The trainer's
metrics.jsonl of each method gives the training curves.

Methods are named by the registry (utils/core/methods.py) and read from what the stages recorded:
an evaluation's method is the checkpoint its metrics.json names, a training's the method its
manifest's config names (the folder's name only where a killed run left no manifest). The paired bootstrap (utils/eval/stats.py) pairs test items keyed by seed and
item id, so seeds pair with themselves.
"""
from __future__ import annotations

import glob
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from utils.core.io import DataError, read_records
from utils.core.files import rel
from utils.core.manifest import MANIFEST_NAME, read_manifest
from utils.core.methods import CHECKPOINTS, RENAMED, TRAINERS
from utils.core.schema import RunConfig
from utils.core.config import repo_path
from utils.core.stages import StageError, run_dir
from utils.reward.scorers import is_correct

DEFAULT_RESAMPLES = 10000  # paired-bootstrap resamples of 08's report
SUMMARY_FIELDS = ("run", "seed", "method", "checkpoint", "n", "accuracy", "ci95_low", "ci95_high", "format",
                  "answered", "reward", "turns", "subtasks", "tokens_planner", "tokens_executor", "source")
PHASES = ("time/rollout", "time/scoring", "time/logprobs", "time/update", "time/weight_sync")


class CompareError(StageError):
    """Bad or missing evaluation outputs; run_main reports it as one line."""


@dataclass
class Evaluation:
    run: str  # run label, e.g. "run_001"
    seed: int | None
    method: str
    directory: Path
    metrics: dict
    scores: dict[str, float]  # item id -> its score on the primary metric (greedy answer score, or mean@k)
    manifest: dict
    primary: str = "greedy"  # eval.primary of the 07 that wrote it
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # item id -> (correct, n) of its samples


@dataclass
class Training:
    run: str
    seed: int | None
    method: str
    directory: Path
    history: list[dict]
    manifest: dict = field(default_factory=dict)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CompareError(f"{path}: not valid JSON (line {exc.lineno}): {exc.msg}") from None


def _read_jsonl(path: Path, allow_empty: bool = False) -> list[tuple[int, dict]]:
    """(row, object) pairs; a trainer killed before its first step leaves an empty metrics.jsonl."""
    if allow_empty and path.is_file() and path.stat().st_size == 0:
        return []
    return list(read_records(path))


def run_label(run_dir: Path, outputs: Path) -> tuple[str, int | None]:
    """("run_001", 2) for outputs/run_001/seed_2. Outside outputs/ the run is named by its folder, and
    a seed folder by its parent's (another checkout's outputs/study/seed_2 is ("study", 2)), so its
    seeds pool into one run as they do inside."""
    try:
        label = run_dir.resolve().relative_to(outputs.resolve()).as_posix()
    except ValueError:
        seed_folder = re.fullmatch(r"seed_\d+", run_dir.name)
        label = f"{run_dir.resolve().parent.name}/{run_dir.name}" if seed_folder else run_dir.name
    m = re.fullmatch(r"(.*)/seed_(\d+)", label)
    return (m.group(1), int(m.group(2))) if m else (label, None)


def find_run_dirs(sources: list[Path]) -> list[Path]:
    """Run directories under the given paths: a directory with 07_evaluate/ or its seed_* children."""
    found = []
    for src in sources:
        if not src.is_dir():
            raise CompareError(f"{src}: no such run directory")
        if (src / "07_evaluate").is_dir():
            found.append(src)
        found += sorted(p for p in src.glob("seed_*") if (p / "07_evaluate").is_dir())
    return sorted(set(found))


def evaluation_dirs(run_dirs: list[Path]) -> list[Path]:
    """Every completed 07_evaluate/<checkpoint>/ under the run directories."""
    out = []
    for d in run_dirs:
        for e in sorted((d / "07_evaluate").iterdir()):
            if (e / "metrics.json").is_file() and (e / MANIFEST_NAME).is_file():
                out.append(e)
    return out


def load_evaluation(directory: Path, outputs: Path) -> Evaluation:
    metrics_path = directory / "metrics.json"
    metrics = _read_json(metrics_path)
    for key in ("checkpoint", "n", "accuracy", "accuracy_ci95", "format", "answered"):
        if key not in metrics:
            raise CompareError(f"{metrics_path}: field '{key}' is missing")
    manifest = read_manifest(directory)
    if manifest.get("status") != "completed":
        raise CompareError(f"{directory / MANIFEST_NAME}: status '{manifest.get('status')}', expected 'completed'")
    preds = directory / "samples" / "predictions.jsonl"
    if not preds.is_file():
        raise CompareError(f"{preds}: missing (07_evaluate writes it beside metrics.json)")
    primary = metrics.get("primary", "greedy")  # 07 before eval.primary existed: greedy
    field_name = {"greedy": "answer", "mean_at_k": "mean_at_k"}.get(primary)
    if field_name is None:
        raise CompareError(f"{metrics_path}: primary '{primary}' is not a known metric (greedy, mean_at_k)")
    scores, counts, uncounted = {}, {}, None
    for i, row in _read_jsonl(preds):
        for key in ("qid", field_name):
            if key not in row:
                raise DataError(preds, i, key, "missing" + (" (primary mean_at_k)" if key == "mean_at_k" else ""))
        value = row[field_name]
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise DataError(preds, i, field_name, f"expected a number, got {value!r}")
        scores[str(row["qid"])] = float(value)
        if (c := sample_counts(row, preds, i)) is not None:
            counts[str(row["qid"])] = c
        elif uncounted is None:
            uncounted = i
    if counts and uncounted is not None:
        raise DataError(preds, uncounted, "curve_n", "no sample counts (curve_n, sampled_n or sampled) where "
                        "other rows have them: every item of a sampled evaluation is counted")
    run, seed = run_label(directory.parent.parent, outputs)
    checkpoint = RENAMED.get(str(metrics["checkpoint"]), str(metrics["checkpoint"]))  # an archive's old name
    method = checkpoint if checkpoint in CHECKPOINTS else directory.name
    return Evaluation(run, manifest.get("seed", seed), method, directory, metrics, scores, manifest, primary, counts)


def refuse_duplicates(evals: list[Evaluation]) -> None:
    """Refuse two evaluations of one (run, seed, checkpoint), such as a study's seed in outputs/ and in
    its archive (utils/run/archive.py) both named in --runs: one would silently stand for the other."""
    seen: dict[tuple, Path] = {}
    for e in evals:
        key = (e.run, e.seed, e.method)
        if key in seen:
            raise CompareError(f"two evaluations of run {e.run}, seed {e.seed}, {e.method}: {seen[key]} and "
                               f"{e.directory}; pass --runs so that each seed of a run is read from one place")
        seen[key] = e.directory


COUNT_FIELDS = (("curve_correct", "curve_n"), ("sampled_correct", "sampled_n"))  # 07's, the curve pass's first


def sample_counts(row: dict, path: Path, i: int) -> tuple[int, int] | None:
    """An item's (correct, n) for pass@k: from 07's curve pass if it ran, else its mean@k samples (a
    07 from before the counts were written: its `sampled` scores); None if it was not sampled."""
    for c_key, n_key in COUNT_FIELDS:
        if n_key in row:
            c, n = row.get(c_key), row[n_key]
            for key, v in ((n_key, n), (c_key, c)):
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    raise DataError(path, i, key, f"expected a count (an integer >= 0), got {v!r}")
            if not 0 < n or c > n:
                raise DataError(path, i, c_key, f"{c} correct of {n} samples: expected 0 <= correct <= n, n > 0")
            return c, n
    sampled = row.get("sampled")
    if not sampled:
        return None
    if not isinstance(sampled, list) or not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in sampled):
        raise DataError(path, i, "sampled", f"expected a list of sample scores, got {sampled!r}")
    return sum(is_correct(s) for s in sampled), len(sampled)


def load_trainings(run_dirs: list[Path], outputs: Path) -> list[Training]:
    out = []
    for d in run_dirs:
        run, seed = run_label(d, outputs)
        for trainer in TRAINERS:
            for m in sorted((d / trainer).glob("*/metrics.jsonl")):
                manifest = read_manifest(m.parent) if (m.parent / MANIFEST_NAME).is_file() else {}
                history = [r for _, r in _read_jsonl(m, allow_empty=True)]
                method = manifest.get("config", {}).get("algorithm", {}).get("method") or m.parent.name
                method = RENAMED.get(method, method)
                out.append(Training(run, manifest.get("seed", seed), method, m.parent, history, manifest))
    return out


def method_key(method: str) -> tuple[int, str]:
    """Report order: the registry's methods, then sft_warmup and base, then anything else by name."""
    return (CHECKPOINTS.index(method) if method in CHECKPOINTS else len(CHECKPOINTS), method)


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def config_diff(configs: dict[str, dict]) -> list[tuple[str, dict]]:
    """[(dotted key, {label: value})] for keys whose values differ between the labelled configs."""
    flat = {label: flatten(c) for label, c in configs.items()}
    keys = sorted(set().union(*(f.keys() for f in flat.values()))) if flat else []
    rows = []
    for key in keys:
        values = {label: f.get(key, "—") for label, f in flat.items()}
        if len({json.dumps(v, sort_keys=True) for v in values.values()}) > 1:
            rows.append((key, values))
    return rows


def fmt(x, digits: int = 4) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def curve_label(t: Training, many_runs: bool) -> str:
    """A training's name in a plot legend: its method and seed, with its run when several are drawn."""
    label = t.method if t.seed is None else f"{t.method} s{t.seed}"
    return f"{t.run}:{label}" if many_runs else label


def source_files(evals: list[Evaluation], trainings: list[Training]) -> list[Path]:
    files = []
    for e in evals:
        files += [e.directory / "metrics.json", e.directory / "samples" / "predictions.jsonl"]
    files += [t.directory / "metrics.jsonl" for t in trainings]
    return files


def resolve_sources(cfg: RunConfig, runs: list[str]) -> list[Path]:
    """The run directories 08 reads: `--runs` patterns, or this run's directory."""
    if not runs:
        return [run_dir(cfg)]
    out = []
    for pattern in runs:
        hits = sorted(glob.glob(str(repo_path(pattern))))
        if not hits:
            raise StageError(f"--runs {pattern}: matches no directory")
        out += [Path(h) for h in hits]
    return out


def compare_settings(cfg: RunConfig, runs: list[str], resamples: int, across: list | None = None) -> dict:
    """What 08's output depends on, and so what its manifest hashes: the sources, every evaluation
    found in them, the bootstrap, the pairs across runs if any were named, and the equivalence margin
    if one is set. (A source that does
    not exist yet contributes no evaluations.)"""
    run_dirs = find_run_dirs([s for s in resolve_sources(cfg, runs) if s.is_dir()])
    return {"runs": runs, "evaluations": [rel(e) for e in evaluation_dirs(run_dirs)], "resamples": resamples,
            "seed": cfg.seed, **({"across": [list(pair) for pair in across]} if across else {}),
            **({"equivalence_margin": cfg.eval.equivalence_margin} if cfg.eval.equivalence_margin else {})}
