"""Where a real model's memory goes in 04 and in an RL step, one lever at a time:

    .venv/bin/python benchmarks/real_memory.py [--run real_smollm2] [--levers today,checkpointing,...]
                                               [--stage rl|sft|both] [--steps 2]

For each lever (LEVERS: a list of `--set` overrides, or an environment variable) a process of its
own runs the real stage's own `main` on a copy of the run's parents (00-03, and 04 for the RL
stage, copied under outputs/memory_probe_<lever>_<stage>/ and removed after): 04 for `--steps` optimizer steps
with a validation after each (so from step 2 on a step runs beside the resident engine), or 06 (grpo) for `--steps` RL steps from the run's warmup adapter. A thread
samples the process's resident memory (VmRSS) and glibc's heap (mallinfo2: bytes in use, bytes
held) every 20 ms, each sample tagged with the phase running then (the trainer's methods are
wrapped at class level; they still run unchanged):

    load          the base model and its LoRA (load_policy)
    engine        the rollout/validation engine's start (make_engine: vLLM in-process, its KV cache)
    rollout       sampling the step's episodes (DynamicSampler.sample)
    update        the RL or SFT optimizer step (forward, head, backward, AdamW)
    validate      04's greedy validation on val
    sync          the adapter handed to the engine (a merged-weights reload)

Per lever it prints, for each phase, the resident MiB when it first began and its peak, the seconds
of each update call (what the levers cost in time), the stage's own peak (its manifest's
peak_rss_mb, getrusage), and at the update's peak glibc's heap: held against in use (what the heap
keeps that nothing uses). The last line is exactly

    sft_peak_mib=<04's peak, first lever> rl_peak_mib=<the RL stage's peak, first lever>

Above it, whether every lever's first RL step sampled the same tokens (a digest of them) and how far
its update's statistics (losses, entropy, gradient norm) are from the first lever's: the levers
must change no number beyond fp32 rounding. docs/PERFORMANCE.md ("Where a real model's memory goes")
quotes it. Not a test; it trains nothing
it keeps.
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LEVERS = {  # each the model config's memory settings (configs/models/<name>.yaml) with one taken back
    "default": [],
    "no_checkpointing": ["model.memory.activation_checkpointing=false"],
    "micro_4096": ["model.memory.micro_batch_tokens=4096"],
    "kv_2.0": ["model.engine.kv_cache_gb=2.0"],
    "no_trim": ["env:REAL_MEMORY_NO_TRIM=1"],
    "head_128": ["model.memory.logits_chunk_mib=128"],
    "all_back": ["model.memory.activation_checkpointing=false", "model.memory.micro_batch_tokens=4096",
                 "model.engine.kv_cache_gb=2.0", "env:REAL_MEMORY_NO_TRIM=1"],
}
STAGE_FOLDERS = {"sft": ["00_check_data", "01_prepare_dataset", "02_build_rewards", "03_generate_sft_traces"],
                 "rl": ["00_check_data", "01_prepare_dataset", "02_build_rewards", "03_generate_sft_traces",
                        "04_sft_warmup"]}


class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


class Sampler(threading.Thread):
    """Resident memory and glibc's heap every 20 ms, the peak of each phase."""

    def __init__(self):
        super().__init__(daemon=True)
        self.phase, self.peaks, self.heap_at_peak, self.entry = "start", {}, {}, {}
        self.call, self.calls = None, []  # the innermost running call; every call: [phase, entry, peak, exit MiB, s]
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = Mallinfo2
        self.libc = libc

    def rss_mib(self) -> float:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def run(self):
        while True:
            rss, phase, call = self.rss_mib(), self.phase, self.call
            if call is not None:
                call[2] = max(call[2], round(rss))
            if rss > self.peaks.get(phase, 0.0):
                self.peaks[phase] = rss
                m = self.libc.mallinfo2()
                held = (m.arena + m.hblkhd) / 2 ** 20
                self.heap_at_peak[phase] = (round(held), round((m.uordblks + m.hblkhd) / 2 ** 20))
            time.sleep(0.02)

    def wrap(self, owner, name: str, phase: str) -> None:
        fn = getattr(owner, name)
        sampler = self

        def tagged(*args, **kwargs):
            before, outer, sampler.phase = sampler.phase, sampler.call, phase
            rss = round(sampler.rss_mib())
            sampler.entry.setdefault(phase, rss)
            sampler.call = [phase, rss, rss, rss, time.perf_counter()]
            sampler.calls.append(sampler.call)
            try:
                return fn(*args, **kwargs)
            finally:
                sampler.call[3] = round(sampler.rss_mib())
                sampler.call[4] = round(time.perf_counter() - sampler.call[4], 2)
                if outer is not None:
                    outer[2] = max(outer[2], sampler.call[2])
                sampler.phase, sampler.call = before, outer

        setattr(owner, name, tagged)


def _load_main(script: str):
    spec = importlib.util.spec_from_file_location(script.replace(".py", ""), ROOT / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one(args) -> None:
    """In this process: the stage's main under the sampler, then one RESULT line."""
    if os.environ.get("REAL_MEMORY_NO_TRIM"):  # before anything binds the name
        import utils.core.heap as heap

        heap.release_freed_memory = lambda: False
    import utils.agent.engines as engines
    import utils.train.grpo_trainer as grpo
    import utils.train.rl_stage as rl_stage
    import utils.train.sampler as sampler_mod
    import utils.train.sft_trainer as sft

    s = Sampler()
    s.start()
    for owner, name, phase in ((engines, "make_engine", "engine"), (rl_stage, "load_policy", "load"),
                               (sampler_mod.DynamicSampler, "sample", "rollout"),
                               (grpo.GrpoTrainer, "_fixed_logprobs", "update"), (grpo.GrpoTrainer, "_update", "update"),
                               (grpo.GrpoTrainer, "sync_policy", "sync"), (sft.SftLoop, "_update", "update"),
                               (sft.SftLoop, "_evaluate", "validate")):
        s.wrap(owner, name, phase)
    seen: dict = {}
    _record_first(sampler_mod.DynamicSampler, "sample", seen, "rollout_sha", _episodes_sha)
    _record_first(grpo.GrpoTrainer, "_update", seen, "update", lambda out: {k: v for k, v in out[0].items()
                                                                            if k.startswith("actor/")})
    sets = [x for x in LEVERS[args.lever] if not x.startswith("env:")]
    common = ["--model", args.model, "--data", args.data, "--run_id", args.run_id, "--seed", str(args.seed)]
    if args.stage == "sft":
        _sft_main(common, sets, args, s)
    else:
        _rl_main(common, sets, args, s)
    manifest = _manifest(args)
    time.sleep(0.1)
    print("RESULT " + json.dumps({**seen, "peaks": {k: round(v) for k, v in s.peaks.items()}, "entry": s.entry, "calls": s.calls,
                                  "heap": s.heap_at_peak,
                                  "stage_peak": manifest.get("peak_rss_mb"),
                                  "seconds": manifest.get("wall_seconds")}), flush=True)


def _episodes_sha(batch) -> str:
    """A digest of every token the first RL step sampled, to compare levers' rollouts."""
    ids = [[list(s.gen_ids) for s in e.segments] for e in batch.episodes]
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]


def _record_first(owner, name: str, seen: dict, key: str, what) -> None:
    """Keep `what(result)` of the first call of owner.name under seen[key]; the call runs unchanged."""
    fn = getattr(owner, name)

    def recorded(*args, **kwargs):
        out = fn(*args, **kwargs)
        seen.setdefault(key, what(out))
        return out

    setattr(owner, name, recorded)


def _sft_main(common, sets, args, s) -> None:
    import utils.eval.evaluation as evaluation

    s.wrap(evaluation, "make_engine", "engine") if hasattr(evaluation, "make_engine") else None
    main = _load_main("04_sft_warmup.py").main
    main(common + [f"--set={x}" for x in sets + [f"warmup.steps={args.steps}", "warmup.eval_every=1",
                                                  f"warmup.save_every={args.steps}", "warmup.decay_start=0",
                                                  "warmup.warmup_steps=0"]])


def _rl_main(common, sets, args, s) -> None:
    from utils.train.rl_stage import run_rl_stage

    run_rl_stage("06_ablate_grpo_only", "memory probe", common + ["--algorithm", "grpo"]
                 + [f"--set={x}" for x in sets + [f"algorithm.rl.steps={args.steps}", "algorithm.rl.save_freq=100"]],
                 "grpo")


def _manifest(args) -> dict:
    folder = "04_sft_warmup" if args.stage == "sft" else "06_ablate_grpo_only/grpo"
    path = ROOT / "outputs" / args.run_id / folder / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def probe(args, lever: str, stage: str) -> dict:
    """One lever, one stage, in a process of its own on a copy of the run's parents."""
    source = ROOT / "outputs" / args.run
    run_id = f"memory_probe_{lever}_{stage}"
    work = ROOT / "outputs" / run_id
    shutil.rmtree(work, ignore_errors=True)
    for name in STAGE_FOLDERS[stage]:
        if not (source / name / "manifest.json").is_file():
            raise SystemExit(f"real_memory: {source / name} has no manifest: run the real-model command first "
                             "(README, 'Real models')")
        shutil.copytree(source / name, work / name, symlinks=True)
    env = dict(os.environ)
    env.update(x[4:].split("=", 1) for x in LEVERS[lever] if x.startswith("env:"))
    cmd = [sys.executable, __file__, "--one", "--lever", lever, "--stage", stage, "--run_id", run_id,
           "--steps", str(args.steps), "--model", args.model, "--data", args.data, "--seed", str(args.seed)]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        raise SystemExit(f"real_memory: {lever} on {stage} failed (exit {proc.returncode})")
    return json.loads(lines[-1][7:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="real_smollm2", help="a run under outputs/ that has finished 04")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--data", default="gsm_symbolic")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--levers", default=",".join(LEVERS))
    ap.add_argument("--stage", default="both", choices=("rl", "sft", "both"))
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--calls", action="store_true", help="also print every wrapped call's entry, peak and exit")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--lever", help=argparse.SUPPRESS)
    ap.add_argument("--run_id", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        one(args)
        return 0
    levers = args.levers.split(",")
    unknown = [x for x in levers if x not in LEVERS]
    if unknown:
        raise SystemExit(f"real_memory: unknown lever(s) {unknown}; valid: {', '.join(LEVERS)}")
    stages = ("sft", "rl") if args.stage == "both" else (args.stage,)
    first: dict[str, float] = {}
    results = []
    for stage in stages:
        for lever in levers:
            r = probe(args, lever, stage)
            results.append(r)
            first.setdefault(stage, r["stage_peak"])
            phases = ", ".join(f"{k} {r['entry'].get(k, 0)}->{v}" for k, v in r["peaks"].items() if k != "start")
            held, used = r["heap"].get("update", (0, 0))
            print(f"{stage:>3} {lever:<14} peak {r['stage_peak']:>8.0f} MiB in {r['seconds']:.0f} s; phases (MiB): "
                  f"{phases}; heap at the update's peak: held {held}, in use {used}", flush=True)
            updates = [c[4] for c in r["calls"] if c[0] == "update"]
            print(f"    update seconds, each call: {' '.join(f'{x:.1f}' for x in updates)}")
            if args.calls:
                print("    calls (entry/peak/exit MiB, s): " + "; ".join(f"{p} {a}/{b}/{c} {t:.1f}"
                                                                      for p, a, b, c, t in r["calls"]))
    rl = [r for r in results if "rollout_sha" in r]
    if rl:
        same = len({r["rollout_sha"] for r in rl}) == 1
        ref = rl[0]["update"]
        worst = max(abs(r["update"][k] - v) / max(abs(v), 1e-12) for r in rl for k, v in ref.items()
                    if k in r["update"] and v)
        print(f"the first RL step under every lever: rollouts {'identical' if same else 'DIFFERENT'}; "
              f"update statistics within a relative {worst:.1e} of the first lever's")
    print(f"sft_peak_mib={first.get('sft', float('nan')):.0f} rl_peak_mib={first.get('rl', float('nan')):.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
