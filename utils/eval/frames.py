"""08's evaluation tables as pandas DataFrames: one frame, and the tables the report derives from it.

`evaluations()` puts every `Evaluation` (utils/eval/compare.py) in one DataFrame, one row per
(run, seed, method) with the fields of its metrics.json as columns, in report order: run, then the
registry's method order, then seed. summary.csv is a column selection of it; the report's per-seed
tables select and format columns; the across-seed table groups it by (run, method); the gain table
joins each method's rows to its run's sft_warmup rows on (run, seed). `markdown()` renders any of
them. The numbers are metrics.json's, never recomputed: only means over seeds are computed here.
"""
from __future__ import annotations

from typing import Callable

import pandas as pd

from utils.core.files import rel
from utils.eval.compare import PHASES, SUMMARY_FIELDS, Evaluation, Training, fmt, method_key
from utils.eval.stats import mean_ci_across_seeds

ORDER = ["run", "method", "seed"]  # the report's row order


def _ordered(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Rows sorted by `by` (stable): methods in registry order, a missing seed as 0."""
    keys = {"method": lambda s: s.map(method_key), "seed": lambda s: s.map(lambda x: 0 if x is None else x)}
    return df.sort_values(by, key=lambda s: keys.get(s.name, lambda v: v)(s), kind="stable").reset_index(drop=True)


def evaluations(evals: list[Evaluation], by: list[str] = ORDER) -> pd.DataFrame:
    """One row per evaluation: run, seed, method, source (its metrics.json) and every metrics.json
    field (a field an evaluation lacks is None, never NaN: cells stay as metrics.json has them)."""
    rows = [{"run": e.run, "seed": e.seed, "method": e.method, "source": rel(e.directory / "metrics.json"),
             **e.metrics} for e in evals]
    columns = list(dict.fromkeys(k for r in rows for k in r)) or ["run", "seed", "method", "source"]
    df = pd.DataFrame([[r.get(c) for c in columns] for r in rows], columns=columns, dtype=object)
    return _ordered(df, by)


def sampled(df: pd.DataFrame) -> pd.DataFrame:
    """The evaluations 07 sampled (eval.samples = k > 0), with each one's `mean@k` and `pass@k` (its
    metrics.json's `mean@<k>` and `pass@<k>`) as two columns of their own."""
    have = df[df["samples"].map(bool)].copy() if "samples" in df else df.iloc[:0].copy()
    have["mean@k"] = [r[f"mean@{r['samples']}"] for _, r in have.iterrows()]
    have["pass@k"] = [r[f"pass@{r['samples']}"] for _, r in have.iterrows()]
    return have


def select(df: pd.DataFrame, names: dict[str, str]) -> pd.DataFrame:
    """Columns `names` (field -> header) of `df`, renamed; a field no row has is a column of None."""
    out = pd.DataFrame({old: df[old] if old in df else [None] * len(df) for old in names}, index=df.index,
                       dtype=object)
    out.columns = list(names.values())  # two fields may share a header ("last")
    return out


def summary_csv(evals: list[Evaluation]) -> str:
    """summary.csv: one row per run, seed and method (ordered so), the numbers exactly as in metrics.json."""
    df = evaluations(evals, by=["run", "seed", "method"])
    if not df.empty:
        df[["ci95_low", "ci95_high"]] = pd.DataFrame(df["accuracy_ci95"].tolist(), dtype=object)
    return df.reindex(columns=list(SUMMARY_FIELDS)).to_csv(index=False, lineterminator="\n")


def markdown(df: pd.DataFrame, formats: dict[str, Callable] | None = None) -> str:
    """A markdown table of `df`, a column's cells passed through formats[column] (else `fmt`)."""
    formats = formats or {}
    cells = [[formats.get(c, fmt)(v) for c, v in zip(df.columns, row)] for row in df.itertuples(index=False)]
    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in cells])


def ci(pair) -> str:
    """A [low, high] cell as "low–high"."""
    return f"{fmt(pair[0])}–{fmt(pair[1])}"


def across_seeds(df: pd.DataFrame) -> pd.DataFrame:
    """Per (run, method) with more than one seed anywhere: the mean of its per-seed accuracies with a
    t-interval over seeds (clipped to [0, 1], where accuracy lives), min and max; empty when every
    (run, method) has one seed."""
    groups = df.groupby(["run", "method"], sort=False)["accuracy"].agg(list)
    if groups.map(len).max() <= 1:
        return pd.DataFrame()
    rows = []
    for (run, method), accs in groups.items():
        mean, lo, hi = mean_ci_across_seeds(accs)
        rows.append({"run": run, "method": method, "seeds": len(accs), "mean accuracy": mean,
                     "95% CI": f"{fmt(max(lo, 0.0))}–{fmt(min(hi, 1.0))}" if lo is not None else "—",
                     "min": min(accs), "max": max(accs)})
    return _ordered(pd.DataFrame(rows, dtype=object), ["run", "method"])



def tests(found: list[dict]) -> pd.DataFrame:
    """The paired tests (utils/eval/paired.py), one row each, cells as computed (None stays None)."""
    columns = list(dict.fromkeys(k for t in found for k in t)) or ["run", "family", "a", "b"]
    return pd.DataFrame([[t.get(c) for c in columns] for t in found], columns=columns, dtype=object)


def _train_accuracy(metrics: dict) -> float | None:
    """A step's share of fully correct rollouts; runs from before `train/accuracy` logged the mean
    answer score instead (the same on exact-match scorers)."""
    return metrics.get("train/accuracy", metrics.get("answer_f1/mean"))


def trainings(found: list[Training]) -> pd.DataFrame:
    """One row per trainer run: its length, first and last RL step's reward and batch accuracy
    (None without RL steps), wall time and mean seconds per step of each phase (0.0 if never logged)."""
    rows = []
    for t in found:
        rl = [h for h in t.history if "critic/rewards/mean" in h]
        row = {"run": t.run, "seed": t.seed, "method": t.method, "steps": len(t.history),
               "reward first": rl[0]["critic/rewards/mean"] if rl else None,
               "reward last": rl[-1]["critic/rewards/mean"] if rl else None,
               "train acc first": _train_accuracy(rl[0]) if rl else None,
               "train acc last": _train_accuracy(rl[-1]) if rl else None,
               "wall s": t.manifest.get("wall_seconds") if t.manifest else None}
        for phase in PHASES:
            vals = [h[phase] for h in t.history if phase in h]
            row[f"{phase.split('/')[1]} s/step"] = sum(vals) / len(vals) if vals else 0.0
        rows.append(row)
    return pd.DataFrame(rows, dtype=object)
