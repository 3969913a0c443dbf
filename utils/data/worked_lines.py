"""Calculations read from worked-solution prose: `a op b ... = value` inside a sentence, with its units.

GSM-Symbolic's worked solutions (`answer_cot`, utils/data/gsm_symbolic.py) are GSM8K's prose without
its `<<expr=value>>` calculator annotations: "Sophia processes 49 orders/day * 4 = 196 orders/day."
This module finds each calculation in a line and writes it as the bare expression an Executor is
asked (`49 * 4`), with the value the line states (`196`), so the data can carry GSM8K's annotations
and the `gsm8k` adapter's gold decomposition reads it unchanged.

A calculation is read at each `=` whose right side starts with a number: the left side's tail that
parses as `number [units] (operator number [units])*`, brackets allowed, where units are words after a
number ("shrimp/minute", "days/week") and dropped, `x` and `×` are multiplication, `÷` division,
currency signs and thousands commas go, and `20%` becomes `20/100`. It is kept only when the
expression, evaluated exactly (fractions), equals the stated value within a relative 1e-4: a line
whose numbers do not add up as read is never passed off as a calculation. A tail that is a single
number (`T = 241 - 144 = 97` reads `241 - 144 = 97` and nothing before it) is a restatement, not a
calculation. What a line holds that this cannot read, e.g. an unknown (`74 + 39 + 31 + T = 144 + T`),
is reported as unread, with the line, and the caller decides (utils/data/gsm_symbolic.py gives such a
problem no gold decomposition).
"""
from __future__ import annotations

import math
import operator
import re
from fractions import Fraction

Calculation = tuple[str, str, Fraction, int]  # (expression as the executor reads it, the stated value's text,
#                                              its value, which `=` of the line: 0 is the first)

REL_TOL = 1e-4
_TOKEN = re.compile(r"""
    (?P<frac>\d+/\d+(?![\d.]))                        # 1/2 written tight: one number, (1/2)
  | (?P<num>[$£€]?\s?\d[\d,]*(?:\.\d+)?%?|[$£€]?\.\d+%?)(?:/[A-Za-z]+)?  # 1,050  $14  20%  £60/day
  | (?P<op>[-+*/×÷−]|\bx\b)                           # x between numbers is a times sign
  | (?P<open>\() | (?P<close>\))
  | (?P<word>[A-Za-z][A-Za-z'’]*(?:/[A-Za-z]+)*)    # a unit after a number: days, orders/day
  | (?P<other>\S)
""", re.VERBOSE)
_RESULT = re.compile(r"\s*[$£€]?\s?(-?\d+/\d+(?![\d.])|-?\d[\d,]*(?:\.\d+)?|-?\.\d+)(\s?%)?")
_OPS = {"×": "*", "x": "*", "÷": "/", "−": "-"}
_ARITHMETIC = re.compile(r"\d\s*(?:[-+*/×÷(]|\bx\b)|[-+*/×÷)]\s*\d|\d[A-Za-z]\b")  # a sum, product, bracket or 2x
MAX_UNITS = 6  # words allowed after one number: "pieces", "orders/day", "skeins per pair of leg warmers"


def _number(kind: str, text: str) -> str:
    """A number token as the expression writes it: no currency, commas or unit after a slash, 20% as
    20/100, a tight fraction in brackets so that `10÷1/2` stays 10 / (1/2)."""
    bare = re.sub(r"/[A-Za-z]+$", "", text.strip()).lstrip("$£€").strip().replace(",", "")
    if kind == "frac":
        return f"({bare})"
    return f"{bare[:-1]}/100" if bare.endswith("%") else bare


def _tail(left: str) -> str | None:
    """The expression that ends `left` (the text before an `=`), or None when its tail is no
    calculation: `number [units] (op number [units])*` read backwards, at least one operator. A
    dangling operator before the first number (a list's "- " bullet) is not part of it."""
    toks = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(left)]
    out: list[str] = []
    i, depth, ops = len(toks) - 1, 0, 0
    done = (0, 0, 0)  # (len(out), depth, ops) after the last complete number
    while True:  # expecting a number, after skipping its units and closing brackets
        units = 0
        while i >= 0 and (toks[i][0] == "word" and toks[i][1] != "x" or toks[i][0] == "close"):
            if toks[i][0] == "close":
                depth += 1
                out.append(")")
            else:
                units += 1
            i -= 1
        if units > MAX_UNITS or i < 0 or toks[i][0] not in ("num", "frac"):
            break
        out.append(_number(*toks[i]))
        i -= 1
        while i >= 0 and toks[i][0] == "open" and depth > 0:
            depth -= 1
            out.append("(")
            i -= 1
        done = (len(out), depth, ops)
        if i >= 0 and toks[i][0] in ("num", "frac") and out[-1] == "(":
            return None  # 2(73+57): a product written as a bracket, not read
        if i >= 0 and toks[i][0] == "op":
            out.append(_OPS.get(toks[i][1], toks[i][1]))
            ops += 1
            i -= 1
            continue
        break
    size, depth, ops = done
    out = out[:size]
    while out and out[0] == ")" and depth > 0:  # closed after the last number, opened before the first
        out.pop(0)
        depth -= 1
    if ops == 0 or depth:
        return None
    expr = " ".join(reversed(out)).replace("( ", "(").replace(" )", ")")
    return expr[1:-1] if re.fullmatch(r"\(\d+/\d+\)", expr) else expr


_APPLY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def evaluate(expr: str) -> Fraction | None:
    """`expr` (numbers, + - * /, brackets) evaluated exactly, or None when it does not parse or
    divides by zero. A small recursive-descent parser: no eval()."""
    toks = re.findall(r"\d+(?:\.\d+)?|\.\d+|[-+*/()]", expr)
    if "".join(toks) != expr.replace(" ", ""):
        return None
    pos = 0

    def atom():
        nonlocal pos
        if pos < len(toks) and toks[pos] == "-":
            pos += 1
            return -atom()
        if pos < len(toks) and toks[pos] == "(":
            pos += 1
            value = add()
            if pos >= len(toks) or toks[pos] != ")":
                raise ValueError("unclosed bracket")
            pos += 1
            return value
        if pos >= len(toks) or not re.fullmatch(r"\d+(?:\.\d+)?|\.\d+", toks[pos]):
            raise ValueError("number expected")
        pos += 1
        return Fraction(toks[pos - 1])

    def level(ops: str, inner):  # one precedence level: inner (op inner)*, left to right
        def parse():
            nonlocal pos
            value = inner()
            while pos < len(toks) and toks[pos] in ops:
                op = toks[pos]
                pos += 1
                value = _APPLY[op](value, inner())
            return value
        return parse

    add = level("+-", level("*/", atom))

    try:
        value = add()
    except (ValueError, ZeroDivisionError):
        return None
    return value if pos == len(toks) else None


def _close(a: Fraction, b: Fraction) -> bool:
    return math.isclose(float(a), float(b), rel_tol=REL_TOL, abs_tol=1e-9)


def line_calculations(line: str) -> tuple[list[Calculation], list[str], list[str]]:
    """The calculations of one line, in order; those it states whose left side evaluates to another
    value (`wrong`: the line's arithmetic is off, e.g. a rounded-down answer); and the `=` before a
    number, after a sentence with digits, that reads as no calculation (`unread`: an unknown, a word
    such as "half", a bracket as a product)."""
    parts = line.split("=")
    found, wrong, unread = [], [], []
    for k in range(len(parts) - 1):
        m = _RESULT.match(parts[k + 1])
        if not m:
            continue
        shown = m.group(1).replace(",", "")
        value = Fraction(shown) / (100 if m.group(2) else 1)
        shown += "%" if m.group(2) else ""
        expr = _tail(parts[k])
        if expr is None:
            sentence = re.split(r"[.:;,]\s|\n", parts[k])[-1]
            if _ARITHMETIC.search(sentence):
                unread.append(f"{sentence.strip()[-60:]} = {shown}")
            continue
        got = evaluate(expr)
        if got is None:
            unread.append(f"{expr} = {shown} (does not parse)")
        elif not _close(got, value):
            wrong.append(f"{expr} = {shown} (evaluates to {float(got):g})")
        else:
            found.append((expr, shown, value, k))
    return found, wrong, unread


def worked_calculations(solution: str) -> tuple[list[Calculation], list[str], list[str]]:
    """Every line's calculations before the `#### N` line, and the wrong and unread ones, each as
    `line k: ...` (`line_calculations`)."""
    found, wrong, unread = [], [], []
    for k, line in enumerate(solution.split("####")[0].splitlines(), 1):
        calcs, off, missed = line_calculations(line)
        found += calcs
        wrong += [f"line {k}: {m}" for m in off]
        unread += [f"line {k}: {m}" for m in missed]
    return found, wrong, unread
