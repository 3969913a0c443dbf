"""09_driver: run the whole chain for one or more methods and seeds.

    python 09_driver.py --method red|grpo|fixed_sft|sft|all [--run_id run_001] [--seeds 1,2,3]
                        [--config run.yaml] [--model tiny-arith] [--data synthetic_arith] [--force]
                        [--set key=value ...]

Per seed: 00 → 01 → 02 → 03 → 04 → 07 (base, sft) → for each method: 05/06 → 07 (method).
A stage whose manifest already matches (same config slice hash, same input hashes, same parent
manifests, completed) is skipped, so a second invocation with nothing changed only checks, and an
interrupted one resumes (the interrupted stage itself resumes from its last checkpoint). With
several seeds, seed s writes to outputs/<run_id>/seed_<s>/. --set overrides reach every stage.
"""
import argparse
import subprocess
import sys
import time

from utils.config import ROOT
from utils.driver import METHODS, plan, stage_path, up_to_date


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="red", choices=[*METHODS, "all"])
    ap.add_argument("--run_id", default="run_001")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default: the config's seed)")
    ap.add_argument("--config", default=None, help="run-level YAML merged over the tiers")
    ap.add_argument("--model", default="tiny-arith")
    ap.add_argument("--data", default="synthetic_arith")
    ap.add_argument("--force", action="store_true", help="re-run every stage")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    methods = list(METHODS) if args.method == "all" else [args.method]
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [None]
    t_start = time.time()
    for seed in seeds:
        common = ["--model", args.model, "--data", args.data]
        common += ["--run_id", args.run_id if seed is None or len(seeds) == 1 else f"{args.run_id}/seed_{seed}"]
        common += ["--seed", str(seed)] if seed is not None else []
        common += ["--config", args.config] if args.config else []
        for item in args.overrides:
            common += ["--set", item]
        steps = plan(methods)
        for i, step in enumerate(steps, 1):
            label = f"[{i}/{len(steps)}] {step.dir_name}"
            skip, reason = (False, "--force") if args.force else up_to_date(step, common)
            if skip:
                print(f"{label}: skipped ({reason})", flush=True)
                continue
            print(f"{label}: running ({reason})", flush=True)
            t0 = time.time()
            code = subprocess.call([sys.executable, f"{step.script}.py", *common, *step.args], cwd=ROOT)
            if code != 0:
                print(f"09_driver: {step.dir_name} failed (exit {code}); fix it and re-run the same command to "
                      f"resume from there", file=sys.stderr)
                return code
            print(f"{label}: done in {time.time() - t0:.0f}s", flush=True)
        evals = [stage_path(common, s) / "metrics.json" for s in steps if s.script == "07_evaluate"]
        print("09_driver: evaluation metrics:\n  " + "\n  ".join(str(p) for p in evals))
    print(f"09_driver: finished in {time.time() - t_start:.0f}s (08_compare_runs and report.md are not built yet)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
