"""How much of an RL run's per-step batch accuracy is its batch's question mix, not its policy?

    .venv/bin/python -m utils.eval.batch_mix --run outputs/study/seed_1 --by_length 0.71,0.40,0.35,0.10,0,0

Each step's questions are rebuilt from the run's question stream: the trainer's own draw on the
train split (`take(rows, k, rl_question_key(seed), cursor)` over the pool `rl_questions` gives), advancing by
the step's kept + dropped groups, which is what dynamic sampling consumes
(tests/test_dynamic_sampling.py checks that). Each step is then given the accuracy one fixed policy
would have on that mix: the mean, over every question the step sampled, of `--by_length` (sample
accuracy per gold subtask count 1, 2, ..., e.g. utils/eval/headroom.py's lines for the run's warmup).

Per RL training under the run (05's and 06's): the correlation of the mix's accuracy with the
observed `train/accuracy`, both detrended, and each one's first-to-last-tenth change as 08's
mechanism table reads it (utils/eval/mechanism.py): how much of that reading is the mix. RED's
w_acc follows the same batch accuracy. Not a test.
"""
import argparse
import statistics
import sys
from pathlib import Path


from utils.core.io import read_jsonl
from utils.core.stages import recorded_config
from utils.core.stream import Cursor, rl_question_key, take
from utils.eval.evaluation import gold_subtask_counts
from utils.eval.mechanism import first_last_tenths
from utils.train.questions import rl_questions, rl_strata


def step_questions(rows: list[dict], steps: list[dict], seed: int, per_step: int,
                   strata: list[int] | None = None) -> list[list[dict]]:
    """Each step's sampled questions: the stream's next kept + dropped rows, or `per_step`
    (questions_per_step) for a step without dynamic sampling (no kept groups logged); `strata` as
    the trainer draws them under algorithm.rl.stratify."""
    cursor, out = Cursor(), []
    for m in steps:
        n = m["train/kept_groups"] + m["train/dropped_groups"] if "train/kept_groups" in m else per_step
        out.append(take(rows, n, rl_question_key(seed), cursor, strata=strata))
    return out


def mix_accuracy(questions: list[dict], by_length: list[float]) -> float:
    """The mean of the per-length accuracy over the questions' gold subtask counts."""
    counts = gold_subtask_counts(questions)

    def acc(row):
        n = counts.get(row["id"], 0)
        if not 1 <= n <= len(by_length):
            raise SystemExit(f"batch_mix: question {row['id']} has {n} gold subtasks; --by_length gives "
                             f"lengths 1-{len(by_length)}")
        return by_length[n - 1]
    return statistics.fmean(acc(r) for r in questions)


def detrend(values: list[float]) -> list[float]:
    """Residuals of a least-squares line through (step, value)."""
    xs = range(len(values))
    mx, my = statistics.fmean(xs), statistics.fmean(values)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, values)) / sum((x - mx) ** 2 for x in xs)
    return [y - my - slope * (x - mx) for x, y in zip(xs, values)]


def trainings(run: Path) -> list[Path]:
    return sorted(p.parent for stage in ("05_train_red_grpo", "06_ablate_grpo_only")
                  for p in (run / stage).glob("*/manifest.json"))


def report(run: Path, by_length: list[float]) -> list[str]:
    rows = read_jsonl(run / "01_prepare_dataset" / "train.jsonl")
    lines = [f"{'training':<14}{'corr':>7}{'mix tenths':>18}{'observed tenths':>20}{'observed - mix':>16}"]
    for out in trainings(run):
        cfg = recorded_config(out)
        steps = [m for m in read_jsonl(out / "metrics.jsonl") if "train/accuracy" in m and "time/rollout" in m]
        if len(steps) < 3:
            continue
        pool = rl_questions(rows, cfg, out)
        strata = rl_strata(pool, out) if cfg.algorithm.rl.stratify else None
        questions = step_questions(pool, steps, cfg.seed, cfg.algorithm.rl.questions_per_step, strata)
        mix = [mix_accuracy(q, by_length) for q in questions]
        seen = [m["train/accuracy"] for m in steps]
        r = statistics.correlation(detrend(mix), detrend(seen))
        (m0, m1), (s0, s1) = first_last_tenths(mix), first_last_tenths(seen)
        lines.append(f"{out.name:<14}{r:>7.2f}{m0:>9.3f}->{m1:.3f}{s0:>12.3f}->{s1:.3f}{(s1 - s0) - (m1 - m0):>+16.3f}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="a run (or a study's seed) folder with RL trainings")
    ap.add_argument("--by_length", required=True, help="sample accuracy per gold subtask count 1,2,...")
    args = ap.parse_args()
    by_length = [float(x) for x in args.by_length.split(",")]
    for line in report(args.run, by_length):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
