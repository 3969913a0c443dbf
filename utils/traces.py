"""SFT traces: complete planner/executor episodes in the exact protocol the rollouts use.

A trace is built from a decomposition: a list of (subtask, result) steps and a final answer.
- `gold`: the synthetic task's own steps (meta.steps).
- `solution`: a worked solution's lines, e.g. GSM8K's "48/2 = 24" becomes subtask "48/2" with
  result "24"; lines without a trailing "= number" are skipped.

Turn texts (the same tags everywhere; the contents are what the tiny model can learn):
    planner, step k:  <think>{remaining expression}</think><task>{subtask}</task>
    planner, final:   <think>{answer}</think><answer>{answer}</answer>
    executor:         <think>{subtask}={result}</think><answer>{result}</answer>
For a question that is not an arithmetic chain, the planner's think is "step k".

Each trace becomes per-role `Example`s of exact token ids with a loss mask: the planner example
is the whole conversation (prompt and injected <result> tokens masked); each executor call is its
own example (prompt masked), since its context is decoupled.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from utils.rollout import Codec


@dataclass
class Example:
    qid: str
    role: str
    ids: list[int]
    mask: list[int]

    def to_json(self) -> dict:
        return {"qid": self.qid, "role": self.role, "ids": self.ids, "mask": self.mask}


@dataclass
class Trace:
    qid: str
    question: str
    planner_turns: list[str]
    executor_calls: list[tuple[str, str]]  # (subtask, executor text)
    results: list[str]
    answer: str


def _remaining(question: str, steps: list[tuple[str, str]], k: int) -> str:
    """The expression left after substituting the first k results (arithmetic chains only)."""
    expr = question.replace("(", "").replace(")", "")
    for task, result in steps[:k]:
        if not expr.startswith(task):
            return f"step {k + 1}"
        expr = result + expr[len(task):]
    return expr


def make_trace(qid: str, question: str, steps: list[tuple[str, str]], answer: str) -> Trace:
    turns, calls = [], []
    for k, (task, result) in enumerate(steps):
        turns.append(f"<think>{_remaining(question, steps, k)}</think><task>{task}</task>")
        calls.append((task, f"<think>{task}={result}</think><answer>{result}</answer>"))
    turns.append(f"<think>{answer}</think><answer>{answer}</answer>")
    return Trace(qid, question, turns, calls, [r for _, r in steps], answer)


_SOLUTION_LINE = re.compile(r"([0-9][0-9.,]*\s*[-+*/x×]\s*[0-9.,]+(?:\s*[-+*/x×]\s*[0-9.,]+)*)\s*=\s*\$?\s*([-0-9.,]+)")


def steps_from_solution(solution: str) -> list[tuple[str, str]]:
    """(subtask, result) pairs from worked-solution lines that contain "expr = number"."""
    steps = []
    for line in (solution or "").splitlines():
        m = _SOLUTION_LINE.search(line)
        if m:
            steps.append((" ".join(m.group(1).split()), m.group(2).rstrip(".,").replace(",", "")))
    return steps


def trace_from_row(row: dict, source: str) -> Trace | None:
    """A trace for a prepared row, or None if the source cannot decompose it."""
    if source == "gold":
        steps = [(s["task"], str(s["result"])) for s in row.get("meta", {}).get("steps", [])]
    elif source == "solution":
        steps = steps_from_solution(row.get("solution") or "")
    else:
        raise ValueError(f"unknown trace source '{source}'; valid: gold, solution, teacher")
    if not steps:
        return None
    return make_trace(row["id"], row["question"], steps, row["answers"][0])


def examples_from_trace(trace: Trace, codec: Codec, context: str | None = None) -> list[Example]:
    """Per-role training examples with the exact ids a rollout would produce for this episode."""
    _, ids = codec.planner_prompt(trace.question, context)
    mask = [0] * len(ids)
    for k, turn in enumerate(trace.planner_turns):
        gen = codec.plain(turn)
        ids, mask = ids + gen, mask + [1] * len(gen)
        if k < len(trace.results):
            _, inj = codec.result(trace.results[k])
            ids, mask = ids + inj, mask + [0] * len(inj)
    out = [Example(trace.qid, "planner", ids, mask)]
    for task, text in trace.executor_calls:
        ctx, gen = codec.executor_prompt(task), codec.plain(text)
        out.append(Example(trace.qid, "executor", ctx + gen, [0] * len(ctx) + [1] * len(gen)))
    return out


def trace_from_episode(ep) -> tuple[Trace, list[Example]]:
    """A teacher episode kept by rejection sampling: its texts, and examples over its exact ids."""
    planner = [s for s in ep.segments if s.role == "planner"]
    execs = [s for s in ep.segments if s.role == "executor"]
    tasks = [extract_task(s.text) for s in planner[:len(execs)]]
    trace = Trace(ep.qid, ep.question, [s.text for s in planner], list(zip(tasks, [s.text for s in execs])),
                  [], ep.final_answer or "")
    ids, mask, _ = ep.planner_sequence()
    examples = [Example(ep.qid, "planner", ids, mask)]
    examples += [Example(ep.qid, "executor", s.context_ids + s.gen_ids, [0] * len(s.context_ids) + [1] * len(s.gen_ids))
                 for s in execs]
    return trace, examples


def extract_task(text: str) -> str:
    from utils.rewards import extract_tag

    return extract_tag(text, "task") or ""


def trace_record(trace: Trace, examples: list[Example], source: str) -> dict:
    return {"qid": trace.qid, "question": trace.question, "answer": trace.answer, "source": source,
            "planner_turns": trace.planner_turns, "executor_calls": [list(c) for c in trace.executor_calls],
            "examples": [e.to_json() for e in examples]}


def read_trace_examples(path, roles=("planner", "executor")) -> list[Example]:
    """All training examples of sft_traces.jsonl; errors name the file and row."""
    import json

    from utils.data_adapters import DataError

    out = []
    for i, line in enumerate(open(path, encoding="utf-8"), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            for e in rec["examples"]:
                if e["role"] in roles:
                    if len(e["ids"]) != len(e["mask"]):
                        raise DataError(path, i, "examples.mask", "mask and ids differ in length")
                    out.append(Example(rec["qid"], e["role"], e["ids"], e["mask"]))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise DataError(path, i, None, f"not a trace record ({type(exc).__name__}: {exc})") from None
    return out
