"""Bootstrap statistics: the one resampling routine behind 07's accuracy CI and 08's paired tests.

Both resample items with replacement from a seeded numpy generator and read percentile bounds;
`bootstrap_ci` resamples one method's item scores, `paired_bootstrap` the per-item differences of
two methods on the items both were evaluated on (so the same items pair with themselves).
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
    """Paired bootstrap of mean(a) - mean(b) over the keys both share: the mean difference, its
    percentile 95% CI and a two-sided p-value (how often a resampled difference lands on the other
    side of zero); significant when the CI excludes zero."""
    import numpy as np

    keys = sorted(set(a) & set(b))
    if not keys:
        return {"n": 0, "diff": None, "ci95_low": None, "ci95_high": None, "p_value": None, "significant": False}
    d = np.array([a[k] - b[k] for k in keys], dtype=np.float64)
    means = _resampled_means(d, resamples, seed)
    lo, hi = np.percentile(means, [2.5, 97.5])
    p = min(1.0, 2 * min(float((means <= 0).mean()), float((means >= 0).mean())))
    if not d.any():
        p = 1.0
    return {"n": len(keys), "diff": round(float(d.mean()), 6), "ci95_low": round(float(lo), 6),
            "ci95_high": round(float(hi), 6), "p_value": round(p, 6),
            "significant": bool(lo > 0 or hi < 0)}
