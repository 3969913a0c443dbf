"""What the sampler's log-probs cost a rollout on vLLM, alternated in one process.

    .venv/bin/python benchmarks/sampler_logprobs.py [--run outputs/run_001] [--repeats 4]

vLLM's output processor turns every sampled token's log-prob into a Python object and decodes its
token to text, a cost per generated token. Training reads those log-probs (the sampler-trainer
mismatch, TIS); a greedy evaluation reads nothing of them, so `greedy_eval` asks for none
(`RolloutSpec.logprobs=False`). On the run's SFT warmup adapter this times, `--repeats` times each,
alternating so the box's drift falls on both arms:
- a greedy evaluation of 200 test items with and without log-probs (07's and 04's workload);
- a sampled rollout of 16 training questions x 4 samples at temperature 1 with and without them
  (05's workload; training cannot drop them, so this is only what they still cost).
It checks that each pair generated the same tokens and prints the medians. Not a test.
"""
import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from utils.agent.engines import make_engine  # noqa: E402
from utils.agent.rollout import Codec, Rollout, RolloutSpec  # noqa: E402
from utils.core.cli import parse_stage_args  # noqa: E402
from utils.core.config import ROOT  # noqa: E402
from utils.core.io import read_records  # noqa: E402
from utils.core.models import load_tokenizer  # noqa: E402
from utils.core.stages import model_dir  # noqa: E402


def timed_rollout(engine, codec, spec, rows, n, step):
    t0 = time.perf_counter()
    episodes = Rollout(engine, codec, spec).run(rows, n=n, seed=1, step=step)
    tokens = [[s.gen_ids for s in e.segments] for e in episodes]
    return time.perf_counter() - t0, tokens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, default=ROOT / "outputs" / "run_001")
    ap.add_argument("--repeats", type=int, default=4)
    args = ap.parse_args()
    import torch

    cfg, _ = parse_stage_args(__doc__, ["--run_id", args.run.name])
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    adapter = args.run / "04_sft_warmup" / "ckpt_sft" / "best"
    if not adapter.exists():
        sys.exit(f"sampler_logprobs: {adapter} missing: run 09_driver.py (or 00-04) for {args.run} first")
    test = [r for _, r in read_records(args.run / "01_prepare_dataset" / "test.jsonl")][:200]
    train = [r for _, r in read_records(args.run / "01_prepare_dataset" / "train.jsonl")][:16]
    engine = make_engine(cfg.model.engine.name, model_dir(cfg), cfg.model.engine, cfg.seed)
    engine.set_adapter(adapter)
    codec = Codec(load_tokenizer(model_dir(cfg), cfg.model.trust_remote_code), cfg.model.templates)
    workloads = (("greedy, 200 test items", RolloutSpec.from_config(cfg, 0.0), test, 1),
                 ("sampled, 16 questions x 4", RolloutSpec.from_config(cfg, 1.0), train, 4))
    timed_rollout(engine, codec, workloads[0][1], test[:16], 1, 0)  # first-call costs are nobody's
    for label, spec, rows, n in workloads:
        seconds = {True: [], False: []}
        for rep in range(args.repeats):
            runs = {lp: timed_rollout(engine, codec, replace(spec, logprobs=lp), rows, n, rep) for lp in (True, False)}
            if runs[True][1] != runs[False][1]:
                sys.exit(f"sampler_logprobs: {label}: tokens differ with and without log-probs (repeat {rep})")
            for lp, (dt, _) in runs.items():
                seconds[lp].append(dt)
        with_lp, without = statistics.median(seconds[True]), statistics.median(seconds[False])
        print(f"{label}: with log-probs {with_lp:.2f} s, without {without:.2f} s (medians of {args.repeats}; "
              f"{1 - without / with_lp:.0%} less); runs {[round(x, 2) for x in seconds[True]]} / "
              f"{[round(x, 2) for x in seconds[False]]}")
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
