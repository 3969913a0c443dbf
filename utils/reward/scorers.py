"""Reward functions: pure `(text, golds) -> (value, components)` maps that never raise on model output.

Answer scorers (registered by name, `SCORERS`):
- `em`   exact match after SQuAD normalisation (lower case, no punctuation/articles/extra spaces);
- `f1`   SQuAD token F1, the best over the gold answers;
- `cem`  cover EM: some normalised gold answer occurs inside the normalised prediction;
- `numeric` the prediction's answer span (`answer_span`: `\\boxed{13}`, `#### 48`, "the answer is 7",
  `\\frac{1}{2}`) equals a gold answer: a span that is one number ("1,234", "$5", "12%", "-3.50",
  "1/2", "3.2e3") within a relative tolerance, anything else by math-verify under a time limit
  (`score_numeric`, utils/reward/verify.py).
`composite` turns an answer score and the protocol's format score (utils/agent/protocol.py) into
the seed's reward `6·score − 3 + 0.1·format`, with the weights of the `reward` config section
(`RewardConfig`, which the reward spec extends), plus two optional terms from the Recursive
Reasoner: token efficiency (a penalty per token over a budget) and subtask independence
(`subtask_independence`).

Scorers parse garbage without raising, so `composite` does not catch exceptions: a bug in a
scorer surfaces as an error instead of silently scoring 0 (reward −3) during training.
"""
from __future__ import annotations

import math
import re
import string
from collections import Counter
from typing import Callable

from utils.agent.protocol import MAX_PARSED_CHARS as MAX_SCORED_CHARS
from utils.core.schema import RewardConfig
from utils.core.registry import Registry

# ---------------------------------------------------------------- normalisation and parsing

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, drop punctuation and articles, collapse whitespace."""
    text = str(text)[:MAX_SCORED_CHARS].lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


_NUMBER = re.compile(r"[-+\u2212]?\s?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?"
                     r"(?:\s?/\s?\d+(?:\.\d+)?)?\s?%?|[-+\u2212]?\$?\.\d+%?")


def parse_number(text: str) -> float | None:
    """The first number in `text`, or None. Commas, '$', '%' (kept as the number: '12%' -> 12) and
    simple fractions are understood; unicode minus counts as '-'."""
    if text is None:
        return None
    match = _NUMBER.search(str(text)[:MAX_SCORED_CHARS])
    if not match:
        return None
    raw = match.group(0).replace(" ", "").replace("$", "").replace(",", "").replace("%", "")
    raw = raw.replace("\u2212", "-")
    try:
        if "/" in raw:
            num, den = raw.split("/")
            value = float(num) / float(den)
        else:
            value = float(raw)
    except (ValueError, ZeroDivisionError):
        return None
    return value if math.isfinite(value) else None


# ---------------------------------------------------------------- answer scorers
# Each returns (score in [0, 1], components); components say what was compared.

Scored = tuple[float, dict]


def score_em(pred: str, golds: list[str]) -> Scored:
    p = normalize_answer(pred)
    hits = [g for g in golds if p == normalize_answer(g)]
    return float(bool(hits)), {"pred_norm": p, "matched": hits[0] if hits else None}


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def score_f1(pred: str, golds: list[str]) -> Scored:
    p = normalize_answer(pred).split()
    scores = [_f1(p, normalize_answer(g).split()) for g in golds]
    best = max(range(len(scores)), key=scores.__getitem__, default=None)
    return (scores[best] if best is not None else 0.0), {"matched": golds[best] if best is not None else None}


def score_cem(pred: str, golds: list[str]) -> Scored:
    p = normalize_answer(pred)
    hits = [g for g in golds if normalize_answer(g) and normalize_answer(g) in p]
    return float(bool(hits)), {"pred_norm": p, "matched": hits[0] if hits else None}


_BOXED = re.compile(r"\\boxed\s*\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")
_FRAC = re.compile(r"\\d?frac\s*\{\s*([-\d.,]+)\s*\}\s*\{\s*([-\d.,]+)\s*\}")
_ANSWER_IS = re.compile(r"(?:final answer|the answer)\s*(?:is|:)\s*", re.IGNORECASE)


def answer_span(text: str) -> str:
    """Where a free-text prediction states its final answer: the last `\\boxed{...}`, else what follows
    the last `####` (GSM8K's mark), else what follows the last "the answer is" / "final answer:", else
    the whole text; LaTeX fractions become a/b and `{,}` thousands marks plain commas. A bare number,
    the protocol's answer, is its own span."""
    text = str(text)[:MAX_SCORED_CHARS]
    boxed = _BOXED.findall(text)
    if boxed:
        text = boxed[-1]
    elif "####" in text:
        text = text.rsplit("####", 1)[1]
    else:
        parts = _ANSWER_IS.split(text)
        text = parts[-1] if len(parts) > 1 else text
    return _FRAC.sub(r"\1/\2", text.replace("{,}", ",").replace("\\$", "$"))


_BARE = re.compile(rf"\s*(?:{_NUMBER.pattern})\s*\.?\s*")


def is_bare_number(span: str) -> bool:
    """Whether an answer span is one number and nothing else ("18", "$1,234", "-3.50", "12%", "1/2",
    "3.2e3", a trailing full stop allowed)."""
    return _BARE.fullmatch(span) is not None


def score_numeric(pred: str, golds: list[str], rel_tol: float = 1e-4) -> Scored:
    """1 when the prediction's answer span (`answer_span`) equals a gold answer, else 0.

    A span that is one number (`is_bare_number`) is compared as a number with the gold numbers, within
    `rel_tol`: the score a bare number had before math-verify. Any other span (free text, LaTeX, an
    expression, a number with its unit) goes to math-verify (utils/reward/verify.py), which reads its
    last expression and compares it with each gold symbolically, under a time limit (past it: 0,
    `timed_out`). So "the total is 3 + 4 = 7", "40 minutes", "$2^{3}$" and "50%" against 0.5 are
    right, and "12 apples and 5 pears" is scored by its 5, where the first number used to count."""
    from utils.reward.verify import verify_equal

    span = answer_span(pred)
    if is_bare_number(span):
        value = parse_number(span)
        for g in golds:
            target = parse_number(g)
            if value is not None and target is not None and math.isclose(value, target, rel_tol=rel_tol, abs_tol=1e-9):
                return 1.0, {"pred_number": value, "matched": g, "checked_by": "number"}
        return 0.0, {"pred_number": value, "matched": None, "checked_by": "number"}
    matched, timed_out = verify_equal(tuple(str(g) for g in golds), span)
    info = {"pred_number": None, "matched": None if matched is None else golds[matched], "checked_by": "math_verify"}
    if timed_out:
        info["timed_out"] = True
    return float(matched is not None), info


SCORERS: Registry[Callable[..., Scored]] = Registry("scorer", {
    "em": score_em, "f1": score_f1, "cem": score_cem, "numeric": score_numeric,
})


def is_correct(score: float) -> bool:
    """A fully correct answer: score 1 (F1's partial credit is not correct). RED's batch accuracy,
    red_paper's group accuracy and pass@k count these; mean scores stay in the logs."""
    return score >= 1.0


def get_scorer(name: str) -> Callable[..., Scored]:
    return SCORERS.get(name)


def gold_parseable(scorer: str, answer: str) -> bool:
    """Whether `scorer` can use `answer` as a gold answer (used by 00_check_data)."""
    if scorer == "numeric":
        return parse_number(answer) is not None
    return bool(normalize_answer(answer))


# ---------------------------------------------------------------- composite

def answer_score(scorer: str, pred: str | None, golds: list[str], rel_tol: float = 1e-4) -> Scored:
    if pred is None:
        return 0.0, {"matched": None}
    if scorer == "numeric":
        return score_numeric(pred, golds, rel_tol)
    return get_scorer(scorer)(pred, golds)


def composite(scorer: str, pred: str | None, golds: list[str], fmt: float, n_tokens: int,
              w: RewardConfig, independence: float = 0.0) -> tuple[float, dict]:
    """The episode reward with `scorer`'s answer score: `shaped_reward` of it. An unknown scorer
    raises KeyError (a config error); a scorer never raises on model output."""
    score, _ = answer_score(scorer, pred, golds, w.numeric_rel_tol)
    return shaped_reward(score, fmt, n_tokens, w, independence)


def shaped_reward(score: float, fmt: float, n_tokens: int, w: RewardConfig,
                  independence: float = 0.0) -> tuple[float, dict]:
    """The episode reward from an answer score in [0, 1], a scorer's or the LLM judge's:
    `answer_scale·score + answer_shift + format_weight·format − efficiency_weight·overrun
    + independence_weight·independence`, and its components.

    `overrun` is max(0, n_tokens/efficiency_budget − 1): no penalty inside the budget;
    `independence` is the episode's `subtask_independence` in [0, 1]; a non-finite format counts 0.
    """
    fmt = min(max(float(fmt), 0.0), 1.0) if math.isfinite(fmt) else 0.0
    overrun = max(0.0, n_tokens / max(w.efficiency_budget, 1) - 1.0)
    value = (w.answer_scale * score + w.answer_shift + w.format_weight * fmt - w.efficiency_weight * overrun
             + w.independence_weight * independence)
    return value, {"answer": score, "format": fmt, "efficiency_overrun": overrun, "independence": independence,
                   "reward": value}


# ---------------------------------------------------------------- subtask independence

def compact(text: str) -> str:
    """`text` lower-cased with all whitespace removed: how subtasks are compared (repeats, gold steps)."""
    return "".join(str(text).lower().split())


def subtask_independence(subtasks: list[str], refs: str) -> float:
    """The share of an episode's delegated subtasks that an executor, which sees only the subtask,
    could work on alone: a proxy for the Recursive Reasoner's "subproblem independence".

    A subtask counts when it
    - is not empty;
    - has no back-reference into the planner's context: no match of the regex `refs`
      (reward.independence_refs; by default words such as "it", "that", "previous", "the result",
      "step 2", "#1" and the injected "<result>" tag), matched case-insensitively; and
    - does not repeat an earlier subtask of the episode (compared lower-cased, without whitespace):
      a repeat gives the executor nothing new. The seed scores dissimilarity with sentence
      embeddings; exact repeats are the part of that a tiny model can be checked on.
    An episode with no subtask scores 0: there is nothing independent to reward. What the proxy
    cannot see: a subtask that names no back-reference yet needs a table or passage only the
    planner holds (FinQA, HotpotQA rows give the executor no context by default).
    """
    if not subtasks:
        return 0.0
    pattern, seen, good = re.compile(refs, re.IGNORECASE), set(), 0
    for task in subtasks:
        text = str(task)[:MAX_SCORED_CHARS]
        key = compact(text)
        if key and key not in seen and not pattern.search(text):
            good += 1
        seen.add(key)
    return good / len(subtasks)
