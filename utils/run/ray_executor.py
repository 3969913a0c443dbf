"""`09_driver.py --executor ray`: the study's independent branches as Ray tasks.

The sequential driver runs one stage at a time. A study's stages form a small graph, per seed:
the data chain (00 → 03), the SFT warmup (04, after it), then one branch per method (its 05/06,
after the warmup; a method whose RL starts from the base, `algorithm.rl.init: base` such as joint,
needs only the data chain, so it trains beside the warmup; matched_sft also after red, whose mean
SFT weight it reads), then the evaluations (one 07 process for every checkpoint, after all the
seed's methods). Seeds are independent of each other; 08 reads them all.
Each branch becomes one Ray task that declares the CPUs and GPUs it needs (`--branch_cpus`,
`--branch_gpus`); Ray starts a task once its inputs are done and the resources are free, on this
box (`ray.init()` with no address: a local Ray with `--ray_cpus` CPUs) or on a cluster
(`--ray_address`). 08 runs in the driver after every branch has ended.

Inside a task the branch's stages run exactly as the sequential driver runs them (`run_batch`: the
same skip rules, the same command lines, the same manifests), their output going to
`outputs/<run_id>/logs/<branch>.log`. The task returns what it did; the driver records it in
`run_manifest.json` as soon as the branch ends. A branch that fails is reported with its log path;
the branches that need it do not run, the others go on, and the driver exits 1 without running 08.
Running the same command again skips every stage that is up to date, so only what failed or never
ran runs.

Ray gives each task's process `OMP_NUM_THREADS` = its CPUs, so a stage started by a 1-CPU task
trains with one torch thread. fp32 sums then round in another order than with two threads, as on
another CPU: compare executors at equal threads (`--set threads=1` for both), as
tests/test_ray_executor.py does.
"""
from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from utils.core.config import ROOT
from utils.core.lock import HOLDER_ENV, RunLock
from utils.core.methods import METHODS
from utils.core.signals import DRIVER_ENV, as_received, process_tag
from utils.run.driver import DATA_STAGES, Step, batches, current_config, run_batch

WARMUP_STAGE = DATA_STAGES[-1]  # 04, a branch of its own


@dataclass
class Branch:
    name: str  # "seed_1/data", "seed_1/red", "seed_1/evaluate"; seed_ dropped for a single seed
    seed: int | None
    common: list[str]  # the stages' common arguments (model, data, run_id, seed, overrides)
    steps: list[Step]
    needs: list[str] = field(default_factory=list)  # names of branches that must have succeeded first


def branches(steps: list[Step], seeds: list, common_of) -> list[Branch]:
    """The plan's steps for every seed, cut into branches (the module docstring's graph)."""
    out: list[Branch] = []
    for seed in seeds:
        tag = f"seed_{seed}/" if len(seeds) > 1 else ""
        common = common_of(seed)
        data = Branch(f"{tag}data", seed, common, [s for s in steps if s.script in DATA_STAGES[:-1]])
        warmup = Branch(f"{tag}warmup", seed, common, [s for s in steps if s.script == WARMUP_STAGE], [data.name])
        trainers = [Branch(f"{tag}{s.algorithm}", seed, common, [s], [data.name if _from_base(s, common) else warmup.name])
                    for s in steps if s.algorithm]
        for b in trainers:
            b.needs += [f"{tag}{n}" for n in METHODS[b.steps[0].algorithm].needs]
        evaluate = Branch(f"{tag}evaluate", seed, common, [s for s in steps if s.checkpoint],
                          [data.name, warmup.name, *(b.name for b in trainers)])
        out += [data, warmup, *trainers, evaluate]
    return out


def _from_base(step: Step, common: list[str]) -> bool:
    """Whether the trainer's RL starts from the base model (it never reads 04's adapter), as its config
    says with this run's settings."""
    return current_config(step, common)[1].algorithm.rl.init == "base"


class Records:
    """The `RunManifest.record` calls of one branch, kept to be replayed in the driver."""

    def __init__(self):
        self.rows: list[tuple] = []

    def record(self, *args, **kwargs):
        self.rows.append((args, kwargs))


def run_branch(branch: Branch, force: bool, log_path: str, holder: str, driver: str, *needed: dict) -> dict:
    """Body of a branch's Ray task: its stages in order, as the sequential driver runs them. The
    results of the branches it needs arrive as arguments (Ray waits for them); if one failed, this
    one does not run. Each stage stops with the driver (`driver`, utils/core/signals.py `stop_with`),
    as a Ray worker can outlive a driver killed outright."""
    failed = [r["branch"] for r in needed if r["status"] != "completed"]
    if failed:
        return {"branch": branch.name, "status": "not run", "reason": f"needs {', '.join(failed)}",
                "records": [], "log": None}
    os.environ[HOLDER_ENV] = holder  # the driver holds the run: its stages get through (utils/core/lock.py)
    os.environ[DRIVER_ENV] = driver
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    records = Records()
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        for batch in batches(branch.steps):
            code = run_batch(batch, branch.common, force, lambda step, name=None: f"[{branch.name}] "
                             f"{name or step.dir_name}", records, branch.seed, stdout=log)
            if code:
                return {"branch": branch.name, "status": f"failed (exit {code})", "records": records.rows,
                        "log": log_path}
    return {"branch": branch.name, "status": "completed", "records": records.rows, "log": log_path}


STOP_GRACE = 90.0  # seconds the running branches get to stop their stages (a stage gets 60, then SIGKILL)


def _stop_branches(ray, refs: list) -> None:
    """Cancel the branches still running and wait for them: Ray raises KeyboardInterrupt in each
    task, whose running stage then gets SIGTERM and unwinds (`run_child`), so its manifest says
    "failed". Shutting Ray down instead SIGKILLs a worker's children, leaving manifests "running"."""
    for ref in refs:
        ray.cancel(ref)
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=STOP_GRACE)


def run_study(plan_steps: list[Step], seeds: list, common_of, run_root: Path, force: bool, log, *,
              address: str | None, cpus: int | None, branch_cpus: float, branch_gpus: float) -> int:
    """Run every seed's branches on Ray; returns 0 if all completed, else 1 (each failure named with
    its log). The caller runs 08 afterwards and writes the run manifest's end."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # read when ray is imported: every branch's lines, not "[repeated 3x]"
    import ray

    plan = branches(plan_steps, seeds, common_of)
    seed_locks = [RunLock(run_root / f"seed_{s}") for s in seeds if len(seeds) > 1]
    for lock in seed_locks:  # concurrent stages of one seed would otherwise refuse each other
        lock.acquire()
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    pending: dict = {}
    try:  # a Ray that fails to start still releases the seed locks
        ours = signal.getsignal(signal.SIGTERM)
        ray.init(address=address, num_cpus=None if address else cpus, include_dashboard=False,
                 runtime_env={"env_vars": env}, log_to_driver=True, configure_logging=False)
        signal.signal(signal.SIGTERM, ours)  # ray.init's own handler exits at once: the run manifest said "running"
        task = ray.remote(run_branch).options(num_cpus=branch_cpus, num_gpus=branch_gpus, max_retries=0)
        refs: dict[str, object] = {}
        for b in plan:  # a branch's needs come before it in the plan
            log_path = str(run_root / "logs" / f"{b.name.replace('/', '_')}.log")
            refs[b.name] = task.remote(b, force, log_path, str(os.getpid()), process_tag(),
                                       *(refs[n] for n in b.needs))
        pending = {refs[b.name]: b for b in plan}
        results: dict[str, dict] = {}
        while pending:  # record each branch as it ends: the run manifest shows a long study's progress
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                results[pending.pop(ref).name] = result = ray.get(ref)
                for args, kwargs in result["records"]:
                    log.record(*args, **kwargs)
    except KeyboardInterrupt as exc:
        _stop_branches(ray, list(pending))
        raise as_received(exc) from None
    finally:
        ray.shutdown()
        for lock in seed_locks:
            lock.release()
    failures = []
    for b in plan:
        result = results[b.name]
        if result["status"].startswith("failed"):
            failures.append(f"{b.name}: {result['status']}; log: {result['log']}")
        elif result["status"] == "not run":
            failures.append(f"{b.name}: not run ({result['reason']})")
    for line in failures:
        print(f"09_driver: {line}", file=sys.stderr)
    return 1 if failures else 0
