"""Where 03's SFT traces come from (`traces.source`): each source is a function from a `TraceJob` to
(trace and examples pairs, episodes sampled), registered in `TRACE_SOURCES`, so that 03 is plumbing
that never branches on a source's name. `gold` reads the task's own decomposition, `solution` a
worked solution's "expr = number" lines, `teacher` samples episodes from a teacher model and keeps
the first correct one per question (rejection sampling; the sampled count gives the acceptance rate).
A new source is one more entry here (docs/EXTENDING.md).

What every source shares: `traces.max_subtasks=N` keeps traces of at most N subtasks,
`traces.long_traces=L` lets the first L longer ones through as well, and `traces.max_traces=K` then
keeps the first K in train order (`teacher` stops sampling once K are kept); all 0 (off) unless set.
A teacher episode is kept only when the reward spec judges it correct and its final answer holds no
tag fragment (`<answer>56</answer</answer>` scores 56 under `numeric` but would teach the broken tag).
The imperfect teacher (`traces.flaw_rate` ρ > 0) stops a share ρ of the gold chains of two or more
subtasks one subtask early: the planner answers the result before the last subtask. `flaw_draw:
question` flaws each chain on its own with probability ρ, drawn from (seed, question id); `length`
flaws exactly round(ρ·n) of the n traced chains of each gold length, those first by the same draw, so
the flawed share per length is ρ on every seed. A flawed record says `"flawed": true`, and 03's
manifest counts them: a warmup on them learns to stop early, which only a reward on the final answer
can unlearn (the embedded regime's positive control)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from utils.agent.retrieval import render_information, run_retriever
from utils.agent.rollout import Codec, Rollout, RolloutSpec
from utils.agent.traces import ThinkStyle, examples_from_trace, flaw_by_length, trace_from_episode, trace_from_row
from utils.core.config import repo_path
from utils.core.registry import Registry
from utils.core.stages import model_dir
from utils.reward.spec import read_spec, score_answer


@dataclass
class TraceJob:
    """What every source is given: the config, 03's StageRun (the retriever index is one of its
    inputs), the prepared train rows, the codec, how many traces are wanted, 02's folder, and the
    list a source appends (question id, why no trace) to."""
    cfg: Any
    run: Any
    rows: list[dict]
    codec: Codec
    wanted: int
    rewards_dir: Path
    skipped: list[tuple[str, str]] = field(default_factory=list)


Pairs = list[tuple[Any, list]]  # (Trace, its per-role Examples)


class LengthFilter:
    """traces.max_subtasks keeps traces with that many subtasks or fewer (0 = all), plus the first
    traces.long_traces longer ones it is shown."""

    def __init__(self, cfg):
        self.cap, self.long_left = cfg.traces.max_subtasks, cfg.traces.long_traces

    def __call__(self, trace) -> bool:
        if not self.cap or len(trace.executor_calls) <= self.cap:
            return True
        if self.long_left > 0:
            self.long_left -= 1
            return True
        return False


def _gold_search(cfg, run) -> Callable[[str], tuple[str, list[str]]] | None:
    """query -> (information text, passage ids) on 01's index, for lookup steps; None without the tool."""
    retriever = run_retriever(cfg, run)
    if retriever is None:
        return None

    def search(query: str) -> tuple[str, list[str]]:
        passages = retriever.search(query, cfg.agent.tool.top_k)
        return render_information(cfg.agent.tool.information, passages), [p.id for p in passages]
    return search


def _from_rows(job: TraceJob, source: str) -> tuple[Pairs, int, Callable]:
    """A trace per usable row (`trace_from_row`), and the row -> unflawed trace function."""
    cfg, usable, pairs = job.cfg, LengthFilter(job.cfg), []
    search, style = _gold_search(cfg, job.run), ThinkStyle.from_config(cfg)
    per_question = cfg.traces.flaw_rate if cfg.traces.flaw_draw == "question" else 0.0
    for row in job.rows:
        trace, why = trace_from_row(row, source, search, style, per_question, cfg.seed)
        if trace is None:
            job.skipped.append((row["id"], why))
        elif usable(trace):
            pairs.append((trace, examples_from_trace(trace, job.codec, row.get("context"))))
    return pairs, 0, lambda row: trace_from_row(row, source, search, style, 1.0, cfg.seed)[0]


def gold_traces(job: TraceJob) -> tuple[Pairs, int]:
    """The task's decomposition; with traces.flaw_draw=length the flawed share is drawn by length."""
    pairs, sampled, flawed = _from_rows(job, "gold")
    cfg = job.cfg
    if cfg.traces.flaw_draw == "length":
        rows = {r["id"]: r for r in job.rows}
        pairs = flaw_by_length(pairs[:job.wanted], rows, cfg.traces.flaw_rate, cfg.seed, flawed, job.codec)
    return pairs, sampled


def solution_traces(job: TraceJob) -> tuple[Pairs, int]:
    pairs, sampled, _ = _from_rows(job, "solution")
    return pairs, sampled


def teacher_traces(job: TraceJob) -> tuple[Pairs, int]:
    """Rejection sampling: the first correct, tag-clean episode per question, batch by batch until
    `wanted` are kept."""
    from utils.agent.engines import make_engine

    cfg, spec = job.cfg, read_spec(job.rewards_dir / "reward_spec.yaml")
    path = model_dir(cfg, cfg.traces.teacher_path or None)
    engine = make_engine(cfg.model.engine.name, path, cfg.model.engine, cfg.seed, cfg.model.trust_remote_code)
    engine.set_adapter(repo_path(cfg.traces.teacher_adapter) if cfg.traces.teacher_adapter else None)
    ro = Rollout(engine, job.codec, RolloutSpec.from_config(cfg, cfg.traces.teacher_temperature), run_retriever(cfg))
    kept, sampled, size, usable = [], 0, cfg.traces.teacher_batch, LengthFilter(cfg)
    for start in tqdm(range(0, len(job.rows), size), desc="teacher rollouts", unit="batch"):
        if len(kept) >= job.wanted:
            break
        episodes = ro.run(job.rows[start:start + size], n=cfg.traces.teacher_samples, seed=cfg.seed, step=start)
        sampled += len(episodes)
        done = set()
        for ep in episodes:  # keep the first correct episode per question whose answer holds no tag fragment
            _, comps = score_answer(spec, ep.question, ep.final_answer, ep.golds, ep.format_score, 0)
            clean = "<" not in (ep.final_answer or "")  # `<answer>56</answer</answer>` scores 56 but teaches junk
            if ep.status == "answered" and comps["answer"] == 1.0 and clean and ep.qid not in done:
                trace, examples = trace_from_episode(ep)
                if usable(trace):
                    done.add(ep.qid)
                    kept.append((trace, examples))
    engine.close()
    return kept, sampled


TRACE_SOURCES: Registry[Callable[[TraceJob], tuple[Pairs, int]]] = Registry("trace source", {
    "gold": gold_traces,
    "solution": solution_traces,
    "teacher": teacher_traces,
})
