"""Is there anything for RL to find? Sample episodes from an adapter on a run's val split and report,
per gold decomposition length, the sample accuracy, pass@n and how many subtasks episodes delegate,
and first, over every question, the sample accuracy (mean@n), pass@n, and the format score, share
answered and planner turns that tell a broken protocol apart (`overall`).

    .venv/bin/python -m utils.eval.headroom --run outputs/run_001 [--adapter DIR]
        [--temperature 0.7] [--samples 8] [--split val] [--limit N] [--max_turns N] [--max_new_tokens_planner N]

Defaults to the run's 04_sft_warmup/ckpt_sft/best adapter. The base model, prompt templates,
engine, turn limit and token budgets are the run's own, as its warmup's manifest recorded them
(utils/core/stages.py `recorded_config`); --max_turns and --max_new_tokens_planner override them. GRPO learns only from groups with a
correct sample, so a length with pass@n = 0 at the rollout temperature gives no RL signal at all:
every method would tie there. docs/RESULTS.md and the journal quote
this probe's figures.
Rows without a gold decomposition (real datasets) are reported under "?".
"""
import argparse
import sys
from collections import Counter, defaultdict
from pathlib import Path


from utils.agent.engines import make_engine
from utils.agent.rollout import Codec, Rollout, RolloutSpec
from utils.core.config import ROOT, repo_path
from utils.core.io import read_records
from utils.core.stages import recorded_config
from utils.eval.evaluation import failure_category, gold_steps, gold_subtask_counts, pass_at_k, summarize_scores
from utils.reward.spec import read_spec, score_episodes


def probe(rows: list[dict], scored: list[dict]) -> dict[str, dict]:
    """Per gold length: sample accuracy, pass@n, mean reward and the subtask-count histogram."""
    length = gold_subtask_counts(rows)
    groups: dict[str, list[dict]] = defaultdict(list)
    for s in scored:
        groups[str(length.get(s["qid"], "?"))].append(s)
    out = {}
    for key, items in sorted(groups.items()):
        out[key] = {"episodes": len(items), "sample_accuracy": sum(s["answer"] for s in items) / len(items),
                    "pass_at_n": pass_at_k(items),
                    "mean_reward": sum(s["reward"] for s in items) / len(items),
                    "subtasks": dict(sorted(Counter(s["subtasks"] for s in items).items()))}
    return out


def overall(scored: list[dict], samples: int, steps: dict[str, list] | None = None) -> str:
    """The line over every question: mean@n, pass@n, and the protocol's health (format score, share
    answered, planner turns per episode, as 07 reports them); with the questions' gold steps (id ->
    meta.steps), also the share of episodes that stopped one subtask early (07's `stopped_early`)."""
    m = summarize_scores(scored)
    line = (f"all: mean@{samples} {m['accuracy']:.4f}  pass@{samples} {pass_at_k(scored):.4f}  "
            f"format {m['format']:.3f}  answered {m['answered']:.3f}  turns {m['turns']:.2f}")
    if steps:
        early = sum(failure_category(s, steps.get(s["qid"])) == "stopped_early" for s in scored)
        line += f"  stopped early {early / max(len(scored), 1):.3f}"
    return line


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, default=ROOT / "outputs" / "run_001")
    ap.add_argument("--adapter", type=Path, default=None, help="default: the run's SFT warmup adapter")
    ap.add_argument("--split", default="val", choices=("val", "train"), help="never test: choose on val")
    ap.add_argument("--limit", type=int, default=0, help="the split's first N questions (0 = all)")
    ap.add_argument("--temperature", type=float, default=0.7, help="default: algorithm.rl.temperature's default")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max_turns", type=int, default=None, help="default: the run's agent.max_turns")
    ap.add_argument("--max_new_tokens_planner", type=int, default=None, help="default: the run's agent.max_new_tokens_planner")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    cfg = recorded_config(args.run / "04_sft_warmup")  # the model, templates, engine, budgets 04 ran with
    if args.max_turns is not None:
        cfg.agent.max_turns = args.max_turns
    if args.max_new_tokens_planner is not None:
        cfg.agent.max_new_tokens_planner = args.max_new_tokens_planner
    adapter = args.adapter or args.run / "04_sft_warmup" / "ckpt_sft" / "best"
    rows = [r for _, r in read_records(args.run / "01_prepare_dataset" / f"{args.split}.jsonl")]
    rows = rows[:args.limit] if args.limit > 0 else rows
    spec = read_spec(args.run / "02_build_rewards" / "reward_spec.yaml")
    model = repo_path(cfg.model.path)
    engine = make_engine("vllm", model, cfg.model.engine, seed=args.seed)
    engine.set_adapter(adapter)
    codec = Codec(AutoTokenizer.from_pretrained(model), cfg.model.templates)
    ro = RolloutSpec.from_config(cfg, args.temperature)
    scored = score_episodes(Rollout(engine, codec, ro).run(rows, n=args.samples, seed=args.seed), spec)
    engine.close()
    print(f"{adapter}: {len(rows)} {args.split} questions x {args.samples} samples at T={args.temperature}, "
          f"max_turns {ro.max_turns}, planner budget {ro.max_new_tokens_planner} tokens")
    print(overall(scored, args.samples, gold_steps(rows)))
    for key, r in probe(rows, scored).items():
        print(f"gold subtasks {key}: sample accuracy {r['sample_accuracy']:.3f}  pass@{args.samples} "
              f"{r['pass_at_n']:.3f}  mean reward {r['mean_reward']:.2f}  subtasks delegated {r['subtasks']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
