"""SFT traces: complete planner/executor episodes in the exact protocol the rollouts use.

A trace is built from a decomposition: a list of (subtask, result) steps and a final answer.
- `gold`: the dataset's own decomposition (meta.steps): the synthetic task's steps, FinQA's
  executed program, GSM8K's calculator annotations, HotpotQA's bridge hops (utils/data/decompose.py);
  a row without one says why in meta.trace_error.
- `solution`: a worked solution's lines, e.g. GSM8K's "48/2 = 24" becomes subtask "48/2" with
  result "24"; lines without a trailing "= number" are skipped.

Turn texts (the same tags everywhere; the contents are what the tiny model can learn):
    planner, step k:  <think>{remaining expression}</think><task>{subtask}</task>
    planner, final:   <think>{answer}</think><answer>{answer}</answer>
    executor:         <think>{subtask}={result}</think><answer>{result}</answer>
    executor, a lookup step (the step names a search query; the search tool is on):
                      <think>{subtask}</think><search>{query}</search>
                      <information>{top-k passages, retrieved by the run's own index}</information>
                      <think>{result}</think><answer>{result}</answer>
With `model.templates.thinking: actor_critic` every think of the roles `actor_critic_roles` names,
but a search step's, is an actor-critic one (`ThinkStyle`):
    planner, step k:  actor: {remaining expression} critic: ok refined: {subtask}
    planner, final:   actor: {answer} critic: ok refined: {answer}
    executor:         actor: {subtask}={shown} critic: check: {subtask}={shown} ok|no refined: {subtask}={result}
where {shown} is the result, or for `traces.critic_error_rate` of integer-result steps (drawn per
question and step from the run's seed) the result off by one, which the critic flags "no": the
same "check: a+b=c ok|no" lines the tiny base model was pretrained on.
For a question that is not an arithmetic chain, the planner's think is "step k". A lookup step
whose gold fact (`fact`) is not among the passages the search returns gives no trace: the
demonstration would answer from nothing.

A trace is first laid out as the `Episode` a rollout would have produced (exact ids through the
codec), and then turned into training examples by the same `episode_sequences` the RL trainer
uses: the planner example is the whole conversation (prompt and injected <result> tokens masked);
each executor call is its own example (prompt masked), since its context is decoupled.
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass

from utils.agent.episode import Episode, Example, Segment, episode_sequences
from utils.agent.protocol import (EXECUTOR, PLANNER, SEARCH, TASK, THINK, actor_critic_think, executor_turn,
                                  extract_tag, planner_answer_turn, planner_task_turn, thinks_actor_critic, wrap)
from utils.agent.rollout import Codec
from utils.agent.sampling import derive_seed
from utils.core.config import ConfigError
from utils.core.io import DataError, read_records


@dataclass(frozen=True)
class ThinkStyle:
    """How gold traces fill <think>: `plain`, or `actor_critic` with a share of deliberate actor slips."""
    mode: str = "plain"
    critic_error_rate: float = 0.0
    seed: int = 0
    roles: str = "both"  # the roles that think actor-critic (templates.actor_critic_roles)

    @classmethod
    def from_config(cls, cfg) -> ThinkStyle:
        rate = cfg.traces.critic_error_rate
        if not 0.0 <= rate <= 1.0:
            raise ConfigError(f"traces.critic_error_rate: {rate} is not a share in [0, 1]")
        t = cfg.model.templates
        return cls(t.thinking, rate, cfg.seed, t.actor_critic_roles)

    def _on(self, role: str) -> bool:
        return thinks_actor_critic(self.mode, self.roles, role)

    def planner(self, remaining: str, decision: str) -> str:
        return actor_critic_think(remaining, "ok", decision) if self._on(PLANNER) else remaining

    def looked_up(self, result: str) -> str:
        """An executor's think after its search returned."""
        return actor_critic_think(result, "ok", result) if self._on(EXECUTOR) else result

    def executor(self, qid: str, k: int, task: str, result: str) -> str:
        if not self._on(EXECUTOR):
            return f"{task}={result}"
        shown = result
        if (result.lstrip("-").isdigit() and self.critic_error_rate > 0
                and derive_seed(self.seed, qid, k, "critic") / 0x7FFFFFFF < self.critic_error_rate):
            shown = str(int(result) + (1 if derive_seed(self.seed, qid, k, "slip") % 2 else -1))
        verdict = "ok" if shown == result else "no"
        return actor_critic_think(f"{task}={shown}", f"check: {task}={shown} {verdict}", f"{task}={result}")


@dataclass
class Trace:
    qid: str
    question: str
    planner_turns: list[str]
    executor_calls: list[tuple[str, str]]  # (subtask, executor text)
    results: list[str]
    answer: str
    segments: list[list[str]] | None = None  # per call: generated, injected, generated, ... (None: one each)
    flawed: bool = False  # the imperfect teacher stopped this chain one subtask early (traces.flaw_rate)

    def call_segments(self, k: int) -> list[str]:
        return self.segments[k] if self.segments else [self.executor_calls[k][1]]


def _remaining(question: str, steps: list[tuple[str, str]], k: int, lookups: bool = False) -> str:
    """The expression left after substituting the first k results (arithmetic chains only). With
    lookup steps, a lookup's result replaces its first occurrence anywhere in the expression."""
    expr = question.replace("(", "").replace(")", "")
    if not steps or not (lookups or expr.startswith(steps[0][0])):
        return f"step {k + 1}"  # not an arithmetic chain
    for task, result in steps[:k]:
        if expr.startswith(task):
            expr = result + expr[len(task):]
        elif lookups and task in expr:
            expr = expr.replace(task, result, 1)
        else:
            return f"step {k + 1}"
    return expr


def make_trace(qid: str, question: str, steps: list[tuple[str, str]], answer: str,
               searches: list[tuple[str, str] | None] | None = None, style: ThinkStyle = ThinkStyle()) -> Trace:
    """`searches[k]`, for a lookup step, is (query, the information text its search injected)."""
    turns, calls, segments = [], [], []
    for k, (task, result) in enumerate(steps):
        turns.append(planner_task_turn(style.planner(_remaining(question, steps, k, bool(searches)), task), task))
        found = searches[k] if searches else None
        segs = ([wrap(THINK, task) + wrap(SEARCH, found[0]), found[1],
                 executor_turn(style.looked_up(result), result)] if found
                else [executor_turn(style.executor(qid, k, task, result), result)])
        calls.append((task, "".join(segs)))
        segments.append(segs)
    turns.append(planner_answer_turn(style.planner(answer, answer), answer))
    return Trace(qid, question, turns, calls, [r for _, r in steps], answer,
                 segments if any(len(s) > 1 for s in segments) else None)


_SOLUTION_LINE = re.compile(r"([0-9][0-9.,]*\s*[-+*/x×]\s*[0-9.,]+(?:\s*[-+*/x×]\s*[0-9.,]+)*)\s*=\s*\$?\s*([-0-9.,]+)")


def steps_from_solution(solution: str) -> list[tuple[str, str]]:
    """(subtask, result) pairs from worked-solution lines that contain "expr = number"."""
    steps = []
    for line in (solution or "").splitlines():
        m = _SOLUTION_LINE.search(line)
        if m:
            steps.append((" ".join(m.group(1).split()), m.group(2).rstrip(".,").replace(",", "")))
    return steps


def _lookups(meta_steps: list[dict], search) -> tuple[list | None, str | None]:
    """Per step, (query, information text) of its gold search, or None; (None, None) when no step
    searches (a plain list of Nones would read as a lookup chain); or (None, why not)."""
    out = []
    for k, step in enumerate(meta_steps):
        if "search" not in step:
            out.append(None)
            continue
        if search is None:
            return None, "the row has lookup steps and the search tool is off (agent.tool.retriever none)"
        info, docs = search(step["search"])
        if step.get("fact") and step["fact"] not in docs:
            return None, f"step {k + 1}: gold fact {step['fact']} not in the top-k for {step['search']!r}"
        out.append((step["search"], info))
    return (out if any(out) else None), None


def _check_rate(rate: float) -> None:
    if not 0.0 <= rate <= 1.0:
        raise ConfigError(f"traces.flaw_rate: {rate} is not a share in [0, 1]")


def stops_early(qid: str, n_steps: int, rate: float, seed: int) -> bool:
    """Whether the imperfect teacher (traces.flaw_rate) stops this question's chain one subtask early:
    for `rate` of the questions with 2+ subtasks, drawn from (seed, question id)."""
    _check_rate(rate)
    return rate > 0 and n_steps >= 2 and (rate >= 1.0 or derive_seed(seed, qid, "flaw") / 0x7FFFFFFF < rate)


def flawed_by_length(lengths: dict[str, int], rate: float, seed: int) -> set[str]:
    """traces.flaw_draw=length: of the chains of each gold length L >= 2 (question id -> L), exactly
    round(rate x their count) (halves up), those first by the (seed, question id) draw stops_early uses;
    the share per length is then the rate, whatever the seed, where per-question draws scatter."""
    _check_rate(rate)
    by_length: dict[int, list[str]] = {}
    for qid, n in lengths.items():
        if n >= 2:
            by_length.setdefault(n, []).append(qid)
    chosen: set[str] = set()
    for qids in by_length.values():
        qids.sort(key=lambda q: (derive_seed(seed, q, "flaw"), q))
        chosen.update(qids[:math.floor(rate * len(qids) + 0.5)])
    return chosen


def flaw_by_length(pairs: list, rows: dict, rate: float, seed: int, flawed_trace, codec: Codec) -> list:
    """traces.flaw_draw=length: of (trace, examples) pairs (rows: question id -> prepared row), the
    chains flawed_by_length picks, each replaced in place by `flawed_trace(row)` (the teacher's
    flawed version) and its examples."""
    chosen = flawed_by_length({t.qid: len(rows[t.qid]["meta"]["steps"]) for t, _ in pairs}, rate, seed)
    out = []
    for trace, examples in pairs:
        if trace.qid in chosen:
            trace = flawed_trace(rows[trace.qid])
            examples = examples_from_trace(trace, codec, rows[trace.qid].get("context"))
        out.append((trace, examples))
    return out


def trace_from_row(row: dict, source: str, search=None, style: ThinkStyle = ThinkStyle(),
                   flaw_rate: float = 0.0, seed: int = 0) -> tuple[Trace | None, str | None]:
    """(trace, None) for a prepared row, or (None, why the source cannot decompose it). `search`
    (query -> (information text, passage ids)) runs a lookup step's gold search. With `flaw_rate`,
    that share of gold chains (`stops_early`) ends after its second-to-last subtask and answers its
    result: a demonstration that is wrong in a way imitation copies and only a reward exposes."""
    meta = row.get("meta") or {}
    searches = None
    if source == "gold":
        steps = [(s["task"], str(s["result"])) for s in meta.get("steps", [])]
        why = meta.get("trace_error") or "the row has no gold decomposition"
        searches, lookup_error = _lookups(meta.get("steps", []), search)
        if lookup_error:
            return None, lookup_error
    elif source == "solution":
        steps = steps_from_solution(row.get("solution") or "")
        why = "no 'expr = number' line in the solution"
    else:
        raise ValueError(f"unknown trace source '{source}'; valid: gold, solution, teacher")
    if not steps:
        return None, why
    answer, flawed = row["answers"][0], source == "gold" and stops_early(row["id"], len(steps), flaw_rate, seed)
    if flawed:
        steps, answer, searches = steps[:-1], steps[-2][1], searches[:-1] if searches else searches
    trace = make_trace(row["id"], row["question"], steps, answer, searches, style)
    trace.flawed = flawed
    return trace, None


def _kind(reason: str) -> str:
    """A reason without its row's particulars, to count alike ones: 'step N (divide)'."""
    return re.sub(r"-?\d[\d.,]*", "N", reason.split(":")[0]).strip()


def skipped_stats(skipped: list[tuple[str, str]], shown: int = 5) -> dict:
    """How many rows gave no trace and why: counts per kind of reason, and the first few in full."""
    kinds: dict[str, int] = {}
    for _, reason in skipped:
        kinds[_kind(reason)] = kinds.get(_kind(reason), 0) + 1
    return {"count": len(skipped), "reasons": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
            "examples": [{"qid": q, "reason": r} for q, r in skipped[:shown]]}


def episode_from_trace(trace: Trace, codec: Codec, context: str | None = None) -> Episode:
    """The episode a rollout would record for this trace: planner turns sampled from the growing
    planner context (prompt, earlier turns, injected results), each subtask from a fresh executor
    prompt. No sampler log-probs (zeros)."""
    _, ctx = codec.planner_prompt(trace.question, context)
    ep = Episode(trace.qid, trace.question, [trace.answer], 0, status="answered", final_answer=trace.answer)
    for k, turn in enumerate(trace.planner_turns):
        gen = codec.plain(turn)
        ep.segments.append(Segment(PLANNER, k, list(ctx), gen, [0.0] * len(gen), turn, "stop"))
        ctx = ctx + gen
        if k < len(trace.executor_calls):
            exe = codec.executor_prompt(trace.executor_calls[k][0], context)
            for j, text in enumerate(trace.call_segments(k)):
                out = codec.plain(text)
                if j % 2 == 0:  # generated; odd positions are injected information
                    ep.segments.append(Segment(EXECUTOR, k, list(exe), out, [0.0] * len(out), text, "stop"))
                exe = exe + out
        if k < len(trace.results):
            ctx = ctx + codec.result(trace.results[k])[1]
    return ep


def examples_from_trace(trace: Trace, codec: Codec, context: str | None = None) -> list[Example]:
    """Per-role training examples with the exact ids a rollout would produce for this episode."""
    return episode_sequences(episode_from_trace(trace, codec, context))


def gold_examples(rows: list[dict], codec: Codec, search=None) -> list[Example]:
    """Training examples from gold traces of prepared rows (rows without a decomposition are skipped);
    `search` runs lookup steps' searches (see `trace_from_row`)."""
    out = []
    for row in rows:
        trace, _ = trace_from_row(row, "gold", search)
        if trace is not None:
            out += examples_from_trace(trace, codec, row.get("context"))
    return out


def trace_from_episode(ep: Episode) -> tuple[Trace, list[Example]]:
    """A teacher episode kept by rejection sampling: its texts, and examples over its exact ids."""
    planner = [s for s in ep.segments if s.role == PLANNER]
    calls: dict[int, str] = {}
    for s in ep.segments:
        if s.role == EXECUTOR:  # a call's segments (with the search tool, several) share its turn
            calls[s.turn] = calls.get(s.turn, "") + s.text
    tasks = [extract_tag(s.text, TASK) or "" for s in planner[:len(calls)]]
    trace = Trace(ep.qid, ep.question, [s.text for s in planner], list(zip(tasks, calls.values())),
                  [], ep.final_answer or "")
    return trace, episode_sequences(ep)


def longest_turns(examples: list[Example]) -> dict[str, tuple[int, str]]:
    """Per role, the longest trained span (one generated turn: a run of mask 1) and its question id."""
    out: dict[str, tuple[int, str]] = {}
    for e in examples:
        run = 0
        for m in [*e.mask, 0]:  # the 0 closes a span that ends the example
            if m:
                run += 1
                continue
            if run > out.get(e.role, (0, ""))[0]:
                out[e.role] = (run, e.qid)
            run = 0
    return out


def trace_record(trace: Trace, examples: list[Example], source: str) -> dict:
    return {"qid": trace.qid, "question": trace.question, "answer": trace.answer, "source": source,
            "planner_turns": trace.planner_turns, "executor_calls": [list(c) for c in trace.executor_calls],
            "examples": [e.to_json() for e in examples], **({"flawed": True} if trace.flawed else {})}


def _record_examples(path, i: int, rec: dict, roles=(PLANNER, EXECUTOR)) -> list[Example]:
    """The training examples of row `i` of sft_traces.jsonl whose role is in `roles`."""
    out = []
    try:
        for e in rec["examples"]:
            if e["role"] in roles:
                if len(e["ids"]) != len(e["mask"]):
                    raise DataError(path, i, "examples.mask", "mask and ids differ in length")
                out.append(Example(rec["qid"], e["role"], e["ids"], e["mask"]))
    except (KeyError, TypeError) as exc:
        raise DataError(path, i, None, f"not a trace record ({type(exc).__name__}: {exc})") from None
    return out


def read_trace_examples(path, roles=(PLANNER, EXECUTOR)) -> list[Example]:
    """All training examples of sft_traces.jsonl; errors name the file and row."""
    return [e for i, rec in read_records(path) for e in _record_examples(path, i, rec, roles)]


@dataclass
class OfflineSample:
    """One expert trace as red_paper puts it in its question's group: its training sequences, its
    final answer and its subtasks (scored like a rollout), and its generated-token count."""
    examples: list[Example]
    answer: str
    subtasks: list[str]

    @property
    def n_tokens(self) -> int:
        return sum(sum(e.mask) for e in self.examples)


def read_offline_samples(path) -> dict[str, OfflineSample]:
    """sft_traces.jsonl as {question id: OfflineSample}, in one pass (the first trace of a question
    wins); errors name the file and row."""
    out = {}
    for i, rec in read_records(path):
        examples = _record_examples(path, i, rec)
        try:
            if rec["qid"] not in out:
                out[rec["qid"]] = OfflineSample(examples, str(rec["answer"]),
                                                [str(task) for task, _ in rec["executor_calls"]])
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(path, i, None, f"not a trace record ({type(exc).__name__}: {exc})") from None
    return out


def _dist(values: list[int]) -> dict:
    if not values:
        return {"count": 0}
    return {"count": len(values), "mean": round(statistics.fmean(values), 2), "max": max(values), "min": min(values)}


def trace_stats(records: list[dict], examples: list[Example], rows_seen: int, accepted: int, sampled: int,
                source: str, skipped: list[tuple[str, str]] = ()) -> dict:
    """stats.json: traces, turns and tokens per role, and (`no_trace`) the rows that gave none and why."""
    by_role = {}
    for role in (PLANNER, EXECUTOR):
        ex = [e for e in examples if e.role == role]
        by_role[role] = {"examples": len(ex), "trained_tokens": _dist([sum(e.mask) for e in ex]),
                         "total_tokens": _dist([len(e.ids) for e in ex])}
    return {
        "source": source, "traces": len(records), "rows_seen": rows_seen, "no_trace": skipped_stats(list(skipped)),
        "acceptance_rate": round(accepted / sampled, 4) if sampled else None,
        "sampled_episodes": sampled, "accepted_episodes": accepted,
        "turns_per_trace": _dist([len(r["planner_turns"]) for r in records]),
        "roles": by_role,
        "examples": [{k: r[k] for k in ("qid", "question", "answer", "planner_turns", "executor_calls")}
                     for r in records[:3]],
    }
