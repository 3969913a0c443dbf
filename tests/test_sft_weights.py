"""How a step weighs its SFT term against its policy loss (utils/train/sft_weights.py): RED's weight,
and CHORD's (1 − μ)·L_GRPO + μ·L_SFT with its μ schedule and φ token weights, by hand and through the
micro-batched update."""
import math

import pytest
import torch

from helpers import assert_close, ragged_rl_batch, random_lora, random_sft_batch
from utils.core.loader import load_run_config
from utils.core.schema import MemoryConfig
from utils.train.policy import forward_logprobs, sft_terms
from utils.train.red import RedState
from utils.train.sft_weights import SFT_WEIGHTINGS, chord_mu
from utils.train.update import red_grpo_loss

RED = RedState(ema_sft=1.0, ema_rl=2.0, prev_ema_sft=1.1, prev_ema_rl=2.05, steps=2)  # w_entropy > 1


def _sft_batch():
    return random_sft_batch(rows=6, seed=1, max_len=30)


def _grads(model, batch, old, sft, alg, step: int, budget: int = 0):
    model.zero_grad(set_to_none=True)
    terms = red_grpo_loss(model, batch, old, sft, alg, RED, 0.4, memory=MemoryConfig(micro_batch_tokens=budget,
                                                                                    logits_chunk_mib=0.004), step=step)
    return terms, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_chords_mu_rises_then_falls_on_a_half_cosine_to_its_valley():
    # warmup 2, decay 4, peak 0.8, valley 0.2: 0, 0.4, then 0.2 + 0.6·(1 + cos(π·t/4))/2 for t = 0..3, then 0.2
    got = [chord_mu(s, 2, 4, 0.8, 0.2) for s in range(8)]
    half = [0.2 + 0.3 * (1 + math.cos(math.pi * t / 4)) for t in range(4)]
    assert got == pytest.approx([0.0, 0.4, *half, 0.2, 0.2])
    assert half[0] == pytest.approx(0.8) and half[2] == pytest.approx(0.5)
    mu = load_run_config(algorithm="chord_mu").algorithm.chord  # the shipped CHORD-μ: 0.9 at the first step
    assert chord_mu(0, mu.mu_warmup_steps, mu.mu_decay_steps, mu.mu_peak, mu.mu_valley) == pytest.approx(0.9)
    assert chord_mu(30, mu.mu_warmup_steps, mu.mu_decay_steps, mu.mu_peak, mu.mu_valley) == pytest.approx(0.05)
    phi = load_run_config(algorithm="chord_phi").algorithm.chord  # the shipped CHORD-φ: a constant 0.1
    assert {chord_mu(s, phi.mu_warmup_steps, phi.mu_decay_steps, phi.mu_peak, phi.mu_valley) for s in (0, 7, 29)} \
        == {0.1}


def test_red_weighting_is_reds_weight_times_alpha_and_leaves_the_policy_loss_whole():
    alg = load_run_config(algorithm="red").algorithm
    mix = SFT_WEIGHTINGS.get("red")(alg, RED, 0.4, 3)
    assert mix.rl == 1.0 and mix.token_weight == "none"
    assert mix.sft == pytest.approx(mix.stats["red/final_weight"] * 0.1)
    assert mix.stats["red/accuracy_factor"] == pytest.approx(5.0 ** (1 - 0.8))


def test_phi_weighs_each_tokens_nll_by_its_detached_p_times_one_minus_p(base_dir):
    model = random_lora(base_dir)
    ids, attn, mask = _sft_batch()
    nll, _ = sft_terms(model, (ids, attn, mask), token_weight="phi")
    nll.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    logp, _ = forward_logprobs(model, ids, attn, need=mask > 0)
    p = logp.detach().exp()
    by_hand = -(logp * p * (1 - p) * mask).sum() / mask.sum()  # CHORD's masked mean: over the token count
    assert nll.item() == pytest.approx(by_hand.item(), rel=1e-5)
    by_hand.backward()
    for n, g in got.items():
        assert_close(g, model.get_parameter(n).grad)
    plain, _ = sft_terms(model, (ids, attn, mask))
    assert plain.item() > 2 * nll.item()  # φ ≤ 1/4: the weighted loss is a fraction of the plain one


@pytest.mark.parametrize("method", ["chord_mu", "chord_phi"])
def test_chords_update_is_one_minus_mu_of_grpos_plus_mu_of_the_sft_terms(method, base_dir):
    """The update's gradient is (1 − μ)·∇L_GRPO + μ·∇L_SFT (φ-weighted for CHORD-φ), μ at the step asked,
    cut into micro-batches or not."""
    model = random_lora(base_dir)
    batch, sft = ragged_rl_batch(), _sft_batch()
    old = batch.sampler_lp + 0.05 * torch.randn(batch.mask.shape, generator=torch.Generator().manual_seed(5))
    alg = load_run_config(algorithm=method).algorithm
    step = 12
    c = alg.chord
    mu = chord_mu(step, c.mu_warmup_steps, c.mu_decay_steps, c.mu_peak, c.mu_valley)
    assert 0.05 < mu < 0.9 if method == "chord_mu" else mu == 0.1
    terms, g = _grads(model, batch, old, sft, alg, step)
    _, g_rl = _grads(model, batch, old, None, alg, step)  # the policy loss alone, already × (1 − μ)
    model.zero_grad(set_to_none=True)
    nll, _ = sft_terms(model, sft, token_weight="phi" if c.phi else "none")
    nll.backward()
    g_sft = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    for n in g:
        assert_close(g[n], g_rl[n] + mu * g_sft[n])
    assert terms.stats["chord/mu"] == pytest.approx(mu) and "red/final_weight" not in terms.stats
    assert terms.stats["actor/sft_loss"] == pytest.approx(nll.item(), rel=1e-5)
    cut, g_cut = _grads(model, batch, old, sft, alg, step, budget=60)  # episode 0 split across pieces
    for n in g:
        assert_close(g_cut[n], g[n])
    assert cut.stats["actor/sft_loss"] == pytest.approx(terms.stats["actor/sft_loss"], rel=1e-5)


def test_the_policy_loss_takes_one_minus_mu(base_dir):
    """(1 − μ) scales the policy loss alone: against grpo's update of the same batch, CHORD's RL-only
    gradient is exactly (1 − μ) times it."""
    model = random_lora(base_dir)
    batch = ragged_rl_batch()
    old = batch.sampler_lp + 0.05 * torch.randn(batch.mask.shape, generator=torch.Generator().manual_seed(5))
    chord = load_run_config(algorithm="chord_mu").algorithm
    _, g_chord = _grads(model, batch, old, None, chord, 0)
    _, g_grpo = _grads(model, batch, old, None, load_run_config(algorithm="grpo").algorithm, 0)
    for n in g_grpo:
        assert_close(g_chord[n], (1 - 0.9) * g_grpo[n], rel=1e-4)  # the scale applied before the backward or after


def test_a_chord_config_out_of_range_is_refused():
    alg = load_run_config(algorithm="chord_mu", overrides=["algorithm.chord.mu_peak=1.5"]).algorithm
    with pytest.raises(ValueError, match=r"outside \[0, 1\]"):
        SFT_WEIGHTINGS.get("chord")(alg, RED, 0.5, 0)
