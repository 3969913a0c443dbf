"""Statistics of the evaluation: bootstrap CIs, the seed-aware paired test, Holm's correction.

One resampling routine (`_resampled_means`: items with replacement from a seeded numpy generator)
serves 07's accuracy CI (`bootstrap_ci`) and 08's paired test (`paired_bootstrap`), which resamples
training seeds first and then each drawn seed's items, so its CI carries run-to-run training
variance as well as test-item sampling. `holm` adjusts a family of p-values; `verdict` turns a
comparison into better / worse / no evidence either way; `mean_ci_across_seeds` is a t-interval.
"""
from __future__ import annotations


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


def paired_bootstrap(a: dict, b: dict, resamples: int = 10000, seed: int = 0) -> dict:
    """Paired bootstrap of mean(a) - mean(b) that carries run-to-run training variance.

    `a` and `b` map (training seed, item id) to a score. Each resample draws the training seeds
    with replacement, then, independently for every drawn seed, that seed's items with replacement;
    its statistic is the mean over the drawn seeds of their mean item difference (every seed weighs
    the same). With one seed this is the plain paired item bootstrap: it then says nothing about
    training variance, and `seeds` in the result says so. The p-value is two-sided: how often a
    resampled difference lands on the other side of zero; significant when the CI excludes zero.
    """
    import numpy as np

    keys = sorted(set(a) & set(b), key=str)
    if not keys:
        return {"n": 0, "seeds": 0, "diff": None, "ci95_low": None, "ci95_high": None, "p_value": None,
                "significant": False}
    by_seed: dict = {}
    for k in keys:
        by_seed.setdefault(k[0], []).append(a[k] - b[k])
    diffs = [np.asarray(v, dtype=np.float64) for _, v in sorted(by_seed.items(), key=lambda kv: str(kv[0]))]
    s = len(diffs)
    rng = np.random.default_rng(seed)
    # item-level resample means for every (slot k, seed j, resample r), drawn independently per slot
    item_means = np.stack([np.stack([_resampled_means(d, resamples, int(rng.integers(2**31))) for d in diffs])
                           for _ in range(s)])  # [slot, seed, resample]
    picked = rng.integers(0, s, size=(resamples, s))  # [resample, slot]
    means = item_means[np.arange(s)[None, :], picked, np.arange(resamples)[:, None]].mean(axis=1)  # [resample]
    point = float(np.mean([d.mean() for d in diffs]))
    lo, hi = np.percentile(means, [2.5, 97.5])
    p = min(1.0, 2 * min(float((means <= 0).mean()), float((means >= 0).mean())))
    if not any(d.any() for d in diffs):
        p = 1.0
    return {"n": len(keys), "seeds": s, "diff": round(point, 6), "ci95_low": round(float(lo), 6),
            "ci95_high": round(float(hi), 6), "p_value": round(p, 6), "significant": bool(lo > 0 or hi < 0)}


def holm(p_values: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the input order (family-wise error control)."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = round(running, 6)
    return adjusted


def verdict(diff: float | None, p_adjusted: float | None, alpha: float = 0.05) -> str:
    """How red compares with an arm: better, worse, or no evidence either way (at `alpha`, adjusted)."""
    if diff is None or p_adjusted is None or p_adjusted >= alpha:
        return "no evidence either way"
    return "better" if diff > 0 else "worse"


# two-sided 95% quantiles of Student's t for 1-30 degrees of freedom (standard tables)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def mean_ci_across_seeds(values: list[float]) -> tuple[float, float | None, float | None]:
    """(mean, 95% CI low, high) of per-seed values with a t interval; no CI from one seed."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None, None
    sd = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5
    half = (_T975[n - 2] if n - 1 <= len(_T975) else 1.96) * sd / n ** 0.5
    return mean, mean - half, mean + half
