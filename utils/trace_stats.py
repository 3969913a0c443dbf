"""Statistics of a set of SFT traces: counts, token lengths per role, examples."""
from __future__ import annotations

import statistics

from utils.traces import Example


def _dist(values: list[int]) -> dict:
    if not values:
        return {"count": 0}
    return {"count": len(values), "mean": round(statistics.fmean(values), 2), "max": max(values), "min": min(values)}


def trace_stats(records: list[dict], examples: list[Example], rows_seen: int, accepted: int, sampled: int,
                source: str) -> dict:
    by_role = {}
    for role in ("planner", "executor"):
        ex = [e for e in examples if e.role == role]
        by_role[role] = {"examples": len(ex), "trained_tokens": _dist([sum(e.mask) for e in ex]),
                         "total_tokens": _dist([len(e.ids) for e in ex])}
    return {
        "source": source, "traces": len(records), "rows_seen": rows_seen,
        "acceptance_rate": round(accepted / sampled, 4) if sampled else None,
        "sampled_episodes": sampled, "accepted_episodes": accepted,
        "turns_per_trace": _dist([len(r["planner_turns"]) for r in records]),
        "roles": by_role,
        "examples": [{k: r[k] for k in ("qid", "question", "answer", "planner_turns", "executor_calls")}
                     for r in records[:3]],
    }
