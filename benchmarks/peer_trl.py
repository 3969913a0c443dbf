"""The same GRPO step and SFT step in this project and in TRL (1.16.0, requirements-test.txt), on one box:

    .venv/bin/python benchmarks/peer_trl.py [--rounds 2] [--steps 3] [--questions 16] [--n 4]

Both arms start from the tiny-arith base (artifacts/tiny-arith) with a fresh LoRA of the model
config's shape (configs/models/tiny-arith.yaml: rank 8, alpha 16, all seven projections), in fp32,
on the same questions (synthetic arithmetic, the default data config's train split, the first
`--questions` rows), and differ only in the trainer:
- **GRPO, ours:** 06's `grpo` method through `GrpoTrainer.step` (rollout on the model config's engine,
  scoring with the reward spec 02 would write, advantages, the update, the adapter handed to the
  engine), one planner turn (`agent.max_turns=1`: the planner answers directly), `--n` samples at
  temperature 0.7, 48 tokens, stopping at </task> or </answer>, lr 1e-4 constant, one optimizer
  pass, token-mean PPO-clip 0.2/0.28, Dr. GRPO's unscaled advantages, no KL, no entropy bonus.
- **GRPO, TRL:** `trl.GRPOTrainer` on the same prompt texts (our planner prompt, rendered), with
  vLLM colocated in the process (`use_vllm=True, vllm_mode="colocate"`: vLLM's CPU build 0.32 runs
  it, TRL warns it supports up to 0.31), the same stops, `loss_type="dapo"` (= token-mean, see
  benchmarks/trl_oracle.py), `scale_rewards="none"`, epsilon 0.2/0.28, beta 0, no vLLM importance
  correction (ours has tis_cap 0), lr 1e-4 constant, one step per generation batch; its reward
  function is our numeric scorer on the completion's <answer>.
- **SFT:** 04's optimizer step (`SftLoop._update`: token-mean NLL over the trained tokens,
  micro-batches, clip, AdamW) against `trl.SFTTrainer` with `completion_only_loss` on the same
  pre-tokenised gold planner and executor traces (03's, from the same rows), the warmup config's
  batch size, lr 5e-3 constant.

Each arm runs in a process of its own (two vLLM engines in one process share its parallel state):
one untimed warm-up step, then `--steps` timed ones; arms alternate by round (ours, TRL; then TRL,
ours; ...) so the box's drift falls on both alike. Per arm it prints the median step seconds,
generated and updated tokens a step, and their rates; the remaining differences in work (tokens
generated, padded positions) are printed beside them, not corrected for. Then the loss oracle's
cases (benchmarks/trl_oracle.py), and the last line is exactly

    grpo_step_ratio=<our step s / TRL step s> sft_step_ratio=<ours / TRL> loss_max_rel_diff=<largest relative loss difference over the oracle's cases>

On a GPU machine: `--device cuda --shape qwen2.5-0.5b` runs both arms on a randomly initialised model
of Qwen2.5-0.5B's shape (benchmarks/gpu_shapes.py SHAPES) in bfloat16, generating with transformers
in both (our `hf` engine, TRL's use_vllm=False: that machine has no vLLM); it needs TRL and
datasets carried as wheels (docs/OPERATIONS.md, "The peer benchmark on a GPU"). Not run there yet.
docs/PERFORMANCE.md ("Against a peer") quotes the figures. Not a test.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ARMS = ("grpo-ours", "grpo-trl", "sft-ours", "sft-trl")


# ------------------------------------------------------------------ the comparison


def arm(args) -> None:
    """One arm in this process: its steps' figures as one JSON line (the warm-up step first)."""
    import peer_arms

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cfg = peer_arms.run_config(args, work)
        base = peer_arms.base_dir(args, work)
        steps = getattr(peer_arms, args.arm.replace("-", "_"))(args, cfg, base, work)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB: the arm's process, engine included
    print("ARM " + json.dumps([{**s, "peak_mib": round(peak)} for s in steps]), flush=True)


def _median(steps: list[dict], key: str) -> float:
    return statistics.median(s[key] for s in steps)


def summary(name: str, steps: list[dict]) -> str:
    sec = _median(steps, "seconds")
    parts = [f"{name:>9}: step {sec:.3f} s (median of {len(steps)}; {min(s['seconds'] for s in steps):.3f}-"
             f"{max(s['seconds'] for s in steps):.3f})"]
    if "generated" in steps[0]:
        gen = _median(steps, "generated")
        parts.append(f"generated {gen:.0f} tokens ({gen / sec:.0f}/s), {_median(steps, 'sequences'):.0f} sequences, "
                     f"prompt tokens {_median(steps, 'prompt'):.0f}")
    parts.append(f"updated {_median(steps, 'updated'):.0f} tokens ({_median(steps, 'updated') / sec:.0f}/s)")
    if "positions" in steps[0]:
        parts.append(f"padded positions {_median(steps, 'positions'):.0f}")
    phases = sorted({k for s in steps for k in s if k.startswith("time/")})
    if phases:
        parts.append("phases (median s): " + ", ".join(f"{k[5:]} {_median(steps, k):.3f}" for k in phases))
    return "; ".join(parts)


def add_arguments(ap, questions: int = 16, model: str = "tiny-arith", data: str = "synthetic_arith") -> None:
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per arm per round (after one warm-up)")
    ap.add_argument("--questions", type=int, default=questions)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shape", default="tiny-arith", help="tiny-arith, or a gpu_shapes.SHAPES name (a random model)")
    ap.add_argument("--model", default=model, help="a model config (configs/models/<name>.yaml) whose base both "
                                                   "arms train; tiny-arith takes --shape")
    ap.add_argument("--data", default=data, help="the data config whose train rows both arms use")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)


def run_arms(args, script: str = __file__) -> tuple[dict[str, list[dict]], dict[str, dict]]:
    """Every arm, alternating by round, each in a process of its own: (each arm's timed steps, each
    arm's first warm-up step)."""
    arms = args.arms.split(",")
    got: dict[str, list[dict]] = {a: [] for a in arms}
    warm: dict[str, dict] = {}  # each arm's first warm-up step
    for r in range(args.rounds):
        for kind in ("grpo", "sft"):
            pair = [a for a in arms if a.startswith(kind)]
            for name in (pair if r % 2 == 0 else pair[::-1]):
                cmd = [sys.executable, script, "--arm", name, *[f"--{k}={v}" for k, v in
                       (("steps", args.steps), ("questions", args.questions), ("n", args.n),
                        ("device", args.device), ("shape", args.shape), ("model", args.model), ("data", args.data))]]
                t0 = time.time()
                proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ARM ")]
                if proc.returncode or not lines:
                    sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
                    raise SystemExit(f"peer_trl: arm {name} failed (exit {proc.returncode})")
                steps = json.loads(lines[-1][4:])
                warm.setdefault(name, steps[0])
                steps = steps[1:]  # the warm-up step dropped
                got[name] += steps
                print(f"round {r} {name}: " + " ".join(f"{s['seconds']:.3f}" for s in steps)
                      + f" s ({time.time() - t0:.0f} s with start-up, peak {steps[0]['peak_mib']} MiB)", flush=True)
    for name in arms:
        print(summary(name, got[name]))
    return got, warm


def ratios(got: dict[str, list[dict]]) -> dict[str, float]:
    """Our median step seconds over TRL's, for grpo and sft (nan where an arm did not run)."""
    return {k: _median(got[f"{k}-ours"], "seconds") / _median(got[f"{k}-trl"], "seconds")
            if f"{k}-ours" in got and f"{k}-trl" in got else float("nan") for k in ("grpo", "sft")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    args = ap.parse_args()
    if args.arm:
        arm(args)
        return 0
    got, warm = run_arms(args)
    if "sft-ours" in warm and "sft-trl" in warm:  # the same batch and the same start (a fresh LoRA's B is 0)
        print(f"sft warm-up step's loss: ours {warm['sft-ours']['loss']:.6f}, TRL {warm['sft-trl']['loss']:.6f}")
    ratio = ratios(got)
    from trl_oracle import oracle

    with tempfile.TemporaryDirectory() as tmp:
        cases = oracle(Path(tmp))
    for c in cases:
        print(f"oracle {c.case}: loss ours {c.ours_loss:+.7f} TRL {c.trl_loss:+.7f} (rel {c.loss_rel_diff:.1e}), "
              f"gradient max rel {c.grad_rel_diff:.1e}")
    print(f"grpo_step_ratio={ratio['grpo']:.3f} sft_step_ratio={ratio['sft']:.3f} "
          f"loss_max_rel_diff={max(c.loss_rel_diff for c in cases):.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
