"""Loss maths on hand-computed 2x4 examples; loop vs vectorised; mask invariance; RED edges."""
import math

import pytest
import torch

from utils.train.losses import (AGGREGATIONS, Agg, POLICY_LOSSES, advantages, aggregate, gather_logprobs, gspo_loss,
                                k3_kl, policy_loss, ppo_clip_loss, sft_cross_entropy, tis_weights, token_entropy)
from utils.train.red import RedState, red_update, red_weights
from helpers import MASK

X = torch.tensor([[1., 2., 3., 100.], [4., 6., 100., 100.]])


def test_group_advantage_by_hand():
    # group 1: [1, 3] mean 2, unbiased std sqrt(2) -> [-1/sqrt2, 1/sqrt2]; group 2: [5, 5] -> std 0 -> [0, 0]
    adv = advantages("group", torch.tensor([1., 3., 5., 5.]), 2)
    torch.testing.assert_close(adv, torch.tensor([-1 / math.sqrt(2), 1 / math.sqrt(2), 0., 0.]), atol=1e-5, rtol=0)


def test_batch_and_none_scaling_by_hand():
    r = torch.tensor([1., 3., 5., 5.])
    # centred: [-1, 1, 0, 0]; batch unbiased std of [1,3,5,5]: mean 3.5, var (6.25+.25+2.25+2.25)/3 = 11/3
    torch.testing.assert_close(advantages("batch", r, 2), torch.tensor([-1., 1., 0., 0.]) / math.sqrt(11 / 3),
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(advantages("none", r, 2), torch.tensor([-1., 1., 0., 0.]))


def test_advantage_loop_matches_vectorised():
    torch.manual_seed(0)
    r = torch.randn(24)
    vec = advantages("group", r, 4)
    loop = []
    for g in range(6):
        grp = r[g * 4:(g + 1) * 4]
        mean, std = sum(grp.tolist()) / 4, math.sqrt(sum((x - sum(grp.tolist()) / 4) ** 2 for x in grp.tolist()) / 3)
        loop += [(x - mean) / (std + 1e-6) for x in grp.tolist()]
    torch.testing.assert_close(vec, torch.tensor(loop), atol=1e-5, rtol=0)


def test_single_sample_groups_get_zero_advantage():
    assert advantages("group", torch.tensor([1., 2.]), 1).tolist() == [0.0, 0.0]
    assert advantages("rloo", torch.tensor([1., 2.]), 1).tolist() == [0.0, 0.0]


def test_rloo_advantage_by_hand():
    # group [1, 3, 5, 5]: the others' means are 13/3, 11/3, 3, 3 -> [-10/3, -2/3, 2, 2]
    #   (= n/(n-1)·(r - mean) = 4/3·[-2.5, -0.5, 1.5, 1.5]);
    # group [0, 2, 4, 6]: others' means 4, 10/3, 8/3, 2 -> [-4, -4/3, 4/3, 4]
    adv = advantages("rloo", torch.tensor([1., 3., 5., 5., 0., 2., 4., 6.]), 4)
    torch.testing.assert_close(adv, torch.tensor([-10 / 3, -2 / 3, 2., 2., -4., -4 / 3, 4 / 3, 4.]))


def test_rloo_loop_matches_vectorised():
    torch.manual_seed(4)
    r = torch.randn(24)
    loop = []
    for g in range(6):
        grp = r[g * 4:(g + 1) * 4].tolist()
        loop += [x - (sum(grp) - x) / 3 for x in grp]
    torch.testing.assert_close(advantages("rloo", r, 4), torch.tensor(loop), atol=1e-5, rtol=0)


def test_aggregations_by_hand():
    # token-mean: (1+2+3+4+6)/5 = 3.2; seq-mean-token-mean: (2 + 5)/2 = 3.5; sum-norm: (6/4 + 10/4)/2 = 2.0
    assert aggregate("token-mean", X, MASK).item() == pytest.approx(3.2)
    assert aggregate("seq-mean-token-mean", X, MASK).item() == pytest.approx(3.5)
    assert aggregate(Agg("seq-mean-token-sum-norm", horizon=4), X, MASK).item() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="algorithm.rl.loss_horizon"):
        aggregate("seq-mean-token-sum-norm", X, MASK)  # no constant: refused, not the padded width
    # token-sum-norm (the SRFT/HPT/ReLIFT releases' RL term): the batch's token sum over the constant, 16 / 8
    assert aggregate(Agg("token-sum-norm", horizon=8), X, MASK).item() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="algorithm.rl.loss_horizon"):
        aggregate("token-sum-norm", X, MASK)


def test_seq_mean_counts_each_episode_once_however_many_executor_calls():
    """Issue 45 case: two episodes with the same advantage and 14 trained tokens each; episode 0 is
    a planner conversation (8 tokens) and 3 executor calls (2 tokens each), episode 1 a planner
    conversation (8) and 1 call (6). Per sequence, episode 0's four rows would weigh 4/6 = 0.667
    against 2/6; per episode each weighs 1/2, as under token-mean."""
    T = 8
    lengths, episode = [8, 2, 2, 2, 8, 6], torch.tensor([0, 0, 0, 0, 1, 1])
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in lengths])  # [6, 8]
    weight = {}
    for name, ep in (("per-sequence", None), ("per-episode", episode)):
        x = torch.zeros(6, T, requires_grad=True)
        aggregate(Agg("seq-mean-token-mean", ep), x, mask).backward()
        weight[name] = [x.grad[episode == e].sum().item() for e in (0, 1)]  # each episode's total weight
    assert weight["per-sequence"] == pytest.approx([4 / 6, 2 / 6])
    assert weight["per-episode"] == pytest.approx([0.5, 0.5])
    x = torch.zeros(6, T, requires_grad=True)
    aggregate("token-mean", x, mask).backward()
    assert [x.grad[episode == e].sum().item() for e in (0, 1)] == pytest.approx([0.5, 0.5])


def test_sum_norm_divides_by_its_constant_not_the_padded_width():
    """Issue 45 case: the same sequence gives 1.5 at width 4 and 0.6 with 6 more padding columns
    when divided by the width; with the constant horizon 4 it gives 1.5 at both widths."""
    x, m = torch.tensor([[1.0, 2.0, 3.0, 0.0]]), torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    wide_x, wide_m = torch.cat([x, torch.zeros(1, 6)], 1), torch.cat([m, torch.zeros(1, 6)], 1)
    agg = Agg("seq-mean-token-sum-norm", horizon=4)
    assert aggregate(agg, x, m).item() == pytest.approx(1.5) == aggregate(agg, wide_x, wide_m).item()
    # episodes pool their sequences' sums: (6 + 4) / 4 for episode 0, 2 / 4 for episode 1 -> 1.5
    rows, masks = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [2.0, 0.0, 0.0]]), torch.tensor(
        [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    assert aggregate(Agg("seq-mean-token-sum-norm", torch.tensor([0, 0, 1]), 4), rows, masks).item() == pytest.approx(1.5)


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(KeyError, match="valid: seq-mean-token-mean, seq-mean-token-sum-norm, token-mean, token-sum-norm"):
        aggregate("sum", X, MASK)
    with pytest.raises(KeyError, match="valid: batch, group, none, rloo"):
        advantages("gae", torch.zeros(4), 2)
    with pytest.raises(KeyError, match="unknown policy loss 'dpo'; valid: gspo, ppo_clip"):
        policy_loss("dpo", X, X, torch.zeros(2), MASK, 0.2, 0.28, "token-mean")


def test_ppo_clip_by_hand():
    # ratios exp(logp-old): row 0 = [1.5, 0.5, 1.0], adv +1; row 1 = [1.5, 0.5], adv -1
    old = torch.zeros(2, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0, 1.0], [1.5, 0.5, 1.0, 1.0]]))
    adv = torch.tensor([1., -1.])
    loss, stats = ppo_clip_loss(logp, old, adv, MASK, clip_low=0.2, clip_high=0.28, agg="token-mean")
    # A=+1: max(-r, -clip(r)) -> r=1.5: max(-1.5, -1.28) = -1.28; r=0.5: max(-0.5, -0.8) = -0.5; r=1: -1
    # A=-1: max(r, clip(r))   -> r=1.5: max(1.5, 1.28) = 1.5;     r=0.5: max(0.5, 0.8) = 0.8
    expected = (-1.28 - 0.5 - 1.0 + 1.5 + 0.8) / 5
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats["clip_frac"] == pytest.approx(2 / 5)  # the 1.5 of row 0 and the 0.5 of row 1


def test_ppo_loop_matches_vectorised():
    torch.manual_seed(1)
    logp, old = torch.randn(3, 5) * 0.3, torch.randn(3, 5) * 0.3
    adv, mask = torch.randn(3), (torch.rand(3, 5) > 0.3).float()
    loss, _ = ppo_clip_loss(logp, old, adv, mask, 0.2, 0.28, "seq-mean-token-mean")
    per_seq = []
    for b in range(3):
        terms = []
        for t in range(5):
            if mask[b, t]:
                r = math.exp(logp[b, t] - old[b, t])
                terms.append(max(-adv[b] * r, -adv[b] * min(max(r, 0.8), 1.28)))
        per_seq.append(sum(terms) / max(len(terms), 1) if terms else 0.0)
    assert loss.item() == pytest.approx(sum(float(x) for x in per_seq) / 3, abs=1e-5)


@pytest.mark.parametrize("loss", sorted(POLICY_LOSSES))
@pytest.mark.parametrize("agg", sorted(AGGREGATIONS))
def test_masked_tokens_cannot_change_the_loss_or_its_gradients(agg, loss):
    agg = Agg(agg, torch.tensor([0, 0]), horizon=4)  # both rows one episode: pooled before the mean
    torch.manual_seed(2)
    old, adv, sampler = torch.randn(2, 4), torch.tensor([0.7, -1.2]), torch.randn(2, 4)
    a = torch.randn(2, 4, requires_grad=True)
    b = a.detach().clone()
    b[MASK == 0] += torch.randn(int((MASK == 0).sum())) * 5  # change only masked positions
    b.requires_grad_(True)
    old_b, sampler_b = old.clone(), sampler.clone()
    old_b[MASK == 0] += 3.0  # the old and sampler log-probs of masked positions are garbage too
    sampler_b[MASK == 0] -= 3.0
    la, _ = policy_loss(loss, a, old, adv, MASK, 0.2, 0.28, agg, sampler_logp=sampler, tis_cap=2.0)
    lb, _ = policy_loss(loss, b, old_b, adv, MASK, 0.2, 0.28, agg, sampler_logp=sampler_b, tis_cap=2.0)
    la.backward()
    lb.backward()
    assert la.item() == pytest.approx(lb.item(), abs=1e-7)
    torch.testing.assert_close(a.grad, b.grad)
    assert torch.all(a.grad[MASK == 0] == 0)


def test_gspo_by_hand():
    # row 0 trains 3 tokens with ratios [1.5, 0.5, 1.0]: s0 = (1.5·0.5·1)^(1/3) = 0.75^(1/3) = 0.90856;
    # row 1 trains 2 tokens with ratios [1.2, 1.2]: s1 = 1.2. Clip range 0.05 / 0.1 -> [0.95, 1.1].
    # A0 = -1: max(s0, clip(s0)) = max(0.90856, 0.95) = 0.95 (clipped)
    # A1 = +1: max(-s1, -clip(s1)) = max(-1.2, -1.1) = -1.1 (clipped)
    old = torch.zeros(2, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0, 9.0], [1.2, 1.2, 9.0, 9.0]]))
    adv = torch.tensor([-1., 1.])
    loss, stats = gspo_loss(logp, old, adv, MASK, 0.05, 0.1, "seq-mean-token-mean")
    assert loss.item() == pytest.approx((0.95 - 1.1) / 2, abs=1e-6)  # the paper's mean over sequences
    assert stats["clip_frac"] == 1.0 and stats["ratio_mean"] == pytest.approx((0.75 ** (1 / 3) + 1.2) / 2, abs=1e-6)
    loss, _ = gspo_loss(logp, old, adv, MASK, 0.05, 0.1, "token-mean")  # each sequence weighted by its length
    assert loss.item() == pytest.approx((3 * 0.95 - 2 * 1.1) / 5, abs=1e-6)
    # wide clip range: nothing clipped, loss = mean(-A·s) = (0.90856 - 1.2) / 2
    loss, stats = gspo_loss(logp, old, adv, MASK, 0.5, 0.5, "seq-mean-token-mean")
    assert loss.item() == pytest.approx((0.75 ** (1 / 3) - 1.2) / 2, abs=1e-6) and stats["clip_frac"] == 0.0


def test_gspo_loop_matches_vectorised_with_its_gradient():
    torch.manual_seed(5)
    logp0, old = torch.randn(3, 5) * 0.3, torch.randn(3, 5) * 0.3
    adv, mask = torch.randn(3), (torch.rand(3, 5) > 0.3).float()
    mask[:, 0] = 1  # every sequence trains a token
    logp = logp0.clone().requires_grad_(True)
    loss, _ = gspo_loss(logp, old, adv, mask, 0.1, 0.15, "seq-mean-token-mean")
    loss.backward()
    ref = logp0.clone().requires_grad_(True)
    terms = []
    for b in range(3):
        idx = [t for t in range(5) if mask[b, t]]
        s = torch.exp(sum(ref[b, t] - old[b, t] for t in idx) / len(idx))
        terms.append(torch.maximum(-adv[b] * s, -adv[b] * torch.clamp(s, 0.9, 1.15)))
    loop = sum(terms) / 3
    loop.backward()
    assert loss.item() == pytest.approx(loop.item(), abs=1e-6)
    torch.testing.assert_close(logp.grad, ref.grad)


def test_gspo_on_policy_gradient_is_the_sequence_mean_of_token_gradients():
    # one optimizer pass: old = logp (detached), s = 1, nothing clipped, and
    # d/dlogp_t of -A·s = -A·s/|seq| on each trained token: each sequence's tokens share 1/|seq|
    logp = torch.zeros(2, 4, requires_grad=True)
    loss, stats = gspo_loss(logp, logp.detach(), torch.tensor([1., -2.]), MASK, 3e-4, 4e-4, "seq-mean-token-mean")
    loss.backward()
    assert stats["clip_frac"] == 0.0 and stats["ratio_mean"] == 1.0
    # mean over 2 sequences: row 0 -1/3 per token (/2), row 1 +2/2 per token (/2)
    torch.testing.assert_close(logp.grad, torch.tensor([[-1 / 6, -1 / 6, -1 / 6, 0.], [0.5, 0.5, 0., 0.]]))


def test_one_pass_gspo_and_rloo_are_rescalings_of_existing_choices():
    """What docs/METHODS.md says of them at one optimizer pass per batch: GSPO's gradient is PPO-clip's
    under seq-mean-token-mean (both weight a sequence's tokens by 1/length), and RLOO's advantage is
    Dr. GRPO's (`none`) times n/(n-1), a constant that Adam's normalisation all but cancels."""
    torch.manual_seed(7)
    logp0, adv, mask = torch.randn(3, 5), torch.randn(3), (torch.rand(3, 5) > 0.3).float()
    grads = []
    for name in ("gspo", "ppo_clip"):
        logp = logp0.clone().requires_grad_(True)
        loss, _ = policy_loss(name, logp, logp.detach(), adv, mask, 3e-4, 4e-4, "seq-mean-token-mean")
        loss.backward()
        grads.append(logp.grad)
    torch.testing.assert_close(grads[0], grads[1])
    r = torch.randn(12)
    torch.testing.assert_close(advantages("rloo", r, 4), advantages("none", r, 4) * 4 / 3)


def test_truncated_importance_weights_by_hand():
    # old - sampler: row 0 [ln 2, ln 0.5, 0, junk], row 1 [ln 1.2, ln 3, junk, junk]; cap 1.5
    old = torch.log(torch.tensor([[2.0, 0.5, 1.0, 7.0], [1.2, 3.0, 7.0, 7.0]]))
    sampler = torch.zeros(2, 4)
    w = tis_weights(old, sampler, MASK, 1.5, "token")
    torch.testing.assert_close(w[MASK == 1], torch.tensor([1.5, 0.5, 1.0, 1.2, 1.5]))
    # per sequence: row 0 geometric mean (2·0.5·1)^(1/3) = 1; row 1 sqrt(1.2·3) = 1.897 -> capped 1.5
    w = tis_weights(old, sampler, MASK, 1.5, "sequence")
    torch.testing.assert_close(w, torch.tensor([[1.0] * 4, [1.5] * 4]))
    # PPO-clip at ratio 1 (logp = old): per-token loss -A·w; A = [+1, -1]
    # token-mean = (-(1.5 + 0.5 + 1.0) + (1.2 + 1.5)) / 5 = -0.06
    loss, stats = policy_loss("ppo_clip", old, old, torch.tensor([1., -1.]), MASK, 0.2, 0.28, "token-mean",
                              sampler_logp=sampler, tis_cap=1.5)
    assert loss.item() == pytest.approx(-0.06, abs=1e-6)
    assert stats["tis_weight_mean"] == pytest.approx(5.7 / 5) and stats["tis_clip_frac"] == pytest.approx(2 / 5)


def test_tis_off_or_on_policy_leaves_the_loss_and_gradient_unchanged():
    torch.manual_seed(6)
    old, adv = torch.randn(2, 4), torch.tensor([0.7, -1.2])
    for name in POLICY_LOSSES:
        a = torch.randn(2, 4, requires_grad=True)
        b = a.detach().clone().requires_grad_(True)
        la, _ = policy_loss(name, a, old, adv, MASK, 0.2, 0.28, "token-mean")
        lb, stats = policy_loss(name, b, old, adv, MASK, 0.2, 0.28, "token-mean", sampler_logp=old, tis_cap=2.0)
        la.backward()
        lb.backward()
        assert la.item() == pytest.approx(lb.item(), abs=1e-7) and stats["tis_weight_mean"] == 1.0
        torch.testing.assert_close(a.grad, b.grad)
    with pytest.raises(ValueError, match="needs the sampler's log-probs"):
        policy_loss("ppo_clip", old, old, adv, MASK, 0.2, 0.28, "token-mean", tis_cap=2.0)


def test_masked_tokens_cannot_change_the_sft_loss_or_its_gradients():
    torch.manual_seed(3)
    a = torch.randn(2, 4, requires_grad=True)
    b = a.detach().clone()
    b[MASK == 0] += torch.randn(int((MASK == 0).sum())) * 5  # change only masked positions
    b.requires_grad_(True)
    la, lb = sft_cross_entropy(a, MASK), sft_cross_entropy(b, MASK)
    la.backward()
    lb.backward()
    assert la.item() == pytest.approx(lb.item(), abs=1e-7)
    torch.testing.assert_close(a.grad, b.grad)
    assert torch.all(a.grad[MASK == 0] == 0)


def test_k3_kl_by_hand():
    # d = ref - logp = [0, ln 2]: k3 = [0, 2 - ln2 - 1]
    kl = k3_kl(torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, math.log(2)]]))
    torch.testing.assert_close(kl, torch.tensor([[0.0, 1 - math.log(2)]]))
    assert (k3_kl(torch.randn(4, 4), torch.randn(4, 4)) >= 0).all()


def test_entropy_by_hand():
    # uniform over 4: ln 4; one-hot-ish: ~0
    logits = torch.tensor([[[0., 0., 0., 0.], [100., 0., 0., 0.]]])
    h = token_entropy(logits)
    assert h[0, 0].item() == pytest.approx(math.log(4), abs=1e-6)
    assert h[0, 1].item() == pytest.approx(0.0, abs=1e-6)


def test_sft_ce_and_gather():
    logits = torch.log(torch.tensor([[[0.5, 0.5], [0.25, 0.75], [1.0, 1e-9]]]))
    ids = torch.tensor([[0, 1, 0]])
    logp = gather_logprobs(logits, ids)  # next-token log-probs: p(1|pos0)=0.5, p(0|pos1)=0.25
    torch.testing.assert_close(logp, torch.log(torch.tensor([[0.5, 0.25]])))
    assert sft_cross_entropy(logp, torch.tensor([[1., 1.]])).item() == pytest.approx(-(math.log(0.5) + math.log(0.25)) / 2)


@pytest.mark.parametrize("acc,expected", [(0.0, 5.0), (0.5, 1.0), (1.0, 0.2)])
def test_red_accuracy_factor_edges(acc, expected):
    w = red_weights(RedState(), acc, G=5.0, accuracy_aware=True, weight_min=0.0, weight_max=25.0)
    assert w["red/accuracy_factor"] == pytest.approx(expected)
    assert w["red/entropy_weight"] == 1.0  # no entropy change yet
    assert w["red/final_weight"] == pytest.approx(expected)


def test_red_entropy_weight_ratio_and_clamps():
    s = red_update(RedState(), h_sft=2.0, h_rl=3.0, decay_sft=0.5, decay_rl=0.5)
    s = red_update(s, h_sft=1.0, h_rl=2.0, decay_sft=0.5, decay_rl=0.5)
    # EMAs: sft 2 -> 1.5 (Δ 0.5), rl 3 -> 2.5 (Δ 0.5): ratio 1
    assert red_weights(s, 0.5, 5.0, True, 0, 25)["red/entropy_weight"] == pytest.approx(1.0, abs=1e-5)
    s = red_update(s, h_sft=0.0, h_rl=2.5, decay_sft=0.5, decay_rl=0.5)
    # sft 1.5 -> 0.75 (Δ 0.75), rl 2.5 -> 2.5 (Δ 0): ΔH_rl = 0 -> ratio huge -> clamped to G
    assert red_weights(s, 0.5, 5.0, True, 0, 25)["red/entropy_weight"] == 5.0
    s2 = red_update(red_update(RedState(), 1.0, 1.0, 0.5, 0.5), 1.0, 5.0, 0.5, 0.5)
    # Δ_sft 0, Δ_rl 2 -> ratio 0 -> clamped up to 1
    assert red_weights(s2, 0.5, 5.0, True, 0, 25)["red/entropy_weight"] == 1.0


def test_red_with_g_one_is_a_constant_weight():
    s = red_update(red_update(RedState(), 3.0, 1.0, 0.9, 0.9), 0.0, 1.0, 0.9, 0.9)
    for acc in (0.0, 0.3, 1.0):
        w = red_weights(s, acc, G=1.0, accuracy_aware=True, weight_min=0.0, weight_max=25.0)
        assert (w["red/entropy_weight"], w["red/accuracy_factor"], w["red/final_weight"]) == (1.0, 1.0, 1.0)


def test_red_final_weight_clamp_and_part2_switch():
    w = red_weights(RedState(), 0.0, G=5.0, accuracy_aware=True, weight_min=0.0, weight_max=2.0)
    assert w["red/final_weight"] == 2.0
    w = red_weights(RedState(), 0.0, G=5.0, accuracy_aware=False, weight_min=0.0, weight_max=25.0)
    assert w["red/accuracy_factor"] == 1.0


def test_red_state_round_trips():
    from dataclasses import asdict
    s = red_update(red_update(RedState(), 1.0, 2.0, 0.99, 0.99), 1.5, 2.5, 0.99, 0.99)
    assert RedState(**asdict(s)) == s and s.steps == 2


def test_red_entropy_weight_is_one_for_the_trainers_first_two_steps():
    """As the trainer runs it (utils/train/grpo_trainer.py _update): step t's weight is computed from
    the state holding steps 1..t−1, so steps 1 and 2 have no EMA change yet, and step 3 uses the
    change from step 1 to step 2. Entropies (sft, rl) per step: (2, 3), (1, 2.5), anything; decay
    0.5: sft 2 -> 1.5 (Δ 0.5), rl 3 -> 2.75 (Δ 0.25): step 3's ratio 2."""
    state, weights = RedState(), []
    for h_sft, h_rl in ((2.0, 3.0), (1.0, 2.5), (7.0, 7.0)):
        weights.append(red_weights(state, 0.5, 5.0, True, 0, 25)["red/entropy_weight"])
        state = red_update(state, h_sft, h_rl, 0.5, 0.5)
    assert weights == [1.0, 1.0, pytest.approx(2.0, abs=1e-4)]


def test_red_accuracy_counts_only_fully_correct_answers():
    """Issue 45 case: on F1-scored data partial credit is not accuracy. Four episodes scoring 1, 0.5,
    0.5 and 0: acc is 1/4 (not the mean F1 0.5), so w_acc = 5^(1 − 0.5) = 2.236, not 5^0 = 1."""
    from utils.train.sampler import batch_accuracy

    scored = [{"answer": a} for a in (1.0, 0.5, 0.5, 0.0)]
    assert batch_accuracy(scored) == 0.25
    w = red_weights(RedState(), batch_accuracy(scored), 5.0, True, 0, 25)
    assert w["red/accuracy_factor"] == pytest.approx(5 ** 0.5)


def test_pass_at_k_is_a_hit_only_for_a_fully_correct_sample():
    from utils.eval.evaluation import pass_at_k

    scored = [{"qid": "a", "answer": 0.5}, {"qid": "a", "answer": 0.0},  # best F1 0.5: no hit
              {"qid": "b", "answer": 0.5}, {"qid": "b", "answer": 1.0},  # one sample right: a hit
              {"qid": "c", "answer": 0.0}, {"qid": "c", "answer": 0.0}]
    assert pass_at_k(scored) == pytest.approx(1 / 3)


def test_the_unclipped_loss_is_minus_a_times_the_ratio_by_hand():
    """The releases' RL term (loss_remove_clip=True): −A·r per token with no clip, where PPO-clip would
    stop a ratio of e^0.5 at 1.28 for a positive advantage."""
    from utils.train.losses import policy_loss

    old = torch.zeros(1, 2)
    logp, adv, mask = torch.tensor([[0.5, -0.5]]), torch.tensor([2.0]), torch.ones(1, 2)
    loss, stats = policy_loss("unclipped", logp, old, adv, mask, 0.2, 0.28, "token-mean")
    want = -(2 * math.exp(0.5) + 2 * math.exp(-0.5)) / 2
    assert loss.item() == pytest.approx(want) and stats["clip_frac"] == 0.0
    clipped, clip_stats = policy_loss("ppo_clip", logp, old, adv, mask, 0.2, 0.28, "token-mean")
    assert clipped.item() == pytest.approx(-(2 * 1.28 + 2 * math.exp(-0.5)) / 2) and clip_stats["clip_frac"] == 0.5
