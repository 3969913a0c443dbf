"""03_generate_sft_traces: write sft_traces.jsonl, complete planner/executor episodes for SFT.

Sources (traces.source): `gold` (the task's own decomposition, the default for synthetic_arith),
`solution` (a worked solution's "expr = number" lines become subtasks and results, e.g. GSM8K),
`teacher` (episodes sampled from a teacher through the rollout engine, kept only when the reward
spec judges the final answer correct: rejection sampling, with the acceptance rate reported).
`traces.max_subtasks` keeps only traces with at most that many subtasks (the default task's "recall
vs extend" regime: demonstrations cover shorter chains than the RL questions and the test split),
`traces.long_traces` lets that many longer traces through as well (the first in train order: a few
demonstrations of long chains, so that sampled rollouts sometimes reach them and RL has a signal),
`traces.max_traces` caps how many are written, in train order (scarce expert traces), and
`traces.flaw_rate` makes the gold teacher imperfect: that share of chains stops one subtask early
and answers that result (marked `flawed` in the record; counted in the manifest).
Each trace is split into per-role examples of exact token ids with loss masks, in the same
protocol and templates the rollouts use. Also writes stats.json.
"""
import sys

from tqdm import tqdm

from utils.agent.retrieval import render_information, run_retriever
from utils.agent.rollout import Codec, Rollout, RolloutSpec
from utils.agent.traces import (ThinkStyle, examples_from_trace, flaw_by_length, skipped_stats, trace_from_episode,
                                trace_from_row, trace_record, trace_stats)
from utils.core.cli import parse_stage_args
from utils.core.io import read_jsonl, write_jsonl
from utils.core.manifest import StageRun, atomic_write_json
from utils.core.models import load_tokenizer
from utils.core.config import repo_path
from utils.core.stages import StageError, model_dir, output_path, parent, run_main, stage_config, stage_dir
from utils.reward.spec import read_spec, score_answer

STAGE = "03_generate_sft_traces"


def _teacher(cfg, rows, spec, codec, wanted):
    from utils.agent.engines import make_engine

    path = model_dir(cfg, cfg.traces.teacher_path or None)
    engine = make_engine(cfg.model.engine.name, path, cfg.model.engine, cfg.seed, cfg.model.trust_remote_code)
    engine.set_adapter(repo_path(cfg.traces.teacher_adapter) if cfg.traces.teacher_adapter else None)
    ro = Rollout(engine, codec, RolloutSpec.from_config(cfg, cfg.traces.teacher_temperature), run_retriever(cfg))
    kept, sampled, size = [], 0, cfg.traces.teacher_batch
    usable = _LengthFilter(cfg)
    for start in tqdm(range(0, len(rows), size), desc="teacher rollouts", unit="batch"):
        if len(kept) >= wanted:
            break
        chunk = rows[start:start + size]
        episodes = ro.run(chunk, n=cfg.traces.teacher_samples, seed=cfg.seed, step=start)
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


def _gold_search(cfg, run):
    """query -> (information text, passage ids) on 01's index, for lookup steps; None without the tool."""
    retriever = run_retriever(cfg, run)
    if retriever is None:
        return None

    def search(query: str) -> tuple[str, list[str]]:
        passages = retriever.search(query, cfg.agent.tool.top_k)
        return render_information(cfg.agent.tool.information, passages), [p.id for p in passages]
    return search


class _LengthFilter:
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


def main(argv=None) -> int:
    cfg, _ = parse_stage_args(__doc__, argv)
    out, skipped = stage_dir(cfg, STAGE), []

    with StageRun(STAGE, out, stage_config(cfg, STAGE), cfg.seed) as run:
        _, prepared = parent(run, cfg, "01_prepare_dataset")
        rewards_dir, _ = parent(run, cfg, "02_build_rewards")
        train = output_path(prepared, "/train.jsonl")
        run.add_input(train)
        rows = read_jsonl(train)
        wanted = cfg.traces.max_traces or len(rows)
        codec = Codec(load_tokenizer(model_dir(cfg), cfg.model.trust_remote_code), cfg.model.templates)
        source = cfg.traces.source
        if source == "teacher":
            pairs, sampled = _teacher(cfg, rows, read_spec(rewards_dir / "reward_spec.yaml"), codec, wanted)
        else:  # gold | solution: the config accepts no other source
            pairs, usable, sampled = [], _LengthFilter(cfg), 0
            search, style = _gold_search(cfg, run), ThinkStyle.from_config(cfg)
            per_question = cfg.traces.flaw_rate if cfg.traces.flaw_draw == "question" else 0.0
            for row in rows:
                trace, why = trace_from_row(row, source, search, style, per_question, cfg.seed)
                if trace is None:
                    skipped.append((row["id"], why))
                elif usable(trace):
                    pairs.append((trace, examples_from_trace(trace, codec, row.get("context"))))
            if source == "gold" and cfg.traces.flaw_draw == "length":
                pairs = flaw_by_length(pairs[:wanted], {r["id"]: r for r in rows}, cfg.traces.flaw_rate, cfg.seed,
                                       lambda row: trace_from_row(row, "gold", search, style, 1.0, cfg.seed)[0], codec)
        accepted = len(pairs) if sampled else 0  # before the cap: the teacher's acceptance rate
        pairs = pairs[:wanted]
        if not pairs:
            cap = f" and traces.max_subtasks={cfg.traces.max_subtasks}" if cfg.traces.max_subtasks else ""
            why = "".join(f"; {n} × {k}" for k, n in list(skipped_stats(skipped)["reasons"].items())[:3])
            raise StageError(f"no usable traces from {len(rows)} rows of {train} with source '{source}'{cap}{why}")
        records = [trace_record(t, ex, source) for t, ex in pairs]
        write_jsonl(out / "sft_traces.jsonl", records)
        stats = trace_stats(records, [e for _, ex in pairs for e in ex], len(rows), accepted,
                            sampled, source, skipped)
        atomic_write_json(out / "stats.json", stats)
        for name in ("sft_traces.jsonl", "stats.json"):
            run.add_output(out / name)
        run.metrics.update(traces=len(records), rows=len(rows), acceptance_rate=stats["acceptance_rate"],
                           planner_examples=stats["roles"]["planner"]["examples"],
                           executor_examples=stats["roles"]["executor"]["examples"],
                           flawed_traces=sum(bool(r.get("flawed")) for r in records))
    rate = f", acceptance {stats['acceptance_rate']:.1%}" if stats["acceptance_rate"] is not None else ""
    print(f"{STAGE}: {len(records)} {source} traces from {len(rows)} rows{rate} -> {out / 'sft_traces.jsonl'}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(STAGE, main))
