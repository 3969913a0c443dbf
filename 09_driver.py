"""09_driver: run the whole chain for one or more methods and seeds.

    python 09_driver.py --method red|NAME|all|M1,M2,…   (the methods: --help, or python -m utils.core.methods)
                        [--run_id run_001] [--seeds 1,2,3]
                        [--config run.yaml] [--model tiny-arith] [--data synthetic_arith] [--force] [--dry_run]
                        [--executor sequential|ray] [--launch fork|exec] [--ray_address ADDR] [--ray_cpus N]
                        [--branch_cpus C] [--branch_gpus G] [--set key=value ...]

`all` is the RED study's arms (`--help` names them); every other method runs by name or in a list.
Per seed: 00 → 01 → 02 → 03 → 04 → each method's 05/06 (red before matched_sft, which reads red's mean
SFT weight) → 07 on base, sft_warmup and every method, in one process sharing one engine; then
08_compare_runs over all seeds writes outputs/<run_id>/08_compare_runs/report.md.
A stage whose manifest already matches (same config slice hash, same input hashes, same parent
manifests, completed) is skipped, so a second invocation with nothing changed only checks, and an
interrupted one resumes (the interrupted stage itself resumes from its last checkpoint). A stage that
re-runs says why (a config change names each differing setting); --dry_run only prints those verdicts. With
several seeds, seed s writes to outputs/<run_id>/seed_<s>/. --set overrides reach every stage.
outputs/<run_id>/run_manifest.json lists every stage's manifest and what the driver did with it.
One driver at a time per run: a second one on the same --run_id is refused, naming the first
(utils/core/lock.py). Ctrl-C or SIGTERM stops the running stage with SIGTERM, waits for it to unwind
(its manifest says "failed", its vLLM engine shuts down), then exits; the same command resumes. --launch
fork (default) forks each stage from the driver, which imports torch, transformers, peft and vLLM
once, not once per stage (same results); exec starts each as `python NN_stage.py ...`.
--executor ray runs the independent branches (each seed's chain; each method after its seed's SFT
warmup, or after its data chain when its RL starts from the base) as Ray tasks, on this box or on
the cluster at --ray_address, with the same manifests and skip rules (utils/run/ray_executor.py); a
failed branch is named with its log and the others go on.
"""
import argparse
import os
import sys
import time

from utils.core.cli import HelpWithDefaults
from utils.core.lock import HOLDER_ENV, RunLock, RunLocked
from utils.core.files import rel
from utils.core.methods import METHODS, STUDY
from utils.core.signals import TERMINATED_EXIT, Terminated, exit_without_teardown, sigterm_as_interrupt, stop_word
from utils.core.stages import DISK_ERRORS, disk_error
from utils.run.driver import (REPORT, RunManifest, dry_run, plan, run_batch, run_sequential, parse_seeds,
                              stage_count, stage_path)


def main(argv=None) -> int:
    ap = HelpWithDefaults(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="red",
                    help=f"a method ({', '.join(METHODS)}), a comma-separated list of them, or all: the RED "
                         f"study's arms ({', '.join(STUDY)})")
    ap.add_argument("--run_id", default="run_001")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default: the config's seed)")
    ap.add_argument("--config", default=None, help="run-level YAML merged over the tiers")
    ap.add_argument("--model", default="tiny-arith")
    ap.add_argument("--data", default="synthetic_arith")
    ap.add_argument("--force", action="store_true", help="re-run every stage")
    ap.add_argument("--dry_run", action="store_true",
                    help="print which stages would run or be skipped, and why; run and write nothing")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--executor", choices=("sequential", "ray"), default="sequential",
                    help="sequential: one stage at a time (default); ray: independent branches as Ray tasks")
    ap.add_argument("--launch", choices=("fork", "exec"), default="fork", help="sequential: fork each stage from "
                    "the driver, which imports the heavy modules once, or exec a new interpreter (ray: always exec)")
    ap.add_argument("--ray_address", default=None,
                    help="ray: a cluster's address (e.g. ray://head:10001 or auto); default: a local Ray on this box")
    ap.add_argument("--ray_cpus", type=int, default=None, help="ray, local: CPUs the local Ray may use (default: all)")
    ap.add_argument("--branch_cpus", type=float, default=1.0, help="ray: CPUs each branch declares (default 1)")
    ap.add_argument("--branch_gpus", type=float, default=0.0, help="ray: GPUs each branch declares (default 0)")
    args = ap.parse_args(argv)
    methods = list(STUDY) if args.method == "all" else [m.strip() for m in args.method.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        ap.error(f"--method {args.method!r}: unknown method {', '.join(map(repr, unknown)) or '(none given)'}; "
                 f"valid: {', '.join(METHODS)}, all, or a comma-separated list")
    methods = list(dict.fromkeys(methods))  # a method named twice runs once
    base = ["--model", args.model, "--data", args.data, *(["--config", args.config] if args.config else []),
            *(a for item in args.overrides for a in ("--set", item))]
    root = base + ["--run_id", args.run_id]
    run_root = stage_path(root, REPORT).parent
    seeds = parse_seeds(ap, args.seeds, run_root, args.run_id)
    if args.dry_run:
        n = dry_run(plan(methods), seeds, lambda seed: _common(args, seeds, base, seed), root, args.force)
        print(f"09_driver: dry run: {n} stage(s) to run; nothing was run or written")
        return 0
    try:
        with sigterm_as_interrupt(), RunLock(run_root):  # one writer per run; our stages get through
            os.environ[HOLDER_ENV] = str(os.getpid())
            return _run(args, methods, seeds, base, root, run_root)
    except RunLocked as exc:
        print(f"09_driver: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        if exc.errno not in DISK_ERRORS:
            raise
        print(f"09_driver: error: {disk_error(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the running stage was stopped with SIGTERM first
        print(f"09_driver: {stop_word(exc)}; the running stage "
              "stopped with it; run the same command again to resume", file=sys.stderr)
        return TERMINATED_EXIT if isinstance(exc, Terminated) else 130
    finally:
        os.environ.pop(HOLDER_ENV, None)


def _common(args, seeds, base, seed) -> list[str]:
    """A seed's stage arguments: its own run folder (seed_<s>) when the run has several seeds."""
    common = base + ["--run_id", args.run_id if seed is None or len(seeds) == 1 else f"{args.run_id}/seed_{seed}"]
    return common + (["--seed", str(seed)] if seed is not None else [])


def _run(args, methods, seeds, base, root, run_root) -> int:
    log = RunManifest(run_root / "run_manifest.json", args.run_id, methods, seeds, sys.argv[1:], root)
    log.write()
    steps = plan(methods)
    total, fork = stage_count(steps, seeds), args.launch == "fork" and args.executor == "sequential"

    def common_of(seed):
        return _common(args, seeds, base, seed)

    if args.executor == "ray":
        from utils.run.ray_executor import run_study

        try:
            code = run_study(steps, seeds, common_of, run_root, args.force, log, address=args.ray_address,
                             cpus=args.ray_cpus, branch_cpus=args.branch_cpus, branch_gpus=args.branch_gpus)
        except KeyboardInterrupt as exc:
            log.finish(f"{stop_word(exc)} (ray)")
            raise
        if code:
            log.finish("failed: see the branches above")
            return code
    else:
        code = run_sequential(steps, seeds, common_of, args.force, log, fork=fork)
        if code:
            return code
    code = run_batch([REPORT], root, args.force, lambda step, name=None: f"[{total}/{total}] {name or step.dir_name}",
                     log, None, fork=fork)
    if code:
        log.finish(f"failed at {REPORT.dir_name}")
        return code
    report = run_root / REPORT.dir_name / "report.md"
    log.finish("completed", rel(report))
    print(f"09_driver: finished in {time.time() - log.t0:.0f}s; run manifest {rel(log.path)}")
    print(f"09_driver: report: {report}")
    return 0


if __name__ == "__main__":
    exit_without_teardown(main)  # utils/core/signals.py: no teardown report from the bindings it imported
