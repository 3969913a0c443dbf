"""What merged LoRA serving (utils/agent/merge.py) refuses to serve rather than serve wrongly, and the
one vLLM notice it silences: pure functions on files, no engine (the engine tests serve real adapters)."""
import json
import logging

import pytest
import torch
from safetensors.torch import save_file

from utils.agent.engines import _TiedHeadNotice
from utils.agent.merge import head_conflict, lora_factors, tied_head


def _adapter(folder, tensors):
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4}))
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


def test_an_embedding_lora_is_refused_not_dropped(tmp_path):
    linear = {"base_model.model.model.layers.0.mlp.up_proj.lora_A.weight": torch.ones(2, 4),
              "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight": torch.ones(6, 2)}
    scale, factors = lora_factors(_adapter(tmp_path / "ok", linear))
    assert scale == 2.0 and list(factors) == ["model.layers.0.mlp.up_proj.weight"]
    embedding = {**linear, "base_model.model.model.embed_tokens.lora_embedding_A": torch.ones(2, 10),
                 "base_model.model.model.embed_tokens.lora_embedding_B": torch.ones(4, 2)}
    with pytest.raises(ValueError, match="embedding LoRA, which cannot be served merged"):
        lora_factors(_adapter(tmp_path / "emb", embedding))


def test_a_tied_head_refuses_a_lora_on_the_head_or_the_embeddings(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    assert tied_head(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"tie_word_embeddings": False}}))
    assert not tied_head(tmp_path)
    layers = {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight"}
    assert head_conflict(layers, tied=True) is None
    assert head_conflict(layers | {"lm_head.weight"}, tied=True) == "lm_head.weight"
    assert head_conflict(layers | {"model.embed_tokens.weight"}, tied=True) == "model.embed_tokens.weight"
    assert head_conflict(layers | {"lm_head.weight"}, tied=False) is None  # an untied head reloads its own weight


def test_only_the_tied_heads_reload_notice_is_silenced():
    log = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    record = lambda layer: log.makeRecord(log.name, logging.WARNING, __file__, 1, "%s: Failed to load weights",
                                          (layer,), None)
    assert not _TiedHeadNotice().filter(record("ParallelLMHead"))
    assert _TiedHeadNotice().filter(record("QKVParallelLinear"))  # a missing weight elsewhere still warns
