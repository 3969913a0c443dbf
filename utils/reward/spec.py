"""The reward spec: the scorer and weights that 02_build_rewards writes and later stages read.

`score_answer` scores one answer and returns `(reward, components)`, never raising on model
output; `score_episodes` is what the trainer and the evaluator call on a batch of episodes.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from utils.agent.episode import Episode
from utils.agent.protocol import EXECUTOR, PLANNER
from utils.core.config import field, from_dict, read_yaml, to_dict
from utils.core.files import atomic_write_text
from utils.core.schema import RewardConfig, RunConfig
from utils.reward.scorers import answer_score, composite, shaped_reward, subtask_independence

FORMULA = ("answer_scale*score + answer_shift + format_weight*format - efficiency_weight*max(0, tokens/efficiency_budget - 1)"
           " + independence_weight*independence")


@dataclass
class RewardSpec(RewardConfig):
    """The `reward` config section plus the scorer it applies and the formula, for readers."""

    scorer: str = field("numeric", "Answer scorer: em | f1 | cem | numeric.")
    formula: str = field(FORMULA, "The composite, for readers of the spec.")


def spec_from_config(cfg: RunConfig) -> RewardSpec:
    """The `reward` section plus the scorer (data.scorer, already checked against its choices)."""
    section = {f.name: getattr(cfg.reward, f.name) for f in fields(cfg.reward)}
    return RewardSpec(**section, scorer=cfg.data.scorer, formula=FORMULA)


def write_spec(spec: RewardSpec, path: Path) -> None:
    atomic_write_text(path, "# Written by 02_build_rewards.py; read by the trainer and the evaluator.\n"
                      + yaml.safe_dump(to_dict(spec), sort_keys=True))


def read_spec(path: Path) -> RewardSpec:
    return from_dict(RewardSpec, read_yaml(path), str(path))


def score_answer(spec: RewardSpec, question: str, pred: str | None, golds: list[str], fmt: float,
                 n_tokens: int, subtasks: list[str] = ()) -> tuple[float, dict]:
    """The episode reward and its components (answer, format, efficiency_overrun, independence, reward)."""
    independence = subtask_independence(list(subtasks), spec.independence_refs)
    if not spec.judge.enabled:
        return composite(spec.scorer, pred, golds, fmt, n_tokens, spec, independence)
    from utils.reward.judge import judge_score

    score, comps = judge_score(spec.judge, question, pred, golds)
    value, base = shaped_reward(score, fmt, n_tokens, spec, independence)
    return value, {**base, **comps, "answer": score, "reward": value}


def gold_self_score(spec: RewardSpec, golds: list[str]) -> float:
    """The scorer's score of the first gold against all golds: 1.0 unless the scorer cannot use it."""
    return answer_score(spec.scorer, golds[0], golds, spec.numeric_rel_tol)[0] if golds else 0.0


def score_episodes(episodes: list[Episode], spec: RewardSpec) -> list[dict]:
    """One record per episode: its reward and components, status, counts and transcript."""
    out = []
    for ep in episodes:
        reward, comps = score_answer(spec, ep.question, ep.final_answer, ep.golds, ep.format_score, ep.n_generated(),
                                     ep.subtasks)
        out.append({"qid": ep.qid, "sample": ep.sample, "status": ep.status, "error": ep.error,
                    "prediction": ep.final_answer, "golds": ep.golds, "reward": reward, **comps,
                    "turns": ep.n_turns, "subtasks": ep.n_subtasks,
                    "tokens_planner": ep.n_generated(PLANNER), "tokens_executor": ep.n_generated(EXECUTOR),
                    "transcript": ep.transcript})
    return out
