"""08's two readings of a study (utils/eval/mechanism.py) on hand-made training logs and evaluations:
whether RED's mechanism was exercised (first against last tenth of the steps), and whether a gain
over the warmup is sharpening or new capability."""
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from utils.eval.compare import Evaluation, Training  # noqa: E402
from utils.eval.mechanism import gain_kinds, mechanism_section, plot_mechanism, red_mechanism  # noqa: E402


def _training(method, acc, weight, seed=1):
    history = [{"step": i + 1, "train/accuracy": a, "red/final_weight": w, "red/entropy_weight": 1.0,
                "red/accuracy_factor": w} for i, (a, w) in enumerate(zip(acc, weight))]
    return Training("study", seed, method, Path("."), history)


def test_a_red_run_whose_accuracy_and_weight_trend_is_exercised():
    # 20 steps: a tenth is 2 steps; accuracy 0.2 -> 0.5, weight 4 -> 1.5 (w_acc falls as accuracy rises)
    acc = [0.2, 0.2] + [0.35] * 16 + [0.5, 0.5]
    weight = [4.0, 4.0] + [2.5] * 16 + [1.5, 1.5]
    (row,) = red_mechanism([_training("red", acc, weight)])
    assert row["acc_first"] == pytest.approx(0.2) and row["acc_last"] == pytest.approx(0.5)
    assert row["weight_ratio"] == pytest.approx(4.0 / 1.5) and row["verdict"] == "exercised"


def test_a_flat_red_run_is_idle_and_says_what_fell_short():
    acc = [0.40, 0.42, 0.5, 0.38, 0.44, 0.46, 0.41, 0.45, 0.50, 0.52]  # one-step tenths: 0.40 -> 0.52
    weight = [1.3] * 9 + [1.1]
    (row,) = red_mechanism([_training("red", acc, weight)])
    assert row["verdict"].startswith("idle: ")
    assert "accuracy moved +0.120 (needs ±0.2)" in row["verdict"] and "weight ratio 1.18" in row["verdict"]
    # a falling accuracy counts as movement too, and only the weight then falls short
    (row,) = red_mechanism([_training("red", [0.6] + [0.5] * 8 + [0.3], weight)])
    assert row["verdict"] == "idle: weight ratio 1.18 (needs ≥ 2)"
    assert red_mechanism([_training("fixed_sft", acc, weight)]) == []  # red's check only
    assert red_mechanism([_training("red", [0.5], [1.0])]) == []  # one step has no trend


def _eval(method, seed, greedy, mean, passk, k=4):
    metrics = {"accuracy": greedy, f"mean@{k}": mean, f"pass@{k}": passk, "samples": k}
    return Evaluation("study", seed, method, Path("."), metrics, {}, {}, "mean_at_k")


def test_gains_are_sharpening_or_new_capability_over_the_seeds_both_have():
    evals = [_eval("sft_warmup", 1, 0.60, 0.40, 0.70), _eval("sft_warmup", 2, 0.50, 0.30, 0.60),
             _eval("grpo", 1, 0.61, 0.50, 0.71), _eval("grpo", 2, 0.51, 0.40, 0.60),  # mean@k +0.10 alone
             _eval("red", 1, 0.70, 0.46, 0.70), _eval("red", 2, 0.56, 0.36, 0.60),  # greedy +0.08 beside +0.06
             _eval("sft", 1, 0.60, 0.39, 0.70), _eval("sft", 2, 0.50, 0.30, 0.60),
             _eval("fixed_sft", 3, 0.9, 0.9, 0.9)]  # no warmup of seed 3: nothing to compare
    rows = {g["method"]: g for g in gain_kinds(evals)}
    assert set(rows) == {"grpo", "red", "sft"}
    assert rows["grpo"]["kind"] == "sharpening" and rows["grpo"]["d_mean"] == pytest.approx(0.10)
    assert rows["grpo"]["d_greedy"] == pytest.approx(0.01) and rows["grpo"]["seeds"] == 2
    assert rows["red"]["kind"] == "new capability" and rows["red"]["d_greedy"] == pytest.approx(0.08)
    assert rows["sft"]["kind"] == "no gain on mean@k"


def test_the_report_section_and_plot(tmp_path):
    trainings = [_training("red", [0.2] * 5 + [0.5] * 5, [4.0] * 5 + [1.0] * 5),
                 _training("red", [0.4] * 10, [1.2] * 10, seed=2)]
    evals = [_eval("sft_warmup", 1, 0.6, 0.4, 0.7), _eval("red", 1, 0.6, 0.5, 0.7)]
    text = "\n".join(mechanism_section(evals, trainings))
    assert "### Sharpening or new capability" in text and "| study | red | 1 | 0.0000 | 0.1000 | 0.0000 | sharpening |" in text
    assert "### RED's mechanism" in text
    assert "| study | 1 | 10 | 0.200 | 0.500 | 4.000 | 1.000 | 4.00 | 1.000 | 1.000 | 4.000 | 1.000 | exercised |" in text
    assert "| study | 2 | 10 | 0.400 | 0.400 | 1.200 | 1.200 | 1.00 | 1.000 | 1.000 | 1.200 | 1.200 | idle: accuracy" in text
    assert mechanism_section([], []) == []
    name, fig = plot_mechanism(plt, evals, trainings, True)
    fig.savefig(tmp_path / name)
    assert name == "red_mechanism.png" and (tmp_path / name).stat().st_size > 0
    assert len(fig.axes[0].lines) == 6  # per run: the curve and its two tenth bars
