"""The RL update's seconds on the embedded default, this tree against an earlier commit, paired:

    .venv/bin/python benchmarks/update_time.py

The tiny-arith base with a random rank-8 adapter, at the default config (configs/models/tiny-arith.yaml,
the imperfect-teacher regime: two optimizer passes, the SFT term of 16 conversations), and a batch
shaped like the main command's: 128 episodes, each a planner conversation of 250 tokens (130
generated, in three turns) and three executor calls of 50 (34 generated). Each round runs one
process per tree, in alternating order (A B, then B A, ...), and each process times `--steps`
updates (the trainer's `_fixed_logprobs` then `_update`, benchmarks/gpu_shapes.py's harness) after
one warm-up. The last line is exactly

    update_time_ratio=<median seconds this tree / median seconds the other> this_s=<median> before_s=<median>
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from update_memory import BEFORE, export  # noqa: E402

PLANNER = (250, [(30, 40), (110, 40), (190, 50)])
EXECUTOR = (50, [(16, 34)])


def _batch(n: int):
    from gpu_shapes import episode_batch

    return episode_batch(n, PLANNER, EXECUTOR, 3)


def point(steps: int, work: Path) -> list[float]:
    import torch
    from gpu_shapes import _examples, bare_trainer, trainer_update
    from utils.core.loader import load_run_config
    from utils.train.policy import load_policy

    torch.manual_seed(0)
    cfg = load_run_config(overrides=["algorithm.rl.stratify=false"])
    policy = load_policy(ROOT / "artifacts" / "tiny-arith", cfg.model.lora)
    for p in policy.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05)
    trainer = bare_trainer(cfg, policy, _examples(64, *PLANNER, "planner"), work)
    batch = _batch(128)
    policy.train()
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        trainer_update(trainer, batch)
        times.append(time.perf_counter() - t0)
    return times[1:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default=BEFORE)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--point", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.point:
        print(json.dumps(point(args.steps, args.work)))
        return 0
    times: dict[str, list[float]] = {"this": [], "before": []}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this": ROOT, "before": export(args.before, Path(tmp) / "before")}
        for r in range(args.rounds):
            for name in (("this", "before") if r % 2 == 0 else ("before", "this")):
                env = {**os.environ, "PYTHONPATH": f"{trees[name]}{os.pathsep}{ROOT / 'benchmarks'}"}
                out = subprocess.run([sys.executable, __file__, "--point", "--steps", str(args.steps), "--work",
                                      str(Path(tmp) / f"w{r}{name}")], cwd=trees[name], env=env,
                                     capture_output=True, text=True, timeout=1800, check=True)
                got = json.loads(out.stdout.strip().splitlines()[-1])
                times[name] += got
                print(f"round {r} {name:>6}: " + " ".join(f"{t:.3f}" for t in got), flush=True)
    this, before = statistics.median(times["this"]), statistics.median(times["before"])
    print(f"update_time_ratio={this / before:.3f} this_s={this:.3f} before_s={before:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
