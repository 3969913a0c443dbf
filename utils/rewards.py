"""Reward functions: pure `(text, golds) -> (value, components)` maps that never raise on model output.

Answer scorers (registered by name, `SCORERS`):
- `em`   exact match after SQuAD normalisation (lower case, no punctuation/articles/extra spaces);
- `f1`   SQuAD token F1, the best over the gold answers;
- `cem`  cover EM: some normalised gold answer occurs inside the normalised prediction;
- `numeric` the first number in the prediction equals a gold number within a relative tolerance;
  it understands "1,234", "$5", "12%", "-3.50", "1/2" and "3.2e3".
Format scores are graduated per role (`format_score(text, role)`), and `composite` turns them into
the seed's reward `6·score − 3 + 0.1·format` with the weights of the reward spec, plus an optional
token-efficiency term. Departure from the seed: repeated or nested tags earn partial, not full,
credit, so a policy cannot farm format reward by spamming tags.
"""
from __future__ import annotations

import math
import re
import string
from collections import Counter
from dataclasses import dataclass
from typing import Callable

MAX_SCORED_CHARS = 20_000  # longer outputs are scored on their head: bounded work on garbage

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


def score_numeric(pred: str, golds: list[str], rel_tol: float = 1e-4) -> Scored:
    value = parse_number(pred)
    if value is None:
        return 0.0, {"pred_number": None, "matched": None}
    for g in golds:
        target = parse_number(g)
        if target is not None and math.isclose(value, target, rel_tol=rel_tol, abs_tol=1e-9):
            return 1.0, {"pred_number": value, "matched": g}
    return 0.0, {"pred_number": value, "matched": None}


SCORERS: dict[str, Callable[..., Scored]] = {
    "em": score_em, "f1": score_f1, "cem": score_cem, "numeric": score_numeric,
}


def get_scorer(name: str) -> Callable[..., Scored]:
    if name not in SCORERS:
        raise KeyError(f"unknown scorer '{name}'; valid: {', '.join(sorted(SCORERS))}")
    return SCORERS[name]


def gold_parseable(scorer: str, answer: str) -> bool:
    """Whether `scorer` can use `answer` as a gold answer (used by 00_check_data)."""
    if scorer == "numeric":
        return parse_number(answer) is not None
    return bool(normalize_answer(answer))


# ---------------------------------------------------------------- tags and format

def extract_tag(text: str, tag: str) -> str | None:
    """Content of the last complete <tag>...</tag> in `text`, stripped; None if there is none."""
    text = str(text)[:MAX_SCORED_CHARS]
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.S)
    return found[-1].strip() if found else None


def _tag_credit(text: str, tag: str) -> float:
    """1 for exactly one well-formed, non-empty, un-nested pair; 0.5 if present but repeated,
    nested or empty; 0 if absent or never closed."""
    opens, closes = text.count(f"<{tag}>"), text.count(f"</{tag}>")
    pairs = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.S)
    if not pairs:
        return 0.0
    if opens == closes == 1 and pairs[0].strip() and f"<{tag}>" not in pairs[0]:
        return 1.0
    return 0.5


ROLE_TAGS = {"executor": ("think", ("answer",)), "planner": ("think", ("task", "answer"))}


def format_score(text: str, role: str) -> Scored:
    """Graduated format score in [0, 1] for one generated segment of `role`.

    Half the credit is for a <think> block, half for the role's action tag: executor <answer>;
    planner exactly one of <task> or <answer>. Both action tags in one planner turn, or text after
    the action, earn half credit for the action.
    """
    if role not in ROLE_TAGS:
        raise KeyError(f"unknown role '{role}'; valid: {', '.join(ROLE_TAGS)}")
    text = str(text)[:MAX_SCORED_CHARS]
    think_tag, actions = ROLE_TAGS[role]
    think = _tag_credit(text, think_tag)
    credits = [(_tag_credit(text, a), a) for a in actions]
    present = [(c, a) for c, a in credits if c > 0]
    if not present:
        action = 0.0
    elif len(present) > 1:
        action = 0.5
    else:
        credit, tag = present[0]
        tail = text[text.rfind(f"</{tag}>") + len(tag) + 3:]
        action = credit if not tail.strip() else min(credit, 0.5)
    return 0.5 * think + 0.5 * action, {"think": think, "action": action}


# ---------------------------------------------------------------- composite

@dataclass(frozen=True)
class RewardWeights:
    answer_scale: float = 6.0
    answer_shift: float = -3.0
    format_weight: float = 0.1
    efficiency_weight: float = 0.0
    efficiency_budget: int = 256
    numeric_rel_tol: float = 1e-4


def answer_score(scorer: str, pred: str | None, golds: list[str], rel_tol: float = 1e-4) -> Scored:
    if pred is None:
        return 0.0, {"matched": None}
    if scorer == "numeric":
        return score_numeric(pred, golds, rel_tol)
    return get_scorer(scorer)(pred, golds)


def composite(scorer: str, pred: str | None, golds: list[str], fmt: float, n_tokens: int,
              w: RewardWeights) -> tuple[float, dict]:
    """`answer_scale·score + answer_shift + format_weight·format − efficiency_weight·overrun`.

    `overrun` is max(0, n_tokens/efficiency_budget − 1): no penalty inside the budget.
    """
    try:
        score, _ = answer_score(scorer, pred, golds, w.numeric_rel_tol)
    except KeyError:
        raise  # an unknown scorer name is a config error, not model output
    except Exception:  # noqa: BLE001 - a reward must never raise on model output
        score = 0.0
    fmt = min(max(float(fmt), 0.0), 1.0) if math.isfinite(fmt) else 0.0
    overrun = max(0.0, n_tokens / max(w.efficiency_budget, 1) - 1.0)
    value = w.answer_scale * score + w.answer_shift + w.format_weight * fmt - w.efficiency_weight * overrun
    return value, {"answer": score, "format": fmt, "efficiency_overrun": overrun, "reward": value}
