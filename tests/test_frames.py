"""08's tables on pandas (utils/eval/frames.py) on hand-made evaluations: row order, cells exactly
metrics.json's numbers, fields an evaluation lacks shown as "—", the optional sections only where
their fields exist, and the across-seed table from the per-seed rows."""
import csv
import io
from pathlib import Path

import pytest

from utils.eval.compare import Evaluation
from utils.eval.frames import across_seeds, evaluations, summary_csv
from utils.eval.report import render_report


def _eval(run, seed, method, accuracy, **extra):
    metrics = {"checkpoint": method, "n": 20, "accuracy": accuracy, "accuracy_ci95": [accuracy - 0.1, accuracy + 0.1],
               "format": 1.0, "answered": 0.95, "reward": accuracy, "turns": 3.25, "subtasks": 2.5,
               "tokens_planner": 101.25, "tokens_executor": 40.0, **extra}
    return Evaluation(run, seed, method, Path("outputs") / run / method, metrics, {}, {})


EVALS = [_eval("b", None, "red", 0.5),
         _eval("a", 2, "red", 0.625, accuracy_by_gold_subtasks={"1": 1.0, "10": 0.25}),
         _eval("a", 1, "sft_warmup", 0.375, accuracy_by_gold_subtasks={"2": 0.5}),
         _eval("a", 1, "red", 0.75, searches_per_subtask=1.5, retrieval_hit_rate=0.8, accuracy_hit=0.9)]


def test_summary_csv_orders_by_run_seed_method_and_keeps_the_numbers():
    rows = list(csv.DictReader(io.StringIO(summary_csv(EVALS))))
    assert [(r["run"], r["seed"], r["method"]) for r in rows] == [("a", "1", "red"), ("a", "1", "sft_warmup"),
                                                                   ("a", "2", "red"), ("b", "", "red")]
    assert rows[0]["accuracy"] == "0.75" and rows[0]["ci95_low"] == "0.65" and rows[0]["ci95_high"] == "0.85"
    assert rows[3]["tokens_planner"] == "101.25" and rows[3]["source"] == "outputs/b/red/metrics.json"
    assert summary_csv([]).splitlines() == [",".join(csv.DictReader(io.StringIO(summary_csv(EVALS))).fieldnames)]


def test_the_report_tables_come_from_the_frame_in_registry_order():
    df = evaluations(EVALS)
    assert list(zip(df["run"], df["method"], df["seed"])) == [("a", "red", 1), ("a", "red", 2), ("a", "sft_warmup", 1),
                                                              ("b", "red", None)]
    assert df["searches_per_subtask"].tolist() == [1.5, None, None, None]  # absent is None, never NaN
    report = render_report(EVALS, [], [], [], [], 100)
    assert "| a | 1 | red | 20 | 0.7500 | 0.6500–0.8500 | 1.0000 | 0.9500 | 3.25 | 2.50 | 101.2 | 40.0 |" in report
    assert "| b | — | red | 20 | 0.5000 |" in report
    length = report.split("### By gold decomposition length")[1].split("###")[0]
    assert "| run | seed | method | 1 subtasks | 2 subtasks | 10 subtasks |" in length  # numeric order, not text
    assert "| a | 2 | red | 1.0000 | — | 0.2500 |" in length and "| b |" not in length
    search = report.split("### Search")[1].split("###")[0]
    assert "| a | 1 | red | 1.50 | 0.8000 | 0.9000 | — |" in search and "| a | 2 |" not in search
    assert "### Sampled at the rollout temperature" not in report  # no evaluation sampled


def test_across_seeds_needs_two_seeds_somewhere_and_takes_each_groups_own():
    seeds = across_seeds(evaluations(EVALS))
    assert list(zip(seeds["run"], seeds["method"], seeds["seeds"])) == [("a", "red", 2), ("a", "sft_warmup", 1),
                                                                         ("b", "red", 1)]
    red = seeds.iloc[0]
    assert red["mean accuracy"] == pytest.approx(0.6875) and (red["min"], red["max"]) == (0.625, 0.75)
    assert seeds.iloc[1]["95% CI"] == "—"  # one seed: no interval
    assert across_seeds(evaluations(EVALS[:1])).empty


def test_training_and_paired_tables_come_from_their_frames():
    from utils.eval.compare import Training
    from utils.eval.frames import tests, trainings

    history = [{"critic/rewards/mean": 0.25, "train/accuracy": 0.125, "time/rollout": 2.0},
               {"critic/rewards/mean": 0.5, "answer_f1/mean": 0.375, "time/rollout": 4.0, "time/update": 1.0}]
    runs = [Training("a", 1, "red", Path("r"), history, {"wall_seconds": 12.25}),
            Training("a", None, "sft", Path("s"), [{"loss": 1.0}], {})]
    df = trainings(runs)
    assert df.loc[0, ["steps", "reward first", "reward last", "train acc first", "train acc last"]].tolist() == \
        [2, 0.25, 0.5, 0.125, 0.375]  # an old run's last step logged answer_f1/mean instead
    assert (df.loc[0, "rollout s/step"], df.loc[0, "update s/step"], df.loc[0, "scoring s/step"]) == (3.0, 1.0, 0.0)
    assert df.loc[1, ["reward first", "wall s"]].tolist() == [None, None]  # no RL steps, no manifest figure
    found = [{"run": "a", "family": "red", "a": "red", "b": "grpo", "seeds": 3, "n": 600, "diff": 0.0125,
              "ci95_low": -0.01, "ci95_high": 0.035, "item_ci95_low": -0.02, "item_ci95_high": 0.04, "mde": 0.05,
              "p_value": 0.00002, "test": "paired t over seeds", "verdict": "no evidence either way"}]
    assert tests(found)["p_value"].tolist() == [0.00002] and tests([]).empty
    report = render_report(EVALS, runs, found, [], [], 100)
    assert "| a | 1 | red | 2 | 0.250 | 0.500 | 0.125 | 0.375 | 12.2 | 3.00 | 0.00 | 0.00 | 1.00 | 0.00 |" in report
    assert "| a | — | sft | 1 | — | — | — | — | — | 0.00 |" in report
    assert ("| a | red − grpo | 3 | 600 | 0.0125 | -0.0100–0.0350 | -0.0200–0.0400 | 0.0500 | < 0.0001 | — | "
            "no evidence either way |") in report  # no p_holm: "—"
