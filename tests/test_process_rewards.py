"""Process rewards (CDRA): the gold-chain verifier and the judge PRM on hand-made episodes with
known answers, group-normalised discounted step advantages, per-token advantages in the RL batch,
and the trainer with the verifier on."""
import math

import pytest
import torch
from transformers import AutoTokenizer

from helpers import make_trainer, REGIME_D
from utils.agent.episode import Episode, Segment
from utils.agent.rollout import Codec
from utils.agent.traces import episode_from_trace, make_trace
from utils.core.config import ConfigError
from utils.core.schema import ProcessRewardConfig
from utils.core.loader import load_run_config
from utils.reward.process import JudgePRM, expected_steps, parse_verdict, verifier_rewards
from utils.reward.spec import RewardSpec
from utils.train.batch import build_rl_batch
from utils.train.losses import policy_loss, process_advantages

ROW = {"id": "q", "question": "12+7*3", "answers": ["57"],
       "meta": {"steps": [{"task": "12+7", "result": 19}, {"task": "19*3", "result": 57}]}}


def _episode(turns: list[tuple[str, str | None]]) -> Episode:
    """Planner turns, each (its text, the executor's answer or None)."""
    ep = Episode("q", ROW["question"], ["57"], 0, status="answered")
    for k, (text, answer) in enumerate(turns):
        ep.segments.append(Segment("planner", k, [], [1], [0.0], text, "stop"))
        if answer is not None:
            ep.segments.append(Segment("executor", k, [], [1], [0.0], f"<think>x</think><answer>{answer}</answer>",
                                       "stop"))
    return ep


@pytest.mark.parametrize("turns, want", [
    ([("<think>a</think><task>12+7</task>", "19"), ("<think>b</think><task>19*3</task>", "57"),
      ("<think>c</think><answer>57</answer>", None)], [1.0, 1.0, None]),                 # the gold chain
    ([("<think>a</think><task>12+7</task>", "18"), ("<think>b</think><task>18*3</task>", "54"),
      ("<think>c</think><answer>54</answer>", None)], [1.0, 1.0, None]),                 # uses what came back
    ([("<think>a</think><task>12+7</task>", "18"), ("<think>b</think><task>19*3</task>", "57"),
      ("<think>c</think><answer>57</answer>", None)], [1.0, 0.0, None]),                 # ignores the result
    ([("<think>a</think><task> 12 + 8 </task>", "20"), ("<think>b</think><answer>20</answer>", None)],
     [0.0, None]),                                                                       # a wrong first step
    ([("<think>a</think><task>12+7</task>", "19"), ("<think>b</think><task>19*3</task>", "57"),
      ("<think>c</think><task>57+0</task>", "57"), ("<think>d</think><answer>57</answer>", None)],
     [1.0, 1.0, 0.0, None]),                                                             # a step past the chain
    ([("no tags at all", None)], [None]),                                                # malformed: no step
])
def test_verifier_on_hand_made_episodes(turns, want):
    assert verifier_rewards(_episode(turns), ROW) == want


def test_verifier_without_a_gold_decomposition_gives_nothing():
    ep = _episode([("<think>a</think><task>12+7</task>", "19"), ("<think>b</think><answer>19</answer>", None)])
    assert verifier_rewards(ep, {**ROW, "meta": {}}) == [None, None]
    # steps that do not chain (lookups): the gold task itself is expected
    assert expected_steps([("capital of X", "Paris"), ("population of Y", "3")], {0: "Rome"}) == [
        "capital of X", "population of Y"]


def test_process_advantages_by_hand():
    # one group of two: step rewards [1, 1, -] and [0, -]; mean 2/3, unbiased std sqrt(1/3)
    got = process_advantages([[1.0, 1.0, None], [0.0, None]], group_size=2, gamma=1.0)
    up, down = (1 / 3) / math.sqrt(1 / 3), -(2 / 3) / math.sqrt(1 / 3)
    assert got[0] == pytest.approx([2 * up, up, 0.0], abs=1e-5)
    assert got[1] == pytest.approx([down, 0.0], abs=1e-5)
    half = process_advantages([[1.0, 1.0, None], [0.0, None]], group_size=2, gamma=0.5)
    assert half[0] == pytest.approx([up + 0.5 * up, up, 0.0], abs=1e-5)
    # equal step rewards, a single one, or none: nothing to learn from
    assert process_advantages([[1.0], [1.0, None]], 2, 1.0) == [[0.0], [0.0, 0.0]]
    assert process_advantages([[1.0], [None]], 2, 1.0) == [[0.0], [0.0]]
    # groups are normalised apart: the second group's values do not move the first's
    two = process_advantages([[1.0], [0.0], [1.0], [1.0]], 2, 1.0)
    assert two[2:] == [[0.0], [0.0]] and two[0][0] == pytest.approx(-two[1][0])


@pytest.mark.parametrize("reply, verdict", [("yes", 1.0), (" Yes, it is", 1.0), ("no.", 0.0), ("NO yes", 0.0),
                                            ("maybe", None), ("", None), ("yesterday", None)])
def test_judge_verdicts(reply, verdict):
    assert parse_verdict(reply) == verdict


def test_per_token_advantages_follow_the_planner_turns(base_dir):
    codec = Codec(AutoTokenizer.from_pretrained(base_dir), load_run_config().model.templates)
    ep = episode_from_trace(make_trace("a", "3+4-2", [("3+4", "7"), ("7-2", "5")], "5"), codec)
    batch = build_rl_batch([ep], torch.tensor([0.5]), 0, turn_bonus=[[1.0, -2.0, 0.25]])
    planner = batch.roles.index("planner")
    segs = [s for s in ep.segments if s.role == "planner"]
    for seg, bonus in zip(segs, (1.0, -2.0, 0.25)):  # shifted by one: position t predicts token t+1
        span = batch.token_adv[planner, len(seg.context_ids) - 1:len(seg.context_ids) - 1 + len(seg.gen_ids)]
        assert torch.all(span == 0.5 + bonus)
    trained = batch.mask[planner] == 1
    assert set(batch.token_adv[planner][trained].tolist()) == {1.5, -1.5, 0.75}
    for row in (i for i, r in enumerate(batch.roles) if r == "executor"):  # executors keep the episode's
        assert torch.all(batch.token_adv[row][batch.mask[row] == 1] == 0.5)
    # a constant per-token advantage is the per-sequence one
    logp, old = torch.randn(2, 4) * 0.2, torch.randn(2, 4) * 0.2
    mask, adv = torch.ones(2, 4), torch.tensor([0.7, -1.1])
    a, _ = policy_loss("ppo_clip", logp, old, adv, mask, 0.2, 0.28, "token-mean")
    b, _ = policy_loss("ppo_clip", logp, old, adv[:, None].expand(2, 4), mask, 0.2, 0.28, "token-mean")
    assert a.item() == pytest.approx(b.item(), abs=1e-7)


def test_process_rewards_need_a_per_token_loss():
    assert load_run_config(algorithm="grpo", overrides=["reward.process.source=verifier"])
    for method in ("gspo", "red_paper"):
        with pytest.raises(ConfigError, match="needs per-token advantages"):
            load_run_config(algorithm=method, overrides=["reward.process.source=judge"])


def test_the_judge_asks_the_sft_model_on_a_real_engine(hf_engine, protocol_adapter, base_dir):
    hf_engine.set_adapter(protocol_adapter)
    tok = AutoTokenizer.from_pretrained(base_dir)
    prm = JudgePRM(hf_engine, tok, ProcessRewardConfig().judge_template, 4)
    eps = [_episode([("<think>a</think><task>12+7</task>", "19"), ("<think>b</think><task>19*3</task>", "57"),
                     ("<think>c</think><answer>57</answer>", None)]),
           _episode([("<think>a</think><answer>19</answer>", None)])]
    assert prm.prompt("12+7*3", ["12+7"], "19*3") == ("question: 12+7*3\nsteps: 12+7\nnext: 19*3\n"
                                                       "is next a sensible next step? yes or no: ")
    got = prm(eps)
    assert [len(g) for g in got] == [3, 1] and got[0][2] is None and got[1] == [None]
    assert all(v in (0.0, 1.0) for v in got[0][:2])
    assert 0 <= prm.unparsed <= 2  # the tiny model was never taught to judge: its replies are counted
    assert prm(eps) == got  # greedy: the same verdicts again
    with pytest.raises(ValueError, match="judge_template"):
        JudgePRM(hf_engine, tok, "{nothing}", 4).prompt("q", [], "t")


def test_the_trainer_adds_verified_step_rewards(hf_engine, protocol_adapter, tmp_path, base_dir):
    cfg = load_run_config(algorithm="grpo", overrides=[
        REGIME_D, "algorithm.rl.steps=1", "algorithm.rl.questions_per_step=3", "algorithm.rl.n_samples=3",
        "algorithm.rl.dump_freq=0", "algorithm.rl.save_freq=100", "reward.process.source=verifier"])
    trainer = make_trainer(cfg, hf_engine, protocol_adapter, tmp_path, base_dir)
    trainer.spec = RewardSpec(process=ProcessRewardConfig(source="verifier"))
    (m,) = trainer.train()
    assert 0.0 <= m["process/step_reward_mean"] <= 1.0 and m["process/steps_per_episode"] > 0
    assert m["train/skipped_nonfinite"] == 0 and math.isfinite(m["actor/pg_loss"])
    rows, episodes = trainer.last_rollout.rows, trainer.last_rollout.episodes
    steps = [verifier_rewards(ep, rows[i // 3]) for i, ep in enumerate(episodes)]
    scored = [r for ep in steps for r in ep if r is not None]
    assert scored, "no delegated step was verified"  # 107 of 120 sampled episodes delegate (AVX-512 box)
    assert m["process/step_reward_mean"] == pytest.approx(sum(scored) / len(scored), rel=1e-5)


def test_masked_tokens_cannot_change_a_per_token_advantage_loss():
    from helpers import MASK
    from utils.train.losses import AGGREGATIONS, Agg

    torch.manual_seed(5)
    old, adv = torch.randn(2, 4) * 0.3, torch.randn(2, 4)
    adv_b = adv.clone()
    adv_b[MASK == 0] += 7.0  # advantages of prompt, result and padding positions are never read
    for name in AGGREGATIONS:
        agg = Agg(name, torch.tensor([0, 1]), horizon=4)
        a = (torch.randn(2, 4) * 0.3).requires_grad_(True)
        b = a.detach().clone()
        b[MASK == 0] += 2.0
        b.requires_grad_(True)
        la, _ = policy_loss("ppo_clip", a, old, adv, MASK, 0.2, 0.28, agg)
        lb, _ = policy_loss("ppo_clip", b, old, adv_b, MASK, 0.2, 0.28, agg)
        la.backward()
        lb.backward()
        assert la.item() == pytest.approx(lb.item(), abs=1e-7), agg
        torch.testing.assert_close(a.grad, b.grad)
