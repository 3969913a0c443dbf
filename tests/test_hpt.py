"""HPT's switch (utils/train/methods/hpt.py): per question, its demonstration by SFT when at most `gate` rollouts
are right, GRPO otherwise; checked on a hand-made step and on two steps of the real trainer."""
import math

import pytest
import torch

from helpers import give_gold_demos, make_trainer
from utils.agent.traces import OfflineSample
from utils.core.config import ConfigError
from utils.core.loader import load_run_config
from utils.reward.spec import RewardSpec
from utils.train.method_variants import active_variants
from utils.train.methods.hpt import DemoSwitch
from utils.train.variants import StepData


def _step(answers: list[list[float]]) -> StepData:
    rows = [{"id": f"q{g}"} for g in range(len(answers))]
    scored = [{"answer": a} for group in answers for a in group]
    return StepData(rows, [None] * len(scored), scored, [0.0] * len(scored))


def test_a_question_switches_to_its_demonstration_when_at_most_gate_rollouts_are_right():
    demos = {"q0": OfflineSample(["d0a", "d0b"], "1", []), "q1": OfflineSample(["d1"], "1", []),
             "q3": OfflineSample(["d3"], "1", [])}
    step = _step([[0.0, 0.0, 0.5], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    DemoSwitch(demos, gate=0, n=3).regroup(step)
    # q0: none right (0.5 is not right) -> its demonstration; q1 has one right; q2 has no demonstration
    assert step.replaced == {0, 1, 2} and step.sft == ["d0a", "d0b"] and step.notes["hpt"] == 1
    step = _step([[0.0, 0.0, 0.5], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    DemoSwitch(demos, gate=1, n=3).regroup(step)  # gate 1: one right rollout still switches
    assert step.replaced == {0, 1, 2, 3, 4, 5} and step.sft == ["d0a", "d0b", "d1"]
    step = _step([[1.0, 0.0, 0.0]])
    DemoSwitch(demos, gate=0, n=3).regroup(step)
    assert step.replaced == set() and step.sft == []  # nothing switched: no SFT rows this step


def test_a_switching_group_carries_a_signal_for_dynamic_sampling():
    switch = DemoSwitch({"q0": OfflineSample([], "1", [])}, gate=0, n=3)
    assert switch.answers({"id": "q0"}, [0.0, 0.0, 0.0]) == [0.0, 0.0, 1.0]  # kept: unequal answers
    assert switch.answers({"id": "q0"}, [1.0, 0.0, 0.0]) == [1.0, 0.0, 0.0]  # RL as usual
    assert switch.answers({"id": "q9"}, [0.0, 0.0, 0.0]) == [0.0, 0.0, 0.0]  # no demonstration: dropped


def test_hpt_is_its_own_method_and_turns_on_its_variant():
    alg = load_run_config(algorithm="hpt").algorithm
    assert alg.hpt.enabled and alg.hpt.gate == 0 and alg.sft.loss_coef == 1.0 and alg.red.G == 1.0
    assert [type(v) for v in active_variants(alg, RewardSpec(), {"q1": object()})] == [DemoSwitch]
    assert active_variants(load_run_config(algorithm="fixed_sft").algorithm, RewardSpec(), {"q1": object()}) == []
    with pytest.raises(ConfigError, match="hpt.enabled=true"):
        load_run_config(algorithm="fixed_sft", overrides=["algorithm.hpt.enabled=true"])


def _hpt_trainer(hf_engine, protocol_adapter, tmp_path, base_dir, every: int):
    """An HPT trainer whose every `every`-th question has its gold trace as demonstration; gate 3 of 3
    samples, so each question with one switches; no dynamic sampling, so a step is its 4 questions."""
    cfg = load_run_config(algorithm="hpt", overrides=[
        "algorithm.rl.steps=2", "algorithm.rl.questions_per_step=4", "algorithm.rl.n_samples=3",
        "algorithm.rl.dump_freq=0", "algorithm.rl.save_freq=100", "algorithm.hpt.gate=3",
        "algorithm.rl.dynamic_sampling=0"])
    trainer = make_trainer(cfg, hf_engine, protocol_adapter, tmp_path, base_dir)
    give_gold_demos(trainer, trainer.rows[::every])
    return trainer


def test_the_trainer_trains_switched_demonstrations_beside_the_other_groups_rollouts(hf_engine, protocol_adapter,
                                                                                    tmp_path, base_dir):
    trainer = _hpt_trainer(hf_engine, protocol_adapter, tmp_path, base_dir, every=2)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    steps = trainer.train()
    assert len(trainer.offline) == 20  # half the questions have a demonstration
    for m in steps:
        switched = m["hpt/switched_groups"]
        assert ("actor/sft_loss" in m) == (switched > 0) and ("actor/pg_loss" in m) == (switched < 4)
        assert m["train/skipped_nonfinite"] == 0
    assert any(0 < m["hpt/switched_groups"] < 4 for m in steps)  # a step with both kinds of rows
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before)


def test_a_step_whose_every_question_switches_trains_its_demonstrations_alone(hf_engine, protocol_adapter, tmp_path,
                                                                             base_dir):
    trainer = _hpt_trainer(hf_engine, protocol_adapter, tmp_path, base_dir, every=1)
    red_before = dict(trainer.state.red)
    for m in trainer.train():
        assert m["hpt/switched_groups"] == 4 and "actor/pg_loss" not in m
        assert m["actor/sft_loss"] > 0 and math.isfinite(m["actor/loss"]) and m["train/skipped_nonfinite"] == 0
    assert trainer.state.red == red_before  # no RL tokens: RED's entropy state has nothing to fold
