"""09_driver end to end with tiny settings: every numbered script in order, then skip-all on a second
run, and a config change that re-runs exactly the stages downstream of it."""
import json
import subprocess
import sys

from utils.config import ROOT
from utils.run_config import DataConfig
from utils.synthetic import write_dataset

TINY = ["data.n_train=40", "data.n_val=6", "data.n_test=6", "warmup.steps=6", "warmup.eval_every=0",
        "warmup.eval_size=3", "warmup.batch_size=8", "algorithm.rl.steps=2", "algorithm.rl.questions_per_step=2",
        "algorithm.rl.n_samples=2", "model.engine.name=hf", "wandb_mode=disabled"]


def _driver(out, data, *extra):
    sets = [x for s in TINY + [f"outputs_dir={out}", f"data.path={data}", *extra] for x in ("--set", s)]
    return subprocess.run([sys.executable, "09_driver.py", "--method", "red", "--run_id", "d", *sets],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)


def test_driver_runs_the_chain_then_skips_then_reruns_downstream(tmp_path):
    data = tmp_path / "synth"
    write_dataset(DataConfig(n_train=40, n_val=6, n_test=6), data)
    out = tmp_path / "outputs"
    first = _driver(out, data)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    for stage in ("00_check_data", "01_prepare_dataset", "02_build_rewards", "03_generate_sft_traces",
                  "04_sft_warmup", "05_train_red_grpo/red", "07_evaluate/base", "07_evaluate/sft", "07_evaluate/red"):
        m = json.loads((out / "d" / stage / "manifest.json").read_text())
        assert m["status"] == "completed", stage
    metrics = json.loads((out / "d" / "07_evaluate" / "red" / "metrics.json").read_text())
    assert set(metrics) >= {"accuracy", "accuracy_ci95", "format", "turns", "failures"}
    report = out / "d" / "08_compare_runs" / "report.md"
    assert f"report: {report}" in first.stdout
    assert "red − sft_warmup" in report.read_text()  # the paired test against the SFT starting point
    run_manifest = json.loads((out / "d" / "run_manifest.json").read_text())
    assert run_manifest["status"] == "completed" and len(run_manifest["stages"]) == 10
    assert all(s["action"] == "ran" and s["status"] == "completed" for s in run_manifest["stages"])

    second = _driver(out, data)
    assert second.returncode == 0
    assert second.stdout.count("skipped (up to date)") == 10 and "running" not in second.stdout
    assert [s["action"] for s in json.loads((out / "d" / "run_manifest.json").read_text())["stages"]] == ["skipped"] * 10
    third = _driver(out, data, "algorithm.rl.lr=0.001")  # read only by 05: 05, its evaluation and 08 re-run
    ran = [line.split(": running")[0].split("] ")[1] for line in third.stdout.splitlines() if ": running" in line]
    assert ran == ["05_train_red_grpo/red", "07_evaluate/red", "08_compare_runs"], third.stdout
