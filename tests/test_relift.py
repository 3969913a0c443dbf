"""ReLIFT (utils/train/methods/relift.py): the buffer of failed questions by hand, the method's config, and the
real trainer taking its SFT step when the buffer fills, the buffer surviving a checkpoint."""
import json
import math

import pytest
import torch

from helpers import give_gold_demos, make_trainer
from utils.agent.traces import OfflineSample
from utils.core.config import ConfigError
from utils.core.loader import load_run_config
from utils.reward.spec import RewardSpec
from utils.train.method_variants import active_variants
from utils.train.methods.relift import HardBuffer
from utils.train.state import TrainState
from utils.train.variants import StepData


def _step(groups: dict[str, list[float]]) -> StepData:
    rows = [{"id": q} for q in groups]
    scored = [{"answer": a} for answers in groups.values() for a in answers]
    return StepData(rows, [None] * len(scored), scored, [0.0] * len(scored))


def test_failed_questions_wait_newest_first_and_leave_by_the_buffers_size():
    demos = {q: OfflineSample([f"{q}a", f"{q}b"], "1", []) for q in ("q0", "q1", "q3")}
    state = TrainState()
    buffer = HardBuffer(demos, size=3, n=2, state=state)
    assert buffer.answers({"id": "q0"}, [0.0, 0.5]) == [0.0, 0.5]  # a group dynamic sampling drops: judged as is
    step = _step({"q1": [1.0, 0.0], "q3": [0.0, 0.0], "q2": [0.0, 0.0]})  # q2 has no demonstration
    buffer.regroup(step)
    assert state.methods["relift"] == ["q0", "q3"] and step.sft == [] and "relift_demos" not in step.notes
    step = _step({"q1": [0.5, 0.0]})
    buffer.regroup(step)  # the third failed question fills it: all three leave, their demonstrations trained
    assert state.methods["relift"] == [] and step.notes["relift_demos"] == ["q1a", "q1b", "q0a", "q0b", "q3a", "q3b"]
    assert buffer.metrics(step, None) == {"relift/buffer": 0, "relift/sft_step": 1.0}
    buffer = HardBuffer(demos, size=2, n=2, state=state)
    buffer.answers({"id": "q0"}, [0.0, 0.0])
    buffer.answers({"id": "q1"}, [0.0, 0.0])
    step = _step({"q3": [0.0, 0.0]})
    buffer.regroup(step)  # three wait, two leave: the newest (this step's, in the order judged), one stays
    assert step.notes["relift_demos"] == ["q0a", "q0b", "q1a", "q1b"] and state.methods["relift"] == ["q3"]


def test_a_kept_group_with_partial_credit_and_no_right_answer_enters_the_buffer_once():
    """With dynamic sampling and a partial-credit scorer (f1), a group with a signal but no fully right
    answer is judged by the sampler (`answers`) and kept: `regroup` must not note it a second time."""
    demos = {q: OfflineSample([f"{q}a"], "1", []) for q in ("q0", "q1")}
    state = TrainState()
    buffer = HardBuffer(demos, size=4, n=2, state=state)
    for q, answers in (("q0", [0.5, 0.2]), ("q1", [0.0, 0.0])):  # q0 kept (a signal), q1 dropped
        buffer.answers({"id": q}, answers)
    buffer.regroup(_step({"q0": [0.5, 0.2]}))  # only the kept group reaches the step
    assert state.methods["relift"] == ["q0", "q1"]
    buffer.regroup(_step({"q0": [0.5, 0.2]}))  # a later step without dynamic sampling: noted by regroup
    assert state.methods["relift"] == ["q0", "q0", "q1"]


def test_relift_refuses_more_than_one_rank():
    from types import SimpleNamespace

    from utils.core.errors import StageError

    buffer = HardBuffer({}, size=2, n=2, state=TrainState())
    buffer.check(SimpleNamespace(size=1))
    with pytest.raises(StageError, match=r"algorithm.relift needs one rank \(this run has 2\)"):
        buffer.check(SimpleNamespace(size=2))


def test_relift_is_its_own_method_and_turns_on_its_variant():
    alg = load_run_config(algorithm="relift").algorithm
    assert alg.relift.enabled and alg.relift.buffer_size == 4 and alg.sft.loss_coef == 1.0
    assert [type(v) for v in active_variants(alg, RewardSpec(), {"q1": object()})] == [HardBuffer]
    with pytest.raises(ConfigError, match="relift.enabled=true"):
        load_run_config(algorithm="fixed_sft", overrides=["algorithm.relift.enabled=true"])


def test_the_trainer_takes_an_sft_step_when_the_buffer_fills_and_keeps_it_in_its_checkpoint(
        hf_engine, protocol_adapter, tmp_path, base_dir):
    """Every question has its gold trace but a gold answer no rollout can give: every group fails, so a
    buffer of 3 fills at every step of 4 questions and its SFT step runs after the RL update."""
    cfg = load_run_config(algorithm="relift", overrides=[
        "algorithm.rl.steps=2", "algorithm.rl.questions_per_step=4", "algorithm.rl.n_samples=2",
        "algorithm.rl.dump_freq=0", "algorithm.rl.save_freq=1", "algorithm.rl.dynamic_sampling=0",
        "algorithm.relift.buffer_size=3"])
    trainer = make_trainer(cfg, hf_engine, protocol_adapter, tmp_path, base_dir)
    give_gold_demos(trainer, trainer.rows)
    for row in trainer.rows:
        row["answers"] = ["-123456789"]
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    steps = trainer.train()
    # step 1: 4 fail, 3 leave, 1 waits; step 2: 4 more, 3 leave, 2 wait
    assert [m["relift/buffer"] for m in steps] == [1, 2] and [m["relift/sft_step"] for m in steps] == [1.0, 1.0]
    for m in steps:
        assert m["train/accuracy"] == 0 and m["relift/sft_loss"] > 0 and m["relift/sft_skipped"] == 0
        assert "actor/sft_loss" not in m and math.isfinite(m["actor/loss"])  # no SFT term inside the RL update
    # the SFT step counts as an optimizer step of the RL step's, its demonstrations' tokens as SFT tokens
    # (utils/eval/compute.py): the logged counts sum to Adam's own step counter
    adam = {int(s["step"]) for s in trainer.opt.state_dict()["state"].values()}
    assert adam == {sum(m["train/optimizer_steps"] for m in steps)}, adam
    assert all(m["train/optimizer_steps"] == cfg.algorithm.rl.ppo_epochs + 1 and m["train/tokens_sft"] > 0
               for m in steps), steps
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before)  # only the SFT steps had a gradient
    saved = json.loads((trainer.ckpt_dir / "step_2" / "state.json").read_text())
    saved.pop("config_sha256")
    assert saved["methods"]["relift"] == trainer.state.methods["relift"] and len(saved["methods"]["relift"]) == 2
    assert TrainState.from_json(saved).methods["relift"] == saved["methods"]["relift"]
    # a checkpoint written before the buffer moved under `methods` resumes with it
    old = {**{k: v for k, v in saved.items() if k != "methods"}, "relift": ["q9", "q8"]}
    assert TrainState.from_json(old).methods == {"relift": ["q9", "q8"]}
