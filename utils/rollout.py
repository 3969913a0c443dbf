"""The context-decoupled Planner/Executor rollout (DESIGN.md §2) and its trajectory records.

One shared model plays both roles. A batch of episodes advances turn by turn:
1. one engine call samples the next planner turn of every live episode, from its persistent
   context (prompt + its own earlier turns + injected results); it stops at </task> or </answer>;
2. one engine call runs every subtask delegated in that turn, each executor starting fresh from
   the executor prompt and the subtask alone; it stops at </answer>;
3. each executor's answer is injected into its planner's context as <result>...</result>.

An episode ends on the planner's <answer> ("answered"), or as "malformed" (a planner turn with
neither a complete <task> nor <answer>, an empty subtask, or a context that no longer fits),
"executor_error" (an executor that never closes <answer>), or "max_turns". Only "answered"
episodes keep a format score; the others score format 0 and never crash the batch.

A `Segment` keeps what the trainer needs to recompute log-probs over exactly the sampled tokens:
the role, the exact context ids, the generated ids and the sampler's log-probs. A role's training
sequence is its last segment's context plus its generated ids, with a loss mask that is 1 only on
generated tokens (injected prompts and results are never trained).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from utils.engines import Engine, SamplingSpec, derive_seed
from utils.prompts import render_executor, render_planner, render_result
from utils.rewards import extract_tag, format_score
from utils.run_config import TemplatesConfig

PLANNER_STOPS = ["</task>", "</answer>"]
EXECUTOR_STOPS = ["</answer>"]
STATUSES = ("answered", "malformed", "executor_error", "max_turns")


@dataclass
class RolloutSpec:
    max_turns: int = 4
    max_new_tokens_planner: int = 48
    max_new_tokens_executor: int = 48
    temperature: float = 1.0
    top_p: float = 1.0
    max_model_len: int = 512


@dataclass
class Segment:
    role: str  # "planner" | "executor"
    turn: int
    context_ids: list[int]
    gen_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    format: float = 0.0

    @property
    def loss_mask(self) -> list[int]:
        """Over context + generated ids: 1 on generated tokens only."""
        return [0] * len(self.context_ids) + [1] * len(self.gen_ids)


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

    @property
    def done(self) -> bool:
        return self.status is not None

    @property
    def n_turns(self) -> int:
        return sum(s.role == "planner" for s in self.segments)

    @property
    def n_subtasks(self) -> int:
        return sum(s.role == "executor" for s in self.segments)

    @property
    def format_score(self) -> float:
        """Mean segment format over the episode; 0 unless the episode ended with an answer."""
        if self.status != "answered" or not self.segments:
            return 0.0
        return sum(s.format for s in self.segments) / len(self.segments)

    def n_generated(self, role: str | None = None) -> int:
        return sum(len(s.gen_ids) for s in self.segments if role in (None, s.role))

    def planner_sequence(self) -> tuple[list[int], list[int], list[float]]:
        """(ids, loss mask, sampler log-probs aligned to ids; 0.0 where masked) of the whole
        planner conversation. Its context is exactly what each planner turn was sampled from."""
        planner = [s for s in self.segments if s.role == "planner"]
        if not planner:
            return [], [], []
        last = planner[-1]
        ids = last.context_ids + last.gen_ids
        mask, lps = [0] * len(ids), [0.0] * len(ids)
        for seg in planner:
            start = len(seg.context_ids)
            if ids[:start] != seg.context_ids or ids[start:start + len(seg.gen_ids)] != seg.gen_ids:
                raise ValueError(f"episode {self.qid}/{self.sample}: planner contexts are not nested")
            for k, lp in enumerate(seg.logprobs):
                mask[start + k], lps[start + k] = 1, lp
        return ids, mask, lps

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(format_score=self.format_score, n_turns=self.n_turns, n_subtasks=self.n_subtasks)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Episode":
        d = {k: v for k, v in d.items() if k not in ("format_score", "n_turns", "n_subtasks")}
        d["segments"] = [Segment(**s) for s in d["segments"]]
        return cls(**d)


def dump_episodes(episodes: list[Episode], path: Path) -> None:
    from utils.manifest import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(e.to_json(), sort_keys=True) + "\n" for e in episodes))


def load_episodes(path: Path) -> list[Episode]:
    return [Episode.from_json(json.loads(line)) for line in Path(path).read_text().splitlines() if line.strip()]


class Codec:
    """Text <-> exact token ids for the protocol, shared by rollouts and SFT traces.

    A role prompt is encoded with the tokenizer's special tokens (BOS) unless a chat template
    rendered them already; generated and injected text is encoded without any.
    """

    def __init__(self, tokenizer, templates: TemplatesConfig):
        self.tok, self.templates = tokenizer, templates
        self._special = not templates.use_chat_template

    def planner_prompt(self, question: str, context: str | None = None) -> tuple[str, list[int]]:
        text = render_planner(self.templates, question, context, self.tok)
        return text, self.tok.encode(text, add_special_tokens=self._special)

    def executor_prompt(self, task: str) -> list[int]:
        return self.tok.encode(render_executor(self.templates, task, self.tok), add_special_tokens=self._special)

    def result(self, answer: str) -> tuple[str, list[int]]:
        text = render_result(self.templates, answer)
        return text, self.tok.encode(text, add_special_tokens=False)

    def plain(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)


class Rollout:
    """Runs batches of episodes on an engine; the codec fixes the exact token ids."""

    def __init__(self, engine: Engine, codec: Codec, spec: RolloutSpec):
        self.engine, self.codec, self.spec = engine, codec, spec

    def _sampling(self, max_tokens: int, stops: list[str]) -> SamplingSpec:
        return SamplingSpec(max_tokens=max_tokens, temperature=self.spec.temperature, top_p=self.spec.top_p,
                            stop=stops)

    def _budget(self, ctx: list[int], want: int) -> int:
        return min(want, self.spec.max_model_len - len(ctx))

    def _end(self, ep: Episode, status: str, error: str | None = None) -> None:
        ep.status, ep.error = status, error
        ep.transcript += f"[end: {status}{': ' + error if error else ''}]\n"

    def _call(self, role: str, contexts: list[list[int]], want: int, seeds: list[int]):
        """One engine call for all contexts that fit; None for those that do not."""
        stops = PLANNER_STOPS if role == "planner" else EXECUTOR_STOPS
        budgets = [self._budget(c, want) for c in contexts]
        fit = [i for i, b in enumerate(budgets) if b > 0]
        out: list = [None] * len(contexts)
        # contexts with a smaller remaining budget go in their own call, so every call is one spec
        for b in sorted({budgets[i] for i in fit}):
            idx = [i for i in fit if budgets[i] == b]
            res = self.engine.generate([contexts[i] for i in idx], self._sampling(b, stops), [seeds[i] for i in idx])
            for i, r in zip(idx, res):
                out[i] = r[0]
        return out

    def run(self, rows: list[dict], n: int, seed: int, step: int = 0) -> list[Episode]:
        """n episodes per row ({id, question, answers, context?}); deterministic in (seed, step)."""
        episodes = []
        for row in rows:
            prompt, ids = self.codec.planner_prompt(row["question"], row.get("context"))
            for k in range(n):
                episodes.append(Episode(row["id"], row["question"], list(row["answers"]), k, planner_ids=list(ids),
                                        transcript=prompt))
        for turn in range(self.spec.max_turns):
            live = [e for e in episodes if not e.done]
            if not live:
                break
            self._planner_turn(live, seed, step, turn, episodes)
        for e in episodes:
            if not e.done:
                self._end(e, "max_turns", f"no <answer> after {self.spec.max_turns} planner turns")
        return episodes

    def _planner_turn(self, live: list[Episode], seed: int, step: int, turn: int, all_eps: list[Episode]) -> None:
        index = {id(e): i for i, e in enumerate(all_eps)}
        seeds = [derive_seed(seed, step, index[id(e)], turn, "planner") for e in live]
        outs = self._call("planner", [e.planner_ids for e in live], self.spec.max_new_tokens_planner, seeds)
        delegated: list[tuple[Episode, str]] = []
        for ep, s in zip(live, outs):
            if s is None:
                self._end(ep, "malformed", "planner context exceeds max_model_len")
                continue
            seg = Segment("planner", turn, list(ep.planner_ids), s.token_ids, s.logprobs, s.text, s.finish_reason,
                          format_score(s.text, "planner")[0])
            ep.segments.append(seg)
            ep.planner_ids = ep.planner_ids + s.token_ids
            ep.transcript += s.text + "\n"
            answer, task = _last_action(s.text)
            if answer is not None:
                ep.final_answer = answer
                self._end(ep, "answered")
            elif task is None:
                self._end(ep, "malformed", "planner turn has neither <task> nor <answer>")
            elif not task.strip():
                self._end(ep, "malformed", "empty <task>")
            else:
                delegated.append((ep, task.strip()))
        self._executor_calls(delegated, seed, step, turn, index)

    def _executor_calls(self, delegated, seed: int, step: int, turn: int, index: dict) -> None:
        if not delegated:
            return
        contexts = [self.codec.executor_prompt(task) for _, task in delegated]
        seeds = [derive_seed(seed, step, index[id(e)], turn, "executor") for e, _ in delegated]
        outs = self._call("executor", contexts, self.spec.max_new_tokens_executor, seeds)
        for (ep, task), ctx, s in zip(delegated, contexts, outs):
            if s is None:
                self._end(ep, "executor_error", "executor context exceeds max_model_len")
                continue
            ep.segments.append(Segment("executor", turn, ctx, s.token_ids, s.logprobs, s.text, s.finish_reason,
                                       format_score(s.text, "executor")[0]))
            ep.transcript += f"  [executor] {task} -> {s.text}\n"
            answer = extract_tag(s.text, "answer")
            if answer is None:
                self._end(ep, "executor_error", "executor never closed <answer>")
                continue
            injected, injected_ids = self.codec.result(answer)
            ep.planner_ids = ep.planner_ids + injected_ids
            ep.transcript += injected


def _last_action(text: str) -> tuple[str | None, str | None]:
    """(answer, task) of a planner turn: the action tag that closes the turn wins."""
    ans_end, task_end = text.rfind("</answer>"), text.rfind("</task>")
    if ans_end > task_end:
        return extract_tag(text, "answer"), None
    if task_end >= 0:
        return None, extract_tag(text, "task")
    return None, None
