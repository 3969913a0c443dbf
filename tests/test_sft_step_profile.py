"""benchmarks/sft_step_profile.py (through utils/train/sft_floor.py) measures 04's SFT step against a
floor that must compute the same function: the adapter merged into the weights gives the LoRA model's loss, and the floor's backward
reaches every layer while training no weight but the input embedding. And the real step it times
takes exactly the batches the floor is timed on, in order."""
import torch

from helpers import random_examples, random_lora
from utils.core.schema import LoraConfig, WarmupConfig
from utils.train.policy import load_policy, sft_loss
from utils.train.sft_trainer import SftLoop


def test_the_merged_floor_computes_the_lora_models_loss_and_trains_only_the_embedding(base_dir):
    import utils.train.sft_floor as mod
    model = random_lora(base_dir)
    model.train()
    batch = random_examples(6)
    floor = mod.merged_floor(model)
    assert not any("lora" in name for name, _ in floor.named_parameters())
    torch.testing.assert_close(sft_loss(floor, batch, 0), sft_loss(model, batch, 0), atol=1e-5, rtol=1e-5)
    plain = load_policy(base_dir, LoraConfig(rank=8, alpha=16), trainable=False).get_base_model()
    assert abs(sft_loss(plain, batch, 0).item() - sft_loss(floor, batch, 0).item()) > 1e-4  # the adapter is in it
    sft_loss(floor, batch, 0).backward()
    with_grad = [name for name, p in floor.named_parameters() if p.grad is not None]
    assert with_grad == ["model.embed_tokens.weight"] and floor.get_input_embeddings().weight.grad.abs().sum() > 0
    assert mod.fwd_bwd(floor, batch, 0) > 0 and floor.get_input_embeddings().weight.grad is None  # dropped after


def test_the_timed_steps_take_the_recorded_batches_in_order(base_dir, tmp_path, monkeypatch):
    import utils.train.sft_trainer as st

    import utils.train.sft_floor as mod
    model = random_lora(base_dir)
    loop = SftLoop(model, random_examples(10, seed=1), WarmupConfig(steps=8, batch_size=4), 3, 0, tmp_path, None, "x")
    batches = mod.record_batches(loop, 5)
    assert loop.state.step == 0 and loop.state.data.position == 0  # recording consumed nothing
    fresh = SftLoop(model, random_examples(10, seed=1), WarmupConfig(steps=8, batch_size=4), 3, 0, tmp_path, None, "x")
    assert [[e.qid for e in fresh._next_batch()] for _ in range(5)] == [[e.qid for e in b] for b in batches]
    stepped = []
    real_batch = st.sft_batch  # what the real step pads: the examples it took
    monkeypatch.setattr(st, "sft_batch", lambda b, *a: (stepped.append([e.qid for e in b]), real_batch(b, *a))[1])
    taken = []
    original = mod.fwd_bwd
    mod.fwd_bwd = lambda m, b, pad: taken.append([e.qid for e in b]) or 0.0
    try:
        times = mod.profile(loop, model, model, mod.merged_floor(model), batches, 2, 0)
    finally:
        mod.fwd_bwd = original
    expected = [[e.qid for e in b] for b in batches]
    assert stepped == expected * 2  # the real step, two rounds
    assert taken == [q for q in expected * 2 for _ in range(4)]  # then the LoRA, peft, folded and floor passes
    assert loop.state.step == 0 and loop.sched.last_epoch == 10  # the profile steps the optimizer, not the loop
    assert [len(v) for v in times.values()] == [10] * 5
    assert all(t > 0 for t in times["step"])
