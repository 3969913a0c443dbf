"""07_evaluate: evaluate a checkpoint on test.jsonl with greedy Planner/Executor rollouts.

--checkpoint base | sft_warmup | red | grpo | fixed_sft | matched_sft | sft (or a path to a peft adapter dir):
the bare base model, 04's adapter, or a method's final adapter (names from utils/core/methods.py).
Writes outputs/<run_id>/07_evaluate/<checkpoint>/: metrics.json (accuracy under the spec's scorer
with a bootstrap 95% CI, format compliance, turns and subtasks per episode, tokens per role,
failure counts, optional pass@k), breakdown.csv (one row per item with its failure category),
samples/predictions.jsonl (full transcripts) and the manifest.
"""
import csv
import io
import sys
from collections import Counter
from pathlib import Path

from utils.agent.rollout import Codec, Rollout, RolloutSpec
from utils.core.cli import parse_stage_args, stage_parser
from utils.core.io import read_jsonl, write_jsonl
from utils.core.manifest import StageRun, atomic_write_json, atomic_write_text
from utils.core.methods import BASE, CHECKPOINTS, METHODS, SFT_WARMUP
from utils.core.schema import repo_path
from utils.core.stages import StageError, model_dir, output_path, parent, run_main, stage_config, stage_dir
from utils.eval.evaluation import failure_category, greedy_eval, pass_at_k
from utils.eval.stats import bootstrap_ci
from utils.reward.spec import read_spec, score_episodes

STAGE = "07_evaluate"
PASS_K_TEMPERATURE = 1.0  # pass@k samples the policy as it is, without temperature scaling
BREAKDOWN = ["qid", "category", "status", "prediction", "golds", "answer", "format", "reward", "turns",
             "subtasks", "tokens_planner", "tokens_executor"]


def resolve_checkpoint(run, cfg, name: str) -> Path | None:
    if name == BASE:
        return None
    if name == SFT_WARMUP:
        return parent(run, cfg, "04_sft_warmup")[0] / "ckpt_sft" / "best"
    if name in METHODS:
        return parent(run, cfg, f"{METHODS[name].trainer}/{name}")[0] / "final_adapter"
    path = repo_path(name)
    if not (path / "adapter_config.json").is_file():
        raise StageError(f"--checkpoint {name}: not one of {', '.join(CHECKPOINTS)} nor an adapter directory")
    return path


def write_outputs(out: Path, metrics: dict, scored: list[dict]) -> None:
    atomic_write_json(out / "metrics.json", metrics)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=BREAKDOWN, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in scored:
        writer.writerow({**r, "golds": "|".join(r["golds"])})
    atomic_write_text(out / "breakdown.csv", buf.getvalue())
    write_jsonl(out / "samples" / "predictions.jsonl", scored)


def main(argv=None) -> int:
    ap = stage_parser(__doc__)
    ap.add_argument("--checkpoint", default=SFT_WARMUP, help=f"{' | '.join(CHECKPOINTS)} | DIR")
    ap.add_argument("--pass_k", type=int, default=0, help="also sample k episodes per item at temperature 1")
    ap.add_argument("--limit", type=int, default=0, help="evaluate only the first N test items (0 = all)")
    cfg, args = parse_stage_args(__doc__, argv, parser=ap)
    from transformers import AutoTokenizer

    from utils.agent.engines import make_engine

    label = args.checkpoint if args.checkpoint in CHECKPOINTS else Path(args.checkpoint).name
    out = stage_dir(cfg, f"{STAGE}/{label}")
    settings = {**stage_config(cfg, STAGE), "checkpoint": args.checkpoint, "pass_k": args.pass_k, "limit": args.limit}
    with StageRun(f"{STAGE}/{label}", out, settings, cfg.seed) as run:
        _, prepared = parent(run, cfg, "01_prepare_dataset")
        rewards_dir, _ = parent(run, cfg, "02_build_rewards")
        adapter = resolve_checkpoint(run, cfg, args.checkpoint)
        test_path = output_path(prepared, "/test.jsonl")
        for p in [test_path, rewards_dir / "reward_spec.yaml"] + ([adapter] if adapter else []):
            run.add_input(p)
        rows = read_jsonl(test_path)
        rows = rows[:args.limit] if args.limit else rows
        base, spec = model_dir(cfg), read_spec(rewards_dir / "reward_spec.yaml")
        engine = make_engine(cfg.model.engine.name, base, cfg.model.engine, cfg.seed)
        engine.set_adapter(adapter)
        codec = Codec(AutoTokenizer.from_pretrained(base), cfg.model.templates)
        summary, scored = greedy_eval(engine, codec, rows, spec, RolloutSpec.from_config(cfg, 0.0))
        for r in scored:
            r["category"] = failure_category(r)
        metrics = {**summary, "accuracy_ci95": bootstrap_ci([r["answer"] for r in scored], seed=cfg.seed),
                   "scorer": spec.scorer, "failures": dict(sorted(Counter(r["category"] for r in scored).items())),
                   "checkpoint": args.checkpoint}
        if args.pass_k:
            sampler = Rollout(engine, codec, RolloutSpec.from_config(cfg, PASS_K_TEMPERATURE))
            metrics[f"pass@{args.pass_k}"] = pass_at_k(score_episodes(sampler.run(rows, n=args.pass_k, seed=cfg.seed), spec))
        engine.close()
        write_outputs(out, metrics, scored)
        for name in ("metrics.json", "breakdown.csv", "samples/predictions.jsonl"):
            run.add_output(out / name)
        run.metrics.update({k: metrics[k] for k in ("accuracy", "accuracy_ci95", "format", "answered", "turns")})
    lo, hi = metrics["accuracy_ci95"]
    print(f"{STAGE}: {label}: accuracy {metrics['accuracy']:.3f} (95% CI {lo:.3f}-{hi:.3f}), format "
          f"{metrics['format']:.3f}, {metrics['turns']:.2f} turns/episode on {len(rows)} items -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(STAGE, main))
