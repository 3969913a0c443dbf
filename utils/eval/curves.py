"""08's pass@k curves: the curves of sft_warmup and every arm, and where the warmup reaches each arm.

08 draws the curve of sft_warmup and every arm of a run (the mean over seeds with the lowest and
highest seed as a band) from the items' (c, n) counts (utils/eval/passk.py's estimator) and asks
where the warmup's curve reaches each arm's: the smallest k on the grid at which the seed-mean of
arm − warmup is ≤ 0, with a 95% interval from resampling the test items within each seed (the
seed-to-seed spread is shown beside it, seed by seed). Within a run it uses the evaluations sampled
deepest (a study's curve-pass seeds beside seeds with mean@k's samples only) and names the others
in the report.
"""
from __future__ import annotations

from dataclasses import dataclass

from utils.core.methods import SFT_WARMUP
from utils.eval.compare import fmt, method_key
from utils.eval.passk import curve, k_grid, pass_at_k

BOOTSTRAP_CHUNK = 1000  # resamples drawn at a time (bounds the (resamples × items × k) array)


@dataclass
class Crossing:
    """Where the warmup's curve reaches one arm's, in one run."""
    run: str
    method: str
    seeds: list
    ks: list[int]
    gap: list[float]  # seed-mean of arm − warmup at each k
    gap_ci: list[tuple[float, float]]  # its 95% item-bootstrap interval
    k: int | None  # the smallest k with gap ≤ 0; None: not by the largest k
    k_ci: tuple[int | None, int | None]  # 95% interval of that k (None: beyond the grid)
    per_seed: list[int | None]  # the same k seed by seed


def _matrix(e, ks: list[int]):
    """(qids, items × len(ks) array of pass@k) of an evaluation's counts."""
    import numpy as np

    qids = sorted(e.counts)
    return qids, np.array([[pass_at_k(e.counts[q][1], e.counts[q][0], k) for k in ks] for q in qids])


def _depth(e) -> int:
    """The fewest samples any of an evaluation's items has."""
    return min(n for _, n in e.counts.values())


def _sampled(evals) -> dict[str, dict[str, dict]]:
    """{run: {method: {seed: evaluation}}} for the evaluations with sampled counts, base left out
    (its curve is not the question)."""
    out: dict[str, dict[str, dict]] = {}
    for e in evals:
        if e.counts and e.method != "base":
            out.setdefault(e.run, {}).setdefault(e.method, {})[e.seed] = e
    return out


def runs_with_curves(evals) -> dict[str, dict[str, dict]]:
    """`_sampled`, keeping in each run only the evaluations sampled deepest: when seeds 1–3 had the
    curve pass (64 samples an item) and the later seeds only mean@k's 4, the curves come from the
    64-sample evaluations, rather than every curve stopping at k = 4. `left_out` names the rest."""
    out: dict[str, dict[str, dict]] = {}
    for run, methods in _sampled(evals).items():
        deepest = max(_depth(e) for by_seed in methods.values() for e in by_seed.values())
        kept = {m: {s: e for s, e in by_seed.items() if _depth(e) == deepest} for m, by_seed in methods.items()}
        out[run] = {m: by_seed for m, by_seed in kept.items() if by_seed}
    return out


def left_out(evals) -> list[str]:
    """One line per run naming the sampled evaluations `runs_with_curves` leaves out."""
    lines = []
    for run, methods in sorted(_sampled(evals).items()):
        depths = {(m, s): _depth(e) for m, by_seed in methods.items() for s, e in by_seed.items()}
        deepest = max(depths.values())
        short: dict[tuple[str, int], list] = {}
        for (m, s), n in depths.items():
            if n < deepest:
                short.setdefault((m, n), []).append(s)
        if short:
            parts = [f"{m} seed {', '.join(str(s) for s in sorted(seeds, key=lambda s: -1 if s is None else s))} "
                     f"({n})" for (m, n), seeds in sorted(short.items(), key=lambda kv: method_key(kv[0][0]))]
            lines.append(f"Run {run} leaves out the evaluations with fewer samples an item than its {deepest}: "
                         + "; ".join(parts) + ".")
    return lines


def run_grid(methods: dict[str, dict]) -> list[int]:
    """The run's k grid: up to the fewest samples any of its items has."""
    return k_grid(min(n for by_seed in methods.values() for e in by_seed.values() for _, n in e.counts.values()))


def _first_reached(gaps) -> int:
    """Index of the first column ≤ 0 in each row of `gaps` (len(row) where none is)."""
    import numpy as np

    reached = gaps <= 0
    return np.where(reached.any(axis=1), reached.argmax(axis=1), gaps.shape[1])


def crossing(run: str, method: str, arm: dict, warmup: dict, resamples: int, seed: int) -> Crossing | None:
    """The warmup's curve against one arm's on the seeds both have, items paired by id (None: no
    seed with an item both evaluated)."""
    import numpy as np

    seeds = sorted(set(arm) & set(warmup), key=lambda s: -1 if s is None else s)
    if not seeds:
        return None
    ks = run_grid({"a": {s: arm[s] for s in seeds}, "w": {s: warmup[s] for s in seeds}})
    diffs, kept = [], []
    for s in seeds:
        qa, pa = _matrix(arm[s], ks)
        qw, pw = _matrix(warmup[s], ks)
        common = sorted(set(qa) & set(qw))
        if not common:
            continue
        ia, iw = {q: i for i, q in enumerate(qa)}, {q: i for i, q in enumerate(qw)}
        diffs.append(pa[[ia[q] for q in common]] - pw[[iw[q] for q in common]])
        kept.append(s)
    if not diffs:
        return None
    gap = np.mean([d.mean(axis=0) for d in diffs], axis=0)
    rng = np.random.default_rng(seed)
    boot = []
    for start in range(0, resamples, BOOTSTRAP_CHUNK):
        b = min(BOOTSTRAP_CHUNK, resamples - start)
        boot.append(np.mean([d[rng.integers(0, len(d), size=(b, len(d)))].mean(axis=1) for d in diffs], axis=0))
    boot = np.concatenate(boot)
    firsts = _first_reached(boot)
    lo, hi = (int(np.quantile(firsts, q, method="inverted_cdf")) for q in (0.025, 0.975))
    at = lambda i: ks[i] if i < len(ks) else None  # noqa: E731
    per_seed = [at(int(_first_reached(d.mean(axis=0)[None])[0])) for d in diffs]
    return Crossing(run, method, kept, ks, [round(float(g), 6) for g in gap],
                    [(round(float(a), 6), round(float(b), 6)) for a, b in np.percentile(boot, [2.5, 97.5], axis=0).T],
                    at(int(_first_reached(gap[None])[0])), (at(lo), at(hi)), per_seed)


def crossings(evals, resamples: int, seed: int) -> list[Crossing]:
    """Every arm against its run's sft_warmup, where the run sampled both."""
    out = []
    for run, methods in sorted(runs_with_curves(evals).items()):
        if SFT_WARMUP not in methods:
            continue
        for method, arm in sorted(methods.items(), key=lambda kv: method_key(kv[0])):
            if method != SFT_WARMUP and (c := crossing(run, method, arm, methods[SFT_WARMUP], resamples, seed)):
                out.append(c)
    return out


def seed_curves(by_seed: dict, ks: list[int]) -> dict:
    """{seed: the evaluation's curve as a list over ks}."""
    return {s: list(curve(e.counts.values(), ks).values()) for s, e in by_seed.items()}


def _band(per_seed: dict) -> tuple[list[float], list[float], list[float]]:
    """(mean, lowest, highest) over seeds at each k."""
    cols = list(zip(*per_seed.values()))
    return [sum(c) / len(c) for c in cols], [min(c) for c in cols], [max(c) for c in cols]


def plot_pass_at_k(plt, evals, trainings, many_runs):
    """pass@k against k (log scale): each method's mean over seeds, a band from its lowest to its
    highest seed."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for run, methods in sorted(runs_with_curves(evals).items()):
        ks = run_grid(methods)
        for method, by_seed in sorted(methods.items(), key=lambda kv: method_key(kv[0])):
            mean, low, high = _band(seed_curves(by_seed, ks))
            label = f"{run}:{method}" if many_runs else method
            line, = ax.plot(ks, mean, marker=".", label=f"{label} ({len(by_seed)} seed(s))")
            ax.fill_between(ks, low, high, color=line.get_color(), alpha=0.15)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="k (samples per item)", ylabel="pass@k (unbiased, from n samples)", title="pass@k", ylim=(0, 1))
    if ax.lines:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no sampled evaluations (eval.samples, eval.curve_samples)", ha="center",
                transform=ax.transAxes)
    return "pass_at_k.png", fig


def _k(k: int | None, ks: list[int]) -> str:
    return f"> {ks[-1]}" if k is None else str(k)


def curve_section(evals, found: list[Crossing]) -> list[str]:
    """report.md's pass@k section: the curves' table per run, then where the warmup reaches each arm."""
    from utils.eval.frames import markdown

    import pandas as pd

    runs = runs_with_curves(evals)
    if not runs:
        return []
    lines = ["## pass@k curves", "",
             "Unbiased pass@k, 1 − C(n−c, k)/C(n, k) for an item with c fully correct samples of n, averaged "
             "over test items (utils/eval/passk.py). From each evaluation's curve pass (eval.curve_samples) "
             "where it has one, else its mean@k samples. Each cell: the mean over seeds (lowest–highest "
             "seed).", ""]
    if omitted := left_out(evals):
        lines += [" ".join(omitted), ""]
    for run, methods in sorted(runs.items()):
        ks = run_grid(methods)
        table = {"k": ks}
        for method, by_seed in sorted(methods.items(), key=lambda kv: method_key(kv[0])):
            mean, low, high = _band(seed_curves(by_seed, ks))
            table[f"{method} ({len(by_seed)})"] = [f"{fmt(m)} ({fmt(a)}–{fmt(b)})" if len(by_seed) > 1 else fmt(m)
                                                   for m, a, b in zip(mean, low, high)]
        lines += ([f"Run {run}:", ""] if len(runs) > 1 else []) + [markdown(pd.DataFrame(table, dtype=object)), ""]
    if found:
        lines += ["The gap is arm − sft_warmup in pass@k. "
                  "Where sft_warmup's curve reaches each arm's: the smallest k at which the seed-mean of "
                  "arm − warmup is ≤ 0, its 95% interval from resampling test items within each seed (08's "
                  "--resamples), and the same k seed by seed (the seed spread the interval "
                  "leaves out).", ""]
        rows = [{"run": c.run, "arm": c.method, "seeds": len(c.seeds),
                 "gap at k=1 (95% CI)": f"{c.gap[0]:+.4f} ({c.gap_ci[0][0]:+.4f}–{c.gap_ci[0][1]:+.4f})",
                 "gap at the largest k (95% CI)": f"k={c.ks[-1]}: {c.gap[-1]:+.4f} ({c.gap_ci[-1][0]:+.4f}–"
                                                  f"{c.gap_ci[-1][1]:+.4f})",
                 "warmup reaches arm at k": _k(c.k, c.ks),
                 "95% interval": f"{_k(c.k_ci[0], c.ks)} to {_k(c.k_ci[1], c.ks)}",
                 "per seed": ", ".join(_k(k, c.ks) for k in c.per_seed)} for c in found]
        lines += [markdown(pd.DataFrame(rows, dtype=object)), ""]
    return lines
