"""Statistics of the evaluation: bootstrap CIs, the paired test behind 08's verdicts, Holm's correction.

- `bootstrap_ci`: 07's percentile CI of an accuracy (test items resampled).
- `paired_test`: a − b on items paired by (training seed, item id). With two or more training seeds
  the verdict's test is a paired t-test over the per-seed mean differences (seeds − 1 degrees of
  freedom): the seeds are the independent units, and at 3 seeds resampling them (a hierarchical
  bootstrap) underestimates their spread and rejects too often (tests/stats_calibration.py
  measures both). With one seed it is the paired item bootstrap, which covers test-item sampling
  only. Either way the item bootstrap within each seed is reported beside it, and so is the
  minimum detectable effect at the study's seed and item counts.
- Bootstrap p-values are never 0: (hits + 1) / (resamples + 1) per tail.
- With an equivalence margin δ > 0 (`eval.equivalence_margin`), the same test runs as two one-sided
  tests (Schuirmann's TOST) of H0: diff ≤ −δ and H0: diff ≥ δ, each at α = 0.05: over seeds two
  one-sided t-tests (df seeds − 1), at one seed the item bootstrap's tails beyond ±δ. `tost_p` is the
  larger of the two p-values; below α, the 90% interval (`ci90_*`) lies inside ±δ.
- `holm` adjusts a family of p-values; `verdict` turns a comparison into better / worse /
  equivalent within ±δ / no evidence either way; `mean_ci_across_seeds` is a t-interval.
"""
from __future__ import annotations

import math


def _resampled_means(values, resamples: int, seed: int):
    """Means of `resamples` bootstrap resamples of the 1-D array `values` -> [resamples]."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return values[rng.integers(0, len(values), size=(resamples, len(values)))].mean(axis=1)


def bootstrap_ci(values: list[float], seed: int = 0, resamples: int = 1000, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of `values`."""
    import numpy as np

    if not values:
        return (0.0, 0.0)
    means = _resampled_means(np.asarray(values, dtype=np.float64), resamples, seed)
    lo, hi = np.percentile(means, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return (round(float(lo), 6), round(float(hi), 6))


def _by_seed(a: dict, b: dict) -> list:
    """Per training seed (in seed order), the array of paired item differences a − b."""
    import numpy as np

    by_seed: dict = {}
    for k in sorted(set(a) & set(b), key=str):
        by_seed.setdefault(k[0], []).append(a[k] - b[k])
    return [np.asarray(v, dtype=np.float64) for _, v in sorted(by_seed.items(), key=lambda kv: str(kv[0]))]


def item_bootstrap(diffs: list, resamples: int, seed: int, margin: float = 0.0) -> dict:
    """Within-seed interval: each seed's items resampled with replacement (the seeds kept as they
    are), the statistic the mean over seeds of their mean difference. Covers test-item sampling
    only. p two-sided, (hits + 1) / (resamples + 1) per tail, so never 0. With `margin` δ > 0 also
    the equivalence test: `tost_p` the larger tail beyond ±δ ((hits + 1) / (resamples + 1) each),
    and the 90% percentile interval."""
    import numpy as np

    rng = np.random.default_rng(seed)
    means = np.mean([_resampled_means(d, resamples, int(rng.integers(2**31))) for d in diffs], axis=0)  # [resample]
    lo, hi = np.percentile(means, [2.5, 97.5])
    tail = min(int((means <= 0).sum()), int((means >= 0).sum()))
    p = 1.0 if not any(d.any() for d in diffs) else min(1.0, 2 * (tail + 1) / (resamples + 1))
    out = {"ci95_low": round(float(lo), 6), "ci95_high": round(float(hi), 6), "p_value": round(p, 6),
           "se": float(means.std(ddof=1)) if resamples > 1 else 0.0}
    if margin > 0:
        lo90, hi90 = np.percentile(means, [5.0, 95.0])
        beyond = max(int((means <= -margin).sum()), int((means >= margin).sum()))
        out.update(tost_p=round(min(1.0, (beyond + 1) / (resamples + 1)), 6), ci90_low=round(float(lo90), 6),
                   ci90_high=round(float(hi90), 6))
    return out


def seed_tost(per_seed: list[float], sd: float, margin: float) -> dict:
    """Two one-sided t-tests over S ≥ 2 per-seed differences (df = S − 1) against ±`margin`, with the
    sd `seed_t_test` used (its floor included): `tost_p` the larger one-sided p, `ci90_*` the
    t-interval at 90%, which lies inside ±margin exactly when tost_p < 0.05."""
    s = len(per_seed)
    mean, df = sum(per_seed) / s, s - 1
    se = sd / s ** 0.5
    if se > 0:
        p = max(_upper_tail((mean + margin) / se, df), _upper_tail((margin - mean) / se, df))
    else:  # no spread at all: the mean is the difference
        p = 0.0 if abs(mean) < margin else 1.0
    half = t_quantile(0.95, df) * se
    return {"tost_p": round(min(1.0, p), 6), "ci90_low": round(mean - half, 6), "ci90_high": round(mean + half, 6)}


def _upper_tail(t: float, df: int) -> float:
    """P(T ≥ t) for Student's t with df degrees of freedom."""
    half = t_two_sided_p(t, df) / 2
    return half if t >= 0 else 1.0 - half


def seed_t_test(per_seed: list[float], item_se: float = 0.0, alpha: float = 0.05, power: float = 0.8) -> dict:
    """Paired t-test of mean(per_seed) = 0 over S ≥ 2 per-seed differences (df = S − 1), its
    t-interval, and the minimum detectable effect at `alpha` (two-sided, before Holm) and `power`:
    (t_{1−α/2} + t_{power}) · sd / √S, sd the per-seed differences' sample sd. Seeds whose differences
    are all equal have no sample spread at all; sd is then `item_se`, the per-seed differences' own
    test-item standard error (root-mean-squared over seeds), the least they vary by. (Using that
    floor always would hold the level too, but at 3 seeds it cut the power at +0.05 from 0.53 to
    0.21: tests/stats_calibration.py.)"""
    s = len(per_seed)
    mean = sum(per_seed) / s
    sd = (sum((d - mean) ** 2 for d in per_seed) / (s - 1)) ** 0.5
    sd = sd if sd > 1e-12 else item_se
    df, crit = s - 1, t_quantile(1 - alpha / 2, s - 1)
    if sd > 0:
        t = mean / (sd / s ** 0.5)
        p = t_two_sided_p(t, df)
    else:  # every item of every seed has the same difference
        t, p = (0.0, 1.0) if mean == 0 else (math.copysign(math.inf, mean), 2 / 2 ** s)
    half = crit * sd / s ** 0.5
    return {"t": t, "df": df, "p_value": round(p, 6), "ci95_low": round(mean - half, 6),
            "ci95_high": round(mean + half, 6), "sd": sd,
            "mde": round((crit + t_quantile(power, df)) * sd / s ** 0.5, 6)}


def paired_test(a: dict, b: dict, resamples: int = 10000, seed: int = 0, margin: float = 0.0) -> dict:
    """The verdict's test of mean(a) − mean(b), with a and b mapping (training seed, item id) to a
    score (module docstring). `test` names it; `ci95_*` and `p_value` are its own; `item_ci95_*`
    the within-seed item bootstrap; `mde` the smallest difference it would detect with 80% power
    at alpha 0.05 before Holm (at one seed: from the bootstrap's standard error). With `margin` δ > 0,
    `margin`, `tost_p` and `ci90_*`: the equivalence test of the same data against ±δ."""
    diffs = _by_seed(a, b)
    tost = {"margin": margin, "tost_p": None, "ci90_low": None, "ci90_high": None} if margin > 0 else {}
    if not diffs:
        return {"n": 0, "seeds": 0, "diff": None, "test": None, "ci95_low": None, "ci95_high": None,
                "p_value": None, "item_ci95_low": None, "item_ci95_high": None, "mde": None, "significant": False,
                **tost}
    per_seed = [float(d.mean()) for d in diffs]
    items = item_bootstrap(diffs, resamples, seed, margin if len(diffs) == 1 else 0.0)
    if len(diffs) >= 2:
        item_se = (sum(d.var(ddof=1) / len(d) if len(d) > 1 else 0.0 for d in diffs) / len(diffs)) ** 0.5
        main = seed_t_test(per_seed, float(item_se))
        test = f"paired t over {len(diffs)} seeds (df {len(diffs) - 1})"
        if margin > 0:
            tost.update(seed_tost(per_seed, main["sd"], margin))
    else:
        main = {**items, "mde": round((1.959964 + 0.841621) * items["se"], 6)}
        test = "paired item bootstrap (1 seed)"
        if margin > 0:
            tost.update({k: items[k] for k in ("tost_p", "ci90_low", "ci90_high")})
    lo, hi = max(main["ci95_low"], -1.0), min(main["ci95_high"], 1.0)  # a difference of scores in [0, 1]
    return {"n": sum(len(d) for d in diffs), "seeds": len(diffs), "diff": round(sum(per_seed) / len(per_seed), 6),
            "per_seed": [round(x, 6) for x in per_seed], "test": test, "ci95_low": lo, "ci95_high": hi,
            "p_value": main["p_value"], "item_ci95_low": items["ci95_low"], "item_ci95_high": items["ci95_high"],
            "mde": main["mde"], "significant": bool(main["p_value"] < 0.05), **tost}


def holm(p_values: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the input order (family-wise error control)."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = round(running, 6)
    return adjusted


def verdict(diff: float | None, p_adjusted: float | None, alpha: float = 0.05, tost_adjusted: float | None = None,
            margin: float = 0.0) -> str:
    """How the first checkpoint compares with the second, at `alpha` on Holm-adjusted p-values: better or
    worse when the difference test rejects; else "equivalent within ±δ" when the equivalence test
    (`tost_adjusted`, margin δ) does; else no evidence either way."""
    if diff is not None and p_adjusted is not None and p_adjusted < alpha:
        return "better" if diff > 0 else "worse"
    if margin > 0 and tost_adjusted is not None and tost_adjusted < alpha:
        return f"equivalent within ±{margin:g}"
    return "no evidence either way"


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| ≥ |t|) for Student's t with integer df ≥ 1, in closed form (Abramowitz and Stegun 26.7.3
    and 26.7.4: finite sums in θ = atan(|t| / √df))."""
    if math.isinf(t):
        return 0.0
    theta = math.atan(abs(t) / math.sqrt(df))
    c2, sin = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:  # odd: (2/π)(θ + sinθ cosθ Σ_{k=1}^{(df−3)/2} (2·4···2k)/(3·5···(2k+1)) cos^{2k}θ)
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= 2 * k / (2 * k + 1) * c2
            total += term
        inside = 2 / math.pi * (theta + sin * math.cos(theta) * total)
    else:  # even: sinθ Σ_{k=0}^{(df−2)/2} (1·3···(2k−1))/(2·4···2k) cos^{2k}θ
        term, total = 1.0, 1.0
        for k in range(1, df // 2):
            term *= (2 * k - 1) / (2 * k) * c2
            total += term
        inside = sin * total
    return min(1.0, max(0.0, 1.0 - inside))


def t_quantile(q: float, df: int) -> float:
    """The q-quantile (q in (0.5, 1)) of Student's t with integer df, by bisection on t_two_sided_p."""
    lo, hi = 0.0, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 1 - t_two_sided_p(mid, df) / 2 < q else (lo, mid)
    return (lo + hi) / 2


def mean_ci_across_seeds(values: list[float]) -> tuple[float, float | None, float | None]:
    """(mean, 95% CI low, high) of per-seed values with a t interval; no CI from one seed."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None, None
    sd = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5
    half = t_quantile(0.975, n - 1) * sd / n ** 0.5
    return mean, mean - half, mean + half
