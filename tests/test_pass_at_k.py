"""pass@k: the unbiased estimator against exhaustive enumeration, 07's curve pass on a rule engine
whose right answers are known, and 08's curve section on hand-made evaluations."""
import itertools
import json
import math

import pytest
from transformers import AutoTokenizer

from helpers import run_compare
from scripted import RuleEngine
from utils.agent.rollout import Codec, RolloutSpec
from utils.core.schema import TemplatesConfig
from utils.eval import evaluation
from utils.eval.passk import curve, k_grid, pass_at_k
from utils.reward.spec import RewardSpec


@pytest.mark.parametrize("n", range(1, 8))
def test_the_estimator_equals_the_share_of_k_subsets_holding_a_correct_sample(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(range(n), k))  # samples 0..c-1 are the correct ones
            share = sum(any(i < c for i in s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(share, abs=1e-12), (n, c, k)


def test_the_estimator_at_large_n_and_its_edges():
    assert pass_at_k(64, 0, 64) == 0.0 and pass_at_k(64, 1, 64) == 1.0 and pass_at_k(64, 64, 1) == 1.0
    assert pass_at_k(64, 8, 1) == pytest.approx(8 / 64)
    assert pass_at_k(1000, 3, 10) == pytest.approx(1 - math.prod((1000 - 3 - j) / (1000 - j) for j in range(10)))
    for bad in ((4, 5, 1), (4, 1, 0), (4, 1, 5), (4, -1, 1)):
        with pytest.raises(ValueError, match="need 0 <= c <= n"):
            pass_at_k(*bad)


def test_the_k_grid_doubles_up_to_n_and_ends_at_n():
    assert k_grid(1) == [1] and k_grid(4) == [1, 2, 4] and k_grid(6) == [1, 2, 4, 6]
    assert k_grid(64) == [1, 2, 4, 8, 16, 32, 64] and k_grid(100)[-2:] == [64, 100]
    assert curve([(1, 4), (0, 4)], [1, 2, 4]) == {"1": 0.125, "2": 0.25, "4": 0.5}


ROWS = [{"id": f"q{i}", "question": q, "answers": [a]}
        for i, (q, a) in enumerate([("2+3", "5"), ("7-4", "3"), ("10+1", "11"), ("9-9", "0")])]
RIGHT = {"2+3": 6, "7-4": 1, "10+1": 0, "9-9": 3}  # how many of each question's 6 samples are right


@pytest.mark.parametrize("in_flight", [4096, 6, 13])
def test_the_curve_pass_counts_each_items_correct_samples(hf_base, base_dir, monkeypatch, in_flight):
    """Whole, one row a chunk, or two rows a chunk (13 // 6): the same counts."""
    gold = {r["question"]: r["answers"][0] for r in ROWS}

    def respond(role, prompt, call, occurrence):  # noqa: ARG001
        q = prompt.removeprefix("plan: ").split("\n")[0]
        return f"<answer>{gold[q] if occurrence < RIGHT[q] else int(gold[q]) + 1}</answer>"

    monkeypatch.setattr(evaluation, "CURVE_EPISODES", in_flight)
    tok = AutoTokenizer.from_pretrained(base_dir)
    counts = evaluation.curve_eval(RuleEngine(hf_base, tok, respond), Codec(tok, TemplatesConfig()), ROWS, RewardSpec(),
                                   RolloutSpec(temperature=0.7), 6, seed=1)
    assert counts == {"q0": (6, 6), "q1": (1, 6), "q2": (0, 6), "q3": (3, 6)}


def _evaluation(run_dir, checkpoint, seed, counts, field="curve"):
    """A completed 07 evaluation whose items have these (correct, n) counts in predictions.jsonl."""
    d = run_dir / "07_evaluate" / checkpoint
    (d / "samples").mkdir(parents=True)
    n = len(counts)
    metrics = {"checkpoint": checkpoint, "n": n, "accuracy": 0.5, "accuracy_ci95": [0.0, 1.0], "format": 1.0,
               "answered": 1.0, "reward": 0.0, "turns": 2.0, "subtasks": 1.0, "tokens_planner": 10.0,
               "tokens_executor": 5.0}
    (d / "metrics.json").write_text(json.dumps(metrics))
    (d / "samples" / "predictions.jsonl").write_text("".join(
        json.dumps({"qid": f"t{i}", "answer": float(i % 2), f"{field}_correct": c, f"{field}_n": m}) + "\n"
        for i, (c, m) in enumerate(counts)))
    (d / "manifest.json").write_text(json.dumps({"stage": f"07_evaluate/{checkpoint}", "status": "completed",
                                                 "seed": seed, "config": {}}))


def test_08_draws_the_curves_and_finds_where_the_warmup_reaches_each_arm(tmp_path):
    """On 40 items of 4 samples each: grpo has half its items always right, half never (pass@k 0.5
    at every k); the warmup gets each item right once in 4 (pass@1 0.25, pass@2 0.5, pass@4 1).
    grpo − warmup is +0.25, 0, −0.5 at k = 1, 2, 4: the warmup reaches grpo at k = 2. Resampling
    grpo's items moves its share of always-right items: below 0.25 (k = 1) almost never, above 0.5
    (k = 4) about half the time, so the interval is 2 to 4. red (counted from its mean@k samples)
    is never right: the warmup reaches it at k = 1 on every resample."""
    run = tmp_path / "outputs" / "r"
    for seed in (1, 2):
        sd = run / f"seed_{seed}"
        _evaluation(sd, "grpo", seed, [(4, 4), (0, 4)] * 20)
        _evaluation(sd, "red", seed, [(0, 4)] * 40, field="sampled")  # counts from the mean@k pass work too
        _evaluation(sd, "sft_warmup", seed, [(1, 4)] * 40)
    res = run_compare(tmp_path, "--run_id", "r", "--resamples", "2000")
    assert res.returncode == 0, res.stderr
    out = run / "08_compare_runs"
    report = (out / "report.md").read_text()
    assert "## pass@k curves" in report and (out / "plots" / "pass_at_k.png").stat().st_size > 0
    assert "| 1 | 0.0000 (0.0000–0.0000) | 0.5000 (0.5000–0.5000) | 0.2500 (0.2500–0.2500) |" in report
    assert "| 4 | 0.0000 (0.0000–0.0000) | 0.5000 (0.5000–0.5000) | 1.0000 (1.0000–1.0000) |" in report
    grpo = next(line for line in report.splitlines() if line.startswith("| r | grpo | 2 |") and "k=4:" in line).split(" | ")
    assert grpo[3].startswith("+0.2500 (") and grpo[4].startswith("k=4: -0.5000 (") and grpo[5:] == ["2", "2 to 4", "2, 2 |"]
    lo, hi = (float(x) for x in grpo[3][9:-1].split("–"))  # about 0.25 ± 1.96 · sqrt(0.25 / 40 / 2)
    assert 0.12 < lo < 0.17 and 0.33 < hi < 0.38
    assert "| r | red | 2 | -0.2500 (-0.2500–-0.2500) | k=4: -1.0000 (-1.0000–-1.0000) | 1 | 1 to 1 | 1, 1 |" in report
    reached = json.loads((out / "manifest.json").read_text())["metrics"]["pass_at_k_reached"]
    assert reached == {"r:red": 1, "r:grpo": 2}


def test_08_says_when_the_warmup_never_reaches_an_arm_and_refuses_bad_counts(tmp_path):
    run = tmp_path / "outputs" / "r"
    _evaluation(run, "grpo", 1, [(2, 8)] * 10)
    _evaluation(run, "sft_warmup", 1, [(0, 8)] * 10)
    res = run_compare(tmp_path, "--run_id", "r")
    assert res.returncode == 0, res.stderr
    report = (run / "08_compare_runs" / "report.md").read_text()
    assert "| r | grpo | 1 | +0.2500 (+0.2500–+0.2500) | k=8: +1.0000 (+1.0000–+1.0000) | > 8 | > 8 to > 8 | > 8 |" in report
    bad = run / "07_evaluate" / "grpo" / "samples" / "predictions.jsonl"
    bad.write_text(bad.read_text().replace('"curve_correct": 2', '"curve_correct": 9', 1))
    res = run_compare(tmp_path, "--run_id", "r")  # its input changed: 08 runs again
    assert res.returncode == 1 and "predictions.jsonl" in res.stderr and "row 1" in res.stderr
    assert "curve_correct" in res.stderr and "9 correct of 8 samples" in res.stderr
    rows = bad.read_text().splitlines()
    row = json.loads(rows[2])
    del row["curve_correct"], row["curve_n"]
    bad.write_text("\n".join([rows[0].replace('"curve_correct": 9', '"curve_correct": 2'), rows[1], json.dumps(row)]
                             + rows[3:]) + "\n")
    res = run_compare(tmp_path, "--run_id", "r")  # a row without counts among counted ones is an error too
    assert res.returncode == 1 and "row 3" in res.stderr and "no sample counts" in res.stderr


def test_08_draws_the_curves_from_the_evaluations_sampled_deepest_and_names_the_rest(tmp_path):
    """Seed 1's warmup and grpo had 8 samples an item, seed 2's and fixed_sft's only 4: the curve
    runs to k = 8 on seed 1 (grpo 0.5 flat, the warmup 1 − C(7,k)/C(8,k) = k/8, reaching grpo at
    k = 4), and the report names the shallower evaluations, rather than cutting every curve at 4."""
    run = tmp_path / "outputs" / "r"
    _evaluation(run / "seed_1", "grpo", 1, [(8, 8), (0, 8)] * 10)
    _evaluation(run / "seed_1", "sft_warmup", 1, [(1, 8)] * 20)
    _evaluation(run / "seed_1", "fixed_sft", 1, [(4, 4)] * 20, field="sampled")
    _evaluation(run / "seed_2", "grpo", 2, [(0, 4)] * 20, field="sampled")
    _evaluation(run / "seed_2", "sft_warmup", 2, [(4, 4)] * 20, field="sampled")
    res = run_compare(tmp_path, "--run_id", "r", "--resamples", "200")
    assert res.returncode == 0, res.stderr
    report = (run / "08_compare_runs" / "report.md").read_text()
    assert "| k | grpo (1) | sft_warmup (1) |" in report and "| 8 | 0.5000 | 1.0000 |" in report
    assert ("Run r leaves out the evaluations with fewer samples an item than its 8: grpo seed 2 (4); "
            "fixed_sft seed 1 (4); sft_warmup seed 2 (4).") in report
    grpo = next(line for line in report.splitlines() if line.startswith("| r | grpo | 1 |")).split(" | ")
    assert grpo[3].startswith("+0.3750 (") and grpo[4].startswith("k=8: -0.5000 (") and grpo[5] == "4"
