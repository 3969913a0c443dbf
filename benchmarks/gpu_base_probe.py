"""The base probe: does a base pretrained on longer sequences remove the 5-6-subtask cliff? (issue 47)

The fair test that docs/journal/2026-11-27-longer-context-base.md asked for and two cores could not
afford: bases built by the committed recipe with only the named fields changed, each then given
regime D's SFT warmup (stages 00-04) and 07's greedy test evaluation, per seed. One process per
build and per (base, seed) chain, run side by side; the committed base's chains start at once.

    base        recipe overrides                        what it separates
    committed   (the artifact in artifacts/tiny-arith)  the reference, built on a CPU
    rebuilt96   none: the committed recipe, rebuilt     how far a rebuild on this device moves
    long384     seq_len 384 (64 sequences a step)       longer pretraining sequences
    long384r6   seq_len 384, reduction_max_ops 6        and chain reductions as long as the task's

On the GPU machine, from the repository root, with its own python3 (torch, transformers, peft;
vLLM is not needed: model.engine.name=hf), with a limit that leaves room for a rerun:

    timeout 560 python3 benchmarks/gpu_base_probe.py --out /tmp/bp; cp /tmp/bp/probe.* /tmp/bp/bases.tar.gz "$OUT"

Here, the CPU dry run of the same paths at toy sizes (a minute or two):

    .venv/bin/python benchmarks/gpu_base_probe.py --device cpu --quick --out /tmp/bp

It writes <out>/probe.json after every build and chain, <out>/probe.txt at the end (per chain: 04's
best val accuracy and 07's test greedy accuracy with its CI and by gold subtask count), each
process's log under <out>/logs, and <out>/bases.tar.gz with the built bases (weights, tokenizer,
manifest), so a CPU run can use them with --set model.path=DIR.

The second use (issue 47, the candidate base on the default): --regime imperfect_teacher --methods
grpo,red runs each method's trainer after 04 (side by side within a chain) and 07 on sft_warmup and
every method, and packs every run without its weights, checkpoints and episodes into
<out>/runs.tar.gz, so 08 can compare them here (`08_compare_runs.py --runs DIR`). `r6` is the
committed candidate artifacts/tiny-arith-r6 (no build). --keep keeps <out>/runs and skips every stage
whose manifest is there, so a second call on the same machine goes on where the first stopped (an
interrupted trainer resumes from its last checkpoint):

    timeout 580 python3 benchmarks/gpu_base_probe.py --out /tmp/bs --bases committed,r6 --seeds 1,2,3 \
        --regime imperfect_teacher --methods grpo,red --budget 540; cp /tmp/bs/probe.* /tmp/bs/runs.tar.gz "$OUT"
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from utils.core.lock import RunLock  # noqa: E402  (after the path: run from anywhere)

# A string is a committed artifact (no build); a dict, the committed recipe's fields to change for a build.
BASES = {"committed": "artifacts/tiny-arith", "r6": "artifacts/tiny-arith-r6", "rebuilt96": {},
         "long384": {"seq_len": 384}, "long384r6": {"seq_len": 384, "reduction_max_ops": 6}}
STAGES = ("00_check_data", "01_prepare_dataset", "02_build_rewards", "03_generate_sft_traces", "04_sft_warmup")
QUICK_SETS = ["data.n_train=40", "data.n_val=6", "data.n_test=6", "warmup.steps=6", "warmup.eval_every=0",
              "warmup.eval_size=3", "warmup.batch_size=8", "algorithm.rl.steps=2",
              "algorithm.rl.questions_per_step=4", "algorithm.rl.dynamic_sampling=0", "eval.samples=2"]
TEST_KEYS = ("accuracy", "accuracy_ci95", "mean@4", "mean@2", "mean_at_k_ci95", "pass@4", "pass@2",
             "accuracy_by_gold_subtasks", "format")
QUICK_BUILD = ["--steps", "4", "--set", "eval_size=8", "--set", "batch_size=8"]


def run_logged(cmd: list[str], log: Path, timeout: float) -> int:
    # The probe holds each run's lock (a chain's stages run side by side); its stages get through.
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONUNBUFFERED": "1", "REDCODA_LOCK_HOLDER": str(os.getpid())}
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        try:
            return subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            f.write(f"timed out after {timeout:.0f} s\n")
            return 124


class Probe:
    def __init__(self, args):
        self.args, self.lock, self.t0 = args, threading.Lock(), time.time()
        self.result: dict = {"argv": sys.argv[1:], "device": args.device, "builds": {}, "chains": {}}
        (args.out / "logs").mkdir(parents=True, exist_ok=True)

    def save(self, **update) -> None:
        """Merge `update` into the result (a key per build or chain) and write it, atomically."""
        with self.lock:
            for part, entries in update.items():
                self.result[part].update(entries)
            self.result["seconds"] = round(time.time() - self.t0, 1)
            tmp = self.args.out / "probe.json.partial"
            tmp.write_text(json.dumps(self.result, indent=1))
            tmp.replace(self.args.out / "probe.json")

    def left(self) -> float:
        return self.args.budget - (time.time() - self.t0)

    def build(self, name: str) -> Path | None:
        """The base's directory, built here unless it is the committed one; None if the build failed."""
        overrides = BASES[name]
        if isinstance(overrides, str):
            return ROOT / overrides
        out, t0 = self.args.out / "bases" / name, time.time()
        if self.args.reuse and (out / "manifest.json").is_file():  # an earlier call's build, on this machine
            m = json.loads((out / "manifest.json").read_text())
            self.save(builds={name: {"returncode": 0, "seconds": 0.0, "overrides": overrides, "reused": True,
                                     **m["metrics"], "wall_seconds": m["wall_seconds"]}})
            return out
        sets = [a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]
        cmd = [sys.executable, "-m", "utils.tinyarith.build", "--out", str(out), "--device", self.args.device,
               *sets, *(QUICK_BUILD if self.args.quick else [])]
        code = run_logged(cmd, self.args.out / "logs" / f"build_{name}.log", max(self.left(), 1))
        record: dict = {"returncode": code, "seconds": round(time.time() - t0, 1), "overrides": overrides}
        if code == 0:
            m = json.loads((out / "manifest.json").read_text())
            record.update(m["metrics"], wall_seconds=m["wall_seconds"], history=m["history"])
        self.save(builds={name: record})
        return out if code == 0 else None

    def stage(self, record: dict, run_id: str, label: str, script: str, argv: list[str], done: Path) -> bool:
        """Run one stage process unless `done` (its manifest) is there from an earlier call under --keep;
        False (and the reason in `record`) if the budget is spent or it fails."""
        if self.args.keep and done.is_file():
            record["stages"][label] = "kept"
            return True
        if self.left() <= 0:
            record["failed"] = f"budget spent before {label}"
            return False
        t0 = time.time()
        code = run_logged([sys.executable, f"{script}.py", *argv], self.args.out / "logs" / f"{run_id}.log", self.left())
        with self.lock:
            record["stages"][label] = round(time.time() - t0, 1)
        if code != 0:
            record["failed"] = f"{label} exited {code}"
        return code == 0

    def chain(self, name: str, base: Path, seed: int) -> None:
        run_id = f"{name}_s{seed}"
        regime = [] if self.args.regime == "default" else [f"regime={self.args.regime}"]
        sets = [*regime, f"seed={seed}", f"model.path={base}", f"outputs_dir={self.args.out / 'runs'}",
                f"data.path={self.args.out / 'data'}", f"model.device={self.args.device}", "model.engine.name=hf",
                "wandb_mode=disabled", *(QUICK_SETS if self.args.quick else []), *self.args.set]
        argv = ["--run_id", run_id] + [a for s in sets for a in ("--set", s)]
        run = self.args.out / "runs" / run_id
        record: dict = {"base": name, "seed": seed, "stages": {}}
        with RunLock(run):
            for stage in STAGES:
                ok = self.stage(record, run_id, stage, stage, argv, run / stage / "manifest.json")
                self.save(chains={run_id: dict(record, stages=dict(record["stages"]))})
                if not ok:
                    break
            else:
                self.arms(record, run_id, argv, run)
        self.save(chains={run_id: record})

    def arms(self, record: dict, run_id: str, argv: list[str], run: Path) -> None:
        """07 on the warmup beside each method's trainer, then 07 on each method: side by side."""
        from utils.core.methods import METHODS

        def evaluate(checkpoint: str) -> None:
            if self.stage(record, run_id, f"07 {checkpoint}", "07_evaluate", [*argv, "--checkpoint", checkpoint],
                          run / "07_evaluate" / checkpoint / "manifest.json"):
                test = json.loads((run / "07_evaluate" / checkpoint / "metrics.json").read_text())
                with self.lock:
                    record.setdefault("test", {})[checkpoint] = {k: test.get(k) for k in TEST_KEYS}

        def train_then_evaluate(method: str) -> None:
            trainer = METHODS[method].trainer
            if self.stage(record, run_id, f"{trainer[:2]} {method}", trainer, [*argv, "--algorithm", method],
                          run / trainer / method / "manifest.json"):
                evaluate(method)

        with ThreadPoolExecutor(max_workers=1 + len(self.args.methods)) as pool:
            jobs = [pool.submit(evaluate, "sft_warmup")] + [pool.submit(train_then_evaluate, m) for m in self.args.methods]
            for job in jobs:
                job.result()
        warm = json.loads((run / "04_sft_warmup" / "manifest.json").read_text())["metrics"]
        record.update(best_val=warm.get("best_val_accuracy"), best_step=warm.get("best_step"))

    def base_and_chains(self, pool: ThreadPoolExecutor, name: str) -> list:
        base = self.build(name)
        if base is None:
            return []
        return [pool.submit(self.chain, name, base, s) for s in self.args.seeds]


def summary(r: dict) -> str:
    lines = [f"device {r['device']}; {r.get('seconds')} s; env {json.dumps(r.get('env', {}))}"]
    for name, b in r["builds"].items():
        lines.append(f"build {name} {b.get('overrides')}: rc {b['returncode']}, {b['seconds']} s, held-out "
                     f"{b.get('heldout_acc')}, task-chain reductions {b.get('task_chain_reduction_acc')}")
    for run_id, c in sorted(r["chains"].items()):
        lines.append(f"{run_id}: {c.get('failed', 'completed')}; best val {c.get('best_val')} (step "
                     f"{c.get('best_step')}); stage seconds {c['stages']}")
        for checkpoint, t in (c.get("test") or {}).items():
            by = "/".join(f"{v:.2f}" for _, v in sorted((t.get("accuracy_by_gold_subtasks") or {}).items(),
                                                       key=lambda kv: int(kv[0])))
            k = next((key for key in ("mean@4", "mean@2") if t.get(key) is not None), None)
            lines.append(f"  {checkpoint}: greedy {t['accuracy']} {t['accuracy_ci95']}"
                         + (f", {k} {t[k]} {t['mean_at_k_ci95']}, pass@{k[-1]} {t.get('pass@' + k[-1])}" if k else "")
                         + f", greedy by gold subtasks {by}, format {t['format']}")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "base_probe")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--quick", action="store_true", help="toy builds and chains: the CPU dry run")
    ap.add_argument("--bases", default=",".join(BASES), help="of: " + ", ".join(BASES))
    ap.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    ap.add_argument("--budget", type=float, default=520.0, help="seconds; no stage starts after it")
    ap.add_argument("--reuse", action="store_true", help="use bases an earlier run built under --out")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE, added to every stage of every chain")
    ap.add_argument("--regime", default="regime_d", help="configs/regimes/<name>, or default (the data tier's)")
    ap.add_argument("--methods", type=lambda s: [m for m in s.split(",") if m], default=[],
                    help="comma-separated methods trained after 04 (07 then evaluates sft_warmup and each)")
    ap.add_argument("--keep", action="store_true", help="keep <out>/runs and skip every stage already done there")
    args = ap.parse_args()
    args.out = args.out.resolve()
    from utils.core.methods import METHODS
    unknown = [b for b in args.bases.split(",") if b not in BASES] + [m for m in args.methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"--bases/--methods: unknown {unknown}; bases: {', '.join(BASES)}; methods: {', '.join(METHODS)}")
    if not args.keep:
        shutil.rmtree(args.out / "runs", ignore_errors=True)
    import torch
    import transformers

    from utils.core.loader import load_run_config
    from utils.data.synthetic import write_dataset

    probe = Probe(args)
    probe.result["env"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    regime = [] if args.regime == "default" else [f"regime={args.regime}"]
    data = load_run_config("tiny-arith", "red", "synthetic_arith", regime + (QUICK_SETS if args.quick else [])).data
    write_dataset(data, args.out / "data")
    names = args.bases.split(",")
    with ThreadPoolExecutor(max_workers=len(names) * (1 + len(args.seeds))) as pool:
        chains = [f for fut in [pool.submit(probe.base_and_chains, pool, n) for n in names] for f in fut.result()]
        for f in chains:
            f.result()
    probe.save()
    built = [p for p in (args.out / "bases").glob("*") if (p / "manifest.json").is_file()] if (args.out / "bases").is_dir() else []
    with tarfile.open(args.out / "bases.tar.gz", "w:gz") as tar:
        for p in built:
            tar.add(p, arcname=p.name)
    if (args.out / "runs").is_dir():  # everything 08 reads, without weights, checkpoints and episodes
        heavy = {"ckpt", "ckpt_sft", "episodes", "final_adapter", "policy", "wandb"}
        with tarfile.open(args.out / "runs.tar.gz", "w:gz") as tar:
            tar.add(args.out / "runs", arcname="runs", filter=lambda t: None if Path(t.name).name in heavy
                    or t.name.endswith((".safetensors", ".pt", ".bin")) else t)
    (args.out / "probe.txt").write_text(summary(probe.result))
    print(summary(probe.result))
    ok = all("failed" not in c for c in probe.result["chains"].values()) and \
        all(b["returncode"] == 0 for b in probe.result["builds"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
