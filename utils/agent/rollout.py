"""The context-decoupled Planner/Executor rollout (docs/ARCHITECTURE.md, "Protocol").

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

Each generated text becomes a `Segment` of its `Episode` (utils/agent/episode.py), with the exact
context ids it was sampled from and the sampler's log-probs, so the trainer can recompute
log-probs over exactly the sampled tokens. Tags and stop strings come from utils/agent/protocol.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from utils.agent.engines import Engine, SamplingSpec, derive_seed
from utils.agent.episode import Episode, Segment
from utils.agent.prompts import render_executor, render_planner, render_result
from utils.agent.protocol import (ANSWER, EXECUTOR, EXECUTOR_STOPS, PLANNER, PLANNER_STOPS, extract_tag,
                                  format_score, last_action)
from utils.core.schema import RunConfig, TemplatesConfig

@dataclass
class RolloutSpec:
    max_turns: int = 4
    max_new_tokens_planner: int = 48
    max_new_tokens_executor: int = 48
    temperature: float = 1.0
    top_p: float = 1.0
    max_model_len: int = 512

    @classmethod
    def from_config(cls, cfg: RunConfig, temperature: float) -> "RolloutSpec":
        """The run's rollout settings (turns, budgets, context length) at `temperature` (0 = greedy)."""
        return cls(cfg.algorithm.rl.max_turns, cfg.model.max_new_tokens_planner, cfg.model.max_new_tokens_executor,
                   temperature, max_model_len=cfg.model.engine.max_model_len)


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
        stops = PLANNER_STOPS if role == PLANNER else EXECUTOR_STOPS
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
        outs = self._call(PLANNER, [e.planner_ids for e in live], self.spec.max_new_tokens_planner, seeds)
        delegated: list[tuple[Episode, str]] = []
        for ep, s in zip(live, outs):
            if s is None:
                self._end(ep, "malformed", "planner context exceeds max_model_len")
                continue
            seg = Segment(PLANNER, turn, list(ep.planner_ids), s.token_ids, s.logprobs, s.text, s.finish_reason,
                          format_score(s.text, PLANNER)[0])
            ep.segments.append(seg)
            ep.planner_ids = ep.planner_ids + s.token_ids
            ep.transcript += s.text + "\n"
            answer, task = last_action(s.text)
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
        outs = self._call(EXECUTOR, contexts, self.spec.max_new_tokens_executor, seeds)
        for (ep, task), ctx, s in zip(delegated, contexts, outs):
            if s is None:
                self._end(ep, "executor_error", "executor context exceeds max_model_len")
                continue
            ep.segments.append(Segment(EXECUTOR, turn, ctx, s.token_ids, s.logprobs, s.text, s.finish_reason,
                                       format_score(s.text, EXECUTOR)[0]))
            ep.transcript += f"  [executor] {task} -> {s.text}\n"
            answer = extract_tag(s.text, ANSWER)
            if answer is None:
                self._end(ep, "executor_error", "executor never closed <answer>")
                continue
            injected, injected_ids = self.codec.result(answer)
            ep.planner_ids = ep.planner_ids + injected_ids
            ep.transcript += injected

