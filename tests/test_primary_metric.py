"""The study's primary metric (eval.primary, eval.samples): mean@k and pass@k at the rollout
temperature from 07, on a rule engine whose right answers are known, and 08's paired tests on
the metric the evaluations declare."""
import json

import pytest
from transformers import AutoTokenizer

from scripted import RuleEngine
from helpers import run_compare, run_stage
from utils.agent.rollout import Codec, RolloutSpec
from utils.core.schema import TemplatesConfig
from utils.eval.evaluation import sampled_eval
from utils.reward.spec import RewardSpec

ROWS = [{"id": f"q{i}", "question": q, "answers": [a]}
        for i, (q, a) in enumerate([("2+3", "5"), ("7-4", "3"), ("10+1", "11"), ("9-9", "0")])]
RIGHT = {"2+3": 4, "7-4": 1, "10+1": 0, "9-9": 2}  # how many of each question's 4 samples are right


def test_mean_and_pass_at_k_by_hand(hf_base, base_dir):
    """Samples 0..RIGHT[q]-1 of question q answer correctly, the others one off: mean@4 is
    (4/4 + 1/4 + 0/4 + 2/4) / 4 = 0.4375, pass@4 is 3 of 4 questions = 0.75."""
    gold = {r["question"]: r["answers"][0] for r in ROWS}

    def respond(role, prompt, call, occurrence):  # noqa: ARG001
        q = prompt.removeprefix("plan: ").split("\n")[0]
        return f"<answer>{gold[q] if occurrence < RIGHT[q] else int(gold[q]) + 1}</answer>"

    tok = AutoTokenizer.from_pretrained(base_dir)
    engine = RuleEngine(hf_base, tok, respond)
    summary, per_item = sampled_eval(engine, Codec(tok, TemplatesConfig()), ROWS, RewardSpec(),
                                     RolloutSpec(temperature=0.7), 4, seed=1)
    assert summary == {"mean@4": pytest.approx(0.4375), "pass@4": pytest.approx(0.75)}
    assert {q: sum(v) for q, v in per_item.items()} == {"q0": 4.0, "q1": 1.0, "q2": 0.0, "q3": 2.0}


def _evaluation(run_dir, checkpoint, seed, greedy, mean_at_k, primary="mean_at_k"):
    d = run_dir / "07_evaluate" / checkpoint
    (d / "samples").mkdir(parents=True)
    n = len(greedy)
    metrics = {"checkpoint": checkpoint, "n": n, "accuracy": sum(greedy) / n, "accuracy_ci95": [0.0, 1.0],
               "format": 1.0, "answered": 1.0, "reward": 0.0, "turns": 2.0, "subtasks": 1.0, "tokens_planner": 10.0,
               "tokens_executor": 5.0, "primary": primary, "samples": 4, "sample_temperature": 0.7,
               "mean@4": sum(mean_at_k) / n, "mean_at_k_ci95": [0.0, 1.0], "pass@4": 0.5}
    (d / "metrics.json").write_text(json.dumps(metrics))
    (d / "samples" / "predictions.jsonl").write_text("".join(
        json.dumps({"qid": f"t{i}", "answer": g, "mean_at_k": m}) + "\n" for i, (g, m) in enumerate(zip(greedy, mean_at_k))))
    (d / "manifest.json").write_text(json.dumps({"stage": f"07_evaluate/{checkpoint}", "status": "completed",
                                                 "seed": seed, "config": {}}))


def test_08_tests_the_declared_primary_metric(tmp_path):
    """Greedy answers are the same for both arms; mean@4 differs by +0.25 on every item of every
    seed, with a per-seed wobble (0.20, 0.25, 0.30): the paired test must see mean@4's +0.25."""
    run = tmp_path / "outputs" / "r"
    for seed, gap in ((1, 0.20), (2, 0.25), (3, 0.30)):
        sd = run / f"seed_{seed}"
        _evaluation(sd, "grpo", seed, [1.0, 0.0] * 10, [0.5] * 20)
        _evaluation(sd, "sft_warmup", seed, [1.0, 0.0] * 10, [0.5 - gap] * 20)
    res = run_compare(tmp_path, "--run_id", "r")
    assert res.returncode == 0, res.stderr
    report = (run / "08_compare_runs" / "report.md").read_text()
    assert "Primary metric of the paired tests: **mean@4 at temperature 0.7**." in report
    assert "| r | grpo − sft_warmup | 3 | 60 | 0.2500 |" in report  # the mean@4 gap; greedy's is 0
    assert "### Sampled at the rollout temperature" in report


def test_08_refuses_a_run_whose_evaluations_disagree_on_the_primary_metric(tmp_path):
    run = tmp_path / "outputs" / "r"
    _evaluation(run, "grpo", 1, [1.0, 0.0], [0.5, 0.5])
    _evaluation(run, "sft_warmup", 1, [1.0, 0.0], [0.5, 0.5], primary="greedy")
    res = run_compare(tmp_path, "--run_id", "r")
    assert res.returncode == 1 and "declare different primary metrics" in res.stderr


def test_07_refuses_mean_at_k_without_samples(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        run_stage("07_evaluate", tmp_path, "--set", "eval.primary=mean_at_k", "--set", "eval.samples=0")
    assert exc.value.code == 2 and "eval.primary=mean_at_k needs eval.samples > 0" in capsys.readouterr().err


def test_07_writes_the_sampled_metrics_and_per_item_scores(prepared):
    """07 on the bare base (it does not know the protocol, so every sample scores 0) with 3 samples
    per item and a curve pass of 5: the figures, the CI, the temperature, each item's 3 scores and
    both passes' counts land where 08 reads them."""
    out, args = prepared
    assert run_stage("07_evaluate", out, *args, "--checkpoint", "base", "--limit", "4", "--set", "model.engine.name=hf",
                     "--set", "eval.samples=3", "--set", "eval.primary=mean_at_k", "--set", "eval.curve_samples=5") == 0
    d = out / "t" / "07_evaluate" / "base"
    m = json.loads((d / "metrics.json").read_text())
    assert (m["primary"], m["samples"], m["sample_temperature"]) == ("mean_at_k", 3, 0.7)
    assert m["mean@3"] == 0.0 and m["pass@3"] == 0.0 and m["mean_at_k_ci95"] == [0.0, 0.0]
    preds = [json.loads(x) for x in (d / "samples" / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 4 and all(p["sampled"] == [0.0, 0.0, 0.0] and p["mean_at_k"] == 0.0 for p in preds)
    assert m["pass_at_k"] == {"1": 0.0, "2": 0.0, "3": 0.0} and m["curve_samples"] == 5
    assert m["pass_at_k_curve"] == {"1": 0.0, "2": 0.0, "4": 0.0, "5": 0.0}
    assert all((p["sampled_correct"], p["sampled_n"], p["curve_correct"], p["curve_n"]) == (0, 3, 0, 5) for p in preds)
    config = json.loads((d / "manifest.json").read_text())["config"]
    assert config["eval"] == {"samples": 3, "primary": "mean_at_k", "curve_samples": 5}
    assert config["algorithm"]["rl"]["temperature"] == 0.7
