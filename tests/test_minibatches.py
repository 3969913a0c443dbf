"""PPO minibatches (algorithm.rl.ppo_minibatches): a pass over the rollout batch split into optimizer
steps of whole episodes, each with its share of the SFT batch, every part after the first trained
against log-probs taken before the first step."""
import pytest
import torch

from helpers import REGIME_D, make_trainer
from utils.core.config import ConfigError
from utils.core.loader import load_run_config
from utils.train.batch import RlBatch, minibatch_rows, sft_parts, take_rows
from utils.train.policy import forward_logprobs, load_policy


def _batch(lengths: list[int], episode: list[int], vocab: int = 50, seed: int = 0) -> RlBatch:
    """A right-padded batch of random sequences of `lengths`, sequence i from `episode[i]`."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    attn = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(1, vocab, (n,), generator=g)
        attn[i, :n] = 1
    mask = attn[:, 1:].float()
    return RlBatch(ids, attn, mask, torch.randn(len(lengths), width - 1, generator=g) * mask,
                   torch.arange(len(lengths), dtype=torch.float), ["planner", "executor"] * (len(lengths) // 2)
                   + ["planner"] * (len(lengths) % 2), episode=torch.tensor(episode))


def test_parts_hold_whole_episodes_and_every_row_once():
    batch = _batch([5, 9, 3, 7, 4, 6, 8], episode=[0, 0, 1, 1, 1, 2, 3])
    parts = minibatch_rows(batch, 2)
    assert [p.tolist() for p in parts] == [[0, 1, 2, 3, 4], [5, 6]]  # episodes {0, 1} and {2, 3}
    three = minibatch_rows(batch, 3)
    assert sorted(torch.cat(three).tolist()) == list(range(7))
    for e in range(4):  # no episode is cut between two parts
        assert sum(e in batch.episode[p].tolist() for p in three) == 1
    # more parts than episodes: the last ones are empty, so every rank still takes the same steps
    assert [len(p) for p in minibatch_rows(batch, 6)] == [2, 3, 1, 1, 0, 0]
    assert [p.tolist() for p in minibatch_rows(batch, 1)] == [list(range(7))]


def test_a_part_is_its_rows_cut_to_their_longest_sequence(base_dir):
    """Each field of a part is its rows, cut to the longest kept sequence, the per-token extras on the
    same columns: the part's log-probs are the whole batch's on those rows and columns."""
    batch = _batch([12, 5, 7, 20, 6], episode=[0, 0, 1, 2, 2])
    old = torch.randn(5, 19)
    rows = minibatch_rows(batch, 2)[0]  # episodes 0 and 1: lengths 12, 5, 7
    part, part_old, nothing = take_rows(batch, rows, old, None)
    assert part.ids.shape == (3, 12) and part.mask.shape == part.sampler_lp.shape == part_old.shape == (3, 11)
    assert nothing is None and part.roles == [batch.roles[i] for i in rows.tolist()]
    assert torch.equal(part.adv, batch.adv[rows]) and torch.equal(part.episode, torch.tensor([0, 0, 1]))
    assert torch.equal(part_old, old[rows, :11]) and torch.equal(part.sampler_lp, batch.sampler_lp[rows, :11])
    model = load_policy(base_dir, load_run_config(overrides=[REGIME_D]).model.lora)
    with torch.no_grad():
        whole, _ = forward_logprobs(model, batch.ids, batch.attn)
        cut, _ = forward_logprobs(model, part.ids, part.attn)
    # fp32 rounding only: a part one column off would differ by O(1)
    torch.testing.assert_close(cut * part.mask, whole[rows, :11] * part.mask, atol=1e-4, rtol=1e-4)


def test_the_sft_batch_splits_into_consecutive_rows():
    ids = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0], [6, 7, 8, 9]])
    attn = (ids > 0).long()
    mask = attn[:, 1:].float()
    first, second = sft_parts((ids, attn, mask), 2)
    assert torch.equal(first[0], ids[:2, :3]) and torch.equal(first[2], mask[:2, :2])
    assert torch.equal(second[0], ids[2:]) and torch.equal(second[1], attn[2:])
    assert sft_parts((ids, attn, mask), 4)[3] is None  # three examples, four parts
    assert sft_parts(None, 3) == [None, None, None]


def test_minibatches_take_one_optimizer_step_per_part(hf_engine, protocol_adapter, tmp_path, base_dir):
    """Two passes of two minibatches: four optimizer steps a batch; the old log-probs come from before
    the first step, so the parts after it see ratios off 1 (one pass of one part: exactly 1)."""
    def run(out, *extra):
        cfg = load_run_config(overrides=[REGIME_D, "algorithm.rl.steps=2", "algorithm.rl.questions_per_step=4",
                                         "algorithm.rl.n_samples=4", "algorithm.rl.lr=0.003",
                                         "algorithm.rl.save_freq=100", "algorithm.rl.dump_freq=0",
                                         "algorithm.rl.temperature=0.7", *extra])
        trainer = make_trainer(cfg, hf_engine, protocol_adapter, out, base_dir)
        history = trainer.train()
        steps = {int(s["step"]) for s in trainer.opt.state_dict()["state"].values()}
        return history, steps

    one, one_steps = run(tmp_path / "one")
    four, four_steps = run(tmp_path / "four", "algorithm.rl.ppo_epochs=2", "algorithm.rl.ppo_minibatches=2")
    assert one_steps == {2} and four_steps == {8}
    # the logged counts (08's compute table) are the optimizer's own, and each pass trains the whole
    # batch: step 1 samples the same batch in both runs, so two passes count its tokens twice
    assert sum(m["train/optimizer_steps"] for m in one) == 2 and sum(m["train/optimizer_steps"] for m in four) == 8
    for key in ("train/tokens_rl", "train/tokens_sft"):
        assert one[0][key] > 0 and four[0][key] == 2 * one[0][key], (key, one[0][key], four[0][key])
    assert all(m["actor/ratio_mean"] == 1.0 for m in one)
    assert all(abs(m["actor/ratio_mean"] - 1.0) > 1e-6 for m in four), [m["actor/ratio_mean"] for m in four]
    for m in four:  # the SFT term ran on each part, and RED's weight with it
        assert m["red/final_weight"] > 0 and m["actor/sft_loss"] > 0 and m["train/skipped_nonfinite"] == 0


def test_minibatches_refuse_red_papers_expert_traces():
    with pytest.raises(ConfigError, match="ppo_minibatches=2 with red_paper"):
        load_run_config(algorithm="red_paper", overrides=["algorithm.rl.ppo_minibatches=2"])
    red = load_run_config(algorithm="red", overrides=["algorithm.rl.ppo_minibatches=2"])
    assert red.algorithm.rl.ppo_minibatches == 2
