"""The numeric scorer with math-verify behind it (utils/reward/scorers.py score_numeric,
utils/reward/verify.py): a bare number scores as it did before, every other answer span is
math-verify's; where the two readings disagree, each case says which is right and why; a hostile
answer is cut off at the time limit and the next check still works, from a thread too."""
import threading

import pytest

from utils.reward.fuzz import HOSTILE_MATH
from utils.reward.scorers import is_bare_number, score_numeric
from utils.reward.verify import verify_equal


@pytest.mark.parametrize("pred, gold", [
    ("18", "18"), ("$18", "18"), ("1,234", "1234"), ("-3.50", "-3.5"), ("1/2", "0.5"), ("3.2e3", "3200"),
    ("12%", "12"), ("\u22123", "-3"), ("19.", "19"), ("\\boxed{13}", "13"), ("#### 48", "48"), ("the answer is 7", "7"),
    ("3.3333", "10/3"),  # within the configured relative tolerance (1e-4), as before
])
def test_a_right_bare_number_scores_as_before(pred, gold):
    score, info = score_numeric(pred, [gold])
    assert score == 1.0 and info["checked_by"] == "number"


@pytest.mark.parametrize("pred, gold, score, why", [
    # the first number of the span used to decide; math-verify reads what the answer ends on
    ("The total is 3 + 4 = 7", "7", 1.0, "worked arithmetic ending in its result: the result is the answer"),
    ("12 apples and 5 pears", "12", 0.0, "two numbers: the last is the one stated, as GSM8K's answers end"),
    ("5, 6", "5", 0.0, "a list is not the number 5"),
    ("40 minutes", "40", 1.0, "a number with its unit (the first number was right too)"),
    ("$2^{3}$", "8", 1.0, "LaTeX evaluates: 2^3 is 8 (the first number read 2)"),
    ("$\\sqrt{16}$", "4", 1.0, "the square root of 16 is 4 (the first number read 16)"),
    ("x = \\frac{3}{4}", "0.75", 1.0, "an equation's right side"),
])
def test_where_the_first_number_and_math_verify_disagree_math_verify_is_right(pred, gold, score, why):
    got, info = score_numeric(pred, [gold])
    assert (got, info["checked_by"]) == (score, "math_verify"), why


def test_bare_numbers_are_told_apart_from_free_text():
    assert all(map(is_bare_number, ["18", " $1,234 ", "12%", "-3.50", "1/2", "3.2e3", "7."]))
    assert not any(map(is_bare_number, ["7 apples", "3 + 4", "x = 5", "$2^{3}$", "", "five"]))


def test_a_hostile_answer_is_cut_off_at_the_limit_and_the_next_check_still_works():
    score, info = score_numeric(HOSTILE_MATH[0], ["5"])  # $9^{9^{9^{9}}}$: one C-level power no signal interrupts
    assert score == 0.0 and info.get("timed_out") is True
    assert score_numeric("so it is 7 in all", ["7"])[0] == 1.0  # a fresh child after the kill
    results = []
    t = threading.Thread(target=lambda: results.append(verify_equal(("7",), "we get 3 + 4 = 7")))
    t.start()
    t.join(60)
    assert results == [(0, False)]  # the first gold matched, off the main thread, where math-verify's own alarm cannot work
