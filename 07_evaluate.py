"""07_evaluate: evaluate a checkpoint on test.jsonl with greedy Planner/Executor rollouts.

--checkpoint base | sft | red | fixed_sft | grpo | sft_method (or a path to a peft adapter dir).
Writes outputs/<run_id>/07_evaluate/<checkpoint>/: metrics.json (accuracy under the spec's scorer
with a bootstrap 95% CI, format compliance, turns and subtasks per episode, tokens per role,
failure counts, optional pass@k), breakdown.csv (one row per item with its failure category),
samples/predictions.jsonl (full transcripts) and the manifest.
"""
import csv
import io
import json
import sys
from collections import Counter
from pathlib import Path

from utils.cli import parse_stage_args, stage_parser
from utils.evaluation import bootstrap_ci, failure_category, greedy_eval, score_episodes
from utils.manifest import StageRun, atomic_write_json, atomic_write_text
from utils.reward_spec import read_spec
from utils.rollout import Codec, Rollout, RolloutSpec
from utils.run_config import repo_path
from utils.stages import StageError, config_slice, model_dir, output_path, parent, run_main, stage_dir

STAGE = "07_evaluate"
CONFIG_KEYS = ("model", "algorithm.rl.max_turns", "seed")
TRAINERS = {"red": "05_train_red_grpo", "fixed_sft": "05_train_red_grpo", "sft_method": "05_train_red_grpo",
            "grpo": "06_ablate_grpo_only"}


def resolve_checkpoint(run, cfg, name: str) -> Path | None:
    if name == "base":
        return None
    if name == "sft":
        d, _ = parent(run, cfg, "04_sft_warmup")
        return d / "ckpt_sft" / "best"
    if name in TRAINERS:
        method = "sft" if name == "sft_method" else name
        d, _ = parent(run, cfg, f"{TRAINERS[name]}/{method}")
        return d / "final_adapter"
    path = repo_path(name)
    if not (path / "adapter_config.json").is_file():
        raise StageError(f"--checkpoint {name}: not one of base, sft, {', '.join(TRAINERS)} nor an adapter directory")
    return path


def main(argv=None) -> int:
    ap = stage_parser(__doc__)
    ap.add_argument("--checkpoint", default="sft", help="base | sft | red | fixed_sft | grpo | sft_method | DIR")
    ap.add_argument("--pass_k", type=int, default=0, help="also sample k episodes per item at temperature 1")
    ap.add_argument("--limit", type=int, default=0, help="evaluate only the first N test items (0 = all)")
    cfg, args = parse_stage_args(__doc__, argv, parser=ap)
    from transformers import AutoTokenizer

    from utils.engines import make_engine

    label = args.checkpoint if args.checkpoint in ("base", "sft", *TRAINERS) else Path(args.checkpoint).name
    out = stage_dir(cfg, f"{STAGE}/{label}")
    settings = {**config_slice(cfg, CONFIG_KEYS), "checkpoint": args.checkpoint, "pass_k": args.pass_k,
                "limit": args.limit}
    with StageRun(f"{STAGE}/{label}", out, settings, cfg.seed) as run:
        _, prepared = parent(run, cfg, "01_prepare_dataset")
        rewards_dir, _ = parent(run, cfg, "02_build_rewards")
        adapter = resolve_checkpoint(run, cfg, args.checkpoint)
        test_path = output_path(prepared, "/test.jsonl")
        for p in [test_path, rewards_dir / "reward_spec.yaml"] + ([adapter] if adapter else []):
            run.add_input(p)
        rows = [json.loads(x) for x in test_path.read_text().splitlines() if x.strip()]
        rows = rows[:args.limit] if args.limit else rows
        base = model_dir(cfg)
        spec = read_spec(rewards_dir / "reward_spec.yaml")
        engine = make_engine(cfg.model.engine.name, base, cfg.model.engine, cfg.seed)
        engine.set_adapter(adapter)
        codec = Codec(AutoTokenizer.from_pretrained(base), cfg.model.templates)
        rspec = RolloutSpec(cfg.algorithm.rl.max_turns, cfg.model.max_new_tokens_planner,
                            cfg.model.max_new_tokens_executor, 1.0, max_model_len=cfg.model.engine.max_model_len)
        summary, scored = greedy_eval(engine, codec, rows, spec, rspec)
        for r in scored:
            r["category"] = failure_category(r)
        metrics = {**summary, "accuracy_ci95": bootstrap_ci([r["answer"] for r in scored], seed=cfg.seed),
                   "scorer": spec.scorer, "failures": dict(sorted(Counter(r["category"] for r in scored).items())),
                   "checkpoint": args.checkpoint}
        if args.pass_k:
            sampled = score_episodes(Rollout(engine, codec, rspec).run(rows, n=args.pass_k, seed=cfg.seed), spec)
            hit = {}
            for r in sampled:
                hit[r["qid"]] = max(hit.get(r["qid"], 0.0), r["answer"])
            metrics[f"pass@{args.pass_k}"] = round(sum(hit.values()) / max(len(hit), 1), 6)
        engine.close()
        atomic_write_json(out / "metrics.json", metrics)
        buf = io.StringIO()
        fields = ["qid", "category", "status", "prediction", "golds", "answer", "format", "reward", "turns",
                  "subtasks", "tokens_planner", "tokens_executor"]
        writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for r in scored:
            writer.writerow({**r, "golds": "|".join(r["golds"])})
        atomic_write_text(out / "breakdown.csv", buf.getvalue())
        atomic_write_text(out / "samples" / "predictions.jsonl",
                          "".join(json.dumps(r, sort_keys=True) + "\n" for r in scored))
        for name in ("metrics.json", "breakdown.csv", "samples/predictions.jsonl"):
            run.add_output(out / name)
        run.metrics.update({k: metrics[k] for k in ("accuracy", "accuracy_ci95", "format", "answered", "turns")})
    lo, hi = metrics["accuracy_ci95"]
    print(f"{STAGE}: {label}: accuracy {metrics['accuracy']:.3f} (95% CI {lo:.3f}-{hi:.3f}), format "
          f"{metrics['format']:.3f}, {metrics['turns']:.2f} turns/episode on {len(rows)} items -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(STAGE, main))
