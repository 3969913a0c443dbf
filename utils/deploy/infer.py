"""Ask the trained agent: run the Planner/Executor rollout on a question typed at the terminal, or on
a JSONL file of questions, and show each planner turn, each delegated subtask and the executor's
answer, with timings.

    .venv/bin/python -m utils.deploy.infer --run_id run_001 --checkpoint red --question "12+30-7"
    .venv/bin/python -m utils.deploy.infer --checkpoint sft_warmup --questions qs.jsonl [--save out.jsonl]
    .venv/bin/python -m utils.deploy.infer --checkpoint red --engine openai --question "12+30-7"   # a served model

`--checkpoint` is `base`, `sft_warmup`, a method or an adapter directory (default `sft_warmup`);
`--engine` is `vllm` (offline), `hf` or `openai` (an endpoint started by `python -m
utils.deploy.serve`, `model.engine.base_url`). `--thinking actor_critic` switches the prompts to
the procedural-thinking template (actor, critic, refined inside <think>) and prints those parts.
A JSONL row has a `question`, and may have `answers` (then each answer is scored with the data
config's scorer) and a `context`. Greedy unless
`--temperature` says otherwise. The run's search tool is used when its data config turns it on.
Times are wall seconds of each engine request, from its submission to its result: with several
questions the requests share the engine, so they overlap.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from utils.agent.episode import Episode
from utils.agent.protocol import ACTOR_CRITIC_LABELS, PLANNER, THINK, extract_tag, split_actor_critic
from utils.agent.retrieval import run_retriever
from utils.agent.rollout import Codec, Rollout, RolloutSpec
from utils.core.cli import parse_stage_args, stage_parser
from utils.core.io import read_records
from utils.core.files import atomic_write_text
from utils.core.methods import CHECKPOINTS, SFT_WARMUP
from utils.core.models import load_tokenizer
from utils.core.schema import ENGINE_NAMES, THINKING_MODES
from utils.core.stages import StageError, model_dir, resolve_checkpoint, run_main
from utils.reward.scorers import answer_score


class Timed:
    """An engine wrapper that times each request from `submit` to the `poll` that returns it; the
    times of episode i, in completion order, are `times[i]` (the order its segments are appended)."""

    def __init__(self, engine):
        self.engine, self.times, self._start = engine, {}, {}

    def submit(self, key, prompt, spec, seed) -> None:
        self._start[id(key)] = time.perf_counter()  # a key holds lists (the executor's context): not hashable
        self.engine.submit(key, prompt, spec, seed)

    def poll(self):
        done = self.engine.poll()
        now = time.perf_counter()
        for key, _ in done:  # engines hand back the key object they were given
            self.times.setdefault(key[1], []).append(now - self._start.pop(id(key)))
        return done


def render(ep: Episode, times: list[float], scorer: str | None) -> str:
    lines = [f"question: {ep.question}"]
    turn = 0
    for seg, seconds in zip(ep.segments, times):
        if seg.role == PLANNER:
            turn += 1
            lines.append(f"  planner turn {turn} ({seconds:.2f} s): {seg.text.strip()}")
        else:
            lines.append(f"    executor ({seconds:.2f} s): {seg.text.strip()}")
        parts = split_actor_critic(extract_tag(seg.text, THINK))
        if parts:  # the procedural-thinking mode: each part on its own line
            pad = " " * (6 if seg.role == PLANNER else 8)
            lines.extend(f"{pad}{label}: {part}" for label, part in zip(ACTOR_CRITIC_LABELS, parts))
    for s in ep.searches:
        lines.append(f"    search (turn {s['turn'] + 1}): {s['query']!r} -> {', '.join(s['docs']) or s['error']}")
    verdict = ""
    if ep.golds and scorer:
        score, _ = answer_score(scorer, ep.final_answer, ep.golds)
        verdict = f" (gold {' | '.join(ep.golds)}: {'correct' if score >= 1.0 else 'wrong'})"
    lines.append(f"answer: {ep.final_answer if ep.final_answer is not None else '-'}{verdict}; {ep.status}"
                 f"{': ' + ep.error if ep.error else ''}; {ep.n_turns} planner turns, {ep.n_subtasks} subtasks, "
                 f"{sum(times):.2f} s of engine time")
    return "\n".join(lines)


def _questions(args) -> list[dict]:
    if args.question:
        return [{"id": "q1", "question": args.question, "answers": []}]
    rows = []
    for n, row in read_records(Path(args.questions)):
        if not isinstance(row.get("question"), str) or not row["question"].strip():
            raise StageError(f"{args.questions}, row {n}, field 'question': expected a non-empty string")
        rows.append({"id": str(row.get("id", f"q{n}")), "question": row["question"],
                     "answers": [str(a) for a in row.get("answers", [])], "context": row.get("context")})
    if not rows:
        raise StageError(f"{args.questions}: no questions")
    return rows


def main(argv=None) -> int:
    ap = stage_parser(__doc__)
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--question", help="one question, as the data config's questions are written")
    source.add_argument("--questions", help="a JSONL file of {question, answers?, context?}")
    ap.add_argument("--checkpoint", default=SFT_WARMUP, help=f"{' | '.join(CHECKPOINTS)} | DIR")
    ap.add_argument("--engine", choices=ENGINE_NAMES, default=None, help="default: the model config's engine")
    ap.add_argument("--thinking", choices=THINKING_MODES, default=None,
                    help="the <think> template (model.templates.thinking); actor_critic: the seed's procedural "
                         "thinking, shown part by part")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--save", default=None, help="also write each episode (transcript, answer, times) as JSONL")
    cfg, args = parse_stage_args(__doc__, argv, parser=ap)
    from utils.agent.engines import make_engine

    if args.thinking:
        cfg.model.templates.thinking = args.thinking
    rows = _questions(args)
    adapter = resolve_checkpoint(None, cfg, args.checkpoint)
    base = model_dir(cfg)
    t0 = time.perf_counter()
    engine = make_engine(args.engine or cfg.model.engine.name, base, cfg.model.engine, cfg.seed,
                         cfg.model.trust_remote_code)
    try:
        engine.set_adapter(adapter)
        started = time.perf_counter() - t0
        timed = Timed(engine)
        codec = Codec(load_tokenizer(base, cfg.model.trust_remote_code), cfg.model.templates)
        rollout = Rollout(timed, codec, RolloutSpec.from_config(cfg, args.temperature), run_retriever(cfg))
        t1 = time.perf_counter()
        episodes = rollout.run(rows, n=1, seed=cfg.seed)
        answered_in = time.perf_counter() - t1
    finally:
        engine.close()
    for i, ep in enumerate(episodes):
        print(render(ep, timed.times.get(i, []), cfg.data.scorer), end="\n\n")
    print(f"infer: {len(rows)} question(s) in {answered_in:.2f} s on {engine.name} ({args.checkpoint}); "
          f"engine start {started:.1f} s")
    if args.save:
        records = [{"id": ep.qid, "question": ep.question, "answer": ep.final_answer, "status": ep.status,
                    "golds": ep.golds, "transcript": ep.transcript, "times": timed.times.get(i, [])}
                   for i, ep in enumerate(episodes)]
        atomic_write_text(Path(args.save), "".join(json.dumps(r) + "\n" for r in records))
    return 0


if __name__ == "__main__":
    sys.exit(run_main("infer", main))
