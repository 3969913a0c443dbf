"""Greedy evaluation of the full Planner/Executor agent: rollouts on rows, scored by the reward spec."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

from utils.reward_spec import RewardSpec, score_answer
from utils.rollout import Codec, Episode, Rollout, RolloutSpec


def score_episodes(episodes: list[Episode], spec: RewardSpec) -> list[dict]:
    out = []
    for ep in episodes:
        reward, comps = score_answer(spec, ep.question, ep.final_answer, ep.golds, ep.format_score, ep.n_generated())
        out.append({"qid": ep.qid, "sample": ep.sample, "status": ep.status, "error": ep.error,
                    "prediction": ep.final_answer, "golds": ep.golds, "reward": reward, **comps,
                    "turns": ep.n_turns, "subtasks": ep.n_subtasks,
                    "tokens_planner": ep.n_generated("planner"), "tokens_executor": ep.n_generated("executor"),
                    "transcript": ep.transcript})
    return out


def summarize_scores(scored: list[dict]) -> dict:
    n = max(len(scored), 1)
    mean = lambda k: round(sum(s[k] for s in scored) / n, 6)  # noqa: E731
    return {"n": len(scored), "accuracy": mean("answer"), "format": mean("format"), "reward": mean("reward"),
            "answered": round(sum(s["status"] == "answered" for s in scored) / n, 6),
            "turns": mean("turns"), "subtasks": mean("subtasks"),
            "tokens_planner": mean("tokens_planner"), "tokens_executor": mean("tokens_executor"),
            "status": dict(sorted(Counter(s["status"] for s in scored).items()))}


def greedy_eval(engine, codec: Codec, rows: list[dict], spec: RewardSpec, rollout: RolloutSpec) -> tuple[dict, list[dict]]:
    """(summary metrics, per-episode records) of greedy rollouts on `rows`."""
    episodes = Rollout(engine, codec, replace(rollout, temperature=0.0)).run(rows, n=1, seed=0)
    scored = score_episodes(episodes, spec)
    return summarize_scores(scored), scored


def failure_category(record: dict) -> str:
    """correct | wrong_answer | no_answer | malformed | hit_max_turns | executor_error."""
    status = record["status"]
    if status == "answered":
        if not (record["prediction"] or "").strip():
            return "no_answer"
        return "correct" if record["answer"] >= 1.0 else "wrong_answer"
    return {"max_turns": "hit_max_turns"}.get(status, status)


def bootstrap_ci(values: list[float], seed: int = 0, resamples: int = 1000, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean, resampling items with a seeded RNG."""
    import random

    if not values:
        return (0.0, 0.0)
    rng, n = random.Random(seed), len(values)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    lo = means[int((1 - level) / 2 * resamples)]
    hi = means[min(int((1 + level) / 2 * resamples), resamples - 1)]
    return (round(lo, 6), round(hi, 6))
