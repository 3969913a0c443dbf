"""07_evaluate: evaluate checkpoints on test.jsonl with greedy Planner/Executor rollouts.

--checkpoint NAME[,NAME...], each base | sft_warmup | a method of utils/core/methods.py (red, grpo,
fixed_sft, matched_sft, sft, rloo, gspo, red_paper), or a path to a peft adapter dir: the bare base
model, 04's adapter, or a method's final adapter. Several checkpoints share one sampling engine,
which swaps adapters between them (starting an engine costs more than evaluating 200 items on it);
each still gets its own folder and manifest, the same as when evaluated alone. Writes
outputs/<run_id>/07_evaluate/<checkpoint>/:
metrics.json (accuracy under the spec's scorer with a bootstrap 95% CI, format compliance, turns and
subtasks per episode, tokens per role, failure counts), breakdown.csv (one row per item with its
failure category), samples/predictions.jsonl (full transcripts) and the manifest. With
eval.samples = k > 0 it also samples k episodes per item at the rollout temperature
(algorithm.rl.temperature, what RL optimises): mean@k with its CI and pass@k in metrics.json, and
each item's k scores, their mean and its count of fully correct ones (sampled_correct of sampled_n)
in predictions.jsonl, with the unbiased pass@k at k = 1, 2, 4, ... k (utils/eval/passk.py). With
eval.curve_samples = n > 0 it samples n more episodes per item, apart from those (so mean@k stays
as it is), for the pass@k curve to k = n: `pass_at_k_curve` in metrics.json, each item's
curve_correct of curve_n in predictions.jsonl. `primary` (eval.primary) names the
metric 08's paired tests use.
"""
import csv
import io
import sys
from collections import Counter
from pathlib import Path

from utils.agent.retrieval import run_retriever
from utils.agent.rollout import Codec, RolloutSpec
from utils.core.cli import parse_stage_args, stage_parser
from utils.core.io import read_jsonl, write_jsonl
from utils.core.files import atomic_write_json, atomic_write_text
from utils.core.manifest import StageRun
from utils.core.models import load_tokenizer
from utils.core.methods import CHECKPOINTS, SFT_WARMUP
from utils.core.stages import (evaluation_settings, model_dir, output_path, parent, resolve_checkpoint, run_main,
                               stage_dir)
from utils.eval.evaluation import (curve_eval, failure_category, fold_curve, fold_sampled, gold_steps, greedy_eval,
                                   sampled_eval)
from utils.eval.stats import bootstrap_ci
from utils.reward.spec import read_spec

STAGE = "07_evaluate"
BREAKDOWN = ["qid", "category", "status", "prediction", "golds", "answer", "format", "reward", "turns",
             "subtasks", "tokens_planner", "tokens_executor"]


SEARCH_FIELDS = ("searches", "retrieval_hit")  # with the search tool (utils/eval/evaluation.py search_metrics)


def write_outputs(out: Path, metrics: dict, scored: list[dict]) -> None:
    atomic_write_json(out / "metrics.json", metrics)
    buf = io.StringIO()
    fields = BREAKDOWN + (list(SEARCH_FIELDS) if scored and "searches" in scored[0] else [])
    writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in scored:
        writer.writerow({**r, "golds": "|".join(r["golds"])})
    atomic_write_text(out / "breakdown.csv", buf.getvalue())
    write_jsonl(out / "samples" / "predictions.jsonl", scored)


class SharedEngine:
    """One sampling engine for every checkpoint of the invocation, started on first use."""

    def __init__(self, cfg):
        self.cfg, self.engine = cfg, None

    def serving(self, adapter: Path | None):
        from utils.agent.engines import make_engine

        if self.engine is None:
            self.engine = make_engine(self.cfg.model.engine.name, model_dir(self.cfg), self.cfg.model.engine,
                                      self.cfg.seed, self.cfg.model.trust_remote_code)
        self.engine.set_adapter(adapter)
        return self.engine

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


def evaluate(cfg, args, name: str, shared: SharedEngine, codec: Codec) -> None:
    """Evaluate one checkpoint into its own folder, under its own manifest."""
    label = name if name in CHECKPOINTS else Path(name).name
    out = stage_dir(cfg, f"{STAGE}/{label}")
    settings = evaluation_settings(cfg, name, args.limit)
    with StageRun(f"{STAGE}/{label}", out, settings, cfg.seed) as run:
        _, prepared = parent(run, cfg, "01_prepare_dataset")
        rewards_dir, _ = parent(run, cfg, "02_build_rewards")
        adapter = resolve_checkpoint(run, cfg, name)
        test_path = output_path(prepared, "/test.jsonl")
        for p in [test_path, rewards_dir / "reward_spec.yaml"] + ([adapter] if adapter else []):
            run.add_input(p)
        run.add_model(model_dir(cfg))
        rows = read_jsonl(test_path)
        rows = rows[:args.limit] if args.limit else rows
        spec = read_spec(rewards_dir / "reward_spec.yaml")
        engine = shared.serving(adapter)
        retriever = run_retriever(cfg, run)
        summary, scored = greedy_eval(engine, codec, rows, spec, RolloutSpec.from_config(cfg, 0.0), retriever)
        steps = gold_steps(rows)
        for r in scored:
            r["category"] = failure_category(r, steps.get(r["qid"]))
        metrics = {**summary, "accuracy_ci95": bootstrap_ci([r["answer"] for r in scored], seed=cfg.seed),
                   "scorer": spec.scorer, "failures": dict(sorted(Counter(r["category"] for r in scored).items())),
                   "checkpoint": name, "primary": cfg.eval.primary}
        if cfg.eval.samples:
            fold_sampled(cfg, metrics, scored, sampled_eval(engine, codec, rows, spec, RolloutSpec.from_config(
                cfg, cfg.algorithm.rl.temperature), cfg.eval.samples, cfg.seed, retriever))
        if cfg.eval.curve_samples:
            fold_curve(cfg, metrics, scored, curve_eval(engine, codec, rows, spec, RolloutSpec.from_config(
                cfg, cfg.algorithm.rl.temperature), cfg.eval.curve_samples, cfg.seed, retriever))
        write_outputs(out, metrics, scored)
        for f in ("metrics.json", "breakdown.csv", "samples/predictions.jsonl"):
            run.add_output(out / f)
        run.metrics.update({k: metrics[k] for k in ("accuracy", "accuracy_ci95", "format", "answered", "turns")})
    lo, hi = metrics["accuracy_ci95"]
    print(f"{STAGE}: {label}: accuracy {metrics['accuracy']:.3f} (95% CI {lo:.3f}-{hi:.3f}), format "
          f"{metrics['format']:.3f}, {metrics['turns']:.2f} turns/episode on {len(rows)} items -> {out}", flush=True)


def main(argv=None) -> int:
    ap = stage_parser(__doc__)
    ap.add_argument("--checkpoint", default=SFT_WARMUP, help=f"comma-separated, each {' | '.join(CHECKPOINTS)} | DIR")
    ap.add_argument("--limit", type=int, default=0, help="evaluate only the first N test items (0 = all)")
    cfg, args = parse_stage_args(__doc__, argv, parser=ap)
    if cfg.eval.primary == "mean_at_k" and not cfg.eval.samples:
        ap.exit(2, f"{ap.prog}: eval.primary=mean_at_k needs eval.samples > 0 (episodes sampled per item)\n")
    names = [n.strip() for n in args.checkpoint.split(",") if n.strip()]
    if not names or len(set(names)) != len(names):
        ap.exit(2, f"{ap.prog}: --checkpoint {args.checkpoint!r}: expected distinct comma-separated names\n")
    codec = Codec(load_tokenizer(model_dir(cfg), cfg.model.trust_remote_code), cfg.model.templates)
    shared = SharedEngine(cfg)
    try:
        for name in names:
            evaluate(cfg, args, name, shared, codec)
    finally:
        shared.close()
    return 0


if __name__ == "__main__":
    sys.exit(run_main(STAGE, main))
