"""The GPU check: the seed's shapes and the embedded default's CUDA path, measured in one prepared run:

    timeout 450 python3 benchmarks/gpu_check.py --out /tmp/gc; cp /tmp/gc/gpu_check.* "$OUT"

On the GPU machine, from the repository root, with that machine's own python3 (it has torch,
transformers, peft, accelerate, safetensors, tokenizers, pyyaml, pandas, matplotlib, tqdm and
psutil; no vLLM, wandb or ray, and none is needed), as one device call of `timeout_s` 500: with the
machine's start, under 10 minutes of a 15-minute allowance, which leaves a rerun of what was cut
(`--shapes gemma-2-2b --sweep "" --no_rollout --dtypes ""`, say, under `timeout 200`).

Nothing has to travel beside the working tree: no wheels (the image's versions are used and
recorded), no weights (the seed-shaped models are randomly initialised, the chain's base model
ships in artifacts/tiny-arith and its data is generated). Write --out outside $OUT: the run folders
under it hold far more files than come back.

The most valuable figures come first, and <out>/gpu_check.json and <out>/gpu_check.txt are written
after every phase, so a timeout or a crash loses only the phase it cut (tests/test_gpu_check.py
kills a dry run in Gemma's SFT step and reads what survived). A phase that fails is named in its
section's `failed`, and the next phase runs; a phase that would start after --budget seconds is
listed in `skipped`. The phases, in order:

1. `env`: torch, CUDA, the GPU, transformers, peft, and which of vllm/wandb/ray import.
2. `seed_shape.<model>` (benchmarks/gpu_shapes.py `ShapeRun`), Qwen2.5-0.5B then Gemma-2-2B: the
   random model of the shape (dims in SHAPES; LoRA, token budgets and `model.memory` from
   configs/models/<name>.yaml), then one RL update at the seed's batch, 32 prompts x 2 samples of
   2 planner turns (256 tokens each) around one executor call (384): planner conversations of 732
   tokens and executor calls of 484, short of the seed's 3,072 prompt and 1,024 response tokens;
   through the trainer's own `_fixed_logprobs` and `_update` (an update that runs out of memory is
   halved until it fits, each size listed), with peak memory and updated tokens/s; then one 04 SFT
   step. Gemma-2 runs on eager attention (its softcap; utils/core/models.py).
3. `budget_sweep` of each shape: the update at each --sweep micro-batch budget; then `pass_cost`: a
   no-grad forward's fixed cost in tokens, fitted over 1-16 rows of 512 tokens (the trainer's
   length-chunking, utils/train/policy.py PASS_COST_TOKENS, uses the CPU's 256 on every device).
4. `rollout` of each shape: the three turns, each to its full budget, on the hf engine.
5. `chain.<dtype>`, for bfloat16 then float32: 00-03, a short 04 (200 steps, validated once), 05 red
   (5 steps) and 07 on the warmup and red (first --limit items), with model.device=<device> and the
   hf engine (trainer and engine in that dtype): each stage's seconds and peak GPU memory, the SFT
   and RL step times, each RL step's rollout/logprob_mismatch and the test accuracies. In bfloat16,
   05 runs as a process of its own, is SIGKILLed while it writes its third checkpoint
   (utils/core/faults.py), and is run again: it must resume from step 2 and log each step once.
Last, `gemma_estimate_from_qwen`: Gemma's seconds scaled from Qwen's by parameter count, for when
Gemma's own did not run (seconds only: memory does not scale so).

The CPU dry run of the same code (`--dry_run`: --device cpu --quick --hide vllm,wandb,ray; about a
minute here) runs in the suite (tests/test_gpu_check.py):

    .venv/bin/python benchmarks/gpu_check.py --dry_run --out /tmp/gpu_check
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

from gpu_shapes import SHAPES, ShapeRun, gpu_reset, param_count  # noqa: E402
from utils.core.faults import fault_point  # noqa: E402
from utils.core.io import read_jsonl  # noqa: E402
from utils.core.files import atomic_write_text
from utils.core.manifest import read_manifest  # noqa: E402
from utils.core.signals import TERMINATED_EXIT, Terminated, sigterm_as_interrupt, stop_word  # noqa: E402

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


def chain(args, dtype: str, data: Path, kill: bool, out: dict, save) -> None:
    """The embedded default's stages in `dtype` into `out`, a stage's record as soon as it completes
    (`save` after each); a stage that exits non-zero ends the chain (RuntimeError)."""
    run_id = f"gpu_check_{dtype}"
    run = args.out / "runs" / run_id
    steps = 3 if args.quick else 5
    # regime D: a check of the path, not of a study; the default's dynamic sampling would stop a
    # warmup this short on a step whose every group scores alike
    sets = ["regime=regime_d", f"outputs_dir={args.out / 'runs'}", f"data.path={data}", f"model.device={args.device}",
            "model.engine.name=hf", f"model.dtype={dtype}", f"model.engine.dtype={dtype}", "wandb_mode=disabled",
            "warmup.steps=200", "warmup.decay_start=0", "warmup.eval_every=0", "warmup.eval_size=50",
            f"algorithm.rl.steps={steps}", "algorithm.rl.save_freq=1", *(QUICK_SETS if args.quick else []), *args.set]
    argv = ["--run_id", run_id] + [a for s in sets for a in ("--set", s)]
    out["stages"] = {}
    for script in (*STAGES, RL_STAGE, "07_evaluate"):
        gpu_reset()
        t0 = time.time()
        if script == RL_STAGE and kill:
            out["resume"] = killed_and_resumed(run, argv, steps, args.hide)
            code = out["resume"]["resumed_returncode"]
        else:
            code = in_process(script, argv + (["--checkpoint", "sft_warmup,red", "--limit", str(args.limit)]
                                              if script == "07_evaluate" else []))
        if code in (130, TERMINATED_EXIT):  # the stage caught our SIGTERM or Ctrl-C: the whole check stops
            raise Terminated(f"{script} stopped by a signal (exit {code})")
        if code != 0:
            raise RuntimeError(f"{script} exited {code}")  # the chain ends here; main names it in `failed`
        stage = f"{RL_STAGE}/red" if script == RL_STAGE else "07_evaluate/red" if script == "07_evaluate" else script
        out["stages"][script] = _stage_record(run, stage, time.time() - t0)
        save()
    sft = [r["time/step"] for r in read_jsonl(run / "04_sft_warmup" / "logs" / "train.jsonl")][1:]  # the first warms up
    rl = read_jsonl(run / RL_STAGE / "red" / "metrics.jsonl")
    out["sft_step_s_median"] = round(statistics.median(sft), 5)
    out["rl_steps"] = [{k: r.get(k) for k in ("step", "time/rollout", "time/logprobs", "time/update",
                                              "time/weight_sync", "rollout/logprob_mismatch", "train/accuracy")}
                       for r in rl]
    out["accuracy"] = {c: json.loads((run / "07_evaluate" / c / "metrics.json").read_text())["accuracy"]
                       for c in ("sft_warmup", "red")}
    out["warmup_val_accuracy"] = read_manifest(run / "04_sft_warmup")["metrics"].get("final_val_accuracy")


def summary(r: dict) -> str:
    """The text summary of whatever `r` holds so far (every section may be partial)."""
    lines = [f"env: {json.dumps(r['env'])}"]
    for name, s in r.get("seed_shape", {}).items():
        lines.append(f"seed shape {name}: {json.dumps(s)}")
    if "gemma_estimate_from_qwen" in r:
        lines.append(f"gemma estimate from qwen: {json.dumps(r['gemma_estimate_from_qwen'])}")
    for dtype, c in r.get("chain", {}).items():
        rl = c.get("rl_steps", [])
        mism = [s["rollout/logprob_mismatch"] for s in rl if s.get("rollout/logprob_mismatch") is not None]
        state = "; ".join(c["failed"]) if "failed" in c else "completed" if "accuracy" in c else "cut"
        lines += [f"chain {dtype}: {state}; stages (s, peak GPU MiB): "
                  + ", ".join(f"{k[:2]} {v['seconds']} {v['peak_gpu_mb']}" for k, v in c.get("stages", {}).items()),
                  f"  SFT step {c.get('sft_step_s_median')} s; RL step rollout/update "
                  + ", ".join(f"{s['time/rollout']:.2f}/{s['time/update']:.2f}" for s in rl)
                  + f" s; logprob mismatch max {max(mism, default=float('nan')):.2e}; accuracy {c.get('accuracy')}"
                  + (f"; resume ok: {c['resume']['ok']}" if "resume" in c else "")]
    if r.get("skipped"):
        lines.append(f"skipped (over the budget): {', '.join(r['skipped'])}")
    if r.get("stopped"):
        lines.append(f"stopped: {r['stopped']}")
    return "\n".join(lines) + f"\nseconds so far {r.get('seconds')}\n"


def gemma_estimate(r: dict) -> dict | None:
    """Gemma's seconds scaled from Qwen's by parameter count, for each figure Qwen's shape has."""
    q = r["seed_shape"].get("qwen2.5-0.5b", {})
    have = {k: q[k] for k in ("update_s", "sft_step_s") if k in q}
    if "rollout" in q:
        have["rollout_s"] = q["rollout"]["seconds"]
    if not have:
        return None
    ratio = param_count("gemma-2-2b") / param_count("qwen2.5-0.5b")
    return {"param_ratio": round(ratio, 2), "basis": "Qwen's seconds x parameter ratio",
            **{k: round(v * ratio, 2) for k, v in have.items()}}


def plan(args, r: dict, data: Path, save) -> list[tuple[dict, str, object]]:
    """The phases in order, as (the section their figures go to, name, callable)."""
    shapes = [ShapeRun(args, n, args.out, r["seed_shape"].setdefault(n, {})) for n in args.shapes.split(",") if n]
    budgets = [int(b) for b in args.sweep.split(",") if b]
    phases = []
    for s in shapes:
        phases += [(s.out, f"{s.name}/build", s.build), (s.out, f"{s.name}/update", s.update),
                   (s.out, f"{s.name}/sft_step", s.sft_step), (s.out, f"{s.name}/release", s.release)]
    for s in shapes:
        phases += [(s.out, f"{s.name}/budget_sweep", lambda s=s: s.sweep(budgets))] if budgets else []
        phases += [(s.out, f"{s.name}/pass_cost", s.pass_cost), (s.out, f"{s.name}/release", s.release)]
    for s in shapes:
        phases += [(s.out, f"{s.name}/rollout", s.rollout)] if args.rollout else []
        phases.append((s.out, f"{s.name}/remove", s.remove))
    for d in (d for d in args.dtypes.split(",") if d):
        out: dict = {}  # in r["chain"] once the phase starts
        phases.append((out, f"chain/{d}", lambda d=d, out=out: chain(args, d, data, d == "bfloat16",
                                                                     r["chain"].setdefault(d, out), save)))
    return phases


def run_phases(args, r: dict, save, t0: float) -> int | None:
    """Every phase of `plan` in order, `save` after each; None, or the exit code of a check stopped by
    SIGTERM (143) or Ctrl-C (130), which `r["stopped"]` names with the phase it cut."""
    broken: set[int] = set()  # sections whose build failed: the rest of that shape is not run
    name = "start"
    try:
        with sigterm_as_interrupt():  # `timeout`'s SIGTERM stops the check, in a stage or between them
            for section, name, fn in plan(args, r, args.out / "data", save):
                if id(section) in broken and not name.endswith(("/release", "/remove")):
                    continue
                if time.time() - t0 > args.budget and not name.endswith(("/release", "/remove")):
                    r["skipped"].append(name)
                    continue
                fault_point(f"gpu_check:{name}")  # the rehearsal's kill (tests/test_gpu_check.py)
                try:
                    fn()
                except Exception as exc:  # noqa: BLE001 - a phase that breaks is recorded; the others still run
                    section.setdefault("failed", []).append(f"{name}: {type(exc).__name__}: {exc}"[:2000])
                    if name.endswith("/build"):
                        broken.add(id(section))
                if (estimate := gemma_estimate(r)) is not None:
                    r["gemma_estimate_from_qwen"] = estimate
                save()
    except KeyboardInterrupt as exc:
        r["stopped"] = f"{stop_word(exc)} in {name}"
        save()
        print(summary(r))
        return TERMINATED_EXIT if isinstance(exc, Terminated) else 130
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "gpu_check")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--quick", action="store_true", help="tiny data, steps and shapes")
    ap.add_argument("--dry_run", action="store_true", help="the CPU rehearsal: --device cpu --quick --hide vllm,wandb,ray")
    ap.add_argument("--hide", default="", help="comma-separated packages to make unimportable, e.g. vllm,wandb,ray")
    ap.add_argument("--budget", type=float, default=400.0, help="seconds; a phase that would start later is skipped")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="seed shapes to measure, of: " + ", ".join(SHAPES))
    ap.add_argument("--sweep", default=None, help="micro-batch token budgets the seed shapes' update is also timed "
                                                  "at (default 8192,16384,32768; --quick: 128; \"\": none)")
    ap.add_argument("--no_rollout", dest="rollout", action="store_false", help="leave out the shapes' rollouts")
    ap.add_argument("--dtypes", default="bfloat16,float32", help="the chain's dtypes (\"\": none); 05 is killed in "
                                                                  "bfloat16's")
    ap.add_argument("--limit", type=int, default=100, help="07: the first N test items (0 = all)")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE, added to every stage of the chain")
    ap.add_argument("--run_stage", help=argparse.SUPPRESS)  # internal: one stage script as a child process
    ap.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.dry_run:
        args.device, args.quick, args.hide = "cpu", True, args.hide or "vllm,wandb,ray"
    if args.sweep is None:
        args.sweep = "128" if args.quick else "8192,16384,32768"
    hide(args.hide)
    if args.run_stage:
        sys.argv = [args.run_stage, *args.rest]
        runpy.run_path(str(ROOT / args.run_stage), run_name="__main__")
        return 0
    t0, args.out = time.time(), args.out.resolve()
    shutil.rmtree(args.out / "runs", ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    r: dict = {"argv": sys.argv[1:], "env": environment(), "seed_shape": {}, "chain": {}, "skipped": []}

    def save() -> None:  # both files, each replaced whole (utils/core/files.py), after every phase
        r["seconds"] = round(time.time() - t0, 1)
        atomic_write_text(args.out / "gpu_check.json", json.dumps(r, indent=1))
        atomic_write_text(args.out / "gpu_check.txt", summary(r))

    from utils.core.loader import load_run_config
    from utils.data.synthetic import write_dataset

    data = load_run_config("tiny-arith", "red", "synthetic_arith", QUICK_SETS if args.quick else []).data
    write_dataset(data, args.out / "data")
    save()
    stopped = run_phases(args, r, save, t0)
    if stopped is not None:
        return stopped
    save()
    print(summary(r))
    failed = [c for c in (*r["seed_shape"].values(), *r["chain"].values()) if "failed" in c]
    ok = not failed and all(c.get("resume", {"ok": True})["ok"] for c in r["chain"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
