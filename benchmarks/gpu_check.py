"""The GPU check: the embedded default's CUDA path and the seed's shapes, measured in one prepared run:

    timeout 500 python3 benchmarks/gpu_check.py --out /tmp/gc --budget 300; cp /tmp/gc/gpu_check.* "$OUT"

On the GPU machine, from the repository root, with that machine's own python3 (it has torch,
transformers, peft, accelerate, safetensors, tokenizers, pyyaml, pandas, matplotlib, tqdm and
psutil; no vLLM, wandb or ray, and none is needed), with a limit that leaves room for a rerun
(`--shapes_first --dtypes bfloat16` puts the seed shapes first when time is short).

Nothing has to travel beside the working tree: no wheels (the image's versions are used and
recorded), no weights (the base model ships in artifacts/tiny-arith, the task's data is generated,
the seed-shaped models are randomly initialised). Write --out outside $OUT: the run folders under it
hold far more files than come back. On one H100 (2026-11-27, docs/PERFORMANCE.md "The GPU path") the
whole run with 07 on all 200 items and two validations in 04 passed 500 s; the defaults now validate
once and evaluate 100 items, and a rerun that chose parts (--dtypes, --shapes, --shapes_first, --set)
took 194 s. On this machine the suite runs the CPU dry run of the same code paths with the three
packages hidden (tests/test_gpu_check.py), in about 20 seconds:

    .venv/bin/python benchmarks/gpu_check.py --device cpu --quick --hide vllm,wandb,ray --out /tmp/gpu_check

It writes <out>/gpu_check.json after every part and <out>/gpu_check.txt at the end:
1. `env`: torch, CUDA, the GPU, transformers, peft, and which of vllm/wandb/ray import.
2. `chain.<dtype>`, for float32 and bfloat16: 00-03, a short 04 (200 steps, validated once), 05 red (5 steps) and 07
   on the warmup and red (first --limit items), with model.device=<device> and the hf engine (trainer and engine in that
   dtype): each stage's seconds and peak GPU memory, the SFT and RL step times, each RL step's
   rollout/logprob_mismatch and the test accuracies. In bfloat16, 05 runs as a process of its own,
   is SIGKILLed while it writes its third checkpoint (utils/core/faults.py), and is run again: it
   must resume from step 2 and log each step once.
3. `seed_shape.<model>` (benchmarks/gpu_shapes.py): a randomly initialised model of Qwen2.5-0.5B's
   shape (dims in SHAPES; LoRA and token budgets from configs/models/qwen2.5-0.5b.yaml) at the
   seed's RL batch: 32 prompts x 2 samples, 2 planner turns (256 tokens each) around one executor
   call (384): planner conversations of 732 tokens and executor calls of 484, short of the seed's
   3,072 prompt and 1,024 response tokens. It times the rollout on the hf engine, one RL update
   through the trainer's own `_fixed_logprobs` and `_update` (the old-log-prob pass, two optimizer
   passes, the SFT term, in the model config's micro-batches: model.memory) and one 04 SFT step,
   with peak memory and updated tokens/s, then the update at each --sweep micro-batch budget; an
   update that does not fit is halved until it does, and each size that ran out of memory is
   listed; a phase that fails otherwise is named in `failed`, and the figures measured before it
   are kept. Then Gemma-2-2B's shape if the --budget allows, and in any case an estimate of its
   seconds scaled from Qwen's by parameter count (seconds only: memory does not scale so).
"""
import argparse
import importlib
import importlib.abc
import json
import os
import runpy
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpu_shapes import SHAPES, gpu_reset, param_count, seed_shape  # noqa: E402
from utils.core.io import read_jsonl  # noqa: E402
from utils.core.manifest import read_manifest  # noqa: E402

STAGES = ("00_check_data", "01_prepare_dataset", "02_build_rewards", "03_generate_sft_traces", "04_sft_warmup")
RL_STAGE = "05_train_red_grpo"
QUICK_SETS = ["data.n_train=40", "data.n_val=6", "data.n_test=6", "warmup.steps=6", "warmup.eval_every=0",
              "warmup.eval_size=3", "warmup.batch_size=8", "algorithm.rl.steps=3",
              "algorithm.rl.questions_per_step=2", "algorithm.rl.n_samples=2"]


class _Hidden(importlib.abc.MetaPathFinder):
    """The path finder with some top-level packages taken out, modules and metadata alike: as if
    they were not installed (importlib.util.find_spec gives None, importing them fails)."""

    def __init__(self, names: set[str], inner):
        self.names, self.inner = names, inner

    def find_spec(self, name, path=None, target=None):
        return None if name.split(".")[0] in self.names else self.inner.find_spec(name, path, target)

    def find_distributions(self, *args, **kwargs):
        return (d for d in self.inner.find_distributions(*args, **kwargs)
                if (d.metadata["Name"] or "").lower().replace("-", "_") not in self.names)

    def invalidate_caches(self) -> None:
        self.inner.invalidate_caches()


def hide(names: str) -> None:
    from importlib.machinery import PathFinder

    wanted = {n for n in names.split(",") if n}
    if wanted:
        sys.meta_path[:] = [_Hidden(wanted, f) if f is PathFinder else f for f in sys.meta_path]


def environment() -> dict:
    import torch

    env = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    for name in ("transformers", "peft", "accelerate", "tokenizers", "vllm", "wandb", "ray"):
        try:
            env[name] = importlib.import_module(name).__version__
        except ImportError:
            env[name] = None
    return env


def in_process(script: str, argv: list[str]) -> int:
    from utils.core.stages import run_main
    from utils.train.rl_stage import run_rl_stage

    mod = importlib.import_module(script)
    if script == RL_STAGE:
        return run_main(script, lambda: run_rl_stage(script, mod.__doc__, argv, default_algorithm="red"))
    return run_main(script, lambda: mod.main(argv))


def as_process(script: str, argv: list[str], hidden: str, fault: str | None = None) -> subprocess.CompletedProcess:
    """The stage as its own process (and process group, which a fault point SIGKILLs whole)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDCODA_FAULT")}
    if fault:
        env.update(REDCODA_FAULT=fault, REDCODA_FAULT_STAGE=script)
    cmd = [sys.executable, __file__, "--hide", hidden, "--run_stage", f"{script}.py", "--", *argv]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, start_new_session=True, timeout=600)


def _stage_record(run: Path, stage: str, seconds: float) -> dict:
    m = read_manifest(run / stage)
    return {"seconds": round(seconds, 2), "status": m["status"], "peak_gpu_mb": m.get("peak_gpu_mb"),
            "device": m.get("device")}


def killed_and_resumed(run: Path, argv: list[str], steps: int, hidden: str) -> dict:
    """05 SIGKILLed while writing checkpoint k (= steps // 2 + 1, save_freq 1), then the same command:
    it must resume from step k - 1 and end with each step logged once."""
    k = steps // 2 + 1
    t0 = time.time()
    killed = as_process(RL_STAGE, argv, hidden, fault=f"checkpoint:{k}")
    again = as_process(RL_STAGE, argv, hidden)
    for proc in (killed, again):  # into this run's log, which the children's output would otherwise miss
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n", flush=True)
    steps_logged = [r["step"] for r in read_jsonl(run / RL_STAGE / "red" / "metrics.jsonl")]
    said = f"resuming red from step {k - 1}"
    out = {"killed_returncode": killed.returncode, "resumed_returncode": again.returncode,
           "expected": said, "said_it": said in again.stdout, "steps_logged": steps_logged,
           "ok": killed.returncode == -signal.SIGKILL and again.returncode == 0 and said in again.stdout
           and steps_logged == list(range(1, steps + 1)), "seconds": round(time.time() - t0, 2)}
    if not out["ok"]:
        out["stderr_tail"] = (killed.stderr[-1500:], again.stderr[-3000:])
    return out


def chain(args, dtype: str, data: Path, kill: bool) -> dict:
    run_id = f"gpu_check_{dtype}"
    run = args.out / "runs" / run_id
    steps = 3 if args.quick else 5
    # regime D: a check of the path, not of a study; the default's dynamic sampling would stop a
    # warmup this short on a step whose every group scores alike
    sets = ["regime=regime_d", f"outputs_dir={args.out / 'runs'}", f"data.path={data}", f"model.device={args.device}",
            "model.engine.name=hf", f"model.dtype={dtype}", f"model.engine.dtype={dtype}", "wandb_mode=disabled",
            "warmup.steps=200", "warmup.decay_start=0", "warmup.eval_every=0", "warmup.eval_size=50", f"algorithm.rl.steps={steps}", "algorithm.rl.save_freq=1",
            *(QUICK_SETS if args.quick else []), *args.set]
    argv = ["--run_id", run_id] + [a for s in sets for a in ("--set", s)]
    out: dict = {"stages": {}}
    for script in (*STAGES, RL_STAGE, "07_evaluate"):
        gpu_reset()
        t0 = time.time()
        if script == RL_STAGE and kill:
            out["resume"] = killed_and_resumed(run, argv, steps, args.hide)
            code = out["resume"]["resumed_returncode"]
        else:
            code = in_process(script, argv + (["--checkpoint", "sft_warmup,red", "--limit", str(args.limit)] if script == "07_evaluate" else []))
        if code != 0:
            out["failed"] = f"{script} exited {code}"
            return out
        stage = f"{RL_STAGE}/red" if script == RL_STAGE else "07_evaluate/red" if script == "07_evaluate" else script
        out["stages"][script] = _stage_record(run, stage, time.time() - t0)
    sft = [r["time/step"] for r in read_jsonl(run / "04_sft_warmup" / "logs" / "train.jsonl")][1:]  # the first warms up
    rl = read_jsonl(run / RL_STAGE / "red" / "metrics.jsonl")
    out["sft_step_s_median"] = round(statistics.median(sft), 5)
    out["rl_steps"] = [{k: r.get(k) for k in ("step", "time/rollout", "time/logprobs", "time/update",
                                              "time/weight_sync", "rollout/logprob_mismatch", "train/accuracy")}
                       for r in rl]
    out["accuracy"] = {c: json.loads((run / "07_evaluate" / c / "metrics.json").read_text())["accuracy"]
                       for c in ("sft_warmup", "red")}
    out["warmup_val_accuracy"] = read_manifest(run / "04_sft_warmup")["metrics"].get("final_val_accuracy")
    return out


def summary(r: dict) -> str:
    lines = [f"env: {json.dumps(r['env'])}"]
    for dtype, c in r.get("chain", {}).items():
        rl = c.get("rl_steps", [])
        mism = [s["rollout/logprob_mismatch"] for s in rl if s.get("rollout/logprob_mismatch") is not None]
        lines += [f"chain {dtype}: {c.get('failed', 'completed')}; stages (s, peak GPU MiB): "
                  + ", ".join(f"{k[:2]} {v['seconds']} {v['peak_gpu_mb']}" for k, v in c["stages"].items()),
                  f"  SFT step {c.get('sft_step_s_median')} s; RL step rollout/update "
                  + ", ".join(f"{s['time/rollout']:.2f}/{s['time/update']:.2f}" for s in rl)
                  + f" s; logprob mismatch max {max(mism, default=float('nan')):.2e}; accuracy {c.get('accuracy')}"
                  + (f"; resume ok: {c['resume']['ok']}" if "resume" in c else "")]
    for name, s in r.get("seed_shape", {}).items():
        lines.append(f"seed shape {name}: {json.dumps(s)}")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "gpu_check")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--quick", action="store_true", help="tiny data, steps and shapes: the CPU dry run")
    ap.add_argument("--hide", default="", help="comma-separated packages to make unimportable, e.g. vllm,wandb,ray")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds; Gemma's shape is measured only within it")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="the chain's dtypes; 05 is killed in bfloat16's")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="seed shapes to measure, of: " + ", ".join(SHAPES))
    ap.add_argument("--shapes_first", action="store_true", help="measure the seed shapes before the chain")
    ap.add_argument("--sweep", default=None, help="micro-batch token budgets the seed shapes' update is also timed "
                                                  "at (default 8192,16384,32768; --quick: 128)")
    ap.add_argument("--limit", type=int, default=100, help="07: the first N test items (0 = all)")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE, added to every stage of the chain")
    ap.add_argument("--run_stage", help=argparse.SUPPRESS)  # internal: one stage script as a child process
    ap.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sweep is None:
        args.sweep = "128" if args.quick else "8192,16384,32768"
    hide(args.hide)
    if args.run_stage:
        sys.argv = [args.run_stage, *args.rest]
        runpy.run_path(str(ROOT / args.run_stage), run_name="__main__")
        return 0
    t0, args.out = time.time(), args.out.resolve()
    shutil.rmtree(args.out / "runs", ignore_errors=True)
    r: dict = {"argv": sys.argv[1:], "env": environment(), "chain": {}, "seed_shape": {}}
    save = lambda: (args.out / "gpu_check.json").write_text(json.dumps(r, indent=1))  # noqa: E731
    from utils.core.loader import load_run_config
    from utils.data.synthetic import write_dataset

    data = load_run_config("tiny-arith", "red", "synthetic_arith", QUICK_SETS if args.quick else []).data
    write_dataset(data, args.out / "data")
    parts = [("chain", d) for d in args.dtypes.split(",") if d] + [("shape", n) for n in args.shapes.split(",") if n]
    for kind, name in sorted(parts, key=lambda p: p[0] != "shape") if args.shapes_first else parts:
        if kind == "shape" and name != "qwen2.5-0.5b" and time.time() - t0 > args.budget:
            r["seed_shape"][name] = {"skipped": f"over the {args.budget:.0f} s budget"}
            continue
        try:
            if kind == "chain":
                r["chain"][name] = chain(args, name, args.out / "data", kill=name == "bfloat16")
            else:
                r["seed_shape"][name] = seed_shape(args, name, args.out)
        except Exception as exc:  # noqa: BLE001 - a part that breaks is recorded; the others still run
            r["chain" if kind == "chain" else "seed_shape"][name] = {"failed": f"{type(exc).__name__}: {exc}"[:2000],
                                                                     "stages": {}}
        save()
    q = r["seed_shape"].get("qwen2.5-0.5b", {})
    if "update_s" in q:
        ratio = param_count("gemma-2-2b") / param_count("qwen2.5-0.5b")
        r["gemma_estimate_from_qwen"] = {"param_ratio": round(ratio, 2), "basis": "Qwen's seconds x parameter ratio",
                                         **{k: round(q[k] * ratio, 2) for k in ("update_s", "sft_step_s")},
                                         "rollout_s": round(q["rollout"]["seconds"] * ratio, 1)}
    r["seconds"] = round(time.time() - t0, 1)
    save()
    (args.out / "gpu_check.txt").write_text(summary(r) + f"total {r['seconds']} s\n")
    print(summary(r) + f"total {r['seconds']} s")
    ok = all("failed" not in c and c.get("resume", {"ok": True})["ok"] for c in r["chain"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
