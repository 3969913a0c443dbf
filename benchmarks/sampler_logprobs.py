"""What the sampler's log-probs cost a rollout on vLLM, alternated in one process.

    .venv/bin/python benchmarks/sampler_logprobs.py [--run outputs/run_001] [--repeats 4]

vLLM's output processor turns every sampled token's log-prob into a Python object and decodes its
token to text, a cost per generated token. Training reads those log-probs (the sampler-trainer
mismatch, TIS); a greedy evaluation reads nothing of them, so `greedy_eval` asks for none
(`RolloutSpec.logprobs=False`). On the run's SFT warmup adapter this times, `--repeats` times each,
alternating (each arm first in turn, every rollout from an empty prefix cache) so the box's drift
falls on both arms:
- a greedy evaluation of 200 test items with and without log-probs (07's and 04's workload);
- a sampled rollout of 16 training questions x 4 samples at temperature 1 with and without them
  (05's workload; training cannot drop them, so "without" is only what they still cost).
The sampled arms also time the log-probs vLLM returns without decoding each entry to text (what
the rollout now asks for, `VLLMEngine.fast_logprobs`) against with it (vLLM's default). It checks
that every arm generated the same tokens and prints the medians. Not a test.
"""
import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from utils.agent.engines import empty_prefix_cache, make_engine  # noqa: E402
from utils.agent.rollout import Codec, Rollout, RolloutSpec  # noqa: E402
from utils.core.cli import parse_stage_args  # noqa: E402
from utils.core.config import ROOT  # noqa: E402
from utils.core.io import read_records  # noqa: E402
from utils.core.models import load_tokenizer  # noqa: E402
from utils.core.stages import model_dir  # noqa: E402


def timed_rollout(engine, codec, spec, rows, n, step):
    """(seconds, generated ids) of one rollout, from an empty prefix cache: every arm replays the same
    requests, and without the reset a later arm would find an earlier arm's contexts cached."""
    empty_prefix_cache(engine)
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
    greedy, sampled = RolloutSpec.from_config(cfg, 0.0), RolloutSpec.from_config(cfg, 1.0)
    # (workload, rows, samples per row, arms: (label, spec, vLLM decodes each log-prob entry's text))
    workloads = (("greedy, 200 test items", test, 1,
                  (("with log-probs", replace(greedy, logprobs=True), False),
                   ("without", replace(greedy, logprobs=False), False))),
                 ("sampled, 16 questions x 4", train, 4,
                  (("log-probs with token text", sampled, False),
                   ("log-probs, no token text", sampled, True),
                   ("no log-probs", replace(sampled, logprobs=False), True))))
    timed_rollout(engine, codec, greedy, test[:16], 1, 0)  # first-call costs are nobody's
    for label, rows, n, arms in workloads:
        seconds = {arm: [] for arm, _, _ in arms}
        for rep in range(args.repeats):
            tokens = []
            for arm, spec, fast in arms[rep % len(arms):] + arms[:rep % len(arms)]:  # each arm first in turn
                engine.fast_logprobs = fast
                dt, toks = timed_rollout(engine, codec, spec, rows, n, rep)
                seconds[arm].append(dt)
                tokens.append(toks)
            if any(t != tokens[0] for t in tokens):
                sys.exit(f"sampler_logprobs: {label}: the arms generated different tokens (repeat {rep})")
        first = statistics.median(seconds[arms[0][0]])
        print(f"{label} (medians of {args.repeats}, same tokens in every arm):")
        for arm, ts in seconds.items():
            med = statistics.median(ts)
            print(f"  {arm:<28}{med:>7.2f} s {1 - med / first:>5.0%} less   runs {[round(x, 2) for x in ts]}")
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
