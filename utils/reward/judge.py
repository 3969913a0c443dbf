"""Optional LLM-judge scorer behind an OpenAI-compatible endpoint (a `vllm serve` judge is the
intended backend). Disabled by default (`reward.judge.enabled`).

The judge is asked for an integer score from 0 to 10 for a prediction against the gold answers;
`parse_judge_score` reads the first integer in 0..10 of its reply and normalises to [0, 1]. An
unparseable reply scores 0 and says so in the components; it never raises. An unreachable
endpoint is a configuration error, reported once, clearly, by `check_judge`.
"""
from __future__ import annotations

import re

from utils.core.http import HTTP_ERRORS, describe_error, request_json
from utils.core.schema import JudgeConfig

RUBRIC = ("You are a strict grader. Question: {question}\nGold answer(s): {golds}\n"
          "Candidate answer: {pred}\nReply with one integer from 0 (wrong) to 10 (fully correct) and nothing else.")


class JudgeUnreachable(RuntimeError):
    pass


def _request(cfg: JudgeConfig, path: str, body: dict | None) -> dict:
    return request_json(cfg.base_url, path, body, cfg.timeout, cfg.api_key_env)


def check_judge(cfg: JudgeConfig) -> list[str]:
    """The model names the endpoint serves; JudgeUnreachable with a clear message otherwise."""
    try:
        listing = _request(cfg, "/models", None)
    except HTTP_ERRORS as exc:
        raise JudgeUnreachable(
            f"reward.judge is enabled but {cfg.base_url} is unreachable ({getattr(exc, 'reason', exc)}); "
            f"start a judge (e.g. `python -m utils.deploy.serve --port 8000`) or set reward.judge.enabled=false") from None
    names = [m.get("id") for m in listing.get("data", []) if isinstance(m, dict)]
    if cfg.model not in names:
        raise JudgeUnreachable(f"judge endpoint {cfg.base_url} serves {names}, not reward.judge.model='{cfg.model}'")
    return names


def parse_judge_score(reply: str) -> float | None:
    match = re.search(r"\b(10|[0-9])\b", str(reply))
    return int(match.group(1)) / 10 if match else None


def judge_score(cfg: JudgeConfig, question: str, pred: str | None, golds: list[str]) -> tuple[float, dict]:
    """(score in [0, 1], components). Network or parse failures score 0 and are named in components."""
    if pred is None:
        return 0.0, {"judge_reply": None, "judge_error": "no prediction"}
    prompt = RUBRIC.format(question=question, golds=" | ".join(golds), pred=str(pred)[:2000])
    body = {"model": cfg.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 8,
            "temperature": 0.0}
    try:
        reply = _request(cfg, "/chat/completions", body)["choices"][0]["message"]["content"]
    except HTTP_ERRORS as exc:
        return 0.0, {"judge_reply": None, "judge_error": describe_error(exc)}
    except (KeyError, IndexError, TypeError) as exc:
        return 0.0, {"judge_reply": None, "judge_error": f"unexpected reply ({type(exc).__name__}: {exc})"}
    score = parse_judge_score(reply)
    if score is None:
        return 0.0, {"judge_reply": reply, "judge_error": "no score 0-10 in reply"}
    return score, {"judge_reply": reply, "judge_error": None}
