"""Is RED's mechanism exercised, and is a gain sharpening or new capability? Two checks of 08's report.

RED's SFT weight is w_entropy · G^(1 − 2·batch_accuracy) (utils/train/red.py). It can only make red
differ from fixed_sft if batch accuracy moves through the run, and the weight with it. The check
compares the first tenth of a red run's steps with its last tenth (at least one step each):
- mean sampled batch accuracy (`train/accuracy`) must differ by at least ACCURACY_SHIFT;
- mean `red/final_weight` must differ by a factor of at least WEIGHT_RATIO, either way.
Both hold: "exercised". Otherwise: "idle", naming what fell short. A tenth, not one step, since a
step's accuracy swings on its own (about ±0.1 over 16 questions).

A trained method's gain over the SFT warmup (the mean over the seeds both have) is called
*sharpening* when mean@k rose and neither greedy accuracy nor pass@k rose by half as much, and
*new capability* when greedy or pass@k rose by at least half of mean@k's rise.
"""
from __future__ import annotations

import math
from statistics import fmean

import pandas as pd

from utils.core.methods import METHODS, SFT_WARMUP
from utils.eval.compare import curve_label, fmt
from utils.eval.frames import evaluations, markdown, sampled, select

ACCURACY_SHIFT = 0.2
WEIGHT_RATIO = 2.0
MECHANISM_METHODS = ("red",)


def _tenth(n: int) -> int:
    """Steps in a tenth of an n-step run (at least one)."""
    return max(1, round(n / 10))


def first_last_tenths(values: list[float]) -> tuple[float, float]:
    k = _tenth(len(values))
    return fmean(values[:k]), fmean(values[-k:])


def red_mechanism(trainings) -> list[dict]:
    """One row per red training with both series logged: the two tenths' means and the verdict."""
    rows = []
    for t in trainings:
        if t.method not in MECHANISM_METHODS:
            continue
        steps = [h for h in t.history if "red/final_weight" in h and "train/accuracy" in h]
        if len(steps) < 2:
            continue
        acc0, acc1 = first_last_tenths([h["train/accuracy"] for h in steps])
        w0, w1 = first_last_tenths([h["red/final_weight"] for h in steps])
        ratio = max(w0, w1) / min(w0, w1) if min(w0, w1) > 0 else math.inf
        short = ([f"accuracy moved {acc1 - acc0:+.3f} (needs ±{ACCURACY_SHIFT})"] if abs(acc1 - acc0) < ACCURACY_SHIFT
                 else []) + ([f"weight ratio {ratio:.2f} (needs ≥ {WEIGHT_RATIO:g})"] if ratio < WEIGHT_RATIO else [])
        factors = {f"{name}_{end}": v
                   for name, key in (("w_entropy", "red/entropy_weight"), ("w_acc", "red/accuracy_factor"))
                   for end, v in zip(("first", "last"), first_last_tenths([h.get(key, math.nan) for h in steps]))}
        rows.append({"run": t.run, "seed": t.seed, "method": t.method, "steps": len(steps), "acc_first": acc0,
                     "acc_last": acc1, "weight_first": w0, "weight_last": w1, "weight_ratio": ratio, **factors,
                     "verdict": "exercised" if not short else "idle: " + "; ".join(short)})
    return rows


def gain_kinds(evals) -> list[dict]:
    """Per run and trained method evaluated with samples: the mean over the seeds it shares with its
    run's sft_warmup of its greedy, mean@k and pass@k minus the warmup's (each method's rows joined to
    the warmup's on run and seed), and the kind of gain."""
    have = sampled(evaluations(evals))
    if have.empty:
        return []
    have = pd.DataFrame({"run": have["run"], "method": have["method"], "seed": have["seed"],
                         "greedy": have["accuracy"], "mean": have["mean@k"], "pass": have["pass@k"]})
    warm = have[have["method"] == SFT_WARMUP].drop(columns="method")
    joined = have[have["method"].isin(list(METHODS))].merge(warm, on=["run", "seed"], suffixes=("", "_w"))
    rows = []
    for (run, method), g in sorted(joined.groupby(["run", "method"]), key=lambda kv: kv[0]):
        d = [fmean(g[c] - g[f"{c}_w"]) for c in ("greedy", "mean", "pass")]
        if d[1] <= 0:
            kind = "no gain on mean@k"
        elif max(d[0], d[2]) >= d[1] / 2:
            kind = "new capability"
        else:
            kind = "sharpening"
        rows.append({"run": run, "method": method, "seeds": len(g), "d_greedy": d[0], "d_mean": d[1],
                     "d_pass": d[2], "kind": kind})
    return rows


def plot_mechanism(plt, evals, trainings, many_runs):  # noqa: ARG001 - evals: the plot interface of report.py
    """Sampled batch accuracy and red's final weight per step, each red run's tenths marked."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for t in trainings:
        if t.method not in MECHANISM_METHODS:
            continue
        lab = curve_label(t, many_runs)
        for ax, key in ((ax1, "train/accuracy"), (ax2, "red/final_weight")):
            pts = [(h["step"], h[key]) for h in t.history if key in h]
            if len(pts) < 2:
                continue
            (line,) = ax.plot(*zip(*pts), alpha=0.5, label=lab)
            k = _tenth(len(pts))
            first, last = first_last_tenths([v for _, v in pts])
            ax.plot([pts[0][0], pts[k - 1][0]], [first] * 2, color=line.get_color(), linewidth=3)
            ax.plot([pts[-k][0], pts[-1][0]], [last] * 2, color=line.get_color(), linewidth=3)
    ax1.set(xlabel="step", ylabel="share of correct episodes", title="Sampled batch accuracy (bars: first/last tenth)")
    ax2.set(xlabel="step", ylabel="w_entropy · w_acc", title="RED's final SFT weight (bars: first/last tenth)")
    for ax in (ax1, ax2):
        if ax.lines:
            ax.legend(fontsize=7)
    return "red_mechanism.png", fig


_GAIN_COLUMNS = {"run": "run", "method": "method", "seeds": "seeds", "d_greedy": "Δ greedy", "d_mean": "Δ mean@k",
                 "d_pass": "Δ pass@k", "kind": "kind"}
_MECH_COLUMNS = {"run": "run", "seed": "seed", "steps": "steps", "acc_first": "accuracy first", "acc_last": "last",
                 "weight_first": "weight first", "weight_last": "last", "weight_ratio": "ratio",
                 "w_entropy_first": "w_entropy first", "w_entropy_last": "last", "w_acc_first": "w_acc first",
                 "w_acc_last": "last", "verdict": "verdict"}


def _3(x) -> str:
    return fmt(x, 3)


def mechanism_section(evals, trainings) -> list[str]:
    """The report's section: the gain kinds, then RED's mechanism check; empty if neither applies."""
    gains, mech = gain_kinds(evals), red_mechanism(trainings)
    lines = []
    if gains:
        lines += ["### Sharpening or new capability", "",
                  "Each method minus the SFT warmup, mean over the seeds both have. Sharpening: mean@k up, greedy and "
                  "pass@k up by less than half as much; new capability: greedy or pass@k up by at least half of it.", "",
                  markdown(select(pd.DataFrame(gains, dtype=object), _GAIN_COLUMNS)), ""]
    if mech:
        lines += ["### RED's mechanism", "",
                  f"First against last tenth of each red run's steps: sampled batch accuracy must move by at least "
                  f"{ACCURACY_SHIFT} and red's final SFT weight by a factor of at least {WEIGHT_RATIO:g}, or the "
                  "mechanism was idle and red could not differ from a fixed weight for its own reasons "
                  "(plots/red_mechanism.png). The weight is w_entropy · w_acc: the two factors' tenths show which "
                  "one moved, and whether one cancelled the other.", "",
                  markdown(select(pd.DataFrame(mech, dtype=object), _MECH_COLUMNS),
                           {"accuracy first": _3, "last": _3, "weight first": _3, "ratio": lambda x: fmt(x, 2),
                            "w_entropy first": _3, "w_acc first": _3}), ""]
    return lines

