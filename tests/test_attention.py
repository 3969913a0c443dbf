"""The attention a model is loaded with (utils/core/models.py `attention_for`): Gemma-2 softcaps its
attention logits (`attn_logit_softcapping`), which transformers' sdpa path drops, so the trainer
(load_policy) and the HF engine load it with eager attention, the model's own; any other model keeps
transformers' default."""
import shutil

import pytest
import torch

from utils.core.config import ROOT
from utils.core.models import load_causal_lm

TINY = ROOT / "artifacts" / "tiny-arith"


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory):
    """A random Gemma-2 (softcap 50, the real one's) whose query and key weights are scaled so that its
    attention logits pass the cap, saved with the tiny tokenizer (ids below 100)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model("gemma2", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=2, num_key_value_heads=1, head_dim=16, vocab_size=300,
                               max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    assert cfg.attn_logit_softcapping == 50.0
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(200)
            layer.self_attn.k_proj.weight.mul_(200)
    path = tmp_path_factory.mktemp("gemma2") / "model"
    model.save_pretrained(path)
    for f in TINY.glob("*token*"):
        shutil.copy(f, path / f.name)
    return path


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits


def test_gemma2_trains_and_samples_with_its_attention_softcap(gemma2):
    from transformers import AutoModelForCausalLM

    from utils.agent.engines import HFEngine
    from utils.core.schema import EngineConfig, LoraConfig
    from utils.train.policy import forward_logprobs, load_policy

    ids = torch.randint(3, 100, (2, 24), generator=torch.Generator().manual_seed(1))
    ref = {impl: AutoModelForCausalLM.from_pretrained(gemma2, attn_implementation=impl).eval()
           for impl in ("eager", "sdpa")}
    eager, sdpa = _logits(ref["eager"], ids), _logits(ref["sdpa"], ids)
    assert (eager - sdpa).abs().max() > 0.1  # the premise: sdpa drops the softcap, and it matters here

    model = load_causal_lm(gemma2).eval()
    assert model.config._attn_implementation == "eager"
    torch.testing.assert_close(_logits(model, ids), eager, atol=1e-5, rtol=1e-5)

    policy = load_policy(gemma2, LoraConfig(rank=4, alpha=8, dropout=0.0)).eval()  # the trainer's load
    with torch.no_grad():
        lp, _ = forward_logprobs(policy, ids, torch.ones_like(ids))
    want = torch.log_softmax(eager[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    torch.testing.assert_close(lp, want, atol=1e-5, rtol=1e-5)

    engine = HFEngine(gemma2, EngineConfig(name="hf", dtype="float32"))  # the HF sampler's load
    assert engine.base.config._attn_implementation == "eager"
    torch.testing.assert_close(_logits(engine.base, ids), eager, atol=1e-5, rtol=1e-5)


def test_a_model_without_an_attention_softcap_keeps_the_default_attention():
    model = load_causal_lm(TINY)
    assert model.config._attn_implementation == "sdpa"
