"""Loading a model's tokenizer and weights with transformers: one place, so a model directory's own
Python code (`auto_map` in its config) runs only when `model.trust_remote_code` says so.

Every load in the project passes the config's value explicitly (default false), and vLLM gets the
same value (utils/agent/engines.py). A local directory that ships code is refused up front, before
transformers or vLLM would ask, with a message naming the file and the switch. The models this
project ships configs for (tiny-arith, Qwen2.5, Gemma-2) need no remote code.
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


def load_causal_lm(path: Path | str, dtype: str = "float32", trust_remote_code: bool = False):
    import torch
    from transformers import AutoModelForCausalLM

    check_remote_code(path, trust_remote_code)
    return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code)
