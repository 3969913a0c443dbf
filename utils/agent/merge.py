"""Folding a peft LoRA adapter into its base model's weights: what the vLLM engine's merged serving
(`model.engine.lora_serving: merged`, utils/agent/engines.py) reloads at each policy change."""
from __future__ import annotations

import json
import math
from pathlib import Path


def lora_deltas(adapter_dir: Path) -> dict:
    """Base weight name -> the fp32 update a peft LoRA adapter adds to it: scale·B·A, with scale
    alpha/r (alpha/sqrt(r) under rsLoRA). Variants whose update is not of that form are refused."""
    scale, factors = lora_factors(adapter_dir)
    return {name: _delta(scale, a, b) for name, (a, b) in factors.items()}


def _delta(scale: float, a, b):
    return scale * (b.float() @ a.float())


class MergedWeights:
    """(name, weight) of every tensor in a model's safetensors files, each LoRA target as W + scale·B·A
    (the same fp32 arithmetic as `lora_deltas`), read and merged one tensor at a time as it is
    iterated: the engine's merged reload never holds a second copy of the model. It pickles as the
    file paths and the adapter's small factors, so it crosses to a spawned engine's worker too."""

    def __init__(self, files: list[Path], adapter_dir: Path | None):
        self.files = [str(f) for f in files]
        self.scale, self.factors = lora_factors(adapter_dir) if adapter_dir is not None else (1.0, {})

    def names(self) -> set[str]:
        from safetensors import safe_open

        out: set[str] = set()
        for file in self.files:
            with safe_open(file, "pt") as f:
                out.update(f.keys())
        return out

    def __iter__(self):
        from safetensors import safe_open

        for file in self.files:
            with safe_open(file, "pt") as f:
                for name in f.keys():
                    w = f.get_tensor(name)
                    if name in self.factors:
                        w = (w.float() + _delta(self.scale, *self.factors[name])).to(w.dtype)
                    yield name, w


def lora_factors(adapter_dir: Path) -> tuple[float, dict]:
    """(scale, {base weight name: (A, B)}) of a peft LoRA adapter: its update to that weight is
    scale·B·A. Variants whose update is not of that form are refused."""
    from safetensors.torch import load_file

    cfg_path = adapter_dir / "adapter_config.json"
    if not cfg_path.is_file():
        raise ValueError(f"{adapter_dir}: no adapter_config.json; merged LoRA serving needs a peft LoRA adapter")
    cfg = json.loads(cfg_path.read_text())
    unsupported = [k for k in ("use_dora", "fan_in_fan_out", "rank_pattern", "alpha_pattern", "modules_to_save")
                   if cfg.get(k)]
    if cfg.get("peft_type", "LORA") != "LORA" or unsupported:
        raise ValueError(f"{cfg_path}: {', '.join(unsupported) or cfg.get('peft_type')} cannot be served merged; "
                         "set model.engine.lora_serving=adapter")
    r = cfg["r"]
    scale = cfg["lora_alpha"] / (math.sqrt(r) if cfg.get("use_rslora") else r)
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    embedding = sorted(k for k in tensors if ".lora_embedding_" in k)
    if embedding:  # peft's embedding LoRA is a lookup, not scale·B·A on a weight: it would be dropped
        raise ValueError(f"{adapter_dir}: {embedding[0]} is an embedding LoRA, which cannot be served merged; "
                         "set model.engine.lora_serving=adapter or leave the embeddings out of model.lora.target_modules")
    factors = {}
    for key, a in tensors.items():
        if key.endswith(".lora_A.weight"):
            prefix = key[:-len(".lora_A.weight")]
            factors[prefix.removeprefix("base_model.model.") + ".weight"] = (a, tensors[prefix + ".lora_B.weight"])
    return scale, factors


def tied_head(model_dir: Path) -> bool:
    """Whether the model ties its LM head to its input embeddings (config.json `tie_word_embeddings`):
    then vLLM loads one of the two and, on a merged reload, puts the head's old copy back and warns
    `ParallelLMHead: Failed to load weights`, harmless while no LoRA touches either."""
    config = json.loads((model_dir / "config.json").read_text())
    return bool(config.get("tie_word_embeddings", config.get("text_config", {}).get("tie_word_embeddings", False)))


def head_conflict(names, tied: bool) -> str | None:
    """The LoRA target, among weight `names`, that merged serving would serve wrongly on a model whose
    head is tied to its embeddings (the reload keeps the head's old copy), or None."""
    if not tied:
        return None
    return next((n for n in sorted(names) if n == "lm_head.weight" or n.endswith("embed_tokens.weight")), None)


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a model directory (one file, or the shards of an index)."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        return sorted({model_dir / f for f in json.loads(index.read_text())["weight_map"].values()})
    single = model_dir / "model.safetensors"
    if not single.is_file():
        raise ValueError(f"{model_dir}: no model.safetensors(.index.json); merged LoRA serving reads the base from it")
    return [single]
