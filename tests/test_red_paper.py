"""red_paper: RED as its paper's code has it. Hand-computed losses, loop vs vectorised, mask
invariance, the entropy-change weight, expert sequences in the RL batch, and the real trainer."""
import math

import pytest
import torch
from transformers import AutoTokenizer

from helpers import give_gold_demos, make_trainer, MASK
from utils.agent.protocol import EXECUTOR, PLANNER, format_score
from utils.agent.rollout import Codec
from utils.agent.traces import OfflineSample, episode_from_trace, examples_from_trace, make_trace
from utils.core.config import ConfigError
from utils.core.loader import load_run_config
from utils.train.batch import build_rl_batch
from utils.train.losses import AGGREGATIONS, Agg, offline_ratio, red_paper_entropy_weight, red_paper_loss

OFF = torch.tensor([False, True])


def test_offline_ratio_by_hand():
    logp = torch.log(torch.tensor([[0.5, 0.2], [0.5, 0.9]]))
    acc = torch.tensor([0.25, 1.0])
    # row 0, a=0.25: 0.5/(0.5+0.5*0.25) = 0.8; 0.2/(0.2+0.8*0.25) = 0.5.  row 1, a=1: the ratio is pi itself
    torch.testing.assert_close(offline_ratio(logp, acc, "accuracy"), torch.tensor([[0.8, 0.5], [0.5, 0.9]]))
    torch.testing.assert_close(offline_ratio(logp, acc, "none"), torch.tensor([[0.5, 0.2], [0.5, 0.9]]))
    with pytest.raises(ValueError, match="accuracy, none"):
        offline_ratio(logp, acc, "sometimes")


def test_red_paper_loss_by_hand():
    # row 0 is a rollout (PPO-clip, ratios [1.5, 0.5, 1.0], A=+1); row 1 an expert trace (A=+2,
    # group accuracy 0.5, pi = [0.5, 0.2]): ratio 0.5/(0.5+0.5*0.5) = 2/3 and 0.2/(0.2+0.8*0.5) = 1/3
    old = torch.zeros(2, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0, 1.0], [0.5, 0.2, 1.0, 1.0]]))
    adv, acc = torch.tensor([1.0, 2.0]), torch.tensor([0.0, 0.5])
    loss, stats = red_paper_loss(logp, old, adv, MASK, OFF, acc, 0.2, 0.28, "token-mean")
    expected = (-1.28 - 0.5 - 1.0 - 2 * 2 / 3 - 2 * 1 / 3) / 5  # one mean over all five trained tokens
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats["offline_ratio_mean"] == pytest.approx(0.5, abs=1e-6)  # (2/3 + 1/3) / 2
    assert stats["clip_frac"] == pytest.approx(1 / 3)  # rollout tokens only: the 1.5 of row 0
    assert stats["ratio_mean"] == pytest.approx(1.0)  # (1.5 + 0.5 + 1.0) / 3


def test_red_paper_loop_matches_vectorised_with_its_gradient():
    torch.manual_seed(3)
    logp = (torch.randn(4, 6) * 0.5 - 1.0).clamp(max=-0.01).requires_grad_(True)
    old, adv = torch.randn(4, 6) * 0.3 - 1.0, torch.randn(4)
    mask, off, acc = (torch.rand(4, 6) > 0.3).float(), torch.tensor([True, False, True, False]), torch.rand(4)
    loss, _ = red_paper_loss(logp, old, adv, mask, off, acc, 0.2, 0.28, "seq-mean-token-mean")
    loss.backward()
    x = logp.detach().clone().requires_grad_(True)
    per_seq = []
    for b in range(4):
        terms = []
        for t in range(6):
            if mask[b, t]:
                if off[b]:
                    p = torch.exp(x[b, t])
                    terms.append(-adv[b] * p / (p + (1 - p) * acc[b]))
                else:
                    r = torch.exp(x[b, t] - old[b, t])
                    terms.append(torch.maximum(-adv[b] * r, -adv[b] * r.clamp(0.8, 1.28)))
        per_seq.append(sum(terms) / len(terms) if terms else torch.tensor(0.0))
    ref = sum(per_seq) / 4
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), abs=1e-6)
    torch.testing.assert_close(logp.grad, x.grad)


def test_full_accuracy_imitates_and_the_gradient_vanishes_where_the_group_cannot_move():
    """a = 1: the expert ratio is pi, so d(-A*pi)/dlogp = -A*pi (imitation). a -> 0: the ratio tends to 1
    and its gradient to 0 for tokens the policy already likes (pi >> a)."""
    logp = torch.log(torch.tensor([[0.6, 0.3]])).requires_grad_(True)
    m = torch.ones(1, 2)
    loss, _ = red_paper_loss(logp, torch.zeros(1, 2), torch.tensor([2.0]), m, torch.tensor([True]),
                             torch.tensor([1.0]), 0.2, 0.28, "token-mean")
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-2 * 0.6 / 2, -2 * 0.3 / 2]]))
    low = torch.log(torch.tensor([[0.6, 0.3]])).requires_grad_(True)
    loss, _ = red_paper_loss(low, torch.zeros(1, 2), torch.tensor([2.0]), m, torch.tensor([True]),
                             torch.tensor([1e-4]), 0.2, 0.28, "token-mean")
    loss.backward()
    assert low.grad.abs().max() < 1e-3


@pytest.mark.parametrize("agg", sorted(AGGREGATIONS))
def test_masked_tokens_cannot_change_the_red_paper_loss(agg):
    agg = Agg(agg, torch.tensor([0, 1]), horizon=4)
    torch.manual_seed(4)
    old, adv, acc = torch.randn(2, 4) - 1, torch.tensor([0.7, -1.2]), torch.tensor([0.0, 0.4])
    a = (torch.randn(2, 4) - 1).clamp(max=-0.01).requires_grad_(True)
    b = a.detach().clone()
    b[MASK == 0] -= torch.rand(int((MASK == 0).sum())) * 5
    b.requires_grad_(True)
    old_b = old.clone()
    old_b[MASK == 0] += 3.0
    la, _ = red_paper_loss(a, old, adv, MASK, OFF, acc, 0.2, 0.28, agg)
    lb, _ = red_paper_loss(b, old_b, adv, MASK, OFF, acc, 0.2, 0.28, agg)
    la.backward()
    lb.backward()
    assert la.item() == pytest.approx(lb.item(), abs=1e-7)
    torch.testing.assert_close(a.grad, b.grad)
    assert torch.all(a.grad[MASK == 0] == 0)


@pytest.mark.parametrize("now,prev,expected", [
    ((1.8, 0.95), (None, None), 1.0),        # first step: nothing to compare with
    ((1.8, 0.95), (2.0, 1.0), 2.0),          # |(1 - 0.9) / (1 - 0.95)| = 2
    ((2.2, 1.1), (2.0, 1.0), 1.0),           # |(-0.1) / (-0.1)| = 1
    ((1.99, 0.5), (2.0, 1.0), 1.0),          # |0.005 / 0.5| = 0.01, clamped up to 1
    ((1.0, 0.99), (2.0, 1.0), 7.0),          # |0.5 / 0.01| = 50, clamped down to 7
    ((1.8, 1.0), (2.0, 1.0), 7.0),           # the rollouts' entropy did not move: the cap
    ((2.0, 1.0), (2.0, 1.0), 1.0),           # nothing moved
    ((1.8, 0.95), (0.0, 1.0), 1.0),          # a zero previous entropy cannot be a base
])
def test_entropy_change_weight(now, prev, expected):
    assert red_paper_entropy_weight(*now, *prev, cap=7.0) == pytest.approx(expected)


def _gold(codec):
    steps = [("3+4", "7"), ("7-2", "5")]
    trace = make_trace("a", "3+4-2", steps, "5")
    return trace, OfflineSample(examples_from_trace(trace, codec), "5", [t for t, _ in steps])


def test_gold_traces_are_well_formed_so_an_expert_scores_format_one(base_dir):
    """The trainer scores an expert trace with format 1: check that every gold turn earns it."""
    trace, _ = _gold(Codec(AutoTokenizer.from_pretrained(base_dir), load_run_config().model.templates))
    assert all(format_score(t, PLANNER)[0] == 1.0 for t in trace.planner_turns)
    assert all(format_score(text, EXECUTOR)[0] == 1.0 for _, text in trace.executor_calls)


def test_expert_sequences_join_the_rl_batch(base_dir):
    codec = Codec(AutoTokenizer.from_pretrained(base_dir), load_run_config().model.templates)
    trace, sample = _gold(codec)
    ep = episode_from_trace(make_trace("b", "8-1", [("8-1", "7")], "7"), codec)
    batch = build_rl_batch([ep], torch.tensor([-0.5]), 0, "both", [(ex, 1.5, 0.25) for ex in sample.examples])
    assert batch.roles == ["planner", "executor", "planner", "executor", "executor"]
    assert batch.offline.tolist() == [False, False, True, True, True]
    assert batch.adv.tolist() == [-0.5, -0.5, 1.5, 1.5, 1.5]
    assert batch.accuracy.tolist() == [0.0, 0.0, 0.25, 0.25, 0.25]
    assert torch.all(batch.sampler_lp[2:] == 0)  # no sampler behind an expert trace
    assert sample.n_tokens == sum(sum(e.mask) for e in sample.examples) > 0


def test_red_paper_config_is_checked():
    cfg = load_run_config(algorithm="red_paper")
    assert cfg.algorithm.red_paper.offline and not cfg.algorithm.sft.enabled and cfg.algorithm.rl.kl_coef == 0
    with pytest.raises(ConfigError, match="red_paper.offline=false"):
        load_run_config(algorithm="red_paper", overrides=["algorithm.red_paper.offline=false"])
    with pytest.raises(ConfigError, match="tis_cap=2.0"):
        load_run_config(algorithm="red_paper", overrides=["algorithm.rl.tis_cap=2.0"])
    with pytest.raises(ConfigError, match="red_paper.offline=true"):
        load_run_config(algorithm="grpo", overrides=["algorithm.red_paper.offline=true"])


def test_the_trainer_puts_experts_in_their_groups(hf_engine, protocol_adapter, tmp_path, base_dir):
    cfg = load_run_config(algorithm="red_paper", overrides=[
        "algorithm.rl.steps=2", "algorithm.rl.questions_per_step=3", "algorithm.rl.n_samples=3",
        "algorithm.rl.lr=0.003", "algorithm.rl.dump_freq=0", "algorithm.rl.save_freq=100",
        "algorithm.rl.mismatch_every=1"])  # the mismatch on both steps (the default regime: every fifth)
    trainer = make_trainer(cfg, hf_engine, protocol_adapter, tmp_path, base_dir)
    give_gold_demos(trainer, trainer.rows[::2])  # half the questions have an expert trace
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    first, second = trainer.train()
    for m in (first, second):
        assert 1 <= m["red_paper/offline_groups"] <= 3
        assert 1 / 3 - 1e-5 <= m["red_paper/group_accuracy"] <= 1.0  # the expert is right: at least 1 of 3
        assert 0 < m["red_paper/offline_ratio_mean"] <= 1 and m["train/skipped_nonfinite"] == 0
        assert m["rollout/logprob_mismatch"] < 1e-4  # rollout tokens only: the expert has no sampler
    assert first["red_paper/entropy_weight"] == 1.0  # nothing to compare with yet
    want = red_paper_entropy_weight(second["red_paper/h_sft"], second["red_paper/h_rl"], first["red_paper/h_sft"],
                                    first["red_paper/h_rl"], 7.0)
    assert second["red_paper/entropy_weight"] == pytest.approx(want, rel=1e-5)
    assert trainer.state.piece_state == pytest.approx({"h_sft": second["red_paper/h_sft"],
                                                     "h_rl": second["red_paper/h_rl"]}, rel=1e-5)  # for the resume
    assert "actor/sft_loss" not in second and "actor/kl" not in second
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before)
    assert math.isfinite(second["actor/pg_loss"])


def test_a_config_turns_on_exactly_its_trainer_variants():
    """Plain GRPO steps with no plug-in; red_paper's expert traces and process rewards each add theirs,
    experts first (their rewards must be in place before the process bonus is read)."""
    from utils.core.schema import ProcessRewardConfig
    from utils.reward.spec import RewardSpec
    from utils.train.red_paper import ExpertTraces
    from utils.train.method_variants import active_variants
    from utils.train.variants import ProcessRewards, StepData

    alg = load_run_config(algorithm="red_paper").algorithm
    assert active_variants(alg, RewardSpec(), {}) == []
    both = active_variants(alg, RewardSpec(process=ProcessRewardConfig(source="verifier")), {"q1": object()})
    assert [type(v) for v in both] == [ExpertTraces, ProcessRewards]
    # a question without an expert keeps its own answers and rewards
    experts = both[0]
    data = StepData([{"id": "q2"}], [], [{"answer": 0.0}] * 4, [0.0] * 4)
    experts.regroup(data)
    assert data.rewards == [0.0] * 4 and data.replaced == set() and experts.answers({"id": "q2"}, [1.0, 0.0]) == [1.0, 0.0]


def test_a_checkpoint_from_before_the_rename_resumes_with_its_entropies():
    """TrainState.piece_state was `red_paper` in checkpoints written before 2026-12-07's seam: such a
    state still resumes with red_paper's entropies, and a new one round-trips under the new name."""
    from dataclasses import asdict

    from utils.train.state import TrainState

    old = {**asdict(TrainState(step=4)), "red_paper": {"h_sft": 0.5, "h_rl": 0.7}}
    del old["piece_state"]
    assert TrainState.from_json(old).piece_state == {"h_sft": 0.5, "h_rl": 0.7}
    new = TrainState(step=4, piece_state={"h_sft": 0.1, "h_rl": 0.2})
    assert TrainState.from_json(asdict(new)) == new
