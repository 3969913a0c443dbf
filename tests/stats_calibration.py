"""Does 08's verdict hold its level? Simulate studies with no true difference between two methods and
count how often 08's paired test calls one better or worse; then the power at a true +0.05. Then the
equivalence test: studies whose true difference is exactly +δ or −δ (the margin, `--margin`), and how
often 08 declares them equivalent within ±δ; and its power to do so at a true difference of 0.

    .venv/bin/python tests/stats_calibration.py [--reps 2000] [--items 200] [--seeds 3,5]
        [--spreads 0,0.02,0.04] [--effect 0.05] [--margin 0.03] [--agree 0.8] [--seed 0]

Each simulated study has S training seeds and N test items per seed. Item i of seed s has a base
accuracy p ~ Beta(3.5, 1.5) (mean 0.7, like the embedded default's warmup); method b is right when a
uniform u < p, method a when u' < p + δ_s, where u' is u itself with probability `agree` (two
checkpoints of one warmup agree on most items) and a fresh draw otherwise. δ_s, the seed's own true
difference, is drawn from N(effect, spread²): `spread` is how much training seeds disagree. The
studies go through `utils.eval.paired.comparisons`, the code 08 runs, as evaluations of `red` and
`grpo`; a rejection is any verdict but "no evidence either way" (Holm over one comparison is the
identity). With several seeds the verdict does not use the bootstrap, so it runs 200 resamples.

A false equivalence is a study at ±δ whose Holm-adjusted equivalence p is below 0.05, whatever the
difference test says (stricter than counting the verdict, which names a significant difference
first). At +δ the clip of p + δ at 1 makes the simulated true difference a little smaller than δ
(Beta(3.5, 1.5) puts about 1% of items above 1 − δ at δ = 0.03), which can only raise that rate.

Prints one line per setting (rate and its Monte Carlo standard error), the powers, and last
`null_rejection_max=<largest null rate> tost_false_equivalence_max=<largest false-equivalence rate>`.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from utils.eval.compare import Evaluation  # noqa: E402
from utils.eval.paired import comparisons  # noqa: E402


def simulate(rng, seeds: int, items: int, effect: float, spread: float, agree: float) -> list[Evaluation]:
    """One study: a `red` and a `grpo` evaluation per seed, paired on item ids."""
    evals = []
    for s in range(seeds):
        p = rng.beta(3.5, 1.5, size=items)
        delta = rng.normal(effect, spread)
        u = rng.random(items)
        u_a = np.where(rng.random(items) < agree, u, rng.random(items))
        for method, right in (("grpo", u < p), ("red", u_a < np.clip(p + delta, 0.0, 1.0))):
            scores = {f"test-{i:04d}": float(r) for i, r in enumerate(right)}
            evals.append(Evaluation("sim", s + 1, method, Path("."), {}, scores, {}))
    return evals


def rejection_rate(rng, reps: int, seeds: int, items: int, effect: float, spread: float, agree: float) -> float:
    hits = 0
    for _ in range(reps):
        (test,) = comparisons(simulate(rng, seeds, items, effect, spread, agree), resamples=200,
                              seed=int(rng.integers(2**31)))
        hits += test["verdict"] != "no evidence either way"
    return hits / reps


def equivalence_rate(rng, reps: int, seeds: int, items: int, effect: float, spread: float, agree: float,
                     margin: float) -> float:
    """The share of studies at true difference `effect` that 08 declares equivalent within ±margin."""
    hits = 0
    for _ in range(reps):
        (test,) = comparisons(simulate(rng, seeds, items, effect, spread, agree), resamples=200,
                              seed=int(rng.integers(2**31)), margin=margin)
        hits += test["tost_holm"] < 0.05
    return hits / reps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=2000, help="simulated studies per setting")
    ap.add_argument("--items", type=int, default=200, help="test items per seed")
    ap.add_argument("--seeds", default="3,5", help="comma-separated seed counts")
    ap.add_argument("--spreads", default="0,0.02,0.04", help="comma-separated sd of the per-seed true difference")
    ap.add_argument("--effect", type=float, default=0.05, help="true difference for the power line")
    ap.add_argument("--margin", type=float, default=0.03, help="equivalence margin (eval.equivalence_margin)")
    ap.add_argument("--agree", type=float, default=0.8, help="share of items whose two draws are shared")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    seed_counts = [int(x) for x in args.seeds.split(",")]
    spreads = [float(x) for x in args.spreads.split(",")]
    print(f"{args.reps} studies per setting, {args.items} items per seed, agreement {args.agree}")
    worst = 0.0
    for seeds in seed_counts:
        for spread in spreads:
            rate = rejection_rate(rng, args.reps, seeds, args.items, 0.0, spread, args.agree)
            se = (rate * (1 - rate) / args.reps) ** 0.5
            worst = max(worst, rate)
            print(f"null  seeds={seeds} spread={spread:.2f}: rejection {rate:.4f} (± {se:.4f})", flush=True)
    for seeds in seed_counts:
        rate = rejection_rate(rng, args.reps, seeds, args.items, args.effect, 0.0, args.agree)
        print(f"power seeds={seeds} effect=+{args.effect:.2f} spread=0.00: rejection {rate:.4f}", flush=True)
    false_eq = 0.0
    for seeds in seed_counts:
        for spread in spreads:
            for sign in (1, -1):
                rate = equivalence_rate(rng, args.reps, seeds, args.items, sign * args.margin, spread, args.agree,
                                        args.margin)
                se = (rate * (1 - rate) / args.reps) ** 0.5
                false_eq = max(false_eq, rate)
                print(f"tost  seeds={seeds} spread={spread:.2f} effect={sign * args.margin:+.2f}: "
                      f"equivalent {rate:.4f} (± {se:.4f})", flush=True)
    for seeds in seed_counts:
        rate = equivalence_rate(rng, args.reps, seeds, args.items, 0.0, 0.0, args.agree, args.margin)
        print(f"tost power seeds={seeds} effect=0.00 spread=0.00: equivalent {rate:.4f}", flush=True)
    print(f"null_rejection_max={worst:.4f} tost_false_equivalence_max={false_eq:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
