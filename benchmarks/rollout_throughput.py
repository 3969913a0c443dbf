"""Rollout throughput of the vLLM and HF engines on the RL stage's own workload.

    .venv/bin/python benchmarks/rollout_throughput.py [--adapter DIR] [--rounds 2] [--set key=value ...]

The workload is 05's rollout under the run config (`load_run_config` with the `--set`s; by default
the main command's): `algorithm.rl.questions_per_step` questions × `n_samples` from the RL question
stream of the default data's train split (the regime's band of gold lengths, stratified as 05 draws
them), its turn limit, token budgets and temperature, and dynamic sampling's refill rounds, all
through the trainer's own sampler (`GrpoTrainer.sampler`, utils/train/sampler.py), with the model
config's engine settings (`model.engine`; only its name changes between the arms).

Without `--adapter` it first trains a protocol-following LoRA adapter on gold traces (about a
minute, utils/tinyarith/quick.py), so episodes run several turns as they do in training; the main
command's warmup adapter (`outputs/run_001/04_sft_warmup/ckpt_sft/best`) is the stage's own
policy. Per engine: one untimed warm-up rollout of a step, then `--rounds` timed steps, the same
questions and seeds for both engines. Prints every step's generated tokens (each sampling round's,
dropped groups included), seconds, tokens/s, episodes/s and sampling rounds, then the last line

    P2=<vLLM tokens/s / HF tokens/s> vllm_tok_s=<median> hf_tok_s=<median>

docs/PERFORMANCE.md quotes it. Not a test.
"""
import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from utils.core.config import ROOT  # noqa: E402


def train_rows(cfg) -> list[dict]:
    """The default data config's train split as 01 prepares it, then the RL stage's question filter."""
    from utils.data.adapters import get_adapter
    from utils.data.synthetic import generate_rows
    from utils.train.questions import rl_questions

    adapter = get_adapter(cfg.data.name)
    rows = [adapter.parse(Path("<generated>"), i, obj, "train").to_json()
            for i, obj in enumerate(generate_rows(cfg.data)["train"])]
    return rl_questions(rows, cfg, Path("<generated train split>"))


def engine_steps(name: str, cfg, adapter: Path, rows: list[dict], rounds: int, work: Path) -> list[dict]:
    """A warm-up step's rollout, then `rounds` timed ones, on engine `name`, as 05 rolls out."""
    from utils.agent.engines import make_engine
    from utils.agent.rollout import Codec, Rollout, RolloutSpec
    from utils.core.models import load_tokenizer
    from utils.core.tracking import NullLogger
    from utils.reward.spec import spec_from_config
    from utils.train.grpo_trainer import GrpoTrainer
    from utils.train.policy import load_policy

    base = ROOT / "artifacts" / "tiny-arith"
    tok = load_tokenizer(base)
    engine = make_engine(name, base, replace(cfg.model.engine, name=name), cfg.seed)
    engine.set_adapter(adapter)
    rollout = Rollout(engine, Codec(tok, cfg.model.templates), RolloutSpec.from_config(cfg, cfg.algorithm.rl.temperature))
    policy = load_policy(base, cfg.model.lora)  # the trainer's optimizer needs parameters; it is not stepped
    trainer = GrpoTrainer(cfg, policy, engine, rollout, spec_from_config(cfg), rows, [], tok.pad_token_id,
                          work / name, NullLogger(), "bench")
    generated: list[int] = []
    run = rollout.run

    def counted(*args, **kwargs):  # every sampling round's episodes, the dropped groups' too
        episodes = run(*args, **kwargs)
        generated.append(sum(e.n_generated() for e in episodes))
        return episodes

    rollout.run = counted
    out = []
    for step in range(rounds + 1):
        trainer.state.step = step
        questions = trainer.next_questions(cfg.algorithm.rl.questions_per_step)
        generated.clear()
        t0 = time.perf_counter()
        batch = trainer.sampler().sample(questions, step, 0)
        seconds = time.perf_counter() - t0
        out.append({"seconds": seconds, "tokens": sum(generated), "kept_episodes": len(batch.episodes),
                    "rounds": batch.metrics.get("train/sampling_rounds", 1)})
    engine.close()
    return out[1:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adapter", type=Path, default=None)
    ap.add_argument("--engines", default="vllm,hf")
    ap.add_argument("--rounds", type=int, default=2, help="timed steps per engine")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides")
    args = ap.parse_args()
    from utils.core.loader import load_run_config

    cfg = load_run_config(overrides=args.set)
    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    rows = train_rows(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        adapter = args.adapter
        if adapter is None:
            from utils.tinyarith.quick import train_gold_adapter

            t0 = time.time()
            adapter = train_gold_adapter(ROOT / "artifacts" / "tiny-arith", Path(tmp) / "adapter")
            print(f"trained a protocol adapter in {time.time() - t0:.0f}s")
        rl = cfg.algorithm.rl
        print(f"workload: {rl.questions_per_step} questions x {rl.n_samples}, temperature {rl.temperature}, "
              f"dynamic sampling {rl.dynamic_sampling} rounds, {len(rows)} questions in the stream")
        print(f"{'engine':<8}{'tokens':>10}{'seconds':>10}{'tokens/s':>10}{'episodes/s':>12}{'rounds':>8}")
        rates = {}
        for name in args.engines.split(","):
            steps = engine_steps(name, cfg, adapter, rows, args.rounds, Path(tmp))
            for s in steps:
                print(f"{name:<8}{s['tokens']:>10}{s['seconds']:>10.2f}{s['tokens'] / s['seconds']:>10.0f}"
                      f"{s['kept_episodes'] / s['seconds']:>12.1f}{s['rounds']:>8}")
            rates[name] = statistics.median(s["tokens"] / s["seconds"] for s in steps)
    if {"vllm", "hf"} <= set(rates):
        print(f"P2={rates['vllm'] / rates['hf']:.2f} vllm_tok_s={rates['vllm']:.0f} hf_tok_s={rates['hf']:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
