"""08_compare_runs: summary.csv and report.md carry the source metrics.json numbers exactly; the
paired bootstrap is right on cases with known answers; bad inputs name the file and row."""
import csv
import json

import pytest

from utils.eval.compare import config_diff
from utils.eval.stats import holm, mean_ci_across_seeds, paired_test, verdict
from utils.core.config import ROOT
from helpers import evaluation_dir as _evaluation, run_compare, seeded as _seeded

FIELDS = ("accuracy", "format", "answered", "reward", "turns", "subtasks", "tokens_planner", "tokens_executor")


def test_summary_and_report_carry_the_metrics_json_numbers(tmp_path):
    run = tmp_path / "outputs" / "r"
    sources = {}
    for seed in (1, 2):
        sd = run / f"seed_{seed}"
        sources[(seed, "red")] = _evaluation(sd, "red", seed, [1.0] * (15 + seed) + [0.0] * (5 - seed))
        sources[(seed, "grpo")] = _evaluation(sd, "grpo", seed, [1.0] * 10 + [0.0] * 10, lr=1e-3)
        sources[(seed, "sft_warmup")] = _evaluation(sd, "sft_warmup", seed, [0.0] * 20)
    res = run_compare(tmp_path, "--run_id", "r", "--set", "eval.equivalence_margin=0")  # tests/test_equivalence.py has it
    assert res.returncode == 0, res.stderr
    out = run / "08_compare_runs"
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert len(rows) == 6
    for row in rows:
        src = sources[(int(row["seed"]), row["method"])]
        for key in FIELDS + ("n",):
            assert float(row[key]) == src[key], (row, key)
        assert [float(row["ci95_low"]), float(row["ci95_high"])] == src["accuracy_ci95"]
    report = (out / "report.md").read_text()
    for (seed, method), src in sources.items():
        lo, hi = src["accuracy_ci95"]
        line = (f"| r | {seed} | {method} | {src['n']} | {src['accuracy']:.4f} | {lo:.4f}–{hi:.4f} | "
                f"{src['format']:.4f} | {src['answered']:.4f} |")
        assert line in report, line
    assert f"| r | 1 | red | {sources[(1, 'red')]['accuracy']:.4f} | 0.1250 |" in report  # by length, 2 before 10
    assert "| run | seed | method | 2 subtasks | 10 subtasks |" in report
    # across seeds: red 16/20 and 17/20 -> mean 0.825; grpo 0.5 both seeds
    # (t-interval over 2 seeds: 0.825 ± 12.706·0.0354/√2, clipped to [0, 1]; grpo has no spread)
    assert "| r | red | 2 | 0.8250 | 0.5073–1.0000 | 0.8000 | 0.8500 |" in report
    assert "| r | grpo | 2 | 0.5000 | 0.5000–0.5000 |" in report
    # paired over (seed, item), a t-test over the 2 seeds' differences (0.80, 0.85): t = 33 on 1 df, p 0.019
    assert "| r | red − sft_warmup | 2 | 40 | 0.8250 |" in report
    # sd 0.0354: t = 0.825 / (0.0354/√2) = 33.0, p 0.0193; Holm over the two comparisons with red 0.0386
    assert ("| r | red − sft_warmup | 2 | 40 | 0.8250 | 0.5073–1.0000 | 0.7000–0.9250 | 0.3521 | 0.0193 | 0.0386 | "
            "better |") in report
    assert ("red vs sft_warmup: **better** (red − sft_warmup = 0.8250 on 40 shared items over 2 seed(s), paired t "
            "over 2 seeds (df 1), 95% CI 0.5073 to 1.0000, MDE 0.3521") in report
    assert "red vs grpo: **better**" in report  # per seed 0.30 and 0.35: t = 13.0, p 0.0489
    # the positive control, alone (grpo 10/20 vs 0/20 on both seeds; the items' own se 0.1147 as the seeds
    # agree): t = 0.5 / (0.1147/√2) = 6.16 on 1 df, p 0.102 = its Holm p; the report says what that costs
    control = report.split("## The positive control: grpo vs sft_warmup")[1].split("\n## ")[0]
    assert "| r | grpo − sft_warmup | 2 | 40 | 0.5000 |" in control and "red −" not in control
    row = next(line for line in control.splitlines() if line.startswith("| r | grpo − sft_warmup"))
    assert row.split(" | ")[-3] == row.split(" | ")[-2] and row.endswith("no evidence either way |")  # p = Holm p
    assert "grpo vs sft_warmup: **no evidence either way** (grpo − sft_warmup = 0.5000 on 40 shared items over 2 seed(s)" in report
    assert "Holm-adjusted p 0.1024, tested alone as the positive control)." in report
    assert "Holm-adjusted p 0.0386 among the comparisons with red)." in report
    assert "**the positive control did not hold**" in report
    # the third family: every other trained method against the warmup it started from; red alone here,
    # so its Holm p is its raw p 0.0193
    warmup = report.split("## Did training improve on its start")[1].split("\n## ")[0]
    assert "| r | red − sft_warmup | 2 | 40 | 0.8250 | 0.5073–1.0000 | 0.7000–0.9250 | 0.3521 | 0.0193 | 0.0193 |" in warmup
    assert "grpo −" not in warmup and "red − grpo" not in warmup
    assert "`0.0005`" in report and "`0.001`" in report  # the trainer configs differ in algorithm.rl.lr
    for name in ("reward_vs_step", "test_accuracy", "red_dynamics", "red_mechanism", "time_per_phase"):
        png = out / "plots" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"](plots/{name}.png)" in report
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "completed" and len(manifest["config"]["evaluations"]) == 6


def test_one_seed_item_bootstrap_on_known_cases():
    same = paired_test({(1, i): float(i % 2) for i in range(50)}, {(1, i): float(i % 2) for i in range(50)})
    assert same["diff"] == 0.0 and same["p_value"] == 1.0 and not same["significant"]
    # 30 wins, no loss: every resample is +1, yet p is (0 + 1) / (10000 + 1) per tail, never 0
    better = paired_test({(1, i): 1.0 for i in range(30)}, {(1, i): 0.0 for i in range(30)})
    assert better["test"] == "paired item bootstrap (1 seed)" and better["diff"] == 1.0 and better["ci95_low"] == 1.0
    assert better["p_value"] == round(2 / 10001, 6) > 0 and better["significant"]
    # issue 45's case: 1 seed, 20 wins against 0 losses on 50 items
    twenty = paired_test({(1, i): float(i < 20) for i in range(50)}, {(1, i): 0.0 for i in range(50)}, 2000)
    assert twenty["p_value"] == round(2 / 2001, 6)
    # one discordant pair in 40: the CI touches 0, not significant
    one = paired_test({(1, i): float(i == 0) for i in range(40)}, {(1, i): 0.0 for i in range(40)})
    assert one["diff"] == 0.025 and one["ci95_low"] == 0.0 and not one["significant"]
    # only shared keys are paired
    assert paired_test({(1, 1): 1.0, (1, 2): 1.0}, {(1, 2): 0.0, (1, 3): 0.0})["n"] == 1
    assert paired_test({(1, 1): 1.0}, {(1, 2): 0.0})["n"] == 0


def test_several_seeds_use_a_t_test_over_the_per_seed_differences():
    """Issue 45's case: per-seed differences +0.015, +0.030, +0.050 (3, 6 and 10 wins of 200). The
    hierarchical bootstrap gave Holm p 0.031; the paired t over three seeds is t = 3.12 with 2 df,
    p = 0.089 (a t table's 0.05 point is 4.303): no evidence either way."""
    t = paired_test(*_seeded({1: 3, 2: 6, 3: 10}), 2000)
    assert t["test"] == "paired t over 3 seeds (df 2)" and t["per_seed"] == [0.015, 0.03, 0.05]
    assert t["diff"] == pytest.approx(0.031667, abs=1e-6) and t["p_value"] == pytest.approx(0.0890, abs=5e-4)
    assert not t["significant"] and t["ci95_low"] < 0 < t["ci95_high"]
    # sd 0.01756: half-width 4.303·0.01756/√3 = 0.04362; MDE (4.303 + 1.061)·0.01756/√3 = 0.0544
    assert t["ci95_high"] - t["diff"] == pytest.approx(0.04362, abs=1e-4) and t["mde"] == pytest.approx(0.0544, abs=2e-4)
    assert 0 < t["item_ci95_low"] < t["diff"] < t["item_ci95_high"]  # within seeds the items alone exclude 0
    # consistent seeds, +0.05 on each of 3: no spread between them, so the spread is the items' own,
    # se √(0.05·0.95·200/199 / 200) = 0.01545: t = 0.05 / (0.01545/√3) = 5.61 on 2 df, p 0.030
    flat = paired_test(*_seeded({1: 10, 2: 10, 3: 10}), 200)
    assert flat["p_value"] == pytest.approx(0.0303, abs=5e-4) and flat["significant"]


def test_seed_to_seed_disagreement_widens_the_interval():
    """Three seeds whose gaps disagree (+0.5, +0.1, −0.3 on 20 items): pooling the items as one seed
    would call a better; the test over seeds does not."""
    a, b = _seeded({1: 10, 2: 2, 3: -6}, 20)
    seeded = paired_test(a, b, 4000, 0)
    assert seeded["seeds"] == 3 and seeded["n"] == 60 and seeded["diff"] == pytest.approx(0.1)
    assert seeded["ci95_low"] < 0 < seeded["ci95_high"] and not seeded["significant"]
    pooled = paired_test({(0, k): v for k, v in a.items()}, {(0, k): v for k, v in b.items()}, 4000, 0)
    assert pooled["seeds"] == 1 and pooled["ci95_high"] - pooled["ci95_low"] < seeded["ci95_high"] - seeded["ci95_low"]


def test_t_distribution_against_table_values():
    from utils.eval.stats import t_quantile, t_two_sided_p

    # two-sided 5% points of a t table, df 1-5, 10 and 30
    for df, t in ((1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (5, 2.571), (10, 2.228), (30, 2.042)):
        assert t_two_sided_p(t, df) == pytest.approx(0.05, abs=2e-4)
        assert t_quantile(0.975, df) == pytest.approx(t, abs=2e-3)
    assert t_two_sided_p(1.0, 1) == pytest.approx(0.5) and t_two_sided_p(0.0, 3) == pytest.approx(1.0)
    assert t_quantile(0.8, 2) == pytest.approx(1.061, abs=1e-3)  # 80% one-sided point, df 2


def test_holm_and_verdicts_by_hand():
    # sorted p: 0.01·4 = 0.04; 0.03·3 = 0.09; 0.04·2 = 0.08 -> kept monotone at 0.09; 0.2·1 = 0.2
    assert holm([0.01, 0.04, 0.03, 0.2]) == [0.04, 0.09, 0.09, 0.2]
    assert holm([0.5, 0.001]) == [0.5, 0.002]
    assert verdict(0.1, 0.01) == "better" and verdict(-0.1, 0.01) == "worse"
    assert verdict(0.1, 0.2) == "no evidence either way" and verdict(None, None) == "no evidence either way"


def test_mean_ci_across_seeds_is_a_t_interval():
    mean, lo, hi = mean_ci_across_seeds([0.5, 0.6, 0.7])  # sd 0.1, t(2) = 4.303: 0.6 ± 0.2484
    assert mean == pytest.approx(0.6) and lo == pytest.approx(0.6 - 0.24843, abs=1e-4) and hi == pytest.approx(0.84843, abs=1e-4)
    assert mean_ci_across_seeds([0.3]) == (0.3, None, None)


def test_config_diff_lists_only_differing_keys():
    diff = config_diff({"a": {"x": 1, "y": {"z": 2}}, "b": {"x": 1, "y": {"z": 3}, "w": 0}})
    assert diff == [("w", {"a": "—", "b": 0}), ("y.z", {"a": 2, "b": 3})]


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "metrics.json").write_text("{not json"), "metrics.json: not valid JSON"),
    (lambda d: (d / "samples" / "predictions.jsonl").write_text('{"qid": "a", "answer": 1}\n{"qid": "b"}\n'),
     "predictions.jsonl, row 2, field 'answer': missing"),
    (lambda d: (d / "metrics.json").write_text('{"checkpoint": "red", "n": 3}'), "metrics.json: field 'accuracy'"),
])
def test_bad_inputs_name_the_file_and_row(tmp_path, damage, message):
    run = tmp_path / "outputs" / "r"
    _evaluation(run, "red", 1, [1.0, 0.0])
    _evaluation(run, "sft_warmup", 1, [0.0, 0.0])
    damage(run / "07_evaluate" / "red")
    res = run_compare(tmp_path, "--run_id", "r")
    assert res.returncode == 1 and message in res.stderr, res.stderr
    assert not (run / "08_compare_runs" / "report.md").exists()


def test_missing_runs_fail_clearly(tmp_path):
    res = run_compare(tmp_path, "--runs", str(tmp_path / "nope_*"))
    assert res.returncode == 1 and "matches no directory" in res.stderr
    (tmp_path / "outputs" / "empty").mkdir(parents=True)
    res = run_compare(tmp_path, "--run_id", "empty")
    assert res.returncode == 1 and "no completed 07_evaluate" in res.stderr


def test_accuracy_by_gold_subtasks_separates_recall_from_extension():
    from utils.eval.evaluation import accuracy_by_gold_subtasks

    rows = [{"id": "a", "meta": {"steps": [1, 2]}}, {"id": "b", "meta": {"steps": [1, 2]}},
            {"id": "c", "meta": {"steps": [1, 2, 3]}}, {"id": "d", "meta": {}}]
    scored = [{"qid": "a", "answer": 1.0}, {"qid": "b", "answer": 0.0}, {"qid": "c", "answer": 1.0},
              {"qid": "d", "answer": 1.0}]
    assert accuracy_by_gold_subtasks(rows, scored) == {"2": 0.5, "3": 1.0}  # d has no decomposition
    assert accuracy_by_gold_subtasks([{"id": "d", "meta": {}}], scored) == {}


def test_failure_category_names_the_imperfect_teachers_flaw():
    from utils.eval.evaluation import failure_category

    steps = [{"task": "3+4", "result": 7}, {"task": "7+5", "result": 12}, {"task": "12-2", "result": 10}]
    answered = lambda prediction, answer: {"status": "answered", "prediction": prediction, "answer": answer}  # noqa: E731
    assert failure_category(answered("10", 1.0), steps) == "correct"
    assert failure_category(answered(" 12 ", 0.0), steps) == "stopped_early"  # the next-to-last result
    assert failure_category(answered("7", 0.0), steps) == "wrong_answer"  # two subtasks early is not the flaw
    assert failure_category(answered("12", 0.0), steps[-1:]) == "wrong_answer"  # one step: nothing to stop before
    assert failure_category(answered("12", 0.0)) == "wrong_answer"  # no gold decomposition
    assert failure_category(answered("", 0.0), steps) == "no_answer"
    assert failure_category({"status": "max_turns", "prediction": None, "answer": 0.0}, steps) == "hit_max_turns"


def test_the_report_counts_greedy_outcomes_per_checkpoint(tmp_path):
    run = tmp_path / "outputs" / "r" / "seed_1"
    for checkpoint, failures in (("sft_warmup", {"correct": 5, "stopped_early": 4, "wrong_answer": 1}),
                                 ("grpo", {"correct": 8, "wrong_answer": 1, "malformed": 1})):
        _evaluation(run, checkpoint, 1, [1.0] * failures["correct"] + [0.0] * (10 - failures["correct"]))
        metrics = json.loads((run / "07_evaluate" / checkpoint / "metrics.json").read_text())
        (run / "07_evaluate" / checkpoint / "metrics.json").write_text(json.dumps({**metrics, "failures": failures}))
    res = run_compare(tmp_path, "--run_id", "r")
    assert res.returncode == 0, res.stderr
    section = (run.parent / "08_compare_runs" / "report.md").read_text().split("### Greedy episodes by outcome")[1]
    table = section.split("\n\n")[2].splitlines()
    assert table[0] == "| run | seed | method | correct | wrong_answer | stopped_early | malformed |"
    assert "| r | 1 | grpo | 8 | 1 | 0 | 1 |" in table and "| r | 1 | sft_warmup | 5 | 1 | 4 | 0 |" in table


def test_stats_calibration_benchmark_runs_08s_test_on_simulated_studies(capsys):
    """The calibration oracle (tests/stats_calibration.py) stays runnable (its figures are quoted in
    docs/RESULTS.md, "Equivalence verdicts"): a few studies per setting, and its last line is the
    largest null rejection rate."""
    import stats_calibration as bench

    assert bench.main(["--reps", "20", "--items", "50", "--seeds", "3", "--spreads", "0,0.04"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 + 2 + 1 + 4 + 1 + 1
    last = dict(kv.split("=") for kv in lines[-1].split())
    assert list(last) == ["null_rejection_max", "tost_false_equivalence_max"]
    nulls = [float(x.split("rejection ")[1].split()[0]) for x in lines if x.startswith("null ")]
    assert len(nulls) == 2 and float(last["null_rejection_max"]) == max(nulls)
    false_eq = [float(x.split("equivalent ")[1].split()[0]) for x in lines if x.startswith("tost  ")]
    assert len(false_eq) == 4 and float(last["tost_false_equivalence_max"]) == max(false_eq)
    assert lines[3].startswith("power seeds=3 effect=+0.05") and lines[-2].startswith("tost power seeds=3 effect=0.00")


def _grpo_gains(methods: list[str]) -> list:
    """Three seeds' evaluations of `methods` on 100 items: grpo right on 60 / 62 / 64 of them, every
    other method on the same 50."""
    from pathlib import Path

    from utils.eval.compare import Evaluation

    out = []
    for seed, wins in ((1, 10), (2, 12), (3, 14)):
        for method in methods:
            right = 50 + (wins if method == "grpo" else 0)
            scores = {f"q{i:03d}": float(i < right) for i in range(100)}
            out.append(Evaluation("r", seed, method, Path("."), {}, scores, {}))
    return out


def test_the_positive_control_is_tested_alone_whatever_else_ran():
    """grpo − sft_warmup is its own family: the arms a run adds beside it change the other families'
    Holm p-values, never the control's. Here grpo gains 0.10 / 0.12 / 0.14 on 100 items per seed
    (t = 0.12 / (0.02/√3) = 10.4 on 2 df, p 0.009); four null arms would raise a five-way Holm p to 0.046."""
    from utils.eval.paired import comparisons

    evals = _grpo_gains
    alone = comparisons(evals(["sft_warmup", "grpo"]), resamples=200, seed=0)
    crowded = comparisons(evals(["sft_warmup", "grpo", "red", "fixed_sft", "matched_sft", "sft"]), resamples=200, seed=0)
    (control,) = [t for t in alone if t["family"] == "control"]
    (control_crowded,) = [t for t in crowded if t["family"] == "control"]
    assert control["p_value"] == pytest.approx(0.0092, abs=5e-4) and control["p_holm"] == control["p_value"]
    assert control_crowded["p_holm"] == control["p_holm"] and control_crowded["verdict"] == "better"
    assert [t["a"] for t in crowded if t["family"] == "warmup"] == ["red", "fixed_sft", "matched_sft", "sft"]
    assert not [t for t in alone if t["family"] == "warmup"]  # grpo is not also in the warmup family


def test_every_trained_arm_but_red_is_tested_against_grpo_in_a_family_of_its_own():
    """The "grpo" family holds each trained method other than grpo and red against grpo (red − grpo is
    in red's family, once). With grpo 0.12 above three equal arms (the t-test's p 0.0092 each), Holm
    over three equal p-values gives each 3p; red's family of five and the warmup's are adjusted apart."""
    from utils.eval.paired import comparisons

    tests = comparisons(_grpo_gains(["sft_warmup", "grpo", "red", "fixed_sft", "matched_sft", "sft"]),
                        resamples=200, seed=0)
    family = [t for t in tests if t["family"] == "grpo"]
    assert [(t["a"], t["b"]) for t in family] == [("fixed_sft", "grpo"), ("matched_sft", "grpo"), ("sft", "grpo")]
    for t in family:
        assert t["diff"] == pytest.approx(-0.12) and t["p_value"] == pytest.approx(0.0092, abs=5e-4)
        assert t["p_holm"] == pytest.approx(3 * t["p_value"], abs=1e-6) and t["verdict"] == "worse"
    (red_grpo,) = [t for t in tests if (t["a"], t["b"]) == ("red", "grpo")]
    assert red_grpo["family"] == "red"
    assert red_grpo["p_holm"] == pytest.approx(min(1.0, 5 * red_grpo["p_value"]), abs=1e-6)
    assert not [t for t in comparisons(_grpo_gains(["sft_warmup", "grpo", "red"]), resamples=200, seed=0)
                if t["family"] == "grpo"]  # nothing but red beside grpo: no family


def test_a_trainings_method_is_read_from_its_manifest_not_its_folder(tmp_path):
    """A trainer folder copied under another name still reports as the method its manifest's config
    names; without a manifest (a run killed before writing one) the folder's name stands."""
    import json

    from utils.eval.compare import load_trainings

    run = tmp_path / "outputs" / "r"
    for folder, manifest in (("red_copy", {"config": {"algorithm": {"method": "red"}}, "seed": 3}), ("grpo", None)):
        d = run / "05_train_red_grpo" / folder
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text('{"step": 1, "train/accuracy": 0.5}\n')
        if manifest:
            (d / "manifest.json").write_text(json.dumps(manifest))
    got = {(t.method, t.seed, t.directory.name) for t in load_trainings([run], tmp_path / "outputs")}
    assert got == {("red", 3, "red_copy"), ("grpo", None, "grpo")}


def test_run_label_pools_seed_folders_inside_and_outside_outputs(tmp_path):
    from utils.eval.compare import run_label

    outputs = tmp_path / "outputs"
    assert run_label(outputs / "run_001" / "seed_2", outputs) == ("run_001", 2)
    assert run_label(outputs / "run_001", outputs) == ("run_001", None)
    other = tmp_path / "elsewhere" / "outputs" / "study"  # another checkout's multi-seed run
    assert run_label(other / "seed_3", outputs) == ("study", 3)
    assert run_label(other, outputs) == ("study", None)
    assert run_label(tmp_path / "seed_x", outputs) == ("seed_x", None)


def test_pairs_across_runs_are_tested_as_their_own_family(tmp_path):
    """--across: a checkpoint of one run against one of another, on the (seed, item) pairs both
    evaluated. Here "early/red" loses 0.10 / 0.12 / 0.14 to "study/grpo" on 100 items per seed (the
    control's figures above, sign flipped: p 0.0092); an unknown label or two primary metrics are refused."""
    from utils.eval.compare import CompareError, Evaluation
    from utils.eval.paired import across_runs
    from utils.eval.report import render_report

    evals = []
    for seed, gap in ((1, 10), (2, 12), (3, 14)):
        for run, method, right in (("early", "red", 50), ("study", "grpo", 50 + gap), ("study", "red", 50)):
            scores = {f"q{i:03d}": float(i < right) for i in range(100)}
            metrics = {"n": 100, "accuracy": right / 100, "accuracy_ci95": [0.4, 0.7], "format": 1.0, "answered": 1.0}
            evals.append(Evaluation(run, seed, method, tmp_path, metrics, scores, {}))
    tests = across_runs(evals, [("early/red", "study/grpo"), ("early/red", "study/red")], resamples=200, seed=0)
    assert [(t["family"], t["run"], t["a"], t["b"]) for t in tests] == [("across", "across", "early/red", "study/grpo"),
                                                                        ("across", "across", "early/red", "study/red")]
    lose, level = tests
    assert lose["diff"] == pytest.approx(-0.12) and lose["seeds"] == 3 and lose["n"] == 300
    assert lose["p_value"] == pytest.approx(0.0092, abs=5e-4) and lose["verdict"] == "worse"
    assert level["diff"] == 0.0 and level["verdict"] == "no evidence either way"
    report = render_report(evals, [], tests, [], [], 200)
    assert "## Paired across runs (named with --across)" in report and "| across | early/red − study/grpo | 3 | 300 |" in report
    assert "among the pairs across runs" in report
    assert "## Paired across runs" not in render_report(evals, [], [], [], [], 200)  # no pair named: no section
    with pytest.raises(CompareError, match="no evaluation labelled early/grpo; have: early/red, study/grpo, study/red"):
        across_runs(evals, [("early/grpo", "study/grpo")], resamples=200, seed=0)
    other = [Evaluation("other", 9, "red", tmp_path, {}, {"q000": 1.0}, {})]
    with pytest.raises(CompareError, match="no .seed, test item. pair evaluated by both"):
        across_runs(evals + other, [("other/red", "study/grpo")], resamples=200, seed=0)
    sampled = [Evaluation("s", 1, "red", tmp_path, {"samples": 4}, {"q000": 1.0}, {}, primary="mean_at_k")]
    with pytest.raises(CompareError, match="different primary metrics"):
        across_runs(evals + sampled, [("s/red", "study/grpo")], resamples=200, seed=0)


def test_the_report_names_the_warmup_each_runs_arms_started_from(tmp_path):
    """The caveat reads each run's 04 warmup length from 04's manifest, so a reader sees whether the
    arms compared methods after SFT or from an early start, and names the arms that started from the
    bare base (their manifests' algorithm.rl.init); a run without a 04 manifest adds nothing."""
    from utils.eval.compare import load_trainings
    from utils.eval.report import _start_caveat

    outputs = tmp_path / "outputs"
    for run, steps in (("study", 800), ("early", 200), ("bare", None)):
        t = outputs / run / "06_ablate_grpo_only" / "grpo"
        t.mkdir(parents=True)
        (t / "metrics.jsonl").write_text('{"step": 1}\n')
        if steps:
            (outputs / run / "04_sft_warmup").mkdir()
            (outputs / run / "04_sft_warmup" / "manifest.json").write_text(
                json.dumps({"stage": "04_sft_warmup", "config": {"warmup": {"steps": steps}}}))
    trainings = load_trainings(sorted(outputs.iterdir()), outputs)
    [line] = _start_caveat(trainings)
    assert "(04's configured steps, early: 200; study: 800)" in line and "bare" not in line
    assert "method joint" in line  # no arm from the base: the report says what the seed's claim needs
    assert _start_caveat([t for t in trainings if t.run == "bare"]) == []
    joint = outputs / "study" / "05_train_red_grpo" / "joint"  # an arm from the base beside the study's
    joint.mkdir(parents=True)
    (joint / "metrics.jsonl").write_text('{"step": 1}\n')
    (joint / "manifest.json").write_text(json.dumps({"stage": "05_train_red_grpo/joint", "config": {
        "algorithm": {"method": "joint", "rl": {"init": "base"}}}}))
    warm, base = _start_caveat(load_trainings(sorted(outputs.iterdir()), outputs))
    assert "The other trained arms" in warm and "early: 200; study: 800" in warm
    assert base.startswith("- joint started from the bare base") and "seed's claim" in base
