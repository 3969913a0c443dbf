"""Random SIGKILLs of the driver's whole process group, then resume, until a run finishes; its results
against an uninterrupted run's:

    .venv/bin/python benchmarks/chaos_soak.py [--model smollm2-135m-instruct] [--kills 24]
                                              [--delay 15,90] [--per_stage N] [--executor ray] [--seed 0]
                                              [--set KEY=VALUE ...]

Both runs are the same small `--method red,grpo` run (`SMALL`: a few SFT and RL steps, a checkpoint at
every step, on 40/8/8 word problems written for it under outputs/soak_data; `--model tiny-arith` takes the embedded
data instead). The reference runs once, untouched (`outputs/soak_ref`, reused when it is complete).
The soak (`outputs/soak_kill`, removed first) starts `09_driver.py` in a session of its own, waits a
random delay, notes which stages' manifests say "running" since that start (the stage a kill lands
in: a kill before any stage has started is `start`), and SIGKILLs the session. Stages a Ray worker started live
outside that session; each must notice that its driver is gone and stop (utils/core/signals.py
`stop_with`), so the next start waits until the run's lock is free, and the seconds it waited are
the orphans' lifetime. After `--kills` kills the driver runs to the end.

`--per_stage N` aims the kills instead, so that they land in every stage, the second-long data
stages and 08 included: each start watches the manifests (every 20 ms), and when a stage that has
had fewer than N kills is seen running, kills the session at a uniform fraction (0.1 to 0.9) of the
seconds that stage took in the reference (its `run_manifest.json`), capped at `--delay`'s HI. A
stage can finish before its kill is due, so the counts printed are where the kills landed, not
where they were aimed; a stage already complete is never run again, so it gets no later kill.
The soak stops aiming once every stage has had N kills or can have no more.

Compared (`compare`): every final adapter byte for byte, every trainer's metrics.jsonl and 04's log
but their time/ columns, 07's metrics.json and predictions (transcripts included), and 08's
summary.csv (its rows name their run: the two names are swapped first). The last lines are the
kills per stage, the longest an orphan held the lock, and

    soak kills=<n> orphan_wait_max_s=<s> differing=<n files> result=<equal|DIFFERENT>

Exit status 0 when equal. Not a test: a run of several minutes per kill on a real model.

Last run, 2026-12-07, the 2-core AVX2 box (AMD EPYC family 25 model 1), `--model tiny-arith --kills 8
--delay 8,45 --set warmup.steps=150 --set warmup.eval_every=50 --set warmup.save_every=25` (the
arms' test accuracy 0.07–0.09, so the predictions compared are not all wrong alike): reference
204 s, soak 339 s; kills in 04 ×2, in both RL arms at once ×3, in 07 ×2, before any stage ×1; no
orphan held a lock after a kill; every compared file equal. Aimed, 2026-12-08, same box and
settings with `--per_stage 1` instead of `--kills 8`: reference 222 s, soak 434 s; 11 kills, one in
each of 01, 02, 03, 04, both RL arms at once, the four 07 evaluations and 08, and one between
stages (aimed at 00, which had finished: 00 runs for 0.04 s); no orphan; every compared file equal.
Not yet run on a real model.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from utils.core.lock import LOCK_NAME, live_holder  # noqa: E402

DATA_SMALL = ["data.n_train=40", "data.n_val=8", "data.n_test=8"]  # a real model's word problems, written here
SMALL = ["wandb_mode=disabled", "traces.max_traces=24", "warmup.steps=16", "warmup.batch_size=8", "warmup.eval_every=8",
         "warmup.eval_size=4", "warmup.save_every=4",
         "algorithm.rl.steps=4", "algorithm.rl.questions_per_step=2", "algorithm.rl.n_samples=4",
         "algorithm.rl.save_freq=1", "algorithm.rl.dynamic_sampling=0", "eval.samples=2"]
VOLATILE_PREFIX = ("time/", "perf/")


def _driver(args, run_id: str, extra: list[str]) -> list[str]:
    sets = [*SMALL, *extra, *args.set]
    return [sys.executable, "09_driver.py", "--model", args.model, *(["--data", args.data] if args.data else []),
            "--method", "red,grpo", "--executor", args.executor, "--run_id", run_id,
            *[x for s in sets for x in ("--set", s)]]


def _running(run: Path, since: float = 0.0) -> list[str]:
    """The stages whose manifests say "running" (what a kill now lands in), written at or after `since`
    (a time.time()): a killed stage's manifest still says "running" until its stage starts again."""
    out = []
    for path in run.rglob("manifest.json"):
        try:
            if path.stat().st_mtime >= since and json.loads(path.read_text()).get("status") == "running":
                out.append(path.parent.relative_to(run).as_posix())
        except (OSError, ValueError):  # being written: not counted
            continue
    return sorted(out)


def _wait_for_locks(run: Path, limit: float = 600.0) -> float:
    """Seconds until no live process holds a lock in the run (an orphaned stage still running)."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if not [p for p in run.rglob(LOCK_NAME) if live_holder(p)]:
            return time.monotonic() - start
        time.sleep(1.0)
    raise SystemExit(f"soak: a lock under {run} still held after {limit:.0f} s: an orphan did not stop")


def _status(run: Path, stage: str) -> str | None:
    try:
        return json.loads((run / stage / "manifest.json").read_text()).get("status")
    except (OSError, ValueError):  # not there yet, or being written
        return None


def _stage_seconds(ref: Path) -> dict[str, float]:
    """Each stage's own seconds in the reference run (its manifest's wall_seconds), by stage folder."""
    out = {}
    for path in ref.rglob("manifest.json"):
        stage = path.parent.relative_to(ref).as_posix()
        if not stage.startswith("logs"):
            out[stage] = float(json.loads(path.read_text()).get("wall_seconds", 1.0))
    return out


def _aim(proc, run: Path, rng, seconds: dict[str, float], landed: Counter, per_stage: int, cap: float):
    """Watch a start until a stage short of its kills is running; wait a fraction of its reference
    time; return the stages running then (None: the start ended first, or nothing is left to aim at)."""
    since = time.time()
    while proc.poll() is None:
        due = [st for st in _running(run, since) if st in seconds and landed[st] < per_stage]
        if due:
            time.sleep(min(rng.uniform(0.1, 0.9) * seconds[due[0]], cap))
            return _running(run, since) or ["between stages"] if proc.poll() is None else None
        if all(landed[st] >= per_stage or _status(run, st) == "completed" for st in seconds):
            return None
        time.sleep(0.02)
    return None


def _kill(proc, run: Path, stages: list[str], landed: Counter, kills: int) -> float:
    """SIGKILL the start's whole session, count where it landed, and wait for any orphan's lock: the
    seconds it waited."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    landed.update(stages)
    print(f"kill {kills}: {', '.join(stages)}", flush=True)
    return _wait_for_locks(run)


def aimed_soak(args, cmd: list[str], run: Path, ref: Path) -> tuple[Counter, int, float]:
    """`--per_stage`: start, kill inside the next stage short of its kills, wait for orphans, start
    again, until no stage is left to aim at (the start that finds none runs to the end)."""
    rng = random.Random(args.seed)
    cap = float(args.delay.split(",")[1])
    seconds = _stage_seconds(ref)
    landed, kills, orphan_max = Counter(), 0, 0.0
    while True:
        proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        stages = _aim(proc, run, rng, seconds, landed, args.per_stage, cap)
        if stages is None:
            if proc.wait() != 0:
                raise SystemExit(f"soak: a start exited {proc.returncode} (logs under {run / 'logs'})")
            return landed, kills, orphan_max
        kills += 1
        orphan_max = max(orphan_max, _kill(proc, run, stages, landed, kills))


def soak(args, cmd: list[str], run: Path) -> tuple[Counter, int, float]:
    """Start, kill after a random delay, wait for orphans, start again; after `args.kills` kills run to
    the end. (kills per stage landed in, kills, the longest wait for an orphan's lock in seconds)."""
    rng = random.Random(args.seed)
    lo, hi = (float(x) for x in args.delay.split(","))
    landed, kills, orphan_max = Counter(), 0, 0.0
    while True:
        since = time.time()
        proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        if kills >= args.kills:
            if proc.wait() != 0:
                raise SystemExit(f"soak: the final uninterrupted start exited {proc.returncode}")
            return landed, kills, orphan_max
        try:
            proc.wait(timeout=rng.uniform(lo, hi))
            if proc.returncode == 0:
                return landed, kills, orphan_max  # it finished before the kill was due
            raise SystemExit(f"soak: a start exited {proc.returncode} before its kill (logs under {run / 'logs'})")
        except subprocess.TimeoutExpired:
            kills += 1
            orphan_max = max(orphan_max, _kill(proc, run, _running(run, since) or ["start"], landed, kills))


def _rows(path: Path) -> list:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE_PREFIX)} for r in rows]


def compare(a: Path, b: Path) -> list[str]:
    """Files of the final results that differ between runs a and b (relative paths), or are missing."""
    wanted = [p.relative_to(a) for pattern in ("**/final_adapter/adapter_model.safetensors",
                                               "**/ckpt_sft/best/adapter_model.safetensors", "**/metrics.jsonl",
                                               "**/logs/train.jsonl", "**/07_evaluate/*/metrics.json",
                                               "**/predictions.jsonl", "08_compare_runs/summary.csv")
              for p in sorted(a.glob(pattern))]
    if not wanted:
        return ["(nothing to compare in the reference)"]
    differ = []
    for rel in wanted:
        x, y = a / rel, b / rel
        if not y.is_file():
            differ.append(f"{rel} (missing)")
        elif rel.suffix == ".jsonl" and _rows(x) != _rows(y):
            differ.append(str(rel))
        elif rel.suffix == ".csv" and x.read_text().replace(a.name, b.name) != y.read_text():  # rows name their run
            differ.append(str(rel))
        elif rel.suffix not in (".jsonl", ".csv") and x.read_bytes() != y.read_bytes():
            differ.append(str(rel))
    return differ


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--data", default=None, help="data config (default: word_problems for a real model)")
    ap.add_argument("--kills", type=int, default=24)
    ap.add_argument("--delay", default="15,90", help="each kill after a uniform delay in LO,HI seconds")
    ap.add_argument("--per_stage", type=int, default=0, help="aim N kills at every stage instead (see above)")
    ap.add_argument("--executor", default="ray", choices=("ray", "sequential"))
    ap.add_argument("--seed", type=int, default=0, help="the delays' random seed")
    ap.add_argument("--set", action="append", default=[], help="more KEY=VALUE for both runs")
    args = ap.parse_args()
    extra = []
    if args.model != "tiny-arith":
        from utils.core.loader import load_run_config
        from utils.data.word_problems import write_word_problems

        args.data = args.data or "word_problems"
        data = write_word_problems(load_run_config(args.model, "grpo", args.data, DATA_SMALL).data,
                                   ROOT / "outputs" / "soak_data")
        extra = [*DATA_SMALL, f"data.path={Path(data).resolve().relative_to(ROOT)}"]
    ref, kill = ROOT / "outputs" / "soak_ref", ROOT / "outputs" / "soak_kill"
    t0 = time.monotonic()
    if subprocess.run(_driver(args, "soak_ref", extra), cwd=ROOT).returncode != 0:
        raise SystemExit("soak: the reference run failed")
    print(f"reference: {time.monotonic() - t0:.0f} s", flush=True)
    shutil.rmtree(kill, ignore_errors=True)
    t0 = time.monotonic()
    cmd = _driver(args, "soak_kill", extra)
    landed, kills, orphan_max = aimed_soak(args, cmd, kill, ref) if args.per_stage else soak(args, cmd, kill)
    differ = compare(ref, kill)
    for stage, n in sorted(landed.items()):
        print(f"kills in {stage}: {n}")
    for rel in differ:
        print(f"differs: {rel}")
    print(f"soak: {time.monotonic() - t0:.0f} s")
    print(f"soak kills={kills} orphan_wait_max_s={orphan_max:.0f} "
          f"differing={len(differ)} result={'DIFFERENT' if differ else 'equal'}")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
