"""Process rewards: a score for each planner step, is this subtask a sensible next step toward the
answer? (CDRA's generative process reward model, `reward.process`; their step advantages:
utils/train/losses.py `process_advantages`).

Two scorers, each giving one value per planner turn of an episode (None for a turn that delegates
nothing: the final answer, or a malformed turn):
- `verifier` (the default when on), for rows with a gold decomposition (meta.steps): turn k's
  subtask scores 1 when it is the k-th gold step with the results the executors actually returned
  substituted, 0 otherwise. On an arithmetic chain the gold step "19*3" after an executor that
  answered 18 becomes "18*3": the planner is judged on its own step, not on an executor's slip.
  Where gold steps do not chain (lookups, GSM8K), the subtask must equal the gold step. A row
  without a gold decomposition gets no step rewards.
- `judge`: a model (by default the SFT warmup itself, on its own engine) is shown the question,
  the steps so far and the proposed subtask through `reward.process.judge_template` and asked for
  yes or no; the first "yes" or "no" in its greedy reply scores 1 or 0, anything else 0 and is
  counted as unparsed. The tiny model was never taught to judge: on the embedded default this
  path is plumbing, exercised by tests, not a useful signal.
"""
from __future__ import annotations

import re

from utils.agent.episode import Episode
from utils.agent.protocol import ANSWER, EXECUTOR, extract_tag
from utils.agent.sampling import SamplingSpec
from utils.reward.scorers import compact


def executor_results(ep: Episode) -> dict[int, str | None]:
    """Planner turn -> the answer its executor call returned (its last segment's <answer>)."""
    out: dict[int, str | None] = {}
    for s in ep.segments:
        if s.role == EXECUTOR:
            out[s.turn] = extract_tag(s.text, ANSWER)
    return out


def expected_steps(gold: list[tuple[str, str]], results: dict[int, str | None]) -> list[str]:
    """The gold steps with the executors' actual results chained in: step k (k > 0) that starts with
    gold result k−1 starts instead with what turn k−1's executor returned."""
    out = []
    for k, (task, _) in enumerate(gold):
        prev = gold[k - 1][1] if k else None
        got = results.get(k - 1)
        if prev is not None and got is not None and task.startswith(prev):
            task = got + task[len(prev):]
        out.append(task)
    return out


def verifier_rewards(ep: Episode, row: dict) -> list[float | None]:
    """One value per planner turn: 1 if its subtask is the expected gold step, 0 if not, None for a
    turn that delegates nothing; all None for a row without a gold decomposition."""
    tasks = ep.turn_subtasks
    steps = (row.get("meta") or {}).get("steps") or []
    if not steps:
        return [None] * len(tasks)
    gold = [(str(s["task"]), str(s["result"])) for s in steps]
    want = expected_steps(gold, executor_results(ep))
    return [None if t is None else float(k < len(want) and compact(t) == compact(want[k]))
            for k, t in enumerate(tasks)]


_VERDICT = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


def parse_verdict(reply: str) -> float | None:
    """1.0 for a reply whose first yes/no is yes, 0.0 for no, None when it has neither."""
    m = _VERDICT.search(reply or "")
    return None if m is None else float(m.group(1).lower() == "yes")


class JudgePRM:
    """The generative process reward model: one greedy request per delegating planner turn, on an
    engine (utils/agent/sampling.py) serving the judge; `unparsed` counts replies without a verdict."""

    def __init__(self, engine, tokenizer, template: str, max_tokens: int):
        self.engine, self.tok, self.template, self.max_tokens = engine, tokenizer, template, max_tokens
        self.unparsed = 0

    def prompt(self, question: str, done: list[str], subtask: str) -> str:
        steps = "; ".join(done) or "none"
        try:
            return self.template.format(question=question, steps=steps, subtask=subtask)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"reward.process.judge_template: cannot render {self.template!r}: {exc!r} "
                             f"(fields: question, steps, subtask)") from None

    def __call__(self, episodes: list[Episode]) -> list[list[float | None]]:
        asks, out = [], []
        for e, ep in enumerate(episodes):
            tasks = ep.turn_subtasks
            out.append([None] * len(tasks))
            done = []
            for k, task in enumerate(tasks):
                if task is not None:
                    asks.append((e, k, self.prompt(ep.question, list(done), task)))
                    done.append(task)
        spec = SamplingSpec(temperature=0.0, max_tokens=self.max_tokens, stop=["\n"], logprobs=False)
        replies = self.engine.generate([self.tok(p, add_special_tokens=False)["input_ids"] for _, _, p in asks],
                                       spec, [0] * len(asks)) if asks else []
        for (e, k, _), samples in zip(asks, replies):
            verdict = parse_verdict(samples[0].text)
            self.unparsed += verdict is None
            out[e][k] = verdict or 0.0
        return out
