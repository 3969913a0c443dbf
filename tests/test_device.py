"""model.device: the trainers' policy and every batch tensor go to one device, each local rank of a
multi-process launch is given its own GPU, and asking for a GPU this machine lacks fails before any
output is written. The GPU itself is untested here: "meta", torch's device without storage, stands
in for a second device to show that nothing stays behind on the CPU."""
import os
import re
import subprocess
import sys
from dataclasses import fields

import pytest
import torch

from helpers import free_port
from utils.agent.episode import Example
from utils.core.config import ROOT, ConfigError
from utils.core.schema import LoraConfig
from utils.train.batch import RlBatch, build_rl_batch
from utils.train.policy import load_policy, policy_device, sft_batch
from utils.train.world import join_world, pin_gpu


def test_each_local_rank_sees_only_its_own_gpu():
    env = {"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    assert pin_gpu(env) == "1" and env["CUDA_VISIBLE_DEVICES"] == "1"
    env = {"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "4, 6,7"}
    assert pin_gpu(env) == "6" and env["CUDA_VISIBLE_DEVICES"] == "6"  # the rank's entry of the user's list
    one = {"CUDA_VISIBLE_DEVICES": "3"}
    assert pin_gpu(dict(one)) is None  # one process: its GPUs are left as they are
    assert pin_gpu({"LOCAL_WORLD_SIZE": "1", "LOCAL_RANK": "0", **one}) is None
    with pytest.raises(ConfigError, match="needs a GPU per rank; CUDA_VISIBLE_DEVICES=3 names 1"):
        pin_gpu({"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "0", **one})
    with pytest.raises(ConfigError, match="CUDA_VISIBLE_DEVICES= names 0"):  # set but empty: no GPU
        pin_gpu({"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.skipif(torch.cuda.is_available(), reason="this check is for a machine without a GPU")
def test_cuda_without_a_gpu_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match="model.device=cuda but torch .* sees no GPU"):
        join_world("cuda")
    for stage in ("04_sft_warmup.py", "05_train_red_grpo.py"):
        done = subprocess.run([sys.executable, stage, "--set", f"outputs_dir={tmp_path}", "--set", "model.device=cuda",
                               "--run_id", "gpu"], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode != 0 and "model.device=cuda but torch" in done.stderr, done.stderr[-2000:]
        assert not any(tmp_path.rglob("*")), sorted(tmp_path.rglob("*"))  # no directory, lock or manifest
    assert join_world("cpu").size == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="this check is for a machine without a GPU")
def _launch(script, tmp_path, *args):
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "configs/accelerate/gpu_node.yaml",
           "--num_processes", "2", "--main_process_port", str(free_port()), script, *args]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": "5,3", "PYTHONPATH": str(ROOT)})
    return done.returncode, done.stdout + done.stderr


def test_the_gpu_node_config_gives_each_rank_its_own_gpu(tmp_path):
    """The shipped GPU-node config, launched as two ranks with the user's CUDA_VISIBLE_DEVICES:
    each rank is pinned to its own entry, and a stage asking for cuda stops before writing (here,
    where torch finds no GPU)."""
    probe = tmp_path / "probe.py"
    probe.write_text("import os, pathlib, sys\nfrom utils.train.world import pin_gpu\n"  # a file per rank: their
                     "pathlib.Path(sys.argv[1], os.environ['LOCAL_RANK']).write_text(str(pin_gpu(os.environ)))\n")
    code, said = _launch(str(probe), tmp_path, str(tmp_path))  # prints would interleave on one pipe
    assert code == 0, said[-3000:]
    assert (tmp_path / "0").read_text() == "5" and (tmp_path / "1").read_text() == "3"
    out = tmp_path / "outputs"
    code, said = _launch("04_sft_warmup.py", tmp_path, "--set", f"outputs_dir={out}", "--set", "model.device=cuda")
    # the first rank to fail has the launcher stop the other, which may not get to say its line
    assert code != 0 and re.search(r"sees no GPU \(CUDA_VISIBLE_DEVICES=[53]\)", said), said[-3000:]
    assert not out.exists()


def test_the_policy_and_its_batches_share_one_device(base_dir):
    model = load_policy(base_dir, LoraConfig(rank=8, alpha=16), device="meta")
    assert policy_device(model).type == "meta"
    assert {p.device.type for p in model.parameters()} == {"meta"}  # base and adapter weights alike
    examples = [Example("q1", "planner", [5, 6, 7], [0, 1, 1]), Example("q2", "executor", [5, 6], [0, 1])]
    assert [t.device.type for t in sft_batch(examples, 0, "meta")] == ["meta"] * 3
    assert [t.device.type for t in sft_batch(examples, 0)] == ["cpu"] * 3  # the default stays on the CPU
    batch = build_rl_batch([], torch.zeros(0), 0, offline=[(e, 0.5, 0.25) for e in examples],
                           turn_bonus=[])
    moved = batch.to("meta")
    tensors = {f.name: getattr(moved, f.name) for f in fields(moved)
               if isinstance(getattr(moved, f.name), torch.Tensor)}
    assert set(tensors) == {"ids", "attn", "mask", "sampler_lp", "adv", "offline", "accuracy", "token_adv", "episode"}
    assert {t.device.type for t in tensors.values()} == {"meta"}
    assert moved.roles == batch.roles and batch.ids.device.type == "cpu"  # a copy: the CPU batch is kept
    without = RlBatch(batch.ids, batch.attn, batch.mask, batch.sampler_lp, batch.adv, batch.roles)
    assert without.to("meta").token_adv is None  # optional fields stay absent
