"""The reward spec: the scorer and weights that 02_build_rewards writes and later stages read.

`score_answer` is the one entry point the trainer and the evaluator call per episode; it returns
`(reward, components)` and never raises on model output.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from utils.config import field, from_dict, read_yaml, to_dict
from utils.manifest import atomic_write_text
from utils.rewards import SCORERS, RewardWeights, answer_score, composite
from utils.run_config import RewardConfig, RunConfig

FORMULA = "answer_scale*score + answer_shift + format_weight*format - efficiency_weight*max(0, tokens/efficiency_budget - 1)"


@dataclass
class RewardSpec(RewardConfig):
    """The `reward` config section plus the scorer it applies and the formula, for readers."""

    scorer: str = field("numeric", "Answer scorer: em | f1 | cem | numeric.")
    formula: str = field(FORMULA, "The composite, for readers of the spec.")

    @property
    def weights(self) -> RewardWeights:
        return RewardWeights(self.answer_scale, self.answer_shift, self.format_weight, self.efficiency_weight,
                             self.efficiency_budget, self.numeric_rel_tol)


def spec_from_config(cfg: RunConfig) -> RewardSpec:
    if cfg.data.scorer not in SCORERS:
        raise ValueError(f"data.scorer: unknown scorer '{cfg.data.scorer}'; valid: {', '.join(sorted(SCORERS))}")
    section = {f.name: getattr(cfg.reward, f.name) for f in fields(cfg.reward)}
    return RewardSpec(**section, scorer=cfg.data.scorer, formula=FORMULA)


def write_spec(spec: RewardSpec, path: Path) -> None:
    atomic_write_text(path, "# Written by 02_build_rewards.py; read by the trainer and the evaluator.\n"
                      + yaml.safe_dump(to_dict(spec), sort_keys=True))


def read_spec(path: Path) -> RewardSpec:
    return from_dict(RewardSpec, read_yaml(path), str(path))


def score_answer(spec: RewardSpec, question: str, pred: str | None, golds: list[str], fmt: float,
                 n_tokens: int) -> tuple[float, dict]:
    """The episode reward and its components (answer, format, efficiency_overrun, reward)."""
    if not spec.judge.enabled:
        return composite(spec.scorer, pred, golds, fmt, n_tokens, spec.weights)
    from utils.judge import judge_score

    score, comps = judge_score(spec.judge, question, pred, golds)
    w = spec.weights
    value, base = composite("em", None, golds, fmt, n_tokens, w)  # format and efficiency terms only
    value += w.answer_scale * score
    return value, {**base, **comps, "answer": score, "reward": value}


def gold_self_score(spec: RewardSpec, golds: list[str]) -> float:
    """The scorer's score of the first gold against all golds: 1.0 unless the scorer cannot use it."""
    return answer_score(spec.scorer, golds[0], golds, spec.numeric_rel_tol)[0] if golds else 0.0
