"""The shell entry points and the stage scripts, run as real subprocesses."""
import os
import subprocess
import sys
import time

import pytest

from utils.core.config import ROOT

STAGES = sorted(p.name for p in ROOT.glob("[0-9][0-9]_*.py"))


def _run(cmd, env=None, timeout=120):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_layout_has_every_numbered_stage():
    assert STAGES == ["00_check_data.py", "01_prepare_dataset.py", "02_build_rewards.py",
                      "03_generate_sft_traces.py", "04_sft_warmup.py", "05_train_red_grpo.py",
                      "06_ablate_grpo_only.py", "07_evaluate.py", "08_compare_runs.py", "09_driver.py"]
    for name in ("setup.sh", "download.sh", "requirements.txt", "README.md", ".ci/run"):
        assert (ROOT / name).is_file(), name


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_answers_help(stage):
    out = _run([sys.executable, stage, "--help"])
    assert out.returncode == 0 and "usage:" in out.stdout


def test_setup_second_run_has_nothing_to_do():
    out = _run(["bash", "setup.sh"], timeout=600)  # CI has just run it, so this is the no-op path
    assert out.returncode == 0, out.stderr
    assert "nothing to do" in out.stdout


def test_setup_rejects_unknown_flags():
    out = _run(["bash", "setup.sh", "--gpu"])
    assert out.returncode == 2 and "unknown argument '--gpu'" in out.stderr


@pytest.mark.parametrize("flag,value", [("--model", "Qwen/Qwen2.5-0.5B-Instruct"), ("--dataset", "gsm8k")])
def test_hub_download_fails_fast_and_clearly_when_unreachable(flag, value):
    t0 = time.time()
    # Port 9 (discard) on loopback refuses connections: an unreachable hub, deterministically.
    out = _run(["bash", "download.sh", flag, value], env={"HF_ENDPOINT": "http://127.0.0.1:9"})
    assert out.returncode == 3
    assert "hub at http://127.0.0.1:9 is unreachable" in out.stderr
    assert "point the config's `path` at them" in out.stderr
    assert time.time() - t0 < 60
    assert not (ROOT / "models" / "Qwen2.5-0.5B-Instruct").exists()


def test_unknown_dataset_name_is_rejected(tmp_path):
    out = _run(["bash", "download.sh", "--dataset", "gsm9k"], env={"HF_ENDPOINT": "http://127.0.0.1:9"})
    assert out.returncode == 2 and "unknown dataset 'gsm9k'; valid: finqa, gsm8k, hotpotqa" in out.stderr


def test_default_download_is_offline_and_idempotent(tmp_path):
    cfg = tmp_path / "tiny.yaml"
    data_dir = tmp_path / "synthetic"
    cfg.write_text(f"name: synthetic_arith\npath: {data_dir}\nn_train: 30\nn_val: 5\nn_test: 5\n")
    first = _run(["bash", "download.sh", "--data-config", str(cfg)], env={"HF_HUB_OFFLINE": "1"})
    assert first.returncode == 0, first.stderr
    assert "tiny-arith: artifacts/tiny-arith intact" in first.stdout
    snapshot = {p.name: p.read_bytes() for p in data_dir.iterdir()}
    second = _run(["bash", "download.sh", "--data-config", str(cfg)], env={"HF_HUB_OFFLINE": "1"})
    assert second.returncode == 0, second.stderr
    assert snapshot == {p.name: p.read_bytes() for p in data_dir.iterdir()}


def test_bad_data_config_names_the_file_and_key(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("name: synthetic_arith\nn_trian: 3\n")
    out = _run(["bash", "download.sh", "--data-config", str(cfg)])
    assert out.returncode == 2
    assert f"{cfg}: unknown key 'n_trian'; did you mean 'n_train'?" in out.stderr
