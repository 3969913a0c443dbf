"""The `joint` arm (configs/algorithms/joint.yaml): RED co-training from the base model, no warmup. Its
config (the method's RL settings over the regime's), the RL stage's learning-rate schedule, and 05
training it from the base without reading 04."""
import json
import math

import pytest

from helpers import manifest, run_rl_stage, run_stage, set_args
from utils.core.config import ConfigError
from utils.core.loader import load_run_config
from utils.train.grpo_trainer import GrpoTrainer


def test_joint_starts_from_the_base_at_the_warmups_schedule_and_red_keeps_the_regimes():
    joint = load_run_config(algorithm="joint").algorithm
    red = load_run_config(algorithm="red").algorithm
    assert joint.rl.init == "base" and red.rl.init == "warmup"
    # the method's own RL settings go over the regime's (imperfect_teacher: 32 questions, 2 passes, lr 4e-4)
    assert (joint.rl.steps, joint.rl.questions_per_step, joint.rl.ppo_epochs) == (860, 2, 1)
    assert (joint.rl.lr, joint.rl.lr_warmup_steps, joint.rl.lr_decay_start, joint.rl.final_lr_ratio) == \
        (5e-3, 30, 250, 0.05)
    assert (red.rl.steps, red.rl.questions_per_step, red.rl.ppo_epochs, red.rl.lr) == (30, 32, 2, 4e-4)
    # what is not the method's stays the regime's, and RED's weights are red's
    assert (joint.rl.min_subtasks, joint.rl.max_subtasks, joint.rl.temperature) == (2, 4, red.rl.temperature)
    assert joint.rl.dynamic_sampling == 0 and red.rl.dynamic_sampling == 2  # no refill can help the bare base
    assert (joint.sft.loss_coef, joint.red.G, joint.sft.batch_size) == (red.sft.loss_coef, red.red.G, 32)
    with pytest.raises(ConfigError, match="rl.init=base"):  # red from the base is joint, not red
        load_run_config(algorithm="red", overrides=["algorithm.rl.init=base"])
    with pytest.raises(ConfigError, match="kl_coef"):  # no warmup adapter to be the KL reference
        load_run_config(algorithm="joint", overrides=["algorithm.rl.kl_coef=0.01"])


class _Opt:
    param_groups = [{"lr": None}]


class _State:
    step = 0


@pytest.mark.parametrize("method", ["joint", "grpo"])
def test_the_rl_learning_rate_warms_up_then_decays_on_a_cosine(method):
    cfg = load_run_config(algorithm=method)
    trainer = GrpoTrainer.__new__(GrpoTrainer)  # the schedule reads the config and the step alone
    trainer.alg, trainer.opt, trainer.state = cfg.algorithm, _Opt(), _State()

    def lr(step):
        trainer.state.step = step
        return trainer._set_lr()

    if method == "grpo":  # the regime's 5 warmup steps, then constant: step s of 5 at 4e-4 · (s + 1) / 5
        assert [lr(s) for s in (0, 4, 5, 29)] == pytest.approx([0.8e-4, 4e-4, 4e-4, 4e-4])
        return
    assert lr(0) == pytest.approx(5e-3 / 30) and lr(29) == pytest.approx(5e-3) and lr(250) == pytest.approx(5e-3)
    # cosine from step 250 to the last (860): halfway at 555, 0.05 · 5e-3 at 860
    assert lr(555) == pytest.approx(5e-3 * (0.05 + 0.95 * 0.5))
    assert lr(860) == pytest.approx(2.5e-4)
    assert trainer.opt.param_groups[0]["lr"] == pytest.approx(2.5e-4)


def test_05_trains_joint_from_the_base_without_reading_the_warmup(prepared):
    out, args = prepared
    assert run_stage("03_generate_sft_traces", out, *args) == 0
    rl = set_args("algorithm.rl.steps=3", "algorithm.rl.questions_per_step=2", "algorithm.rl.n_samples=2",
                  "algorithm.rl.lr_warmup_steps=1", "algorithm.rl.lr_decay_start=1", "algorithm.sft.batch_size=4",
                  "model.engine.name=hf", "wandb_mode=disabled")
    assert run_rl_stage("05_train_red_grpo", out, *args, "--algorithm", "joint", *rl) == 0
    assert not (out / "t" / "04_sft_warmup").exists()  # no warmup ran, and none was read
    m = manifest(out, "05_train_red_grpo/joint")
    assert m["status"] == "completed" and "04_sft_warmup" not in json.dumps(m["inputs"])
    assert "sft_traces.jsonl" in json.dumps(m["inputs"])
    steps = [json.loads(x) for x in (out / "t" / "05_train_red_grpo" / "joint" / "metrics.jsonl").read_text().splitlines()]
    # lr 5e-3: step 0 ends the one-step warmup, the cosine starts at step 1 and reaches 0.525 of the peak at step 2
    assert [s["actor/lr"] for s in steps] == pytest.approx([5e-3, 5e-3, 5e-3 * 0.525])
    assert all(s["actor/sft_loss"] > 0 and math.isfinite(s["actor/loss"]) for s in steps)
    # from the bare base: the demonstrations are far from fitted, and no answer is right
    assert steps[0]["actor/sft_loss"] > 5 and steps[0]["train/accuracy"] == 0
    assert (out / "t" / "05_train_red_grpo" / "joint" / "final_adapter" / "adapter_config.json").is_file()
