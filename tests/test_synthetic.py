"""The synthetic task and the pretraining corpus: deterministic, disjoint, arithmetically right."""
import json
import random
import re

from utils.data.arith import OperandRange, apply_op, is_heldout, is_task_question, make_problem, pretrain_text
from utils.core.schema import DataConfig
from utils.data.synthetic import generate_rows, write_dataset


def _eval_left_to_right(question: str) -> int:
    return eval(question)  # noqa: S307 - our own generated expressions: digits, + - * ( )


def test_problems_decompose_into_correct_steps():
    rng = random.Random(0)
    for _ in range(500):
        p = make_problem(rng, rng.randint(1, 4), ("+", "-", "*"), 50, 199)
        assert _eval_left_to_right(p.question) == p.answer
        value = None
        for task, result in p.steps:
            a, op, b = re.fullmatch(r"(\d+)([+\-*])(\d+)", task).groups()
            if value is not None:
                assert int(a) == value  # each step continues from the previous result
            assert apply_op(int(a), op, int(b)) == result
            assert 0 <= result <= 199
            value = result
        assert value == p.answer


def test_splits_are_deterministic_and_disjoint():
    cfg = DataConfig(n_train=300, n_val=50, n_test=80)
    a, b = generate_rows(cfg), generate_rows(cfg)
    assert a == b
    questions = {s: {r["question"] for r in rows} for s, rows in a.items()}
    assert {s: len(q) for s, q in questions.items()} == {"train": 300, "val": 50, "test": 80}
    assert not questions["train"] & questions["test"]
    assert not questions["train"] & questions["val"]
    assert not questions["val"] & questions["test"]
    other = generate_rows(DataConfig(n_train=300, n_val=50, n_test=80, seed=99))
    assert other["test"] != a["test"]


def test_difficulty_knob_sets_the_number_of_steps():
    rows = generate_rows(DataConfig(n_train=100, n_val=0, n_test=0, min_steps=3, max_steps=3))
    assert {len(r["steps"]) for r in rows["train"]} == {3}


def test_impossible_knobs_fail_clearly():
    import pytest
    with pytest.raises(ValueError, match="distinct problems"):
        generate_rows(DataConfig(n_train=500, n_val=0, n_test=0, min_steps=1, max_steps=1, operand_max=3))


def test_write_dataset_writes_files_and_manifest(tmp_path):
    out = tmp_path / "synthetic_arith"
    m = write_dataset(DataConfig(n_train=20, n_val=5, n_test=5), out)
    assert m["counts"] == {"train": 20, "val": 5, "test": 5}
    rows = [json.loads(line) for line in (out / "test.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and set(rows[0]) == {"id", "question", "answer", "steps"}
    assert not (tmp_path / "synthetic_arith.partial").exists()


def test_pretraining_text_never_shows_heldout_facts_nor_protocol_tags():
    text = pretrain_text(0, 5000, ("+", "-"), OperandRange())
    for tag in ("<think>", "<task>", "<answer>", "<result>", "</"):
        assert tag not in text  # raw arithmetic text: the characters of the protocol, never its tags
    # a left operand may be a negative running value ("80-90=-10, -10+5=-5")
    facts = re.findall(r"(?:^|(?<=[\s,]))(-?\d+) ?([+\-]) ?(\d+) ?[=?]", text, flags=re.M)
    words = {"plus": "+", "minus": "-"}
    facts += [(a, words[w], b) for a, w, b in re.findall(r"(\d+) (plus|minus) (\d+) is", text)]
    assert len(facts) > 3500  # three lines in four carry one or two +/- facts
    assert not any(is_heldout(int(a), op, int(b)) for a, op, b in facts)
    assert pretrain_text(0, 50, ("+", "-"), OperandRange()) == pretrain_text(0, 50, ("+", "-"), OperandRange())


def test_heldout_share_is_about_ten_percent():
    share = sum(is_heldout(a, "+", b) for a in range(200) for b in range(100)) / 20000
    assert 0.08 < share < 0.12


def test_task_questions_never_appear_in_pretraining_text():
    rows = generate_rows(DataConfig(n_train=300, n_val=50, n_test=80))
    assert all(is_task_question(r["question"]) for split in rows.values() for r in split)
    text = pretrain_text(0, 20000, ("+", "-"), OperandRange())
    worked = re.findall(r"^(?:[a-z ]+: )?(\d+(?:[+-]\d+)+): ", text, flags=re.M)
    assert len(worked) > 3000  # worked reductions are common...
    assert not any(is_task_question(q) for q in worked)  # ...but never of a task question
