"""The memory preflight (utils/train/preflight.py): its estimate counts what the trainer really trains and
moves with each memory setting, and a stage whose estimate exceeds the machine's memory stops at once,
naming the setting, before it writes anything; `model.memory.preflight=false` runs it anyway."""
from __future__ import annotations

import math

import pytest

from helpers import run_rl_stage, run_stage, set_args
from utils.core.loader import load_run_config
from utils.train.preflight import GIB, check_memory, estimate, weight_shapes

HUGE = "model.memory.micro_batch_tokens=100000000"  # 10^8 tokens a micro-batch: terabytes of activations


def _cfg(*sets: str):
    return load_run_config("tiny-arith", "grpo", overrides=list(sets))


def test_the_policy_part_counts_the_parameters_the_trainer_trains(base_dir):
    from utils.train.policy import load_policy

    cfg = _cfg()
    model = load_policy(base_dir, cfg.model.lora, cfg.model.dtype)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    base = sum(p.numel() for n, p in model.named_parameters() if not p.requires_grad)
    parts = estimate(cfg, base_dir, engine=False, total_memory=24 * GIB)
    assert parts["policy"] == 4 * base + 16 * trained
    assert sum(1 for _ in weight_shapes(base_dir)) == sum(1 for n, _ in model.named_parameters() if "lora_" not in n)


def test_each_memory_setting_moves_its_own_part(base_dir):
    plain = estimate(_cfg("model.memory.micro_batch_tokens=4096"), base_dir, True, 24 * GIB)
    ckpt = estimate(_cfg("model.memory.micro_batch_tokens=4096", "model.memory.activation_checkpointing=true"),
                    base_dir, True, 24 * GIB)
    half = estimate(_cfg("model.memory.micro_batch_tokens=2048"), base_dir, True, 24 * GIB)
    kv = estimate(_cfg("model.memory.micro_batch_tokens=4096", "model.engine.kv_cache_gb=2.0"), base_dir, True, 24 * GIB)
    shared = estimate(_cfg("model.memory.micro_batch_tokens=4096", "model.engine.kv_cache_gb=0",
                           "model.engine.memory_share=0.25"), base_dir, True, 24 * GIB)
    full = estimate(_cfg("model.memory.micro_batch_tokens=4096", "model.lora.full_finetune=true"), base_dir, True,
                    24 * GIB)
    assert ckpt["update"] < plain["update"] and half["update"] < plain["update"]
    assert ckpt["policy"] == plain["policy"] and ckpt["engine"] == plain["engine"]
    assert kv["engine"] - plain["engine"] == pytest.approx((2.0 - 1.0) * GIB)  # tiny-arith's config holds 1.0
    assert shared["engine"] - plain["engine"] == pytest.approx(6 * GIB - 1.0 * GIB)  # a quarter of 24 GiB
    params = sum(math.prod(s) for s in weight_shapes(base_dir).values())
    assert full["policy"] == 20 * params  # every weight trained: itself, its gradient and two AdamW moments
    assert "engine" not in estimate(_cfg(), base_dir, False, 24 * GIB)


def test_short_memory_is_refused_with_the_setting_that_saves_most(base_dir):
    from utils.core.errors import StageError

    cfg = _cfg("model.memory.micro_batch_tokens=4096")
    need = check_memory("04_sft_warmup", cfg, base_dir, True, (64 * GIB, 64 * GIB))["total"]
    with pytest.raises(StageError, match="activation_checkpointing=true") as e:
        check_memory("04_sft_warmup", cfg, base_dir, True, (int(need * GIB / 4), 64 * GIB))
    assert str(e.value).startswith("04_sft_warmup: needs about") and "\n" not in str(e.value)
    ckpt = _cfg("model.memory.micro_batch_tokens=4096", "model.memory.activation_checkpointing=true")
    with pytest.raises(StageError, match="lower model.memory.micro_batch_tokens"):
        check_memory("04_sft_warmup", ckpt, base_dir, True, (1, 64 * GIB))
    assert check_memory("x", _cfg("model.device=cuda"), base_dir, True, (1, 1)) == {}  # the GPU path's own
    off = _cfg("model.memory.micro_batch_tokens=4096", "model.memory.preflight=false")
    assert check_memory("x", off, base_dir, True, (1, 64 * GIB))["total"] == pytest.approx(need)


@pytest.mark.slow
def test_a_stage_that_cannot_fit_stops_before_writing_and_the_override_runs_it(prepared, capsys):
    out, args = prepared
    assert run_stage("03_generate_sft_traces", out, *args) == 0
    assert run_stage("04_sft_warmup", out, *args, *set_args(HUGE, "warmup.steps=2")) != 0
    err = capsys.readouterr().err
    assert "04_sft_warmup: needs about" in err and "model.memory.activation_checkpointing=true" in err
    assert not (out / "t" / "04_sft_warmup").exists()  # stopped before its folder or manifest
    # the RL stage stops the same way before it reads a parent (none of 04's outputs exist)
    assert run_rl_stage("06_ablate_grpo_only", out, *args, *set_args(HUGE), default="grpo") != 0
    assert "06_ablate_grpo_only/grpo: needs about" in capsys.readouterr().err
    assert run_stage("04_sft_warmup", out, *args, *set_args(HUGE, "warmup.steps=2", "model.memory.preflight=false")) == 0
    assert (out / "t" / "04_sft_warmup" / "manifest.json").is_file()
