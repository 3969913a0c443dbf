"""The RL question pool and its stream: gold-length bounds (algorithm.rl.min_subtasks /
max_subtasks) and the stratified draw (algorithm.rl.stratify, utils/core/stream.py)."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from helpers import EVERY_QUESTION, make_trainer
from utils.core.loader import load_run_config
from utils.core.stages import StageError
from utils.core.stream import Cursor, epoch_order, rl_question_key, take
from utils.train.questions import gold_length, rl_questions, rl_strata


def _rows(lengths: list[int]) -> list[dict]:
    return [{"id": f"r{i}", "meta": {"steps": [{}] * n}} for i, n in enumerate(lengths)]


def test_the_plain_stream_is_the_seeded_shuffle():
    order = list(range(50))
    random.Random("k/3").shuffle(order)
    assert epoch_order(50, "k", 3) == order
    assert epoch_order(50, "k", 3, strata=None) == order


def test_a_stratified_epoch_mixes_each_label_in_proportion():
    strata = [1] * 40 + [2] * 35 + [3] * 25
    order = epoch_order(100, "k", 0, strata)
    assert sorted(order) == list(range(100))  # every item once
    plain = epoch_order(100, "k", 0)
    for label in (1, 2, 3):  # within a label, the plain shuffle's order
        assert [i for i in order if strata[i] == label] == [i for i in plain if strata[i] == label]
    share = Counter(strata)
    for w in (10, 16):
        for start in range(100 - w + 1):
            got = Counter(strata[i] for i in order[start:start + w])
            for label in (1, 2, 3):
                assert abs(got[label] - w * share[label] / 100) <= 2, (w, start, label, got)
    # the plain shuffle strays far from the shares somewhere: the check above can fail
    worst = max(abs(Counter(strata[i] for i in plain[s:s + 16])[1] - 6.4) for s in range(85))
    assert worst > 2
    assert epoch_order(100, "k", 1, strata) != order and epoch_order(100, "k", 0, strata) == order


def test_a_stratified_take_resumes_across_epochs():
    items = list(range(30))
    strata = [i % 3 for i in items]
    whole = take(items, 70, "q", Cursor(), strata=strata)
    cursor, parts = Cursor(), []
    for k in (16, 5, 9, 40):
        parts += take(items, k, "q", cursor, strata=strata)
    assert parts == whole and cursor == Cursor(epoch=2, position=10)
    assert Counter(strata[i] for i in whole[:30]) == {0: 10, 1: 10, 2: 10}
    with pytest.raises(ValueError, match="2 strata labels for 30 items"):
        take(items, 1, "q", Cursor(), strata=[0, 1])


def test_rl_questions_bound_the_gold_length(tmp_path):
    rows = _rows([1, 2, 3, 4, 5, 6]) + [{"id": "bare", "meta": {}}]
    path = tmp_path / "train.jsonl"

    def ids(*overrides):
        return [r["id"] for r in rl_questions(rows, load_run_config(overrides=[*EVERY_QUESTION, *overrides]), path)]
    assert ids() == [r["id"] for r in rows]  # 0 and 0: every row, in order
    assert ids("algorithm.rl.min_subtasks=4") == ["r3", "r4", "r5"]  # the bare row is left out
    assert ids("algorithm.rl.max_subtasks=2") == ["r0", "r1"]
    assert ids("algorithm.rl.min_subtasks=2", "algorithm.rl.max_subtasks=4") == ["r1", "r2", "r3"]
    with pytest.raises(StageError, match=r"train.jsonl: no row has a gold decomposition of 7 or more subtasks"):
        ids("algorithm.rl.min_subtasks=7")
    with pytest.raises(StageError, match="max_subtasks=2 is below algorithm.rl.min_subtasks=3"):
        ids("algorithm.rl.min_subtasks=3", "algorithm.rl.max_subtasks=2")
    # stratify needs every row's length: the bare row is named by file, row and field
    with pytest.raises(StageError, match=r"train.jsonl: row 7 \(id 'bare'\): field meta.steps is missing"):
        ids("algorithm.rl.stratify=true")
    assert ids("algorithm.rl.stratify=true", "algorithm.rl.min_subtasks=1") == [f"r{i}" for i in range(6)]
    assert rl_strata(rows[:6], path) == [1, 2, 3, 4, 5, 6] and gold_length(rows[6]) is None


def test_the_trainer_draws_the_stratified_stream(base_dir, tmp_path):
    cfg = load_run_config(algorithm="grpo", overrides=["algorithm.rl.stratify=true"])
    trainer = make_trainer(cfg, None, None, tmp_path, base_dir)
    assert trainer.strata == [gold_length(r) for r in trainer.rows] and set(trainer.strata) == {2, 3}
    key = rl_question_key(cfg.seed)
    expected = take(trainer.rows, 16, key, Cursor(), strata=trainer.strata)
    assert trainer.next_questions(16) == expected != take(trainer.rows, 16, key, Cursor())
    assert trainer.state.questions == Cursor(position=16)
    plain = make_trainer(load_run_config(algorithm="grpo", overrides=list(EVERY_QUESTION)), None, None,
                         tmp_path / "plain", base_dir)
    assert plain.strata is None and plain.next_questions(16) == take(plain.rows, 16, key, Cursor())


def test_the_default_regime_narrows_rl_questions_and_regime_d_does_not():
    rl = load_run_config(algorithm="red").algorithm.rl
    assert (rl.min_subtasks, rl.max_subtasks, rl.stratify, rl.questions_per_step, rl.lr_warmup_steps) == (2, 4, True, 32, 5)
    d = load_run_config(algorithm="red", overrides=["regime=regime_d"]).algorithm.rl
    assert (d.min_subtasks, d.max_subtasks, d.stratify, d.questions_per_step, d.lr_warmup_steps) == (0, 0, False, 16, 0)
