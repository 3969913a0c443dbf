"""utils/eval/batch_mix.py (a study analysis) rebuilds each RL step's questions from the trainer's
stream and prices them with a per-length accuracy: the questions are the stream's, step after step,
and the mix's share of a run's accuracy is read as 08 reads the mechanism (first against last
tenth)."""
import json

import pytest

from utils.core.stream import Cursor, rl_question_key, take
from utils.eval import batch_mix


def _rows(n: int) -> list[dict]:
    return [{"id": f"q{i}", "meta": {"steps": [{}] * (1 + i % 3)}} for i in range(n)]


def test_steps_take_the_streams_questions_in_order():
    mod, rows = batch_mix, _rows(25)
    steps = [{"train/kept_groups": 4, "train/dropped_groups": 3}, {}, {"train/kept_groups": 2, "train/dropped_groups": 0}]
    got = mod.step_questions(rows, steps, seed=7, per_step=4)  # the middle step: no dynamic sampling
    cursor = Cursor()
    assert [[r["id"] for r in q] for q in got] == [[r["id"] for r in take(rows, n, rl_question_key(7), cursor)] for n in (7, 4, 2)]


def test_mix_accuracy_prices_each_question_by_its_gold_length():
    mod, rows = batch_mix, _rows(6)  # lengths 1, 2, 3, 1, 2, 3
    assert mod.mix_accuracy(rows, [0.9, 0.5, 0.1]) == pytest.approx(0.5)
    assert mod.mix_accuracy(rows[:1], [0.9, 0.5, 0.1]) == pytest.approx(0.9)
    with pytest.raises(SystemExit, match="q2 has 3 gold subtasks"):
        mod.mix_accuracy(rows, [0.9, 0.5])


def test_the_report_separates_the_mix_from_the_policy(tmp_path):
    """A run whose observed accuracy is the mix's plus a trend of 0.01 a step: correlation 1, and
    observed - mix is the trend's tenths (27 steps of 30 apart: +0.27)."""
    mod, rows = batch_mix, _rows(400)
    (tmp_path / "01_prepare_dataset").mkdir()
    (tmp_path / "01_prepare_dataset" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    by_length = [0.8, 0.4, 0.0]
    mix = [mod.mix_accuracy(q, by_length) for q in mod.step_questions(rows, [{}] * 30, seed=3, per_step=16)]
    out = tmp_path / "06_ablate_grpo_only" / "grpo"
    out.mkdir(parents=True)
    (out / "manifest.json").write_text(json.dumps({"config": {"seed": 3, "algorithm": {"rl": {
        "questions_per_step": 16, "min_subtasks": 0}}}}))
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": i + 1, "time/rollout": 1.0, "train/accuracy":
                                                           m + 0.01 * i}) + "\n" for i, m in enumerate(mix)))
    header, line = mod.report(tmp_path, by_length)
    assert header.split()[0] == "training" and line.split()[0] == "grpo"
    assert float(line.split()[1]) == pytest.approx(1.0, abs=0.005)
    assert float(line.split()[-1]) == pytest.approx(0.27, abs=0.0005)
