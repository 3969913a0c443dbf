"""SRFT (utils/train/srft.py): its rollout advantages, its policy loss and its entropy-weighted SFT term
by hand, the micro-batched update against those, and two steps of the real trainer."""
import math

import pytest
import torch

from helpers import assert_close, demo_trainer, ragged_rl_batch, random_lora, random_sft_batch
from utils.core.algorithm_schema import SrftConfig
from utils.core.config import ConfigError
from utils.core.loader import load_run_config
from utils.core.schema import MemoryConfig
from utils.reward.spec import RewardSpec
from utils.train.batch import RlBatch
from utils.train.method_variants import active_variants
from utils.train.losses import Agg
from utils.train.policy import forward_logprobs, sft_terms
from utils.train.red import RedState
from utils.train.srft import DemoGroups, rollout_advantages, srft_loss
from utils.train.update import red_grpo_loss

RED = RedState()
PAPER = SrftConfig(enabled=True)  # c 0.1, a wrong rollout −1, γ 0.1
CLAMPED = SrftConfig(enabled=True, negative_coef=0.0)  # the released loss with its clamp on


def test_a_right_rollouts_advantage_is_c_exp_h_and_a_wrong_ones_minus_one():
    got = rollout_advantages(torch.tensor([True, False, True]), torch.tensor([0.5, 1.0, 0.0]), 0.1, -1.0)
    assert got.tolist() == pytest.approx([0.1 * math.exp(0.5), -1.0, 0.1])
    clamped = rollout_advantages(torch.tensor([True, False, True]), torch.tensor([0.5, 1.0, 0.0]), 0.1, 0.0)
    assert clamped.tolist() == pytest.approx([0.1 * math.exp(0.5), 0.0, 0.1])


def _tiny_part() -> RlBatch:
    """Three rows of two tokens: a right rollout, a wrong one with one trained token, a demonstration."""
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    ids = torch.zeros(3, 3, dtype=torch.long)
    return RlBatch(ids, torch.ones_like(ids), mask, None, torch.tensor([0.3, -0.2, 0.6]), ["executor"] * 3,
                   offline=torch.tensor([False, False, True]), accuracy=torch.tensor([0.0, 0.0, 0.5]),
                   correct=torch.tensor([True, False, True]))


def test_the_policy_loss_by_hand():
    logp = torch.log(torch.tensor([[0.5, 0.25], [0.8, 0.3], [0.9, 0.1]])).requires_grad_()
    ent = torch.tensor([[0.2, 0.4], [1.0, 5.0], [3.0, 3.0]])  # row 1's masked 5.0 is not in its H
    loss, stats, _ = srft_loss(_tiny_part(), logp, ent, Agg("token-mean"), PAPER)
    # row 0: H 0.3, A' = 0.1·e^0.3 = 0.134986, −A'·log p = 0.093565 and 0.187130
    # row 1: wrong, A' = −1: log 0.8 = −0.223144 (its second token untrained)
    # row 2: the demonstration, A = 0.6 (its group's, not replaced): −0.6·0.9/1.0 = −0.54, −0.6·0.1/0.2 = −0.3
    assert loss.item() == pytest.approx((0.093565 + 0.187130 - 0.223144 - 0.54 - 0.3) / 5, abs=1e-6)
    loss.backward()
    # d/dlog p: −A' on rollouts; −A·γp/(p + γ)² on the demonstration (0.09 and 0.25); each over 5 tokens
    want = torch.tensor([[-0.134986, -0.134986], [1.0, 0.0], [-0.6 * 0.09, -0.6 * 0.25]]) / 5
    assert torch.allclose(logp.grad, want, atol=1e-6)
    assert stats["positive_adv"] == pytest.approx(0.134986, abs=1e-6)
    assert stats["offline_ratio_mean"] == pytest.approx(0.7)
    with pytest.raises(ValueError, match="correctness"):
        srft_loss(RlBatch(**{**_tiny_part().__dict__, "correct": None}), logp, ent, Agg("token-mean"), PAPER)


def test_the_clamped_form_leaves_a_wrong_rollout_no_gradient_but_keeps_its_tokens_in_the_mean():
    logp = torch.log(torch.tensor([[0.5, 0.25], [0.8, 0.3], [0.9, 0.1]])).requires_grad_()
    ent = torch.tensor([[0.2, 0.4], [1.0, 5.0], [3.0, 3.0]])
    loss, _, _ = srft_loss(_tiny_part(), logp, ent, Agg("token-mean"), CLAMPED)
    # as by hand above with row 1's term 0, still over 5 tokens (the clamped loss adds 0.8 there, a constant)
    assert loss.item() == pytest.approx((0.093565 + 0.187130 - 0.54 - 0.3) / 5, abs=1e-6)
    loss.backward()
    want = torch.tensor([[-0.134986, -0.134986], [0.0, 0.0], [-0.6 * 0.09, -0.6 * 0.25]]) / 5
    assert torch.allclose(logp.grad, want, atol=1e-6)


def _sft_batch():
    return random_sft_batch(rows=5, seed=3, max_len=26)


def _grads(model) -> dict:
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def test_the_sft_term_weighs_each_sequences_tokens_by_its_detached_exp_minus_h(base_dir):
    model = random_lora(base_dir)
    ids, attn, mask = _sft_batch()
    nll, _ = sft_terms(model, (ids, attn, mask), token_weight="entropy")
    nll.backward()
    got = _grads(model)
    logp, ent = forward_logprobs(model, ids, attn, with_entropy=True, need=mask > 0)
    h = (ent.detach() * mask).sum(1) / mask.sum(1)
    assert h.min() > 0.5 and h.max() - h.min() > 1e-3  # a random adapter: weights well below 1, not all equal
    by_hand = -(logp * torch.exp(-h)[:, None] * mask).sum() / mask.sum()
    assert nll.item() == pytest.approx(by_hand.item(), rel=1e-5)
    by_hand.backward()
    for n, g in got.items():
        assert_close(g, model.get_parameter(n).grad)
    with pytest.raises(ValueError, match="token_weight"):
        sft_terms(model, (ids, attn, mask), token_weight="phy")


@pytest.mark.parametrize("method", ["srft", "srft_clamped"])
def test_the_update_is_srfts_policy_loss_plus_alpha_times_the_weighted_sft_term_whole_or_cut(base_dir, method):
    model = random_lora(base_dir)
    alg = load_run_config(algorithm=method).algorithm
    batch = ragged_rl_batch(offline=True)
    batch.correct = torch.tensor([True, True, True, False, True, False, False, True, True])
    sft = _sft_batch()

    def update(sft_part, budget: int = 0):
        terms = red_grpo_loss(model, batch, None, sft_part, alg, RED, 0.4, step=0,
                              memory=MemoryConfig(micro_batch_tokens=budget, logits_chunk_mib=0.004))
        return terms, _grads(model)

    terms, g = update(sft)
    _, g_rl = update(None)
    logp, ent = forward_logprobs(model, batch.ids, batch.attn, with_entropy=True, temperature=alg.rl.temperature,
                                 need=batch.mask > 0)
    pg, _, _ = srft_loss(batch, logp, ent, Agg("token-mean"), PAPER if method == "srft" else CLAMPED)
    pg.backward()
    g_pg = _grads(model)
    nll, _ = sft_terms(model, sft, token_weight="entropy")
    nll.backward()
    g_sft = _grads(model)
    for n in g:
        assert_close(g_rl[n], g_pg[n])
        assert_close(g[n], g_pg[n] + 0.5 * g_sft[n])
    assert terms.stats["actor/pg_loss"] == pytest.approx(pg.item(), rel=1e-5)
    assert terms.stats["actor/sft_loss"] == pytest.approx(nll.item(), rel=1e-5)
    assert 0 < terms.stats["srft/offline_ratio_mean"] < 1 and terms.stats["srft/positive_adv"] > 0.1
    cut, g_cut = update(sft, budget=60)  # episode 0 split across pieces
    for n in g:
        assert_close(g_cut[n], g[n])
    assert cut.stats["actor/pg_loss"] == pytest.approx(terms.stats["actor/pg_loss"], rel=1e-5)


def test_srft_is_its_own_method_and_turns_on_its_variant():
    alg = load_run_config(algorithm="srft").algorithm
    assert alg.srft.enabled and alg.sft.weighting == "srft" and alg.sft.loss_coef == 0.5 and not alg.red_paper.offline
    assert [type(v) for v in active_variants(alg, RewardSpec(), {"q1": object()})] == [DemoGroups]
    clamped = load_run_config(algorithm="srft_clamped").algorithm
    assert clamped.srft.negative_coef == 0.0 and alg.srft.negative_coef == -1.0
    assert [type(v) for v in active_variants(clamped, RewardSpec(), {"q1": object()})] == [DemoGroups]
    with pytest.raises(ConfigError, match="srft.enabled=true"):
        load_run_config(algorithm="fixed_sft", overrides=["algorithm.srft.enabled=true"])
    with pytest.raises(ConfigError, match="srft.enabled true"):
        load_run_config(algorithm="srft", overrides=["reward.process.source=verifier"])


def test_the_trainer_trains_demonstrations_in_their_groups_and_as_sft(hf_engine, protocol_adapter, tmp_path, base_dir):
    """Every question has its gold trace: it takes its group's last place and is the step's SFT."""
    trainer, before = demo_trainer("srft", hf_engine, protocol_adapter, tmp_path, base_dir)
    steps = trainer.train()
    for m in steps:
        assert m["red_paper/offline_groups"] == 4  # a demonstration in each of the step's four groups
        assert m["actor/sft_loss"] > 0 and 0 < m["srft/offline_ratio_mean"] < 1
        assert math.isfinite(m["actor/loss"]) and m["train/skipped_nonfinite"] == 0
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before)
