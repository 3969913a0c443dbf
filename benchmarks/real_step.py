"""A real model's GRPO step and SFT step against TRL's on the same model, with each arm's peak memory:

    .venv/bin/python benchmarks/real_step.py [--model smollm2-135m-instruct] [--data gsm_symbolic]
                                             [--rounds 2] [--steps 2] [--questions 8] [--n 4]

benchmarks/peer_trl.py's four arms (its docstring holds the setup each pair shares: the same
prompts, samples, generation budget, loss, lr and LoRA, one planner turn), run on a real model
config's converted base (`bash download.sh --model <name>`) and its data config's first train rows
(`bash download.sh --dataset <name>`) instead of tiny-arith. The defaults are the step of the real-model
regime's first settings, which docs/PERFORMANCE.md's figures measured: 8 questions x 4 samples at
temperature 0.7 (configs/regimes/real_cpu.yaml now samples 8 at 1.0 with lr 3e-5; `--n 8` sets the count,
the temperature and lr are peer_trl.py's). Both sides use
the model config's memory settings: its micro-batches and activation checkpointing on ours, TRL's
`gradient_checkpointing` set alike; vLLM's KV cache is 1 GiB in both (VLLM_CPU_KVCACHE_SPACE=1,
which vLLM's CPU platform applies over either side's own setting: TRL's colocated engine would
otherwise take 0.3 of the machine's memory). Arms alternate by round, each in a process of its
own, one untimed warm-up step first; an arm's peak is its process's peak resident memory
(getrusage), the engine's included.

The last line is exactly

    sft_peak_mib=<ours> rl_peak_mib=<ours> trl_rl_peak_mib=<TRL's> grpo_step_ratio=<ours / TRL> sft_step_ratio=<ours / TRL>

the step ratios of median step seconds. docs/PERFORMANCE.md ("Against TRL on a real model") quotes
it. Not a test.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

from peer_trl import add_arguments, ratios, run_arms  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap, questions=8, model="smollm2-135m-instruct", data="gsm_symbolic")
    args = ap.parse_args()
    if args.model == "tiny-arith":
        raise SystemExit("real_step: --model names a real model config; benchmarks/peer_trl.py runs tiny-arith")
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"  # both arms' engines: the same 1 GiB cache
    got, _ = run_arms(args)
    peak = {name: max(s["peak_mib"] for s in steps) for name, steps in got.items() if steps}
    ratio = ratios(got)
    print(f"sft_peak_mib={peak.get('sft-ours', float('nan')):.0f} rl_peak_mib={peak.get('grpo-ours', float('nan')):.0f} "
          f"trl_rl_peak_mib={peak.get('grpo-trl', float('nan')):.0f} grpo_step_ratio={ratio['grpo']:.3f} "
          f"sft_step_ratio={ratio['sft']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
