"""pass@k from n samples per item: the unbiased estimator and its k grid.

An item sampled n times with c fully correct samples (an F1 of 0.5 is not correct) has
pass@k = 1 − C(n−c, k) / C(n, k): the chance that k of its n samples, drawn without replacement,
include a correct one (Chen et al. 2021). Averaged over items it estimates the policy's pass@k
without bias for every k ≤ n, so one evaluation of n samples gives the whole curve. 07 writes each
item's (c, n) into predictions.jsonl, so any k ≤ n can be recomputed from it; 08's analysis of the
curves is utils/eval/curves.py.
"""
from __future__ import annotations

import math


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one item with c correct among n samples (k ≤ n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@{k} of {c} correct in {n} samples: need 0 <= c <= n and 1 <= k <= n")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def k_grid(n: int) -> list[int]:
    """k = 1, 2, 4, … up to n, and n itself."""
    ks = [2 ** i for i in range(n.bit_length()) if 2 ** i <= n]
    return ks + ([n] if n not in ks else [])


def curve(counts, ks: list[int]) -> dict[str, float]:
    """{"k": mean over items of pass@k} for the items' (c, n) counts."""
    counts = list(counts)
    return {str(k): round(sum(pass_at_k(n, c, k) for c, n in counts) / max(len(counts), 1), 6) for k in ks}
