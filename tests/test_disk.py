"""A full disk and a read-only folder, on a real small tmpfs: the stage fails with one line naming
the file, everything written before is untouched, no temporary file or lock is left, and the same
command succeeds once there is room. Needs permission to mount (root, as on this project's box);
skipped with the reason otherwise."""
import errno
import hashlib
import subprocess

import pytest
import torch

from helpers import run_stage
from utils.core.schema import DataConfig
from utils.data.synthetic import write_dataset

SETS = ["--set", "data.n_train=40", "--set", "data.n_val=6", "--set", "data.n_test=6", "--set", "wandb_mode=disabled"]


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip() or res.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def _fill(mnt, leave: int) -> None:
    """Fill the tmpfs until `leave` bytes are free."""
    import os

    st = os.statvfs(mnt)
    (mnt / "filler").write_bytes(b"\0" * (st.f_bavail * st.f_frsize - leave))


def _digests(root) -> dict:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_full_disk_and_read_only_folder_fail_cleanly(small_disk, tmp_path, capsys):
    data = tmp_path / "synth"
    write_dataset(DataConfig(n_train=40, n_val=6, n_test=6), data)
    args = ["--set", f"data.path={data}", *SETS]
    for stage in ("00_check_data", "01_prepare_dataset", "02_build_rewards"):
        assert run_stage(stage, small_disk, *args) == 0
    run = small_disk / "t"
    before = _digests(run)

    _fill(small_disk, 20_000)  # room for 03's first manifest, not for its traces
    capsys.readouterr()
    assert run_stage("03_generate_sft_traces", small_disk, *args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0], err
    assert str(run / "03_generate_sft_traces") in err[0]  # names the file it could not write
    after = _digests(run)
    assert {k: v for k, v in after.items() if not k.startswith("03_")} == before  # nothing earlier touched
    assert not [k for k in after if k.endswith(".tmp") or "/." in k or k == ".lock"], sorted(after)
    assert set(after) - set(before) <= {"03_generate_sft_traces/manifest.json"}
    if "03_generate_sft_traces/manifest.json" in after:
        assert '"status":"completed"' not in (run / "03_generate_sft_traces" / "manifest.json").read_text()

    (small_disk / "filler").unlink()
    assert run_stage("03_generate_sft_traces", small_disk, *args) == 0  # the same command, once there is room
    done = _digests(run)

    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    try:
        capsys.readouterr()
        assert run_stage("04_sft_warmup", small_disk, *args) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "Read-only file system" in err[0] and str(run) in err[0], err
        assert _digests(run) == done
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)


def test_a_checkpoint_that_does_not_fit_leaves_nothing_behind(small_disk, base_dir):
    from transformers import AutoModelForCausalLM

    from utils.core.checkpoint import save_checkpoint, save_weights

    model = AutoModelForCausalLM.from_pretrained(base_dir)  # 3.4 MB of weights on a 2 MB disk
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(OSError) as full:
        save_checkpoint(small_disk / "ckpt", model, opt, None, {"step": 1}, "sha")
    assert full.value.errno == errno.ENOSPC  # safetensors' own error, turned into the OSError run_main reports
    with pytest.raises(OSError) as full:
        save_weights(model, small_disk / "best")
    assert full.value.errno == errno.ENOSPC and full.value.filename == str(small_disk / "best.tmp")
    assert sorted(p.name for p in small_disk.iterdir()) == []
