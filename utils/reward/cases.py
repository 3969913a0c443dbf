"""Hand-computed reward cases that `02_build_rewards.py` runs against the reward spec.

Each case names a function, its arguments and the value worked out by hand (the working is in
`why`). 02 writes the cases to unit_tests/test_cases.json and the outcomes to
unit_tests/test_results.json, and fails if any case fails. tests/test_rewards.py runs them too.
"""
from __future__ import annotations

import math

from utils.agent.protocol import format_score
from utils.core.schema import INDEPENDENCE_REFS, RewardConfig
from utils.reward.scorers import composite, get_scorer, subtask_independence

CASES: list[dict] = [
    # numeric: units, commas, signs, percentages, fractions
    {"fn": "numeric", "pred": "The total is $1,234.", "golds": ["1234"], "expected": 1.0, "why": "$ and comma stripped"},
    {"fn": "numeric", "pred": "-3.50", "golds": ["-3.5"], "expected": 1.0, "why": "-3.50 == -3.5"},
    {"fn": "numeric", "pred": "12%", "golds": ["12"], "expected": 1.0, "why": "percent sign dropped, value kept"},
    {"fn": "numeric", "pred": "1/2", "golds": ["0.5"], "expected": 1.0, "why": "fraction 1/2 = 0.5"},
    {"fn": "numeric", "pred": "about 19 apples", "golds": ["18", "19"], "expected": 1.0, "why": "second gold matches"},
    {"fn": "numeric", "pred": "19.01", "golds": ["19"], "expected": 0.0, "why": "|0.01|/19 = 5e-4 > rel_tol 1e-4"},
    {"fn": "numeric", "pred": "\u22125", "golds": ["-5"], "expected": 1.0, "why": "unicode minus"},
    {"fn": "numeric", "pred": "no number here", "golds": ["3"], "expected": 0.0, "why": "nothing to parse"},
    # em / f1 / cem with SQuAD normalisation
    {"fn": "em", "pred": "The Eiffel Tower!", "golds": ["eiffel tower"], "expected": 1.0, "why": "article and punctuation dropped"},
    {"fn": "em", "pred": "Eiffel", "golds": ["eiffel tower"], "expected": 0.0, "why": "partial is not exact"},
    {"fn": "em", "pred": "Paris", "golds": ["London", "paris"], "expected": 1.0, "why": "any gold counts"},
    {"fn": "f1", "pred": "the big red dog", "golds": ["red dog"], "expected": 0.8,
     "why": "pred tokens [big, red, dog], gold [red, dog]: P=2/3, R=1, F1=2*(2/3)/(5/3)=0.8"},
    {"fn": "f1", "pred": "cat", "golds": ["red dog", "cat"], "expected": 1.0, "why": "best over golds"},
    {"fn": "f1", "pred": "", "golds": ["dog"], "expected": 0.0, "why": "empty prediction"},
    {"fn": "cem", "pred": "It was the Eiffel Tower, in Paris", "golds": ["Eiffel Tower"], "expected": 1.0,
     "why": "normalised gold is a substring of the prediction"},
    {"fn": "cem", "pred": "a tower", "golds": ["Eiffel Tower"], "expected": 0.0, "why": "gold not covered"},
    # format, graduated: 0.5 * think credit + 0.5 * action credit
    {"fn": "format_executor", "text": "<think>12+7=19</think><answer>19</answer>", "expected": 1.0, "why": "both tags once"},
    {"fn": "format_executor", "text": "<answer>19</answer>", "expected": 0.5, "why": "no think: 0 + 0.5*1"},
    {"fn": "format_executor", "text": "<think>x</think><answer>19</answer><answer>20</answer>", "expected": 0.75,
     "why": "repeated answer: 0.5*1 + 0.5*0.5"},
    {"fn": "format_executor", "text": "<think><think>x</think></think><answer>1</answer>", "expected": 0.75,
     "why": "nested think: 0.5*0.5 + 0.5*1"},
    {"fn": "format_executor", "text": "<think>x</think><answer>19", "expected": 0.5, "why": "unclosed answer: 0.5*1 + 0"},
    {"fn": "format_planner", "text": "<think>first</think><task>12+7</task>", "expected": 1.0, "why": "think + one task"},
    {"fn": "format_planner", "text": "<think>a</think><task>1+1</task><answer>2</answer>", "expected": 0.75,
     "why": "task and answer in one turn: action 0.5"},
    {"fn": "format_planner", "text": "<task>12+7</task> trailing", "expected": 0.25, "why": "no think, text after action: 0.5*0.5"},
    {"fn": "format_planner", "text": "", "expected": 0.0, "why": "empty"},
    # composite: answer_scale*score + answer_shift + format_weight*format (seed default 6, -3, 0.1)
    {"fn": "composite", "scorer": "numeric", "pred": "49", "golds": ["49"], "format": 1.0, "n_tokens": 10,
     "expected": 3.1, "why": "6*1 - 3 + 0.1*1"},
    {"fn": "composite", "scorer": "numeric", "pred": None, "golds": ["49"], "format": 0.0, "n_tokens": 10,
     "expected": -3.0, "why": "no answer, no format: -3"},
    {"fn": "composite", "scorer": "f1", "pred": "the big red dog", "golds": ["red dog"], "format": 0.5,
     "n_tokens": 10, "expected": 1.85, "why": "6*0.8 - 3 + 0.1*0.5"},
    # subtask independence (the default back-reference regex): share of self-contained, new subtasks
    {"fn": "independence", "subtasks": ["12+7", "19*3", "57-4"], "expected": 1.0, "why": "literal operands only"},
    {"fn": "independence", "subtasks": ["12+7", "multiply the result by 3"], "expected": 0.5,
     "why": "'the result' points into the planner's context: 1 of 2"},
    {"fn": "independence", "subtasks": ["12+7", "12 + 7", "add 4 to it"], "expected": 1 / 3,
     "why": "a repeat (whitespace ignored) and a pronoun: 1 of 3"},
    {"fn": "independence", "subtasks": ["capital of France", "use step 1 here", "population of #1"],
     "expected": 1 / 3, "why": "'step 1' and '#1' are back-references: 1 of 3"},
    {"fn": "independence", "subtasks": ["Italy's capital", "THAT city"], "expected": 0.5,
     "why": "'its' is not in \"Italy's\"; 'THAT' matches case-insensitively"},
    {"fn": "independence", "subtasks": [], "expected": 0.0, "why": "no subtask: nothing to reward"},
]


def run_case(case: dict, weights: RewardConfig) -> float:
    fn = case["fn"]
    if fn.startswith("format_"):
        return format_score(case["text"], fn.split("_", 1)[1])[0]
    if fn == "composite":
        return composite(case["scorer"], case["pred"], case["golds"], case["format"], case["n_tokens"], weights)[0]
    if fn == "numeric":
        return get_scorer(fn)(case["pred"], case["golds"], weights.numeric_rel_tol)[0]
    if fn == "independence":  # the proxy's rules, under the default regex whatever the spec's
        return subtask_independence(case["subtasks"], INDEPENDENCE_REFS)
    return get_scorer(fn)(case["pred"], case["golds"])[0]


def run_cases(weights: RewardConfig, cases: list[dict] | None = None) -> list[dict]:
    """Each case with its `got` value and `passed` flag (tolerance 1e-9)."""
    results = []
    for i, case in enumerate(cases if cases is not None else CASES):
        try:
            got = run_case(case, weights)
            passed = math.isclose(got, case["expected"], abs_tol=1e-9)
            error = None
        except Exception as exc:  # noqa: BLE001 - a failing case is reported, not raised
            got, passed, error = None, False, f"{type(exc).__name__}: {exc}"
        results.append({"index": i, "fn": case["fn"], "expected": case["expected"], "got": got,
                        "passed": passed, "error": error})
    return results
