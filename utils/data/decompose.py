"""Gold decompositions read from the datasets' own annotations, as (subtask, result) steps.

Each function returns `(steps, None)` or `([], reason)`; the adapters store the steps in
`meta.steps` (what 03's `gold` source turns into SFT traces) or the reason in `meta.trace_error`
(what 03's stats.json counts). Nothing here raises on a row's content.

- FinQA `qa.program`, e.g. `subtract(1050, 1000), divide(#0, 1000)`: one subtask per operation in
  infix form (`1050 - 1000`, then `50 / 1000`). `#k` is the executed value of step k, `const_100`
  is 100 (`const_m1` is -1), `5%` is 0.05; `table_max/min/sum/average(row, none)` reduce the
  numbers of the table row with that header. The executed result must equal `exe_ans` (relative
  tolerance 1e-4), or the row gets no trace.
- GSM8K `<<expr=value>>` calculator annotations: one subtask per annotation; the answer after
  `####` must be among the results.
- HotpotQA `supporting_facts` (the release's [[title, sentence], ...] or the hub's {title: [...],
  sent_id: [...]}) of a bridge question: two hops when exactly two paragraphs support
  it and one of them names the other's title. Hop 1 asks, in the first paragraph, what the question
  leads to (result: the bridge title); hop 2 asks the question about that entity (result: the
  answer). Comparison questions have no trace: their per-hop values are not in the data.
"""
from __future__ import annotations

import math
import re

from utils.reward.scorers import parse_number

Steps = list[tuple[str, str]]
REL_TOL = 1e-4


def fmt_number(x: float) -> str:
    """A result as the executor would write it: integers without a point, else 6 significant digits."""
    if math.isfinite(x) and x == round(x) and abs(x) < 1e15:
        return str(int(round(x)))
    return f"{x:.6g}"


# ---------------------------------------------------------------- FinQA programs

_OP = re.compile(r"\s*([a-z_]+)\(([^()]*)\)\s*(?:,|$)")
_INFIX = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/", "exp": "^"}
_APPLY = {"add": lambda a, b: a + b, "subtract": lambda a, b: a - b, "multiply": lambda a, b: a * b,
          "divide": lambda a, b: a / b, "exp": lambda a, b: a ** b}
_TABLE = {"table_max": ("max", max), "table_min": ("min", min), "table_sum": ("sum", sum),
          "table_average": ("average", lambda v: sum(v) / len(v))}


def _finqa_arg(arg: str, done: list[float]) -> float:
    arg = arg.strip()
    if arg.startswith("#"):
        k = int(arg[1:]) if arg[1:].isdigit() else -1
        if not 0 <= k < len(done):
            raise ValueError(f"reference {arg} before step {k} was computed")
        return done[k]
    if arg.startswith("const_"):
        text = arg[len("const_"):]
        return -1.0 if text == "m1" else float(text)
    if arg.endswith("%"):
        return float(arg[:-1].replace(",", "")) / 100
    return float(arg.replace(",", ""))


def _cell_number(cell) -> float | None:
    """A table cell's number; an accounting negative '( 300 )' is -300, and in '$ -230 ( 230 )' the
    bracketed part only repeats the first."""
    text = str(cell).strip()
    value = parse_number(text)
    if value is not None and text.startswith("(") and value > 0:
        return -value
    return value


def _table_row(table: list, name: str) -> list[float]:
    want = " ".join(name.lower().split())
    for row in table:
        if isinstance(row, list) and row and " ".join(str(row[0]).lower().split()) == want:
            values = [v for v in map(_cell_number, row[1:]) if v is not None]
            if values:
                return values
            raise ValueError(f"table row '{name}' has no numbers")
    raise ValueError(f"no table row named '{name}'")


def _finqa_step(op: str, args: list[str], done: list[float], table: list) -> tuple[str, float, str]:
    """(subtask text, exact value, result text) of one program operation."""
    if op in _TABLE:
        word, reduce = _TABLE[op]
        values = _table_row(table, args[0])
        value = float(reduce(values))
        return f"{word} of {', '.join(fmt_number(v) for v in values)}", value, fmt_number(value)
    if len(args) != 2:
        raise ValueError(f"{op} takes 2 arguments, got {len(args)}")
    a, b = (_finqa_arg(x, done) for x in args)
    if op == "greater":
        return f"is {fmt_number(a)} greater than {fmt_number(b)}", float(a > b), "yes" if a > b else "no"
    if op not in _INFIX:
        raise ValueError(f"unknown operation '{op}'")
    if op == "divide" and b == 0:
        raise ValueError("division by zero")
    value = _APPLY[op](a, b)
    if not isinstance(value, float) or not math.isfinite(value):
        raise ValueError(f"{op}({fmt_number(a)}, {fmt_number(b)}) is not a finite real number")
    return f"{fmt_number(a)} {_INFIX[op]} {fmt_number(b)}", value, fmt_number(value)


def finqa_program_steps(program: str | None, table: list, gold) -> tuple[Steps, str | None]:
    if not isinstance(program, str) or not program.strip():
        return [], "no program"
    ops, pos, text = [], 0, program.strip()
    while pos < len(text):
        m = _OP.match(text, pos)
        if not m:
            return [], f"cannot parse the program at character {pos}: {text[pos:pos + 30]!r}"
        ops.append((m.group(1), [a for a in m.group(2).split(",")]))
        pos = m.end()
    steps, done = [], []
    for k, (op, args) in enumerate(ops):
        try:
            task, value, shown = _finqa_step(op, args, done, table)
        except (ValueError, OverflowError) as exc:
            return [], f"step {k} ({op}): {exc}"
        steps.append((task, shown))
        done.append(value)
    if not _matches(steps[-1][1], done[-1], gold):
        return [], f"program gives {steps[-1][1]}, gold is {gold}"
    return steps, None


def _matches(shown: str, value: float, gold) -> bool:
    if isinstance(gold, str) and gold.strip().lower() in ("yes", "no"):
        return shown == gold.strip().lower()
    target = parse_number(str(gold))
    return target is not None and math.isclose(value, target, rel_tol=REL_TOL, abs_tol=1e-9)


# ---------------------------------------------------------------- GSM8K annotations

_CALC = re.compile(r"<<([^<>=]+)=([^<>]+)>>")


def gsm8k_annotation_steps(answer_text: str, final: str) -> tuple[Steps, str | None]:
    steps = [(" ".join(e.split()), r.strip()) for e, r in _CALC.findall(answer_text)]
    if not steps:
        return [], "no <<expr=value>> annotations"
    target = parse_number(final)
    if target is None or not any((v := parse_number(r)) is not None and math.isclose(v, target, rel_tol=REL_TOL)
                                 for _, r in steps):
        return [], f"no annotation's result is the answer {final}"
    return steps, None


# ---------------------------------------------------------------- HotpotQA hops

def hotpot_bridge_hops(qtype, supporting, paragraphs: list[tuple[str, str]]) -> tuple[tuple[str, str] | None, str | None]:
    """((first paragraph's title, bridge paragraph's title), None) of a bridge question, or (None, why not)."""
    if qtype != "bridge":
        return None, f"{qtype or 'untyped'} question: hops without intermediate values in the data"
    if isinstance(supporting, dict):  # the hub's form: {title: [...], sent_id: [...]}
        supporting = [[t] for t in supporting.get("title") or [] if isinstance(t, str)]
    if not isinstance(supporting, list):
        return None, "no supporting_facts"
    titles = list(dict.fromkeys(f[0] for f in supporting if isinstance(f, list) and f and isinstance(f[0], str)))
    if len(titles) != 2:
        return None, f"{len(titles)} supporting paragraphs (two hops need 2)"
    text = dict(paragraphs)
    first = [t for t, other in (titles, titles[::-1]) if other.lower() in text.get(t, "").lower()]
    if len(first) != 1:
        return None, "no supporting paragraph names the other (bridge entity not found)"
    a = first[0]
    return (a, titles[1] if a == titles[0] else titles[0]), None


def hotpot_bridge_steps(question: str, answer: str, qtype, supporting, paragraphs: list[tuple[str, str]]
                        ) -> tuple[Steps, str | None]:
    """The two hops: from paragraph a to the bridge entity b (b's title), then from b to the answer."""
    hops, why = hotpot_bridge_hops(qtype, supporting, paragraphs)
    if hops is None:
        return [], why
    a, b = hops
    return [(f'In "{a}", which entity does this question lead to? {question}', b),
            (f"About {b}: {question}", answer)], None
