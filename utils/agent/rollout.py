"""The context-decoupled Planner/Executor rollout (docs/ARCHITECTURE.md, "Protocol").

One shared model plays both roles. Each episode of a batch cycles through:
1. a planner turn, sampled from its persistent context (prompt + its own earlier turns + injected
   results); it stops at </task> or </answer>;
2. on a <task>, one executor call, starting fresh from the executor prompt and the subtask alone;
   it stops at </answer>;
3. the executor's answer injected into the planner's context as <result>...</result>, and the
   next planner turn.
Episodes do not wait for each other: every request goes to the engine's queue (`Engine.submit`)
as soon as it is known, and finished ones come back from `Engine.poll`. On vLLM that is one
continuously batched stream; HF runs each poll's queue as one generate call per spec, which
reproduces a turn-by-turn barrier. Each request is seeded by (seed, step, episode, turn, role).

An episode ends on the planner's <answer> ("answered"), or as "malformed" (a planner turn with
neither a complete <task> nor <answer>, an empty subtask, or a context that no longer fits),
"executor_error" (an executor that never closes <answer>, or searches more than allowed), or
"max_turns". Only "answered"
episodes keep a format score; the others score format 0 and never crash the batch.

Each generated text becomes a `Segment` of its `Episode` (utils/agent/episode.py), with the exact
context ids it was sampled from and the sampler's log-probs, so the trainer can recompute
log-probs over exactly the sampled tokens. Tags and stop strings come from utils/agent/protocol.py.

With a retriever (the search tool, utils/agent/retrieval.py), an executor segment may end in
<search>query</search> instead: the rollout searches, appends the top-k passages as
<information>…</information> to that executor's context (never the planner's) and queues its next
segment, up to `max_searches` per subtask. Every search is recorded in `Episode.searches`.
"""
from __future__ import annotations

from dataclasses import dataclass

from utils.agent.sampling import Engine, SamplingSpec, derive_seed
from utils.agent.episode import Episode, Segment
from utils.agent.prompts import render_executor, render_planner, render_result
from utils.agent.protocol import (ANSWER, EXECUTOR, EXECUTOR_STOPS, PLANNER, PLANNER_STOPS, SEARCH,
                                  SEARCHER_STOPS, extract_tag, format_score, last_action)
from utils.agent.retrieval import QueryTooLong, render_information
from utils.core.faults import fault_point
from utils.core.heap import release_freed_memory
from utils.core.schema import RunConfig, TemplatesConfig

@dataclass
class RolloutSpec:
    max_turns: int = 4
    max_new_tokens_planner: int = 48
    max_new_tokens_executor: int = 48
    temperature: float = 1.0
    top_p: float = 1.0
    max_model_len: int = 512
    top_k: int = 2  # the search tool's passages per search
    max_searches: int = 2  # per subtask
    information: str = "<information>{passages}</information>\n"
    logprobs: bool = True  # sampler log-probs of every generated token (training needs them)

    @classmethod
    def from_config(cls, cfg: RunConfig, temperature: float) -> "RolloutSpec":
        """The run's rollout settings (turns, budgets, context length, tool) at `temperature` (0 = greedy).
        Without the tool its settings are not read: the manifests leave them out then (stage_config)."""
        a, t = cfg.agent, cfg.agent.tool
        tool = dict(top_k=t.top_k, max_searches=t.max_searches, information=t.information) if t.retriever != "none" else {}
        return cls(a.max_turns, a.max_new_tokens_planner, a.max_new_tokens_executor,
                   temperature, max_model_len=cfg.model.engine.max_model_len, **tool)


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

    def executor_prompt(self, task: str, context: str | None = None) -> list[int]:
        """The executor's prompt ids; `context` reaches it only if the executor template says {context}."""
        text = render_executor(self.templates, task, self.tok, context)
        return self.tok.encode(text, add_special_tokens=self._special)

    def result(self, answer: str) -> tuple[str, list[int]]:
        text = render_result(self.templates, answer)
        return text, self.tok.encode(text, add_special_tokens=False)

    def plain(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)


class Rollout:
    """Runs batches of episodes on an engine; the codec fixes the exact token ids."""

    def __init__(self, engine: Engine, codec: Codec, spec: RolloutSpec, retriever=None):
        self.engine, self.codec, self.spec, self.retriever = engine, codec, spec, retriever
        self._evidence: list[str | None] = []  # per episode of the running batch: its row's context
        self._index: list[int] = []  # per episode: the index it is seeded as (its place in a larger batch)
        self._left: list[int] = []  # per row added: its episodes still running
        self._ended: list[int] = []  # rows whose episodes have all ended, not yet handed to on_group
        self._n = 1

    def _sampling(self, max_tokens: int, stops: list[str]) -> SamplingSpec:
        return SamplingSpec(max_tokens=max_tokens, temperature=self.spec.temperature, top_p=self.spec.top_p,
                            stop=stops, logprobs=self.spec.logprobs)

    def _budget(self, ctx: list[int], want: int) -> int:
        return min(want, self.spec.max_model_len - len(ctx))

    def _end(self, i: int, ep: Episode, status: str, error: str | None = None) -> None:
        ep.status, ep.error = status, error
        ep.transcript += f"[end: {status}{': ' + error if error else ''}]\n"
        g = i // self._n  # its row's place: every row adds n episodes in a row
        self._left[g] -= 1
        if not self._left[g]:
            self._ended.append(g)

    def _submit(self, key: tuple, context: list[int], want: int, seed: int) -> bool:
        """Queue one turn's request; False (and nothing queued) if its context leaves no token budget."""
        budget = self._budget(context, want)
        if budget <= 0:
            return False
        stops = PLANNER_STOPS if key[0] == PLANNER else SEARCHER_STOPS if self.retriever else EXECUTOR_STOPS
        self.engine.submit(key, context, self._sampling(budget, stops), seed)
        return True

    def _submit_planner(self, i: int, ep: Episode, seed: int, step: int, turn: int) -> None:
        if turn >= self.spec.max_turns:
            self._end(i, ep, "max_turns", f"no <answer> after {self.spec.max_turns} planner turns")
        elif not self._submit((PLANNER, i, turn, None), ep.planner_ids, self.spec.max_new_tokens_planner,
                              derive_seed(seed, step, self._index[i], turn, "planner")):
            self._end(i, ep, "malformed", "planner context exceeds max_model_len")

    def run(self, rows: list[dict], n: int, seed: int, step: int = 0, first: int = 0,
            on_group=None) -> list[Episode]:
        """n episodes per row ({id, question, answers, context?}); deterministic in (seed, step).
        `first`: the index of the first episode in a larger batch that several data-parallel ranks
        share (utils/train/world.py), so each episode is seeded as it would be in one process.

        Every request is seeded by (seed, step, episode, turn, role) alone, and episodes advance
        independently: an executor call is queued as soon as its planner turn ends, and the next
        planner turn as soon as its result is injected, all on the engine's one request stream.

        `on_group(g, episodes)`, when given, is called as soon as the n episodes of the g-th row
        (in the order rows were added) have all ended; it returns rows to add to the running batch,
        each as (row, the index its first episode is seeded as), whose episodes start at once on
        the same stream. The result lists every row's episodes in the order the rows were added."""
        episodes: list[Episode] = []
        self._evidence, self._index, self._left, self._ended, self._n = [], [], [], [], n
        self._start(episodes, [(row, first + g * n) for g, row in enumerate(rows)], seed, step)
        while True:
            while on_group is not None and self._ended:
                g = self._ended.pop(0)
                self._start(episodes, on_group(g, episodes[g * n:(g + 1) * n]), seed, step)
            done = self.engine.poll()
            if not done:
                release_freed_memory()  # the engine's freed activations, before the caller's phase (utils/core/heap.py)
                return episodes
            fault_point("rollout")  # the kill-anywhere test's cut (utils/core/faults.py)
            for (role, i, turn, call), sample in done:
                if role == PLANNER:
                    self._planner_done(i, episodes[i], turn, sample, seed, step)
                else:
                    self._executor_done(i, episodes[i], turn, call, sample, seed, step)

    def _start(self, episodes: list[Episode], rows: list[tuple[dict, int]], seed: int, step: int) -> None:
        """Add n episodes of each (row, seed index of its first episode) and queue their first turns."""
        start = len(episodes)
        for row, index in rows:
            prompt, ids = self.codec.planner_prompt(row["question"], row.get("context"))
            self._evidence += [row.get("context")] * self._n
            self._index += [index + k for k in range(self._n)]
            self._left.append(self._n)
            episodes += [Episode(row["id"], row["question"], list(row["answers"]), k, planner_ids=list(ids),
                                 transcript=prompt) for k in range(self._n)]
        for i in range(start, len(episodes)):
            self._submit_planner(i, episodes[i], seed, step, 0)

    def _planner_done(self, i: int, ep: Episode, turn: int, s, seed: int, step: int) -> None:
        ep.segments.append(Segment(PLANNER, turn, list(ep.planner_ids), s.token_ids, s.logprobs, s.text,
                                   s.finish_reason, format_score(s.text, PLANNER)[0]))
        ep.planner_ids = ep.planner_ids + s.token_ids
        ep.transcript += s.text + "\n"
        answer, task = last_action(s.text)
        if answer is not None:
            ep.final_answer = answer
            self._end(i, ep, "answered")
        elif task is None:
            self._end(i, ep, "malformed", "planner turn has neither <task> nor <answer>")
        elif not task.strip():
            self._end(i, ep, "malformed", "empty <task>")
        else:
            task = task.strip()
            self._submit_executor(i, ep, turn, (task, self.codec.executor_prompt(task, self._evidence[i]), 0),
                                  seed, step)

    def _submit_executor(self, i: int, ep: Episode, turn: int, call: tuple, seed: int, step: int) -> None:
        """Queue an executor segment; call = (subtask, its context so far, searches made)."""
        searches = call[2]
        role = "executor" if searches == 0 else f"executor/{searches}"
        if not self._submit((EXECUTOR, i, turn, call), call[1], self.spec.max_new_tokens_executor,
                            derive_seed(seed, step, self._index[i], turn, role)):
            self._end(i, ep, "executor_error", "executor context exceeds max_model_len")

    def _search(self, ep: Episode, turn: int, query: str) -> str:
        """Run one search and record it; the information text to inject."""
        record = {"turn": turn, "query": query, "docs": [], "error": None}
        try:
            passages = self.retriever.search(query, self.spec.top_k)
            record["docs"] = [p.id for p in passages]
            info = render_information(self.spec.information, passages)
        except QueryTooLong as exc:
            record["error"] = str(exc)
            info = self.spec.information.format(passages=str(exc))
        ep.searches.append(record)
        return info

    def _executor_done(self, i: int, ep: Episode, turn: int, call: tuple, s, seed: int, step: int) -> None:
        task, context, searches = call
        tool = self.retriever is not None
        ep.segments.append(Segment(EXECUTOR, turn, context, s.token_ids, s.logprobs, s.text, s.finish_reason,
                                   format_score(s.text, EXECUTOR, search=tool)[0]))
        ep.transcript += f"  [executor] {task} -> {s.text}\n" if searches == 0 else f"  [executor] -> {s.text}\n"
        answer, query = last_action(s.text, SEARCH) if tool else (extract_tag(s.text, ANSWER), None)
        if answer is None and query is not None:
            if searches >= self.spec.max_searches:
                self._end(i, ep, "executor_error", f"more than {self.spec.max_searches} searches for one subtask")
                return
            info = self._search(ep, turn, query)
            ep.transcript += "  " + info
            self._submit_executor(i, ep, turn, (task, context + s.token_ids + self.codec.plain(info), searches + 1),
                                  seed, step)
            return
        if answer is None:
            self._end(i, ep, "executor_error", "executor never closed <answer>")
            return
        injected, injected_ids = self.codec.result(answer)
        ep.planner_ids = ep.planner_ids + injected_ids
        ep.transcript += injected
        self._submit_planner(i, ep, seed, step, turn + 1)
