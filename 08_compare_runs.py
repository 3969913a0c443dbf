"""08_compare_runs: aggregate evaluated runs into summary.csv, plots/ and report.md.

    python 08_compare_runs.py [--run_id run_001] [--runs DIR_OR_GLOB ...] [--out DIR] [--resamples 10000]
                              [--across RUN/METHOD RUN/METHOD ...]

--runs takes run directories or globs (outputs/run_00*); each may hold seed_<s>/ subdirectories.
Default: this run's directory, outputs/<run_id>. Reads every 07_evaluate/<checkpoint>/ (metrics.json,
samples/predictions.jsonl, manifest) and every trainer's metrics.jsonl, and writes into
outputs/<run_id>/08_compare_runs/ (or --out):
- summary.csv: one row per run, seed and method, with the numbers exactly as in metrics.json;
- plots/: reward_vs_step.png, test_accuracy.png, red_dynamics.png, red_mechanism.png, time_per_phase.png,
  pass_at_k.png;
- report.md: tables, the plots, paired tests of red against every other method, of every other
  method against grpo and of every method against its warmup on the same (seed, test item) pairs
  (a t-test over seeds at two or more seeds, the item bootstrap at one: utils/eval/stats.py), and
  the config values that differ between methods and between runs, and the pass@k curves of the
  sampled evaluations with the smallest k at which sft_warmup's reaches each arm's
  (utils/eval/curves.py);
- the manifest.
--across pairs two checkpoints that no single run holds together (a run is named by its folder under
outputs/, or outside it by its own folder; e.g. `--runs outputs/study outputs/early --across
early/red study/grpo`): tested the same way, in a family of their own.
The logic lives in utils/eval/compare.py (collecting), utils/eval/paired.py (the tests) and
utils/eval/report.py (writing).
"""
import sys

from utils.core.cli import parse_stage_args, stage_parser
from utils.core.files import atomic_write_text
from utils.core.manifest import StageRun
from utils.core.config import repo_path
from utils.core.stages import StageError, run_main, stage_dir
from utils.eval.compare import (DEFAULT_RESAMPLES, compare_settings, find_run_dirs, load_evaluation, load_trainings,
                                refuse_duplicates, resolve_sources, source_files)
from utils.eval.frames import summary_csv
from utils.eval.paired import across_runs, comparisons
from utils.eval.curves import crossings
from utils.eval.plots import plot_all
from utils.eval.report import render_report

STAGE = "08_compare_runs"


def main(argv=None) -> int:
    ap = stage_parser(__doc__)
    ap.add_argument("--runs", nargs="*", default=[], help="run directories or globs (default: this run)")
    ap.add_argument("--out", default=None, help="output directory (default: outputs/<run_id>/08_compare_runs)")
    ap.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES, help="item bootstrap resamples")
    ap.add_argument("--across", nargs=2, action="append", default=[], metavar=("RUN/METHOD", "RUN/METHOD"),
                    help="also test this pair of checkpoints from two runs (repeatable), e.g. early/red study/grpo")
    cfg, args = parse_stage_args(__doc__, argv, parser=ap)
    if args.resamples < 100:
        raise StageError(f"--resamples {args.resamples}: use at least 100")
    out = repo_path(args.out) if args.out else stage_dir(cfg, STAGE)
    sources = resolve_sources(cfg, args.runs)
    settings = compare_settings(cfg, args.runs, args.resamples, args.across)
    outputs = repo_path(cfg.outputs_dir)
    with StageRun(STAGE, out, settings, cfg.seed) as run:
        run_dirs = find_run_dirs(sources)
        evals = [load_evaluation(repo_path(d), outputs) for d in settings["evaluations"]]
        trainings = load_trainings(run_dirs, outputs)
        if not evals:
            raise StageError(f"no completed 07_evaluate/*/metrics.json under {', '.join(map(str, sources))}: "
                             "run 07_evaluate.py (or 09_driver.py) first")
        refuse_duplicates(evals)
        for p in source_files(evals, trainings):
            run.add_input(p)
        # the tests first: a bad --across pair stops the stage before it writes anything
        margin = cfg.eval.equivalence_margin
        tests = (comparisons(evals, args.resamples, cfg.seed, margin)
                 + across_runs(evals, [tuple(p) for p in args.across], args.resamples, cfg.seed, margin))
        found = crossings(evals, args.resamples, cfg.seed)
        atomic_write_text(out / "summary.csv", summary_csv(evals))
        plots = plot_all(evals, trainings, out / "plots")
        atomic_write_text(out / "report.md", render_report(evals, trainings, tests, plots, sources, args.resamples,
                                                           found))
        for name in ["summary.csv", "report.md"] + [f"plots/{p}" for p in plots]:
            run.add_output(out / name)
        run.metrics.update(evaluations=len(evals), trainings=len(trainings),
                           paired_tests={f"{t['run']}:{t['a']}-{t['b']}": t["diff"] for t in tests},
                           **({"pass_at_k_reached": {f"{c.run}:{c.method}": c.k for c in found}} if found else {}))
    print(f"{STAGE}: {len(evals)} evaluations, {len(trainings)} training curves -> {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(STAGE, main))
