"""Generated hostile model outputs for the reward functions (tests/test_rewards.py and
benchmarks/reward_fuzz.py): random bytes decoded leniently, deep, unclosed and interleaved tags,
megabyte strings and numbers in every format. Deterministic in the seed."""
from __future__ import annotations

import random

TAGS = ("think", "task", "answer", "result")
NUMBERS = ("1,234", "-3.50", "$5", "12%", "1/2", "1/0", ".5", "3.2e3", "1e309", "-0", "\u22127", "0x1F", "NaN",
           "inf", "١٢٣", "1 234", "(300)", "9" * 400)


def _tags(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 40)):
        tag = rng.choice(TAGS)
        parts.append(rng.choice([f"<{tag}>", f"</{tag}>", f"<{tag}", f"{tag}>", rng.choice(NUMBERS), " "]))
    return "".join(parts)


def _nested(rng: random.Random) -> str:
    depth = rng.randint(1, 2000)
    tag = rng.choice(TAGS)
    inner = rng.choice(NUMBERS)
    close = f"</{tag}>" * rng.randint(0, depth)
    return f"<{tag}>" * depth + inner + close


def _bytes(rng: random.Random) -> str:
    raw = bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))
    codec, errors = rng.choice([("utf-8", "replace"), ("utf-8", "ignore"), ("utf-8", "surrogateescape"),
                                ("latin-1", "strict"), ("utf-16", "replace")])
    return raw.decode(codec, errors=errors)  # lone surrogates included: not valid text


def _huge(rng: random.Random) -> str:
    unit = rng.choice(["<answer>", "9", "<think>x", " ", "1,", "</task>", "\ufffd"])
    return unit * (1_000_000 // len(unit))


def _numbers(rng: random.Random) -> str:
    return rng.choice(["", "<answer>", "answer: ", "$ "]) + " ".join(rng.choice(NUMBERS) for _ in range(rng.randint(1, 5)))


# answers that make a symbolic checker work: huge powers and factorials, deep nesting, long sums (the
# numeric scorer's math-verify path, utils/reward/verify.py; benchmarks/reward_fuzz.py times them)
HOSTILE_MATH = ("$9^{9^{9^{9}}}$", "\\boxed{10^{10^{10^{10}}}}", "$100000000!$", "$(((((((((2)))))))))^{999999999}$",
                "$" + "{" * 500 + "1" + "}" * 500 + "$", "$" + "+".join(["x"] * 2000) + "$",
                "\\boxed{\\frac{1}{0}}", "$\\sqrt[99999999]{2}^{99999999}$", "$" + "\\frac{1}{" * 300 + "2" + "}" * 300 + "$",
                "$e^{e^{e^{e^{e^{e}}}}}$", "$\\sum_{k=1}^{10^{12}} k$", "$\\int_0^1 x^{x^{x}} dx$")


KINDS = {"tags": _tags, "nested": _nested, "bytes": _bytes, "numbers": _numbers, "huge": _huge}


def fuzz_strings(n: int, seed: int = 0, huge_every: int = 500) -> list[tuple[str, str]]:
    """n (kind, text) pairs: one megabyte string every `huge_every`, the rest spread over the other kinds."""
    rng = random.Random(seed)
    small = [k for k in KINDS if k != "huge"]
    out = []
    for i in range(n):
        kind = "huge" if i % huge_every == huge_every - 1 else small[i % len(small)]
        out.append((kind, KINDS[kind](rng)))
    return out
