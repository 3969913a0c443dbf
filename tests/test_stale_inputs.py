"""Inputs that cannot go stale: a stage that loads the base model records the model folder's files
(utils/core/hashing.py model_identity), so replacing its weights makes the driver re-run exactly the
stages that read it and say why; and a generated dataset's setting that the files were not written
with is named by the dry run as what 00 will stop on."""
import shutil
import subprocess
import sys

from safetensors.torch import load_file, save_file

from helpers import TINY, run_stage, set_args
from utils.core.config import ROOT
from utils.core.schema import DataConfig
from utils.data.synthetic import write_dataset


def _dry_run(*settings: str, flags=()) -> str:
    done = subprocess.run([sys.executable, "09_driver.py", "--method", "grpo", "--run_id", "t", "--dry_run", *flags,
                           *set_args(*TINY, *settings)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def test_replacing_the_model_weights_reruns_the_stages_that_load_it(tmp_path):
    model, data, out = tmp_path / "model", tmp_path / "synth", tmp_path / "outputs"
    shutil.copytree(ROOT / "artifacts" / "tiny-arith", model)
    write_dataset(DataConfig(n_train=40, n_val=6, n_test=6), data)
    settings = (f"outputs_dir={out}", f"data.path={data}", f"model.path={model}")
    for stage in ("00_check_data", "01_prepare_dataset", "02_build_rewards", "03_generate_sft_traces"):
        assert run_stage(stage, out, *set_args(*TINY, *settings)) == 0, stage
    before = _dry_run(*settings)
    for stage in ("00_check_data", "01_prepare_dataset", "02_build_rewards", "03_generate_sft_traces"):
        assert f"{stage}: would skip (up to date" in before, before
    weights = next(model.glob("*.safetensors"))
    tensors = load_file(weights)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1e-3  # a re-converted model: same names, same size, other numbers
    save_file(tensors, weights, metadata={"format": "pt"})
    after = _dry_run(*settings)
    for stage in ("01_prepare_dataset", "03_generate_sft_traces"):  # they load the model
        assert f"{stage}: would run (base model changed: {model}: {weights.name} changed)" in after, after
    assert "00_check_data: would skip (up to date" in after  # reads the data alone
    assert "02_build_rewards: would run (after 01_prepare_dataset re-runs)" in after, after


def test_a_generator_setting_the_files_lack_is_named_before_anything_runs(tmp_path):
    from utils.data.gsm_symbolic import write_gsm_symbolic
    from utils.run.download import data_config

    cfg = data_config(ROOT / "configs" / "data" / "gsm_symbolic.yaml")
    cfg.n_train, cfg.n_val, cfg.n_test = 40, 6, 6  # TINY's sizes
    data = write_gsm_symbolic(cfg, tmp_path / "gs")
    settings = (f"outputs_dir={tmp_path / 'outputs'}", f"data.path={data}")
    plain = _dry_run(*settings, flags=["--data", "gsm_symbolic"])
    assert "00_check_data: would run (never ran)\n" in plain, plain
    moved = _dry_run(*settings, f"data.seed={cfg.seed + 1}", flags=["--data", "gsm_symbolic"])
    assert (f"00_check_data: would run (never ran; it will stop: {data / 'manifest.json'}: the gsm_symbolic files were "
            f"generated with other settings (data.seed is {cfg.seed + 1}, the files have {cfg.seed}); regenerate them: "
            f"bash download.sh --dataset gsm_symbolic") in moved, moved


def test_diff_names_the_model_file_that_differs():
    from utils.run.diff import compare_stage

    a = {"stage": "04_sft_warmup", "model": {"path": "models/x", "files": {"config.json": "a" * 64, "w.safetensors": "b" * 64}}}
    b = {"stage": "04_sft_warmup", "model": {"path": "models/x", "files": {"config.json": "a" * 64, "w.safetensors": "c" * 64}}}
    assert compare_stage(a, b, "04_sft_warmup") == ['  model w.safetensors: A "bbbbbbbbbbbb" | B "cccccccccccc"']
    assert compare_stage(a, a, "04_sft_warmup") == []
