"""Reward functions: hand-computed cases, robustness to garbage, the judge's parsing and errors."""
import math

import pytest

from utils.reward.judge import JudgeUnreachable, check_judge, judge_score, parse_judge_score
from utils.reward.cases import CASES, run_cases
from utils.reward.spec import RewardSpec, score_answer
from utils.agent.protocol import extract_tag, format_score
from utils.core.schema import RewardConfig
from utils.reward import scorers
from utils.reward.scorers import composite, normalize_answer, parse_number, score_f1
from utils.core.schema import JudgeConfig


def test_every_hand_computed_case_passes():
    failed = [r for r in run_cases(RewardConfig()) if not r["passed"]]
    assert not failed, failed
    assert len(CASES) >= 25


def test_a_wrong_expectation_is_reported_as_failed():
    bad = [{"fn": "em", "pred": "a", "golds": ["b"], "expected": 1.0}]
    assert run_cases(RewardConfig(), bad)[0]["passed"] is False


@pytest.mark.parametrize("text,value", [("1,234", 1234.0), ("$5", 5.0), ("12%", 12.0), ("-3.50", -3.5),
                                        ("costs $ 2,500.75 total", 2500.75), ("3.2e3", 3200.0), (".5", 0.5),
                                        ("x", None), ("", None), ("1/0", None)])
def test_parse_number(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize("pred,gold,score", [
    ("#### 48", "48", 1.0), ("so the total is \\boxed{13}.", "13", 1.0), ("The answer is 7 apples", "7", 1.0),
    ("Final answer: $12", "12", 1.0), ("\\boxed{\\frac{3}{4}}", "0.75", 1.0), ("\\dfrac{1}{2}", "0.5", 1.0),
    ("1{,}234", "1234", 1.0), ("42", "42", 1.0), ("#### 47", "48", 0.0),
    ("2 boxes, so \\boxed{9}", "2", 0.0),  # the boxed answer wins over an earlier number
    ("5 then #### 6", "5", 0.0),            # so does GSM8K's mark
])
def test_numeric_reads_a_real_models_free_text(pred, gold, score):
    """What a real model writes inside <answer> (or a base model anywhere): the answer span is read."""
    from utils.reward.scorers import score_numeric

    assert score_numeric(pred, [gold])[0] == score


def test_squad_normalisation():
    assert normalize_answer("  The  Quick, brown FOX!! ") == "quick brown fox"
    assert normalize_answer("an apple a day") == "apple day"


def test_f1_partial_credit_by_hand():
    # pred [cat, sat, mat] vs gold [cat, mat]: P = 2/3, R = 1, F1 = 0.8
    assert math.isclose(score_f1("the cat sat on a mat", ["cat mat"])[0], 2 * (2 / 4) * 1 / (2 / 4 + 1))


GARBAGE = ["", "<answer>", "<answer><answer></answer>", "</think><think>", "\x00\x01\ufffd" * 50,
           "<task>" * 5000, "9" * 100_000, "<think>" + "x" * 100_000, "<answer>\ud800</answer>", None]


@pytest.mark.parametrize("text", GARBAGE)
def test_rewards_never_raise_on_garbage(text):
    for role in ("planner", "executor"):
        value, comps = format_score(text, role)
        assert 0.0 <= value <= 1.0 and set(comps) == {"think", "action"}
    value, comps = composite("numeric", text, ["5"], 0.3, 10, RewardConfig())
    assert math.isfinite(value) and comps["answer"] in (0.0, 1.0)
    for scorer in ("em", "f1", "cem"):
        assert math.isfinite(composite(scorer, text, ["x"], 0.0, 0, RewardConfig())[0])
    extract_tag(text, "answer")


def test_composite_efficiency_term():
    w = RewardConfig(efficiency_weight=1.0, efficiency_budget=100)
    inside = composite("numeric", "5", ["5"], 1.0, 100, w)
    over = composite("numeric", "5", ["5"], 1.0, 150, w)
    assert inside[0] == pytest.approx(3.1)
    assert over[0] == pytest.approx(3.1 - 0.5) and over[1]["efficiency_overrun"] == pytest.approx(0.5)


def _episode(planner_turns: list[str], answer: str | None):
    from utils.agent.episode import Episode, Segment

    ep = Episode("q", "12+7*3", ["57"], 0, status="answered" if answer else "malformed", final_answer=answer)
    for k, text in enumerate(planner_turns):
        ep.segments.append(Segment("planner", k, [], [0] * 5, [0.0] * 5, text, "stop", 1.0))
        if "<task>" in text:
            ep.segments.append(Segment("executor", k, [], [0] * 5, [0.0] * 5, "<think>x</think><answer>1</answer>",
                                       "stop", 1.0))
    return ep


def test_independence_term_on_hand_made_episodes():
    from utils.reward.spec import score_episodes

    spec = RewardSpec(independence_weight=0.3)
    clean = _episode(["<think>a</think><task>12+7</task>", "<think>b</think><task>19*3</task>",
                      "<think>c</think><answer>57</answer>"], "57")
    leaning = _episode(["<think>a</think><task>12+7</task>", "<think>b</think><task>multiply it by 3</task>",
                        "<think>c</think><task>12+7</task>", "<think>d</think><answer>57</answer>"], "57")
    lazy = _episode(["<think>a</think><answer>57</answer>"], "57")
    assert clean.subtasks == ["12+7", "19*3"] and leaning.subtasks == ["12+7", "multiply it by 3", "12+7"]
    got = score_episodes([clean, leaning, lazy], spec)
    assert [g["independence"] for g in got] == pytest.approx([1.0, 1 / 3, 0.0])
    # 6*1 - 3 + 0.1*1 + 0.3*independence: the one-turn answer loses the 0.3 the delegating episode earns
    assert [g["reward"] for g in got] == pytest.approx([3.4, 3.2, 3.1])
    off = score_episodes([clean, leaning, lazy], RewardSpec())  # weight 0 (the default): the reward ignores it
    assert [g["reward"] for g in off] == pytest.approx([3.1] * 3) and off[1]["independence"] == pytest.approx(1 / 3)


def test_non_finite_format_counts_as_zero():
    assert composite("numeric", "5", ["5"], float("nan"), 0, RewardConfig())[1]["format"] == 0.0


def test_a_bug_in_a_scorer_is_not_swallowed(monkeypatch):
    """Garbage output scores 0 without raising (above); a scorer that itself raises is a bug, and
    composite lets it surface instead of turning it into reward -3."""
    def broken(pred, golds, rel_tol=1e-4):
        raise ZeroDivisionError("bug in scorer")

    monkeypatch.setattr(scorers, "score_numeric", broken)
    with pytest.raises(ZeroDivisionError, match="bug in scorer"):
        composite("numeric", "5", ["5"], 1.0, 0, RewardConfig())


def test_unknown_scorer_is_a_config_error():
    with pytest.raises(KeyError, match="valid: cem, em, f1, numeric"):
        composite("bleu", "x", ["x"], 0, 0, RewardConfig())


@pytest.mark.parametrize("reply,score", [("8", 0.8), ("Score: 10/10", 1.0), ("0", 0.0), ("I think 7.", 0.7),
                                         ("great answer", None), ("42", None)])
def test_judge_reply_parsing(reply, score):
    assert parse_judge_score(reply) == score


def test_enabled_judge_that_is_unreachable_fails_clearly():
    cfg = JudgeConfig(enabled=True, base_url="http://127.0.0.1:9/v1", timeout=5)
    with pytest.raises(JudgeUnreachable, match=r"reward.judge is enabled but http://127.0.0.1:9/v1 is unreachable"):
        check_judge(cfg)
    value, comps = judge_score(cfg, "q", "a", ["a"])  # per-item scoring never raises
    assert value == 0.0 and comps["judge_error"]
    spec = RewardSpec(judge=cfg)
    value, comps = score_answer(spec, "q", "a", ["a"], 1.0, 10)
    assert value == pytest.approx(-3 + 0.1) and comps["answer"] == 0.0


def test_ten_thousand_hostile_outputs_never_raise_and_stay_in_range():
    """Every scorer and the format score of both roles on 10,000 generated strings (utils/reward/fuzz.py;
    their worst-case time is benchmarks/reward_fuzz.py's figure, not asserted here)."""
    from collections import Counter

    from utils.reward.fuzz import fuzz_strings

    cases = fuzz_strings(10_000)
    assert len(cases) == 10_000 and Counter(k for k, _ in cases)["huge"] == 20
    w = RewardConfig()
    for kind, text in cases:
        for role in ("planner", "executor"):
            value, _ = format_score(text, role)
            assert 0.0 <= value <= 1.0, (kind, text[:80])
        fmt = format_score(text, "planner")[0]
        for scorer in ("em", "f1", "cem", "numeric"):
            value, comps = composite(scorer, text, ["5", "the Tessel"], fmt, len(text), w)
            assert 0.0 <= comps["answer"] <= 1.0, (scorer, kind, text[:80])
            assert -3.0 - w.efficiency_weight * comps["efficiency_overrun"] <= value <= 3.1, (scorer, kind)
        extract_tag(text, "answer")
