"""Loading a model's tokenizer and weights with transformers: one place, so a model directory's own
Python code (`auto_map` in its config) runs only when `model.trust_remote_code` says so.

Every load in the project passes the config's value explicitly (default false), and vLLM gets the
same value (utils/agent/engines.py). A local directory that ships code is refused up front, before
transformers or vLLM would ask, with a message naming the file and the switch. The models this
project ships configs for (tiny-arith, Qwen2.5, Gemma-2) need no remote code.

The attention a model runs on is chosen here too (`attention_for`): a model whose attention softcaps
its logits (Gemma-2's `attn_logit_softcapping`) loads with eager attention, since transformers' sdpa
path drops the softcap without a word, and the trainer and the HF engine (both load through
`load_causal_lm`) would then agree with each other on a model vLLM does not serve. Any other model
keeps transformers' default (sdpa).
"""
from __future__ import annotations

import json
from pathlib import Path

from utils.core.config import ConfigError

CODE_FILES = ("config.json", "tokenizer_config.json")  # where a model directory names its own classes


def check_remote_code(path: Path | str, trust_remote_code: bool) -> None:
    """ConfigError if the local model directory `path` ships Python code (auto_map) and trust is off."""
    if trust_remote_code:
        return
    for name in CODE_FILES:
        f = Path(path) / name
        try:
            auto_map = json.loads(f.read_text()).get("auto_map") if f.is_file() else None
        except (OSError, ValueError, AttributeError):
            continue  # not ours to judge: transformers reports a broken config itself
        if auto_map:
            raise ConfigError(f"{f}: the model ships its own Python code (auto_map: "
                              f"{', '.join(sorted(auto_map))}), which is not run unless you trust it: set "
                              "model.trust_remote_code=true (--set model.trust_remote_code=true)")


def load_tokenizer(path: Path | str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    check_remote_code(path, trust_remote_code)
    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)


def attention_for(config) -> str | None:
    """"eager" for a model config whose attention softcaps its logits (its own or its text config's
    `attn_logit_softcapping`), else None: transformers' default."""
    for c in (config, getattr(config, "text_config", None)):
        if getattr(c, "attn_logit_softcapping", None):
            return "eager"
    return None


def load_causal_lm(path: Path | str, dtype: str = "float32", trust_remote_code: bool = False):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    check_remote_code(path, trust_remote_code)
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    attention = attention_for(config)
    return AutoModelForCausalLM.from_pretrained(path, config=config, dtype=getattr(torch, dtype),
                                                trust_remote_code=trust_remote_code,
                                                **({"attn_implementation": attention} if attention else {}))
