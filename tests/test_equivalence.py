"""08's equivalence verdicts (eval.equivalence_margin): the two one-sided tests against ±δ over seeds
and at one seed, computed by hand, and 08's report and manifest carrying them."""
import json

import pytest

from helpers import evaluation_dir as _evaluation, run_compare, seeded as _seeded
from utils.eval.stats import paired_test, verdict


def test_equivalence_over_seeds_by_hand():
    """TOST over seeds against ±0.03. Per-seed differences +0.005, +0.010, +0.015 (1, 2 and 3 wins of
    200): mean 0.01, sd 0.005, se 0.002887; the upper test t = (0.03 − 0.01)/se = 6.928 on 2 df, whose
    tail is ½(1 − t/√(t² + 2)) = 0.0101; the 90% interval 0.01 ± 2.920·se = 0.00157 to 0.01843, inside
    ±0.03. The difference test (t 3.46, p 0.074) cannot call it, so the verdict is equivalence."""
    a, b = _seeded({1: 1, 2: 2, 3: 3})
    t = paired_test(a, b, 200, margin=0.03)
    assert t["p_value"] == pytest.approx(0.0742, abs=5e-4) and not t["significant"]
    assert t["tost_p"] == pytest.approx(0.0101, abs=2e-4) and t["margin"] == 0.03
    assert t["ci90_low"] == pytest.approx(0.00157, abs=5e-5) and t["ci90_high"] == pytest.approx(0.01843, abs=5e-5)
    assert verdict(t["diff"], t["p_value"], tost_adjusted=t["tost_p"], margin=0.03) == "equivalent within ±0.03"
    # seeds that disagree (+0.5, +0.1, −0.3 on 20 items): mean 0.1, far from inside ±0.03
    wide = paired_test(*_seeded({1: 10, 2: 2, 3: -6}, 20), 200, margin=0.03)
    assert wide["tost_p"] > 0.5 and wide["ci90_low"] < -0.03 and wide["ci90_high"] > 0.03
    assert verdict(wide["diff"], wide["p_value"], tost_adjusted=wide["tost_p"], margin=0.03) == "no evidence either way"
    # without a margin nothing of the equivalence test is computed or reported
    assert "tost_p" not in paired_test(a, b, 200) and verdict(0.0, 0.9, tost_adjusted=0.001) == "no evidence either way"


def test_equivalence_at_one_seed_uses_the_item_bootstrap():
    """One seed: the bootstrap's tails beyond ±δ. 400 items where a wins 4 and loses 2 (diff 0.005, se
    about 0.006): no resample reaches ±0.03, so the p-value is its floor 1/(resamples + 1). 50 items
    where a wins 3 and loses 2 (diff 0.02, se about 0.045): most resamples lie past +0.03 or near it."""
    a = {(1, i): float(i < 4) for i in range(400)}
    b = {(1, i): float(4 <= i < 6) for i in range(400)}
    tight = paired_test(a, b, 999, margin=0.03)
    assert tight["test"] == "paired item bootstrap (1 seed)" and tight["tost_p"] == pytest.approx(1 / 1000)
    assert -0.03 < tight["ci90_low"] < tight["diff"] < tight["ci90_high"] < 0.03
    few = paired_test({(1, i): float(i < 3) for i in range(50)}, {(1, i): float(3 <= i < 5) for i in range(50)},
                      999, margin=0.03)
    assert few["tost_p"] > 0.3 and few["ci90_high"] > 0.03
    assert verdict(few["diff"], few["p_value"], tost_adjusted=few["tost_p"], margin=0.03) == "no evidence either way"


def test_08_reports_equivalence_within_the_declared_margin(tmp_path):
    """08 end to end with eval.equivalence_margin: red and grpo 1-3 items apart of 200 on three seeds
    read 'equivalent within ±0.03' with the 90% interval and the equivalence test in the table, and the
    margin is in 08's manifest (its hash); red against a warmup it beats by 0.5 stays 'better'."""
    run = tmp_path / "outputs" / "r"
    for seed, wins in ((1, 1), (2, 2), (3, 3)):
        sd = run / f"seed_{seed}"
        _evaluation(sd, "grpo", seed, [1.0] * 100 + [0.0] * 100)
        _evaluation(sd, "red", seed, [1.0] * (100 + wins) + [0.0] * (100 - wins))
        _evaluation(sd, "sft_warmup", seed, [0.0] * 200)
    res = run_compare(tmp_path, "--run_id", "r", "--set", "eval.equivalence_margin=0.03")
    assert res.returncode == 0, res.stderr
    out = run / "08_compare_runs"
    report = (out / "report.md").read_text()
    assert "90% CI" in report and "equivalence p (Holm)" in report and "δ = 0.03" in report
    row = next(line for line in report.splitlines() if line.startswith("| r | red − grpo"))
    assert "equivalent within ±0.03" in row
    assert next(line for line in report.splitlines() if line.startswith("| r | red − sft_warmup")).endswith("better |")
    assert json.loads((out / "manifest.json").read_text())["config"]["equivalence_margin"] == 0.03
