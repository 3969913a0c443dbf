"""The plots of `08_compare_runs.py`'s report (utils/eval/report.py links them): reward, accuracy,
RED's weights, the mechanism (utils/eval/mechanism.py), time per phase and pass@k (utils/eval/curves.py),
each a PNG written atomically into the plots folder.
"""
from __future__ import annotations

import io
from pathlib import Path

from utils.core.files import atomic_write_bytes
from utils.eval import frames
from utils.eval.compare import PHASES, Evaluation, Training, curve_label, method_key
from utils.eval.curves import plot_pass_at_k
from utils.eval.mechanism import plot_mechanism


def _save(fig, out: Path, name: str, made: list[str]) -> None:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(out / name, buf.getvalue())
    made.append(name)


def plot_all(evals: list[Evaluation], trainings: list[Training], out: Path) -> list[str]:
    """Draw every plot into `out`; returns the file names written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    many_runs = len({e.run for e in evals}) > 1
    made: list[str] = []
    for plot in (_plot_reward, _plot_accuracy, _plot_red, plot_mechanism, _plot_phases, plot_pass_at_k):
        name, fig = plot(plt, evals, trainings, many_runs)
        _save(fig, out, name, made)
    return made


def _plot_reward(plt, evals, trainings, many_runs):
    fig, ax = plt.subplots(figsize=(7, 4))
    for t in trainings:
        pts = [(h["step"], h["critic/rewards/mean"]) for h in t.history if "critic/rewards/mean" in h]
        if pts:
            ax.plot(*zip(*pts), marker=".", label=curve_label(t, many_runs))
    ax.set(xlabel="RL step", ylabel="mean episode reward (critic/rewards/mean)", title="Training reward")
    if ax.lines:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no RL training curves in these runs", ha="center", transform=ax.transAxes)
    return "reward_vs_step.png", fig


def _plot_accuracy(plt, evals, trainings, many_runs):
    fig, ax = plt.subplots(figsize=(7, 4))
    ordered = sorted(evals, key=lambda e: (e.run, method_key(e.method), e.seed or 0))
    labels, accs, errs = [], [], [[], []]
    for e in ordered:
        lo, hi = e.metrics["accuracy_ci95"]
        acc = e.metrics["accuracy"]
        labels.append(curve_label(Training(e.run, e.seed, e.method, e.directory, []), many_runs))
        accs.append(acc)
        errs[0].append(max(acc - lo, 0.0))
        errs[1].append(max(hi - acc, 0.0))
    ax.bar(range(len(accs)), accs, yerr=errs, capsize=4, color="tab:blue")
    ax.set_xticks(range(len(accs)), labels, rotation=30, ha="right", fontsize=8)
    ax.set(ylabel="test accuracy (bootstrap 95% CI)", title="Greedy test accuracy", ylim=(0, 1))
    return "test_accuracy.png", fig


def _plot_red(plt, evals, trainings, many_runs):
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for t in trainings:
        lab = curve_label(t, many_runs)
        for key, style in (("red/final_weight", "-"), ("red/entropy_weight", "--"), ("red/accuracy_factor", ":")):
            pts = [(h["step"], h[key]) for h in t.history if key in h]
            if pts:
                ax1.plot(*zip(*pts), style, label=f"{lab} {key.split('/')[1]}")
        for key, style in (("actor/rl_entropy", "-"), ("actor/sft_entropy", "--")):
            pts = [(h["step"], h[key]) for h in t.history if key in h]
            if pts:
                ax2.plot(*zip(*pts), style, label=f"{lab} {key.split('/')[1]}")
    ax1.set(xlabel="step", ylabel="weight", title="RED weights")
    ax2.set(xlabel="step", ylabel="nats/token", title="Token entropy: RL vs SFT tokens")
    for ax in (ax1, ax2):
        if ax.lines:
            ax.legend(fontsize=7)
    return "red_dynamics.png", fig


def _plot_phases(plt, evals, trainings, many_runs):
    fig, ax = plt.subplots(figsize=(7, 4))
    names, bottoms = [curve_label(t, many_runs) for t in trainings], [0.0] * len(trainings)
    per_step = frames.trainings(trainings)
    for phase in PHASES:
        vals = list(per_step[f"{phase.split('/')[1]} s/step"]) if trainings else []
        ax.bar(range(len(trainings)), vals, bottom=bottoms, label=phase.split("/")[1])
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    ax.set_xticks(range(len(trainings)), names, rotation=30, ha="right", fontsize=8)
    ax.set(ylabel="seconds per step (mean)", title="Time per phase")
    if trainings:
        ax.legend(fontsize=8)
    return "time_per_phase.png", fig


# --------------------------------------------------------------------------------------- report
