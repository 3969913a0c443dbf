"""`python -m utils.run.diff`: two real runs of stages 00-02 that differ in one config key, diffed
stage by stage (utils/run/diff.py)."""
import json
import shutil

from helpers import run_stage
from utils.core.schema import DataConfig
from utils.data.synthetic import write_dataset
from utils.run.diff import main


def _runs(tmp_path) -> tuple:
    synth = tmp_path / "synth"
    write_dataset(DataConfig(n_train=60, n_val=10, n_test=20), synth)
    data = ["--set", f"data.path={synth}", "--set", "data.n_train=60", "--set", "data.n_val=10", "--set", "data.n_test=20"]
    runs = []
    for name, budget in (("a", 64), ("b", 48)):  # 01 reads the planner's budget, and writes the same rows
        out = tmp_path / name
        for stage in ("00_check_data", "01_prepare_dataset", "02_build_rewards"):
            assert run_stage(stage, out, *data, "--set", f"agent.max_new_tokens_planner={budget}") == 0
        runs.append(out / "t")
    return runs


def test_diff_names_the_config_key_digests_and_metrics_that_differ_and_nothing_else(tmp_path, capsys):
    a, b = _runs(tmp_path)
    capsys.readouterr()  # the stages' own lines
    assert main([str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "01_prepare_dataset:\n  config.agent.max_new_tokens_planner: A 64 | B 48  (B − A -16)\n" in out
    assert "02_build_rewards:\n  parents 01_prepare_dataset: A " in out  # 02's parent changed, not 02
    assert "outputs" not in out and "metrics" not in out  # the same rows under each run's own folder
    assert "00_check_data" not in out  # it reads nothing that differs: its digest, which covers the run's
    # folder, differs, and is not shown as a change of its children
    assert "started_at" not in out and "wall_seconds" not in out and "seal_sha256" not in out

    assert main([str(a), str(a), "--stage", "01"]) == 0  # a run against itself
    assert capsys.readouterr().out.endswith("no differences (times, memory, seals and warnings not compared: --all)\n")


def test_diff_of_a_copied_run_shows_times_only_with_all_and_counts_a_missing_stage(tmp_path, capsys):
    a, b = _runs(tmp_path)
    capsys.readouterr()  # the stages' own lines
    copy = tmp_path / "copy" / "t"
    shutil.copytree(a, copy)
    manifest = copy / "00_check_data" / "manifest.json"
    m = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**m, "wall_seconds": m["wall_seconds"] + 5}))
    assert main([str(a), str(copy)]) == 0  # the copy's paths still name the first run's folder
    assert main([str(a), str(copy), "--all"]) == 0  # shown, not counted
    assert "  wall_seconds: A " in capsys.readouterr().out
    manifest.write_text(json.dumps({**m, "metrics": {**m["metrics"], "rows_train": 59, "extra": 2.5}}))
    assert main([str(a), str(copy)]) == 1
    out = capsys.readouterr().out
    assert "00_check_data:\n  metrics.extra: only in B = 2.5\n  metrics.rows_train: A 60 | B 59  (B − A -1)\n" in out
    shutil.rmtree(copy / "02_build_rewards")
    assert main([str(a), str(copy)]) == 1
    assert "02_build_rewards: only in A" in capsys.readouterr().out


def test_diff_errors_name_the_run_or_the_file(tmp_path, capsys):
    a, _ = _runs(tmp_path)
    capsys.readouterr()
    assert main([str(a), str(tmp_path / "nowhere")]) == 2
    assert f"{tmp_path / 'nowhere'}: no such run folder" in capsys.readouterr().err
    bad = a / "01_prepare_dataset" / "manifest.json"
    bad.write_text("{not json")
    assert main([str(a), str(a)]) == 2
    assert f"{bad}: manifest is not valid JSON" in capsys.readouterr().err
