"""Rollout throughput of the vLLM and HF engines on the same batch of planner/executor episodes.

    .venv/bin/python benchmarks/rollout_throughput.py [--questions 32] [--n 4] [--adapter DIR]

Without --adapter it first trains a protocol-following LoRA adapter on gold traces (about a
minute), so episodes run several turns as they do in training. Prints generated tokens/s and
episodes/s per engine; the first (warm-up) call of each engine is not timed. Not a test.
"""
import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from utils.core.config import ROOT  # noqa: E402
from utils.agent.engines import make_engine  # noqa: E402
from utils.agent.rollout import Codec, Rollout, RolloutSpec  # noqa: E402
from utils.core.schema import DataConfig, EngineConfig, TemplatesConfig  # noqa: E402
from utils.data.synthetic import generate_rows  # noqa: E402
from utils.tinyarith.quick import SHORT_CHAINS  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "artifacts" / "tiny-arith")
    ap.add_argument("--adapter", type=Path, default=None)
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--n", type=int, default=4, help="samples per question")
    ap.add_argument("--engines", default="vllm,hf")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    import torch
    torch.set_num_threads(2)

    adapter = args.adapter
    if adapter is None:
        from utils.tinyarith.quick import train_gold_adapter
        t0 = time.time()
        adapter = train_gold_adapter(args.model, Path(tempfile.mkdtemp()) / "adapter", batch_size=32)  # as when its figures were taken
        print(f"trained a protocol adapter in {time.time() - t0:.0f}s")
    rows = [{"id": r["id"], "question": r["question"], "answers": [str(r["answer"])]}
            for r in generate_rows(DataConfig(n_train=0, n_val=0, n_test=args.questions, seed=99, **SHORT_CHAINS))["test"]]
    cfg = EngineConfig(max_lora_rank=8)
    print(f"{'engine':<8}{'episodes':>10}{'gen tokens':>12}{'seconds':>10}{'tokens/s':>10}{'episodes/s':>12}{'turns/ep':>10}")
    for name in args.engines.split(","):
        engine = make_engine(name, args.model, cfg)
        engine.set_adapter(adapter)
        ro = Rollout(engine, Codec(engine.tokenizer, TemplatesConfig()), RolloutSpec(temperature=1.0))
        ro.run(rows[:4], n=2, seed=0)  # warm-up
        for rep in range(args.repeats):
            t0 = time.time()
            eps = ro.run(rows, n=args.n, seed=rep + 1)
            dt = time.time() - t0
            toks = sum(e.n_generated() for e in eps)
            turns = sum(e.n_turns for e in eps) / len(eps)
            print(f"{name:<8}{len(eps):>10}{toks:>12}{dt:>10.2f}{toks / dt:>10.0f}{len(eps) / dt:>12.1f}{turns:>10.2f}")
        engine.close()
        del engine
    return 0


if __name__ == "__main__":
    sys.exit(main())
