"""Worst-case time of the reward functions on hostile outputs: the 10,000 generated strings of
tests/test_rewards.py (utils/reward/fuzz.py) through the format score of both roles and every
scorer's composite reward, then the answers made to stall a symbolic checker (`HOSTILE_MATH`) through
the numeric scorer's math-verify path, whose time limit (utils/reward/verify.py) bounds each. Prints
the slowest case per kind and overall; the math-verify child's start is outside every timing.

    .venv/bin/python benchmarks/reward_fuzz.py [--n 10000]
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from utils.agent.protocol import format_score  # noqa: E402
from utils.core.schema import RewardConfig  # noqa: E402
from utils.reward.fuzz import HOSTILE_MATH, fuzz_strings  # noqa: E402
from utils.reward.scorers import composite  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=10_000)
    n = ap.parse_args().n
    w, worst = RewardConfig(), {}
    composite("numeric", "x = 1 + 1", ["2"], 1.0, 1, w)  # starts the math-verify child
    for kind, text in fuzz_strings(n):
        t0 = time.perf_counter()
        fmt = max(format_score(text, "planner")[0], format_score(text, "executor")[0])
        for scorer in ("em", "f1", "cem", "numeric"):
            composite(scorer, text, ["5", "the Tessel"], fmt, len(text), w)
        ms = (time.perf_counter() - t0) * 1000
        if ms > worst.get(kind, (0.0, 0))[0]:
            worst[kind] = (ms, len(text))
    for text in HOSTILE_MATH:
        t0 = time.perf_counter()
        _, parts = composite("numeric", f"<answer>{text}</answer>", ["5"], 1.0, len(text), w)
        ms = (time.perf_counter() - t0) * 1000
        if ms > worst.get("math", (0.0, 0))[0]:
            worst["math"] = (ms, len(text))
        print(f"math     {ms:8.2f} ms  {text[:40]!r}")
    for kind, (ms, size) in sorted(worst.items(), key=lambda kv: -kv[1][0]):
        print(f"{kind:8s} worst {ms:7.2f} ms  ({size:,} chars)")
    print(f"cases={n} worst_ms={max(ms for ms, _ in worst.values()):.2f}")


if __name__ == "__main__":
    main()
