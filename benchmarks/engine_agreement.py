"""Do vLLM (LoRARequest) and transformers+peft give the same greedy planner/executor rollouts for a
trained adapter, on a run's own test split?

    .venv/bin/python benchmarks/engine_agreement.py [--run outputs/run_001] [--adapter DIR] [--limit 200]

Defaults to the run's 04_sft_warmup/ckpt_sft/best adapter and 01_prepare_dataset/test.jsonl.
Prints, per engine, accuracy and format under the run's reward spec, then how many episodes are
token-for-token identical across the engines and the worst log-prob difference. Exits 1 if any
episode differs. Not a test: the unit test (tests/test_engines.py) does the same on a small adapter.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from utils.core.config import ROOT  # noqa: E402
from utils.core.io import read_records  # noqa: E402
from utils.agent.engines import make_engine  # noqa: E402
from utils.eval.evaluation import summarize_scores  # noqa: E402
from utils.reward.spec import score_episodes  # noqa: E402
from utils.reward.spec import read_spec  # noqa: E402
from utils.agent.rollout import Codec, Rollout, RolloutSpec  # noqa: E402
from utils.core.schema import EngineConfig, TemplatesConfig  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, default=ROOT / "outputs" / "run_001")
    ap.add_argument("--model", type=Path, default=ROOT / "artifacts" / "tiny-arith")
    ap.add_argument("--adapter", type=Path, default=None, help="default: <run>/04_sft_warmup/ckpt_sft/best")
    ap.add_argument("--limit", type=int, default=200, help="test rows used (0 = all)")
    ap.add_argument("--max_turns", type=int, default=4)
    args = ap.parse_args()
    import torch
    torch.set_num_threads(2)

    adapter = args.adapter or args.run / "04_sft_warmup" / "ckpt_sft" / "best"
    test = args.run / "01_prepare_dataset" / "test.jsonl"
    rows = [row for _, row in read_records(test)]
    rows = rows[:args.limit] if args.limit else rows
    spec = read_spec(args.run / "02_build_rewards" / "reward_spec.yaml")
    rollout = RolloutSpec(max_turns=args.max_turns, temperature=0.0)
    results = {}
    for name in ("vllm", "hf"):
        engine = make_engine(name, args.model, EngineConfig(max_lora_rank=8))
        engine.set_adapter(adapter)
        episodes = Rollout(engine, Codec(engine.tokenizer, TemplatesConfig()), rollout).run(rows, n=1, seed=0)
        results[name] = episodes
        metrics = summarize_scores(score_episodes(episodes, spec))
        print(f"{name:<5} accuracy {metrics['accuracy']:.3f}  format {metrics['format']:.3f}  "
              f"turns {metrics['turns']:.2f}  ({len(episodes)} episodes, adapter {adapter})")
        engine.close()
        del engine
    same, worst = 0, 0.0
    for v, h in zip(results["vllm"], results["hf"]):
        segs_v, segs_h = v.segments, h.segments
        if len(segs_v) == len(segs_h) and all(a.gen_ids == b.gen_ids for a, b in zip(segs_v, segs_h)):
            same += 1
            worst = max([worst] + [abs(x - y) for a, b in zip(segs_v, segs_h) for x, y in zip(a.logprobs, b.logprobs)])
    print(f"identical episodes: {same}/{len(rows)}; worst |logprob(vllm) - logprob(hf)| over them: {worst:.2e}")
    return 0 if same == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
