"""02_build_rewards: write reward_spec.yaml and run the reward unit cases against it.

The spec (scorer from data.scorer, weights and judge from the `reward` config section) is what
the trainer and the evaluator score with. The hand-computed cases of utils/reward/cases.py are
written to unit_tests/test_cases.json and their outcomes to unit_tests/test_results.json; any
failure fails the stage. Every gold answer of the prepared splits must score 1.0 against itself,
or the stage fails naming the file and row. With reward.judge.enabled, the endpoint must answer.
"""
import sys

from utils.core.cli import parse_stage_args
from utils.core.io import read_records
from utils.core.files import atomic_write_json
from utils.core.manifest import StageRun
from utils.reward.cases import CASES, run_cases
from utils.reward.spec import gold_self_score, spec_from_config, write_spec
from utils.core.stages import StageError, output_path, parent, run_main, stage_config, stage_dir

STAGE = "02_build_rewards"


def _check_golds(spec, prepared) -> int:
    n = 0
    for split in ("train", "val", "test"):
        path = output_path(prepared, f"/{split}.jsonl")
        for i, row in read_records(path):
            golds = row["answers"]
            if gold_self_score(spec, golds) != 1.0:
                raise StageError(f"{path}, row {i}, field 'answers': scorer '{spec.scorer}' scores gold "
                                 f"{golds[0]!r} below 1.0 against itself")
            n += 1
    return n


def main(argv=None) -> int:
    cfg, _ = parse_stage_args(__doc__, argv)
    out = stage_dir(cfg, STAGE)
    with StageRun(STAGE, out, stage_config(cfg, STAGE)) as run:  # no run seed: nothing here is drawn
        _, prepared = parent(run, cfg, "01_prepare_dataset")
        spec = spec_from_config(cfg)
        if spec.judge.enabled:
            from utils.reward.judge import JudgeUnreachable, check_judge

            try:
                check_judge(spec.judge)
            except JudgeUnreachable as exc:
                raise StageError(str(exc)) from None
        write_spec(spec, out / "reward_spec.yaml")
        results = run_cases(spec)
        atomic_write_json(out / "unit_tests" / "test_cases.json", CASES)
        atomic_write_json(out / "unit_tests" / "test_results.json", results)
        for name in ("reward_spec.yaml", "unit_tests/test_cases.json", "unit_tests/test_results.json"):
            run.add_output(out / name)
        failed = [r for r in results if not r["passed"]]
        run.metrics.update(cases=len(results), cases_failed=len(failed), golds_checked=_check_golds(spec, prepared))
        if failed:
            raise StageError(f"{len(failed)} reward case(s) failed, e.g. {failed[0]}; "
                             f"see {out / 'unit_tests' / 'test_results.json'}")
    print(f"{STAGE}: {len(results)} reward cases passed, scorer '{spec.scorer}', "
          f"{run.metrics['golds_checked']} golds self-score 1.0 -> {out / 'reward_spec.yaml'}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(STAGE, main))
