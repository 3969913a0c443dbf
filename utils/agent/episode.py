"""Trajectory records and the one function that turns an episode into training sequences.

A `Segment` keeps what the trainer needs to recompute log-probs over exactly the sampled tokens:
the role, the exact context ids, the generated ids and the sampler's log-probs. An `Episode` is
one question's segments, in the order they were generated, plus how it ended.

`episode_sequences` is the only place that builds training sequences (`Example`s) from an
episode, for the RL batch (utils/train/batch.py) and for SFT traces (utils/agent/traces.py):
- the planner's whole conversation is one sequence: its last context plus its last turn, with a
  loss mask that is 1 only on the planner's own generated tokens (the prompt and the injected
  <result> tokens are never trained);
- each executor call is its own sequence (its context is decoupled): prompt masked, answer trained;
  with the search tool a call has several segments, and like the planner's they form one
  conversation in which the injected <information> tokens are masked.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from utils.agent.protocol import EXECUTOR, PLANNER, last_action
from utils.core.io import read_jsonl, write_jsonl


@dataclass
class Segment:
    role: str  # "planner" | "executor"
    turn: int
    context_ids: list[int]
    gen_ids: list[int]
    logprobs: list[float] | None  # the sampler's, one per generated token; None if not asked for
    text: str
    finish_reason: str
    format: float = 0.0


@dataclass
class Example:
    """One training sequence: token ids and a loss mask of the same length (1 = trained), plus the
    sampler's log-probs aligned to the ids (0.0 where masked) when it came from a rollout that asked
    for them (None otherwise, or when any of its segments was sampled without them)."""

    qid: str
    role: str
    ids: list[int]
    mask: list[int]
    logprobs: list[float] | None = None

    def to_json(self) -> dict:
        return {"qid": self.qid, "role": self.role, "ids": self.ids, "mask": self.mask}


@dataclass
class Episode:
    qid: str
    question: str
    golds: list[str]
    sample: int
    segments: list[Segment] = field(default_factory=list)
    status: str | None = None  # None while live
    final_answer: str | None = None
    error: str | None = None
    planner_ids: list[int] = field(default_factory=list)  # the live planner context
    transcript: str = ""
    searches: list[dict] = field(default_factory=list)  # the search tool's calls: {turn, query, docs, error}

    @property
    def done(self) -> bool:
        return self.status is not None

    @property
    def n_turns(self) -> int:
        return sum(s.role == PLANNER for s in self.segments)

    @property
    def n_subtasks(self) -> int:
        """Executor calls (with the search tool a call has several segments, all of its turn)."""
        return len({s.turn for s in self.segments if s.role == EXECUTOR})

    @property
    def turn_subtasks(self) -> list[str | None]:
        """Per planner turn, the subtask it delegated, stripped (what its executor call was given);
        None for a turn that delegates nothing (an answer, a malformed or empty task)."""
        tasks = (last_action(s.text)[1] for s in self.segments if s.role == PLANNER)
        return [t.strip() if t is not None and t.strip() else None for t in tasks]

    @property
    def subtasks(self) -> list[str]:
        """The subtasks the planner delegated, in order."""
        return [t for t in self.turn_subtasks if t is not None]

    @property
    def format_score(self) -> float:
        """Mean segment format over the episode; 0 unless the episode ended with an answer."""
        if self.status != "answered" or not self.segments:
            return 0.0
        return sum(s.format for s in self.segments) / len(self.segments)

    def n_generated(self, role: str | None = None) -> int:
        return sum(len(s.gen_ids) for s in self.segments if role in (None, s.role))

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(format_score=self.format_score, n_turns=self.n_turns, n_subtasks=self.n_subtasks)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Episode":
        d = {k: v for k, v in d.items() if k not in ("format_score", "n_turns", "n_subtasks")}
        d["segments"] = [Segment(**s) for s in d["segments"]]
        return cls(**d)


def _conversation(ep: Episode, segments: list[Segment], role: str) -> Example:
    """One sequence from segments whose contexts nest (each extends the previous context and
    output): the last context plus the last output, trained only on the generated tokens."""
    last = segments[-1]
    ids = last.context_ids + last.gen_ids
    mask, lps = [0] * len(ids), [0.0] * len(ids)
    for seg in segments:
        start = len(seg.context_ids)
        if ids[:start] != seg.context_ids or ids[start:start + len(seg.gen_ids)] != seg.gen_ids:
            raise ValueError(f"episode {ep.qid}/{ep.sample}: {role} contexts are not nested")
        for k in range(len(seg.gen_ids)):
            mask[start + k] = 1
            if seg.logprobs is not None:
                lps[start + k] = seg.logprobs[k]
    sampled = all(seg.logprobs is not None for seg in segments)
    return Example(ep.qid, role, ids, mask, lps if sampled else None)


def episode_sequences(ep: Episode) -> list[Example]:
    """The planner conversation, then each executor call with generated tokens, as training sequences."""
    planner = [s for s in ep.segments if s.role == PLANNER]
    out = [_conversation(ep, planner, PLANNER)] if planner else []
    calls: dict[int, list[Segment]] = {}
    for s in ep.segments:
        if s.role == EXECUTOR:
            calls.setdefault(s.turn, []).append(s)
    for segs in calls.values():
        if any(s.gen_ids for s in segs):
            out.append(_conversation(ep, segs, EXECUTOR))
    return out


def dump_episodes(episodes: list[Episode], path: Path) -> None:
    write_jsonl(path, (e.to_json() for e in episodes))


def load_episodes(path: Path) -> list[Episode]:
    return [Episode.from_json(d) for d in read_jsonl(path)]
