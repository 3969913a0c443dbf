"""utils/train/lora_fast.py: the fused LoRA forward computes peft's sum (loss and every gradient, on
the tiny model, within fp32 rounding: the kernel decides the last bit), it is what load_policy's
model runs, and every case off its path (dropout, a merged or disabled adapter, another active
adapter) gets peft's own result. The folded forward (`model.lora.forward: folded`) computes the
same function by other arithmetic: its loss and gradients agree with peft's to a looser bound."""
import copy

import pytest
import torch

from helpers import random_examples, random_lora
from utils.train import lora_fast
from utils.train.policy import REFERENCE, _serving, sft_loss


def _peft_copy(model):
    """A copy running peft's own forward again."""
    stock = copy.deepcopy(model)
    assert lora_fast.uninstall_fast_lora(stock) == 28
    return stock


def _loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    loss = sft_loss(model, batch, 0)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _layers(model):
    from peft.tuners.lora.layer import Linear
    return [m for m in model.modules() if isinstance(m, Linear)]


def test_load_policy_installs_it_on_every_adapted_layer_and_the_path_is_taken(base_dir):
    model = random_lora(base_dir)
    layers = _layers(model)
    assert len(layers) == 4 * 7  # tiny-arith: 4 layers x (q, k, v, o, gate, up, down)
    assert all(layer.forward.__func__ is lora_fast.fast_forward for layer in layers)
    x = torch.randn(2, 5, 128)
    assert lora_fast.fast_path(layers[0], x, (), {}) == "default"
    copied = _layers(copy.deepcopy(model))
    assert all(c.forward.__self__ is c for c in copied)  # a deep copy's layers run on their own weights
    assert lora_fast.install_fast_lora(_peft_copy(model).get_base_model()) == 28  # bare peft layers found again


def test_loss_and_every_gradient_match_pefts_forward(base_dir):
    model = random_lora(base_dir)
    model.train()
    stock = _peft_copy(model)
    assert all(getattr(m.forward, "__func__", None) is not lora_fast.fast_forward for m in _layers(stock))
    batch = random_examples(6)
    loss, grads = _loss_and_grads(model, batch)
    ref_loss, ref_grads = _loss_and_grads(stock, batch)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    assert grads.keys() == ref_grads.keys() and len(grads) == 2 * 28  # every A and B, nothing else
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-5, atol=1e-7, msg=name)
    assert any(g.abs().sum() > 0 for n, g in grads.items() if "lora_B" in n)


def test_the_folded_forward_is_installed_on_request_and_gives_pefts_loss_and_gradients(base_dir):
    model = random_lora(base_dir)
    model.train()
    stock = _peft_copy(model)
    assert lora_fast.install_fast_lora(model, "folded") == 28
    assert all(layer.forward.__func__ is lora_fast.folded_forward for layer in _layers(model))
    batch = random_examples(6)
    loss, grads = _loss_and_grads(model, batch)
    ref_loss, ref_grads = _loss_and_grads(stock, batch)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys() and len(grads) == 2 * 28
    for name, g in grads.items():  # other arithmetic: within 1e-4 of each tensor's largest entry
        scale = ref_grads[name].abs().max()
        assert (g - ref_grads[name]).abs().max() <= 1e-4 * scale + 1e-8, name
    assert any(g.abs().sum() > 0 for n, g in grads.items() if "lora_B" in n)
    with torch.no_grad():  # no change to the stored weights: the fold is per call
        for (n, p), (_, q) in zip(model.named_parameters(), stock.named_parameters()):
            assert torch.equal(p, q), n
    assert lora_fast.uninstall_fast_lora(model) == 28


def test_a_config_naming_the_folded_forward_gets_it_from_load_policy(base_dir):
    from utils.core.schema import LoraConfig
    from utils.train.policy import load_policy

    model = load_policy(base_dir, LoraConfig(rank=8, alpha=16, forward="folded"))
    assert all(layer.forward.__func__ is lora_fast.folded_forward for layer in _layers(model))
    model = load_policy(base_dir, LoraConfig(rank=8, alpha=16))
    assert all(layer.forward.__func__ is lora_fast.fast_forward for layer in _layers(model))


def test_dropout_keeps_pefts_forward(base_dir):
    model = random_lora(base_dir, dropout=0.5)
    layer = _layers(model)[0]
    assert lora_fast.fast_path(layer, torch.randn(2, 5, 128), (), {}) is None
    model.train()
    torch.manual_seed(3)
    out = model(input_ids=torch.tensor([[5, 6, 7, 8]])).logits
    stock = _peft_copy(model)
    torch.manual_seed(3)  # same dropout masks: the same computation, so the same numbers
    torch.testing.assert_close(out, stock(input_ids=torch.tensor([[5, 6, 7, 8]])).logits, rtol=0, atol=0)


@pytest.mark.parametrize("forward", ["fused", "folded"])
@pytest.mark.parametrize("case", ["disabled", "reference", "merged"])
def test_disabled_merged_and_other_adapters_give_pefts_result(base_dir, tmp_path, case, forward):
    model = random_lora(base_dir)
    lora_fast.install_fast_lora(model, forward)
    model.eval()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    if case == "reference":  # a second adapter, active as the KL reference is while it scores
        other = random_lora(base_dir)
        with torch.no_grad():
            for p in other.parameters():
                if p.requires_grad:
                    p.mul_(-2.0)
        other.save_pretrained(tmp_path / "ref")
        model.load_adapter(str(tmp_path / "ref"), adapter_name=REFERENCE, is_trainable=False)
    stock = _peft_copy(model)

    def run(m):
        with torch.no_grad():
            if case == "disabled":
                with m.disable_adapter():
                    return m(input_ids=ids).logits
            if case == "reference":
                with _serving(m, REFERENCE):
                    return m(input_ids=ids).logits
            m.merge_adapter()
            try:
                return m(input_ids=ids).logits
            finally:
                m.unmerge_adapter()

    got, want = run(model), run(stock)
    tol = 1e-6 if forward == "fused" else 1e-4  # the reference alone is on the path: folded arithmetic
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    with torch.no_grad():
        default = stock(input_ids=ids).logits
    if case != "merged":  # the case really changes the result: the test sees which adapter ran
        assert (got - default).abs().max() > 1e-3
