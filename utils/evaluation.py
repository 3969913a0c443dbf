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
