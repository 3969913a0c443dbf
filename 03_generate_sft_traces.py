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

from utils.agent.rollout import Codec
from utils.agent.traces import longest_turns, skipped_stats, trace_record, trace_stats
from utils.core.cli import parse_stage_args
from utils.core.io import read_jsonl, write_jsonl
from utils.core.files import atomic_write_json
from utils.core.manifest import StageRun
from utils.core.models import load_tokenizer
from utils.core.stages import StageError, model_dir, output_path, parent, run_main, stage_config, stage_dir
from utils.data.trace_sources import TRACE_SOURCES, TraceJob

STAGE = "03_generate_sft_traces"


def _fits_the_sampler(cfg, examples) -> list[str]:
    """A demonstrated turn longer than its role's generation budget is taught by 04 and cut off in
    every rollout and evaluation: a warning naming the setting (printed, and kept in the manifest)."""
    out = []
    for role, (length, qid) in sorted(longest_turns(examples).items()):
        key = f"agent.max_new_tokens_{role}"
        budget = getattr(cfg.agent, key.split(".")[1])
        if length > budget:
            out.append(f"{key}={budget}: a gold {role} turn of question {qid} is {length} tokens, so the sampler "
                       f"would cut it off; raise {key} to at least {length} (--set {key}={length})")
    return out


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
        run.add_model(model_dir(cfg))
        codec = Codec(load_tokenizer(model_dir(cfg), cfg.model.trust_remote_code), cfg.model.templates)
        source = cfg.traces.source
        job = TraceJob(cfg, run, rows, codec, wanted, rewards_dir, skipped)
        pairs, sampled = TRACE_SOURCES.get(source)(job)
        accepted = len(pairs) if sampled else 0  # before the cap: the teacher's acceptance rate
        pairs = pairs[:wanted]
        if not pairs:
            cap = f" and traces.max_subtasks={cfg.traces.max_subtasks}" if cfg.traces.max_subtasks else ""
            why = "".join(f"; {n} × {k}" for k, n in list(skipped_stats(skipped)["reasons"].items())[:3])
            raise StageError(f"no usable traces from {len(rows)} rows of {train} with source '{source}'{cap}{why}")
        for warning in _fits_the_sampler(cfg, [e for _, ex in pairs for e in ex]):
            run.warnings.append(warning)
            print(f"{STAGE}: warning: {warning}", file=sys.stderr)
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
