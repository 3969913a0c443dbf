"""Arithmetic text shared by the tiny base model's pretraining corpus and the synthetic task.

Two consumers, one source of truth:
- `pretrain_line` makes *raw* arithmetic text ("12+7=19", "what is 12+7? 19") for pretraining
  `tiny-arith`. It never contains the agent protocol's tags, so the pretrained model is a base
  model that knows arithmetic but not how to be a planner or an executor.
- `make_problem` makes a multi-step problem with its gold decomposition into one-operation
  subtasks, for the `synthetic_arith` dataset.

Held-out pairs: `is_heldout(a, op, b)` marks a fixed ~10% of operand pairs that pretraining never
shows, so the base model's accuracy on them measures arithmetic it learned, not memorised.
All randomness comes from a `random.Random` the caller seeds.
"""
from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

OPS = ("+", "-", "*")
_WORDS = {"+": "plus", "-": "minus", "*": "times"}
_ASK = ("compute", "work out", "find", "evaluate")  # never the agent templates' "plan"/"solve"


def apply_op(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unknown operator {op!r}; valid: {', '.join(OPS)}")


def is_heldout(a: int, op: str, b: int, percent: int = 10) -> bool:
    """True for a fixed `percent`% of (a, op, b) triples, chosen by hash (stable across runs)."""
    digest = hashlib.sha256(f"{a}{op}{b}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < percent


@dataclass(frozen=True)
class OperandRange:
    """Operand bounds for one-step facts. `*` uses a small right operand to stay learnable."""

    left_max: int = 99
    right_max: int = 99
    mul_right_max: int = 9


def sample_fact(rng: random.Random, ops: tuple[str, ...], rng_bounds: OperandRange,
                heldout: bool | None) -> tuple[int, str, int]:
    """Draw (a, op, b). heldout=False excludes held-out triples, True draws only them, None both."""
    while True:
        op = rng.choice(ops)
        a = rng.randint(0, rng_bounds.left_max)
        b = rng.randint(0, rng_bounds.mul_right_max if op == "*" else rng_bounds.right_max)
        if heldout is None or is_heldout(a, op, b) == heldout:
            return a, op, b


def _other_line(rng: random.Random, bounds: OperandRange) -> str:
    """Comparisons, exact division, checks and bracketed chains: raw text that gives the model
    every character the prompts and tags use ('<', '>', '/', '(', ':', the letters of "think",
    "task", "answer", "result", "plan", "solve") without ever forming a tag."""
    a, b = rng.randint(0, bounds.right_max), rng.randint(0, bounds.right_max)
    form = rng.randrange(4)
    if form == 0:
        sign, truth = rng.choice([("<", a < b), (">", a > b)])
        return f"{a}{sign}{b} is {'true' if truth else 'false'}"
    if form == 1:
        d = rng.randint(1, 9)
        q = rng.randint(0, bounds.right_max // 2)
        return f"{q * d}/{d}={q}"
    if form == 2:
        c = a + b if not is_heldout(a, "+", b) else a
        shown = c if rng.random() < 0.5 else c + rng.choice([-1, 1])
        verdict = "ok" if shown == c else "no"
        return f"check: {a}+{b}={shown} {verdict}" if c == a + b else f"check: {a}={a} ok"
    c = rng.randint(0, 30)
    if is_heldout(a, "+", b) or is_heldout(a + b, "-", c):
        return f"{a}={a}"
    return f"solve ({a}+{b})-{c}: {a + b - c}"


def is_task_question(question: str) -> bool:
    """True for the half of all chain expressions (by hash) reserved for the synthetic task.

    Pretraining works only the other half, so no train/val/test question of `synthetic_arith`
    appears in the base model's corpus."""
    return hashlib.sha256(f"question:{question}".encode()).digest()[0] % 2 == 0


def reduction_text(question: str, steps) -> str:
    """A worked left-to-right reduction: "9+26-4: 9+26=35, 35-4: 35-4=31, 31".

    Each clause restates the remaining expression, then works its first operation; the result
    replaces that operation in the next clause."""
    parts, remaining = [], question
    for task, result in steps:
        parts.append(f"{remaining}: {task}={result}")
        remaining = f"{result}{remaining[len(task):]}"
    return ", ".join(parts + [remaining])


def chain_problem(rng: random.Random, ops: tuple[str, ...], bounds: OperandRange, min_steps: int,
                  task_side: bool, max_steps: int = 3) -> Problem:
    """A min_steps..max_steps step +/- chain on the task side of the hash split (task_side) or the
    pretraining side; the operands and values match what the corpus shows."""
    chain_ops = tuple(o for o in ops if o in "+-") or ("+",)
    while True:
        p = make_problem(rng, rng.randint(min_steps, max_steps), chain_ops, (bounds.right_max + 1) // 2,
                         bounds.left_max)
        if is_task_question(p.question) == task_side:
            return p


def reduction_problem(rng: random.Random, ops: tuple[str, ...], bounds: OperandRange, max_ops: int = 3) -> Problem:
    """A 1..max_ops step +/- chain for pretraining: never a task question, never a held-out fact."""
    while True:
        p = chain_problem(rng, ops, bounds, 1, task_side=False, max_steps=max_ops)
        facts = [re.fullmatch(r"(\d+)([+-])(\d+)", t).groups() for t, _ in p.steps]
        if not any(is_heldout(int(a), op, int(b)) for a, op, b in facts):
            return p


def pretrain_line(rng: random.Random, ops: tuple[str, ...], bounds: OperandRange, max_ops: int = 3) -> str:
    """One line (or a question line and its worked line) of raw arithmetic text, in one of
    several surface forms (never held-out facts).

    The word forms teach the letters the prompts use; two-step lines, worked reductions of
    chains of 1..max_ops operations (30% of lines, `reduction_text`) and questions restated on the next line
    ("compute: 12+7\n12+7=19") give the base the copying and chaining a real pretrained model
    has; a fifth of the lines are other arithmetic text (`_other_line`).
    """
    draw = rng.random()
    if draw < 0.3:
        p = reduction_problem(rng, ops, bounds, max_ops)
        if rng.random() < 0.5:  # the expression on a line of its own, worked on the next line
            return f"{rng.choice(_ASK)}: {p.question}\n{reduction_text(p.question, p.steps)}"
        return reduction_text(p.question, p.steps)
    if draw < 0.5:
        return _other_line(rng, bounds)
    a, op, b = sample_fact(rng, ops, bounds, heldout=False)
    c = apply_op(a, op, b)
    form = rng.randrange(6)
    if form == 5:
        return f"{rng.choice(_ASK)}: {a}{op}{b}\n{a}{op}{b}={c}"
    if form == 0:
        return f"{a} {op} {b} = {c}"
    if form == 1:
        return f"what is {a}{op}{b}? {c}"
    if form == 2:
        return f"{a} {_WORDS[op]} {b} is {c}"
    if form == 3:
        op2 = rng.choice([o for o in ops if o != "*"] or list(ops))
        d = rng.randint(0, bounds.right_max)
        if is_heldout(c, op2, d):
            return f"{a}{op}{b}={c}"
        return f"{a}{op}{b}={c}, {c}{op2}{d}={apply_op(c, op2, d)}"
    return f"{a}{op}{b}={c}"


def pretrain_text(seed: int, n_lines: int, ops: tuple[str, ...], bounds: OperandRange, max_ops: int = 3) -> str:
    rng = random.Random(seed)
    return "\n".join(pretrain_line(rng, ops, bounds, max_ops) for _ in range(n_lines)) + "\n"


@dataclass(frozen=True)
class Problem:
    """A multi-step problem: `question` is an expression evaluated left to right; `steps` are the
    gold subtasks ("12+7", "19+30") with their results, the last of which is the answer."""

    question: str
    steps: tuple[tuple[str, int], ...]
    answer: int


def make_problem(rng: random.Random, n_steps: int, ops: tuple[str, ...], operand_max: int,
                 value_max: int) -> Problem:
    """Draw a chain of `n_steps` one-operation subtasks whose running value stays in [0, value_max].

    Parentheses are added where `*` follows `+`/`-`, so ordinary precedence gives the chain's order.
    """
    if n_steps < 1:
        raise ValueError(f"n_steps must be >= 1, got {n_steps}")
    value = rng.randint(1, operand_max)
    expr, last_low = str(value), False
    steps: list[tuple[str, int]] = []
    while len(steps) < n_steps:
        op = rng.choice(ops)
        b = rng.randint(2, 9) if op == "*" else rng.randint(1, operand_max)
        nxt = apply_op(value, op, b)
        if not 0 <= nxt <= value_max:
            continue
        if op == "*" and last_low:
            expr = f"({expr})"
        expr = f"{expr}{op}{b}"
        steps.append((f"{value}{op}{b}", nxt))
        value, last_low = nxt, op in "+-"
    return Problem(question=expr, steps=tuple(steps), answer=value)
