"""Will the stage fit? A training stage's peak resident memory, estimated before anything slow starts.

04 and the RL stages call `check_memory` before they load the model. On a CPU device it estimates the
peak from the model's weights (their shapes, read from the safetensors headers), the LoRA, the
micro-batch and the engine's settings, and where the machine's available memory (MemAvailable) is
short it stops at once with one line naming the setting that saves the most, instead of being killed
by the kernel minutes in. `--set model.memory.preflight=false` runs anyway. On a GPU it checks
nothing (the GPU path's memory is benchmarks/memory_model.py's).

The parts, in bytes (`estimate`):
- `runtime`: Python, torch, transformers and vLLM imported (0.5 GiB measured at a stage's start);
- `policy`: the base weights in `model.dtype`, and the LoRA's weights, gradients and AdamW moments
  (16 bytes a trained parameter; a full fine-tune trains every weight);
- `engine`, where the stage starts one (`vllm`): its weights 2.5 times over (the weights, the CPU
  kernels' packed copy and the runner's buffers: 2.09 GiB measured for SmolLM2-135M with a 0.75 GiB
  cache) and its KV cache (`kv_cache_gb`, or `memory_share` of the machine's memory when 0); the
  `hf` engine holds one more copy of the weights;
- `update`: the LM head's chunks (twice `logits_chunk_mib`: the chunk and its gradient) and, per
  micro-batch token, what the backward keeps: every layer's activations, (16·hidden + 6·intermediate)
  values each, or with activation checkpointing each layer's input and three layers' worth (the
  recomputed layer, its backward's buffers and the heap's fragments: measured, not derived). The
  merged policy's reload happens between updates, so the peak holds the larger of the two (counted
  as a copy of the weights: an upper bound now that it merges one tensor at a time).

Calibrated on SmolLM2-135M-Instruct on this project's 2-core box; docs/PERFORMANCE.md ("Where a real
model's memory goes") sets each estimate beside the measured peak (benchmarks/real_memory.py).
"""
from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from utils.agent.merge import weight_files
from utils.core.errors import StageError

GIB = 2 ** 30
RUNTIME = 0.5 * GIB
ENGINE_WEIGHT_COPIES = 2.5
RECOMPUTED_LAYERS = 3  # checkpointed: a layer's activations recomputed, and what its backward holds beside them
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8}


def weight_shapes(model_dir: Path) -> dict[str, list[int]]:
    """Every tensor's shape in the model's safetensors files, read from their headers alone."""
    shapes = {}
    for file in weight_files(model_dir):
        with open(file, "rb") as f:
            size = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(size))
        shapes.update({k: v["shape"] for k, v in header.items() if k != "__metadata__"})
    return shapes


def estimate(cfg, model_dir: Path, engine: bool, total_memory: int) -> dict[str, float]:
    """The stage's peak by part, in bytes (the module's docstring says what each part holds)."""
    shapes = weight_shapes(model_dir)
    arch = json.loads((model_dir / "config.json").read_text())
    params = sum(math.prod(s) for s in shapes.values())
    weights = params * DTYPE_BYTES.get(cfg.model.dtype, 4)
    lora = cfg.model.lora
    if lora.full_finetune:
        trained = params
    else:
        trained = sum(lora.rank * sum(s) for name, s in shapes.items() if len(s) == 2 and name.endswith(".weight")
                      and name.rsplit(".", 2)[-2] in lora.target_modules)
    parts = {"runtime": RUNTIME, "policy": weights + 16 * trained}
    e = cfg.model.engine
    if engine and e.name == "vllm":
        kv = e.kv_cache_gb * GIB if e.kv_cache_gb else e.memory_share * total_memory
        parts["engine"] = ENGINE_WEIGHT_COPIES * params * DTYPE_BYTES.get(e.dtype, 4) + kv
    elif engine and e.name == "hf":
        parts["engine"] = weights
    mem = cfg.model.memory
    hidden, inter = arch["hidden_size"], arch.get("intermediate_size", 4 * arch["hidden_size"])
    layers, act = arch["num_hidden_layers"], DTYPE_BYTES.get(cfg.model.dtype, 4)
    per_layer = (16 * hidden + 6 * inter) * act
    if mem.activation_checkpointing:
        per_token = layers * hidden * act + RECOMPUTED_LAYERS * per_layer
    else:
        per_token = layers * per_layer
    tokens = mem.micro_batch_tokens or 16384
    update = 2 * mem.logits_chunk_mib * 2 ** 20 + tokens * per_token
    reload = weights if engine and e.name == "vllm" and e.lora_serving == "merged" else 0
    parts["update"] = max(update, reload)
    return parts


def available_memory() -> tuple[int, int]:
    """(MemAvailable, MemTotal) in bytes, from /proc/meminfo (0, 0 where there is none)."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return 0, 0
    fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in text.splitlines() if line.split()[1:]}
    return fields.get("MemAvailable", 0), fields.get("MemTotal", 0)


def _advice(cfg) -> str:
    mem, e = cfg.model.memory, cfg.model.engine
    if not mem.activation_checkpointing:
        return "set model.memory.activation_checkpointing=true (the backward keeps one layer's activations, not all)"
    if mem.micro_batch_tokens == 0 or mem.micro_batch_tokens > 1024:
        return (f"lower model.memory.micro_batch_tokens (now {mem.micro_batch_tokens or 'the whole batch'}; "
                "1024 changes what is computed only by fp32 rounding)")
    if e.name == "vllm" and (e.kv_cache_gb == 0 or e.kv_cache_gb > 0.5):
        return f"lower model.engine.kv_cache_gb (now {e.kv_cache_gb or 'memory_share of RAM'})"
    return "use a machine with more memory or a smaller model"


def check_memory(stage: str, cfg, model_dir: Path, engine: bool, have: tuple[int, int] | None = None) -> dict:
    """Stop `stage` now if its estimated peak exceeds the memory available (`have`: (available, total)
    bytes; None reads /proc/meminfo). Returns the estimate in GiB by part, for the manifest."""
    if not str(cfg.model.device).startswith("cpu") or not (model_dir / "config.json").is_file():
        return {}  # a missing model is the loader's error to name
    available, total = have if have is not None else available_memory()
    parts = estimate(cfg, model_dir, engine, total)
    need = sum(parts.values())
    summary = {k: round(v / GIB, 2) for k, v in parts.items()} | {"total": round(need / GIB, 2)}
    if cfg.model.memory.preflight and available and need > available + RUNTIME:
        detail = ", ".join(f"{k} {v}" for k, v in summary.items() if k != "total")
        raise StageError(f"{stage}: needs about {need / GIB:.1f} GiB ({detail}) but {available / GIB:.1f} GiB is "
                         f"available; {_advice(cfg)}, or --set model.memory.preflight=false to run anyway")
    return summary
