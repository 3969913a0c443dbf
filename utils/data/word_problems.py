"""Generated grade-school word problems in GSM8K's native schema, for real models offline.

No package ships GSM8K's data, and the hub is unreachable here, so `bash download.sh --dataset
word_problems` writes multi-step word problems from templates, seeded, in GSM8K's own format:
`{"question", "answer"}` where the answer is a worked solution whose calculations are annotated
`<<48/2=24>>` and whose last line is `#### N` (plus `id`, and `template` and `numbers`, the instance,
which the adapter ignores). The `gsm8k` adapter, its gold decompositions (one
subtask per annotation, utils/data/decompose.py) and the numeric scorer read them unchanged.

A problem is a template (2 or 3 operations over +, -, *, /, every intermediate value a whole
number) filled with numbers, a name and an object. Its *instance* is (template, numbers): the
splits are drawn in order train, val, test, and an instance already drawn is never drawn again,
so no val or test problem repeats a train problem's arithmetic under other names. Knobs (the data
config): `seed`, `n_train`/`n_val`/`n_test`, `min_steps`/`max_steps` (which templates) and
`operand_max` (the largest number a problem states, change and bills aside).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from utils.core.hashing import config_sha256
from utils.data.draw import draw_splits, publish_splits, up_to_date

GENERATOR_VERSION = 3  # raised whenever the same config would write other files: an older folder is rewritten
NAMES = (("Ana", "she"), ("Ben", "he"), ("Carla", "she"), ("Dev", "he"), ("Elena", "she"), ("Farid", "he"),
         ("Grace", "she"), ("Hugo", "he"), ("Ines", "she"), ("Jamal", "he"), ("Keiko", "she"), ("Liam", "he"),
         ("Maya", "she"), ("Noah", "he"), ("Olga", "she"), ("Pablo", "he"), ("Rosa", "she"), ("Sam", "he"))
ITEMS = ("apples", "marbles", "stickers", "pencils", "cookies", "books", "shells", "stamps", "cards", "eggs",
         "oranges", "buttons")


@dataclass(frozen=True)
class Problem:
    template: str
    numbers: tuple[int, ...]
    question: str
    lines: tuple[tuple[str, str, int], ...]  # (sentence before the calculation, expression, value)

    @property
    def answer(self) -> str:
        body = "\n".join(f"{lead} {expr} = <<{expr}={value}>>{value}." for lead, expr, value in self.lines)
        return f"{body}\n#### {self.lines[-1][2]}"


def _add_sub(r, n, who, item, other):
    a, b = r.randint(2, n), r.randint(2, n)
    c = r.randint(1, a + b - 1)
    return (a, b, c), (f"{who[0]} has {a} {item}. {who[1].capitalize()} buys {b} more and then gives {c} to "
                       f"{other}. How many {item} does {who[0]} have now?",
                       [(f"After buying more, {who[0]} has", f"{a}+{b}", a + b),
                        (f"After giving some away, {who[1]} has", f"{a + b}-{c}", a + b - c)])


def _packs(r, n, who, item, other):
    a, b = r.randint(2, n), r.randint(2, n)
    c = r.randint(1, a * b - 1)
    return (a, b, c), (f"{who[0]} buys {a} packs of {item}. Each pack holds {b} {item}. {who[1].capitalize()} "
                       f"uses {c} of them. How many {item} are left?",
                       [(f"{who[0]} buys", f"{a}*{b}", a * b), ("The number left is", f"{a * b}-{c}", a * b - c)])


def _two_days(r, n, who, item, other):
    a, b = r.randint(2, n), r.randint(2, 5)
    return (a, b), (f"A shop sold {a} {item} on Monday. On Tuesday it sold {b} times as many. How many {item} "
                    f"did it sell on the two days together?",
                    [("On Tuesday the shop sold", f"{a}*{b}", a * b), ("Together it sold", f"{a}+{a * b}", a + a * b)])


def _share(r, n, who, item, other):
    c, each = r.randint(2, 6), r.randint(1, n)
    a = r.randint(2, n)
    total = c * each * a  # every share whole: a bags of (c*each) items, shared by c friends
    b = c * each
    return (a, b, c), (f"{who[0]} has {a} bags with {b} {item} in each bag. {who[1].capitalize()} shares them "
                       f"equally among {c} friends. How many {item} does each friend get?",
                       [(f"{who[0]} has", f"{a}*{b}", total), ("Each friend gets", f"{total}/{c}", total // c)])


def _change(r, n, who, item, other):
    a, b = r.randint(2, n), r.randint(2, 6)
    bill = next(x for x in (10, 20, 50, 100, 200) if x >= a * b)
    return (a, b, bill), (f"One box of {item} costs {a} dollars. {who[0]} buys {b} boxes and pays with a "
                          f"{bill}-dollar bill. How much change does {who[1]} get, in dollars?",
                          [("The boxes cost", f"{a}*{b}", a * b), ("The change is", f"{bill}-{a * b}", bill - a * b)])


def _pages(r, n, who, item, other):
    a, b, c = r.randint(2, n), r.randint(2, n), r.randint(2, n)
    return (a, b, c), (f"{who[0]} read {a} pages on Monday, {b} pages on Tuesday and {c} pages on Wednesday. "
                       f"How many pages did {who[1]} read in all?",
                       [("On Monday and Tuesday together", f"{a}+{b}", a + b), ("In all", f"{a + b}+{c}", a + b + c)])


def _more_than(r, n, who, item, other):
    a, b = r.randint(2, n), r.randint(1, n)
    return (a, b), (f"{who[0]} has {a} {item}. {other} has {b} more {item} than {who[0]}. How many {item} do "
                    f"they have together?",
                    [(f"{other} has", f"{a}+{b}", a + b), ("Together they have", f"{a}+{a + b}", a + a + b)])


def _savings(r, n, who, item, other):
    a, b = r.randint(2, n), r.randint(2, 8)
    c = r.randint(1, a * b - 1)
    return (a, b, c), (f"{who[0]} saves {a} dollars every week for {b} weeks, then spends {c} dollars on a "
                       f"gift. How many dollars does {who[1]} have left?",
                       [(f"{who[0]} saves", f"{a}*{b}", a * b), ("After the gift", f"{a * b}-{c}", a * b - c)])


def _half(r, n, who, item, other):
    a, b = 2 * r.randint(1, n), r.randint(1, n)
    return (a, b), (f"{who[0]} had {a} {item}. {who[1].capitalize()} gave half of them to {other} and then "
                    f"found {b} more. How many {item} does {who[0]} have now?",
                    [(f"{who[0]} kept", f"{a}/2", a // 2), ("Now there are", f"{a // 2}+{b}", a // 2 + b)])


def _picking(r, n, who, item, other):
    a, b = r.randint(2, n), r.randint(2, 6)
    c = r.randint(1, a * b - 1)
    x = a * b
    return (a, b, c), (f"{who[0]} picks {a} {item} each day for {b} days. {other} picks {c} fewer {item} in "
                       f"total than {who[0]}. How many {item} did they pick altogether?",
                       [(f"{who[0]} picks", f"{a}*{b}", x), (f"{other} picks", f"{x}-{c}", x - c),
                        ("Altogether they picked", f"{x}+{x - c}", 2 * x - c)])


def _rows(r, n, who, item, other):
    a, b, c = r.randint(2, n), r.randint(2, n), r.randint(1, 5)
    return (a, b, c), (f"A garden has {a} rows of {b} {item}. {who[0]} adds {c} more rows of the same size. "
                       f"How many {item} are in the garden now?",
                       [("The garden has", f"{a}+{c}", a + c), ("rows, so it holds", f"{a + c}*{b}", (a + c) * b)])


def _trip(r, n, who, item, other):
    a, b, c = r.randint(2, n), r.randint(2, 5), r.randint(2, n)
    return (a, b, c), (f"{who[0]} buys {a} {item}. {other} buys {b} times as many, and then they get {c} more "
                       f"as a gift. How many {item} do they have in all?",
                       [(f"{other} buys", f"{a}*{b}", a * b), ("Both bought", f"{a}+{a * b}", a + a * b),
                        ("With the gift", f"{a + a * b}+{c}", a + a * b + c)])


TEMPLATES: dict[str, tuple[int, Callable]] = {  # name -> (operations, maker)
    "add_sub": (2, _add_sub), "packs": (2, _packs), "two_days": (2, _two_days), "share": (2, _share),
    "change": (2, _change), "pages": (2, _pages), "more_than": (2, _more_than), "savings": (2, _savings),
    "half": (2, _half), "rows": (2, _rows), "picking": (3, _picking), "trip": (3, _trip),
}


def make_problem(rng: random.Random, template: str, operand_max: int) -> Problem:
    who, item = rng.choice(NAMES), rng.choice(ITEMS)
    other = rng.choice([n for n, _ in NAMES if n != who[0]])
    numbers, (question, steps) = TEMPLATES[template][1](rng, operand_max, who, item, other)
    return Problem(template, numbers, question, tuple(steps))


def generate(cfg) -> dict[str, list[dict]]:
    """The three splits' native rows; no (template, numbers) instance is drawn twice across them."""
    names = [t for t, (ops, _) in TEMPLATES.items() if cfg.min_steps <= ops <= cfg.max_steps]
    if not names:
        raise ValueError(f"data.min_steps={cfg.min_steps}, data.max_steps={cfg.max_steps}: the word-problem "
                         f"templates have 2 or 3 operations; no template fits")
    if cfg.operand_max < 2:
        raise ValueError(f"data.operand_max={cfg.operand_max}: word problems need numbers of at least 2")
    sizes = {"train": cfg.n_train, "val": cfg.n_val, "test": cfg.n_test}
    for split, n in sizes.items():
        if isinstance(n, float):
            raise ValueError(f"data.n_{split}={n}: word problems are drawn as a count, not a fraction")
    rng = random.Random(cfg.seed)
    drawn = draw_splits(sizes, lambda: make_problem(rng, rng.choice(names), cfg.operand_max),
                        lambda p: (p.template, p.numbers),
                        f"cannot draw {sum(sizes.values())} distinct word problems with operand_max="
                        f"{cfg.operand_max}; raise it or draw fewer")
    return {split: [{"id": f"{split}-{i:05d}", "question": p.question, "answer": p.answer, "template": p.template,
                     "numbers": list(p.numbers)} for i, p in enumerate(problems)]
            for split, problems in drawn.items()}


def write_word_problems(cfg, out_dir: Path) -> Path:
    """Write train/val/test.jsonl and manifest.json into `out_dir`, atomically; a no-op when the
    folder already holds this config's files."""
    from utils.core.config import to_dict

    digest = config_sha256({"config": to_dict(cfg), "generator": GENERATOR_VERSION})
    if up_to_date(out_dir, digest):
        print(f"word_problems: {out_dir} is up to date")
        return out_dir
    splits = generate(cfg)
    publish_splits(out_dir, splits, {"generator": "utils/data/word_problems.py", "config": to_dict(cfg),
                                     "config_sha256": digest, "generator_version": GENERATOR_VERSION,
                                     "templates": sorted(TEMPLATES)})
    print(f"word_problems: wrote {out_dir} {({s: len(r) for s, r in splits.items()})}")
    return out_dir
