"""The trainer's forward pass over ragged batches: length-chunked passes give the one-pass values
and gradients on real tokens (fp32 rounding apart), and the chunking is an exact partition."""
import random

import pytest
import torch

from utils.core.schema import LoraConfig
from utils.core.tensors import pad
from utils.train.policy import forward_logprobs, logits_logprobs, length_chunks, load_policy


def test_length_chunks_partition_and_optimum():
    rng = random.Random(0)
    lengths = [rng.choice([20, 25, 30]) for _ in range(40)] + [rng.randint(200, 300) for _ in range(10)]
    runs = length_chunks(lengths, pass_cost=256)
    assert sorted(i for run in runs for i in run) == list(range(len(lengths)))  # each sequence once
    widths = [max(lengths[i] for i in run) for run in runs]
    assert widths == sorted(widths, reverse=True)  # longest first
    cost = sum(256 + len(run) * w for run, w in zip(runs, widths))
    one_pass = 256 + len(lengths) * max(lengths)
    assert len(runs) >= 2 and cost < one_pass / 3  # planners and executors go apart
    # brute force over every cut of the sorted order (small case): the DP finds the optimum
    small = [3, 9, 4, 10, 2, 8]
    order = sorted(small, reverse=True)
    best = min(sum(5 + (b - a) * order[a] for a, b in zip((0, *cuts), (*cuts, len(order))))
               for mask in range(1 << (len(order) - 1))
               for cuts in [tuple(k + 1 for k in range(len(order) - 1) if mask >> k & 1)])
    runs = length_chunks(small, pass_cost=5)
    assert sum(5 + len(r) * max(small[i] for i in r) for r in runs) == best
    assert length_chunks([7, 7, 7], pass_cost=5) == [[0, 1, 2]]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_forward_matches_one_pass(base_dir, temperature):
    torch.manual_seed(0)
    model = load_policy(base_dir, LoraConfig(rank=8, alpha=16))
    for p in model.parameters():  # a non-zero adapter, so its gradients are not all zero
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05)
    rng = random.Random(1)
    seqs = [[rng.randint(3, 99) for _ in range(n)] for n in [180, 25, 30, 170, 22, 28, 1, 120]]
    ids, attn = pad(seqs, 0, torch.long)
    mask = attn[:, 1:].float()

    def run(fn):
        model.zero_grad()
        logp, ent = fn(model, ids, attn, True, temperature)
        ((logp * mask).sum() + (ent * mask).sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        return logp.detach() * mask, ent.detach() * mask, grads

    one = run(logits_logprobs)
    chunked = run(lambda m, i, a, e, t: forward_logprobs(m, i, a, with_entropy=e, temperature=t, entropy_grad=True))
    assert len(length_chunks(attn.sum(1).tolist())) > 1  # the batch really is split
    torch.testing.assert_close(chunked[0], one[0], atol=1e-5, rtol=1e-5)  # fp32 rounding
    torch.testing.assert_close(chunked[1], one[1], atol=1e-5, rtol=1e-5)
    for name in one[2]:
        torch.testing.assert_close(chunked[2][name], one[2][name], atol=1e-4, rtol=1e-4)


def test_one_pass_update_needs_no_separate_old_logprobs(base_dir):
    """With one optimizer pass per batch the old log-probs are the update's own, detached: the loss,
    its gradient and the logged sampler mismatch equal those of a separate old-log-prob forward."""
    from utils.core.loader import load_run_config
    from utils.train.batch import RlBatch
    from utils.train.update import red_grpo_loss
    from utils.train.red import RedState

    torch.manual_seed(0)
    model = load_policy(base_dir, LoraConfig(rank=8, alpha=16))
    for p in model.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05)
    rng = random.Random(2)
    ids, attn = pad([[rng.randint(3, 99) for _ in range(n)] for n in [90, 20, 60, 15]], 0, torch.long)
    mask = attn[:, 1:].float()
    mask[:, :5] = 0  # a prompt
    batch = RlBatch(ids, attn, mask, torch.full(mask.shape, -2.0) * mask, torch.tensor([1.0, -0.5, 0.3, -0.8]),
                    ["planner", "executor", "planner", "executor"])
    alg = load_run_config(overrides=["algorithm.rl.temperature=0.7"]).algorithm

    def loss_and_grads(old_lp):
        model.zero_grad()
        terms = red_grpo_loss(model, batch, old_lp, None, alg, RedState(), 0.5)  # runs the backward
        return terms, {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    with torch.no_grad():
        old, _ = forward_logprobs(model, ids, attn, temperature=0.7)
    separate, g_separate = loss_and_grads(old)
    reused, g_reused = loss_and_grads(None)
    assert reused.stats["actor/ratio_mean"] == 1.0 and reused.stats["actor/clip_frac"] == 0.0
    for key in ("actor/loss", "actor/pg_loss", "rollout/logprob_mismatch"):
        assert reused.stats[key] == pytest.approx(separate.stats[key], rel=1e-5, abs=1e-6)
    assert separate.stats["rollout/logprob_mismatch"] > 0.1  # the mismatch is measured, not a constant
    for name in g_separate:
        torch.testing.assert_close(g_reused[name], g_separate[name], atol=1e-5, rtol=1e-4)
