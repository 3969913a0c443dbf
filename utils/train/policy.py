"""The trained policy: loading it (LoRA or full fine-tuning), its log-probs, and the SFT loss.

`sft_terms` is the one SFT objective of the project, used by the SFT warmup (04, through
`sft_loss`), by the SFT term of RED-GRPO and by the no-RL `sft` method (05): the token-mean negative
log-likelihood over positions whose mask is 1 (a role's own generated tokens), and on request the
token-mean entropy there. Prompts, injected results and padding contribute nothing
(tests/test_losses.py checks `sft_cross_entropy` for this as an invariance).
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from utils.core.config import ConfigError
from utils.core.models import load_causal_lm
from utils.core.schema import LoraConfig
from utils.core.tensors import pad
from utils.agent.episode import Example
from utils.train.lora_fast import install_fast_lora
from utils.train.losses import aggregate, gather_logprobs, sft_cross_entropy, token_entropy


def load_policy(base_path: Path, lora: LoraConfig, dtype: str = "float32", adapter: Path | None = None,
                trainable: bool = True, trust_remote_code: bool = False, device: str = "cpu"):
    """The base model wrapped with a (new or loaded) LoRA adapter, or the bare model for full FT,
    on `device` (model.device; the trainers put their batches where its parameters are)."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import PeftModel, get_peft_model

    model = load_causal_lm(base_path, dtype, trust_remote_code)
    if lora.full_finetune:
        return model.to(device)
    if adapter is not None:
        policy = PeftModel.from_pretrained(model, str(adapter), is_trainable=trainable)
    else:
        cfg = PeftLoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                             target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
        policy = get_peft_model(model, cfg)
    install_fast_lora(policy, lora.forward)  # fewer passes than peft's forward (utils/train/lora_fast.py)
    return policy.to(device)


def policy_device(model):
    """The device the policy's parameters live on: where its training batches must go."""
    return next(model.parameters()).device


REFERENCE = "reference"  # the peft adapter name of the frozen KL reference


def add_reference(model, adapter: Path) -> None:
    """Load `adapter` beside the trained one as the frozen KL reference (the SFT warmup adapter)."""
    if not hasattr(model, "load_adapter"):
        raise ConfigError("algorithm.rl.kl_coef > 0 needs a LoRA policy: the reference is a frozen adapter "
                         "(model.lora.full_finetune=true has none)")
    model.load_adapter(str(adapter), adapter_name=REFERENCE, is_trainable=False)


@contextmanager
def _serving(model, adapter: str):
    """Make `adapter` the active one for the block. peft's set_adapter also flips requires_grad,
    so the block must not build a graph; the trained adapter is active and trainable again after."""
    active = model.active_adapter
    model.set_adapter(adapter)
    try:
        yield
    finally:
        model.set_adapter(active)


def dropout_active(model) -> bool:
    """Whether the model's train-mode forward can differ from its eval-mode one: a Dropout module
    with p > 0 (peft's lora_dropout is one), or a dropout rate above 0 in its config (HF attention
    dropout is applied as a function, not a module)."""
    import torch

    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    rates = config.to_dict() if hasattr(config, "to_dict") else {}
    return any("dropout" in k and isinstance(v, (int, float)) and v > 0 for k, v in rates.items())


def reference_logprobs(model, ids, attn, temperature: float = 1.0):
    """Log-probs [S, T-1] of `ids` under the frozen reference adapter (no gradient)."""
    import torch

    with torch.no_grad(), _serving(model, REFERENCE):
        logp, _ = forward_logprobs(model, ids, attn, temperature=temperature)
    return logp


PASS_COST_TOKENS = 256  # a forward pass's fixed cost, in padded tokens (benchmarks/step_profile.py)


def length_chunks(lengths: list[int], pass_cost: int = PASS_COST_TOKENS) -> list[list[int]]:
    """Indices of a batch's sequences grouped into forward passes, longest first.

    A batch mixes long planner conversations with short executor calls; padding them all to the
    widest wastes most of the compute. Sequences sorted by length are cut into consecutive runs,
    each padded only to its own longest, choosing the cuts that minimise
    (padded tokens + `pass_cost` per pass) exactly (dynamic programming over the sorted order).
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    widths = [lengths[i] for i in order]
    n = len(widths)
    cost, cut = [0.0] + [float("inf")] * n, [0] * (n + 1)
    for end in range(1, n + 1):
        for start in range(end):  # the last run is order[start:end], padded to widths[start]
            c = cost[start] + pass_cost + (end - start) * widths[start]
            if c < cost[end]:
                cost[end], cut[end] = c, start
    runs, end = [], n
    while end:
        runs.append(order[cut[end]:end])
        end = cut[end]
    return runs[::-1]


def _logprobs(model, ids, attn, with_entropy: bool, temperature: float):
    logits = model(input_ids=ids, attention_mask=attn).logits
    logp = gather_logprobs(logits if temperature == 1.0 else logits / temperature, ids)
    return logp, (token_entropy(logits[:, :-1]) if with_entropy else None)


def forward_logprobs(model, ids, attn, with_entropy: bool = False, temperature: float = 1.0):
    """Next-token log-probs [S, T-1] of `ids` under `model` at the sampling `temperature` (logits / T:
    the distribution the sampler drew from), and optionally the entropies [S, T-1] of the untempered
    distribution (the one estimator RED compares on RL and SFT tokens).

    A right-padded batch runs in `length_chunks` passes, each trimmed to its own longest sequence;
    a causal model's values at real positions do not depend on the padding after them, so only
    fp32 rounding differs from one pass over the whole batch. Values at padding positions are
    meaningless (0 or computed on padding); every consumer masks them. A batch with other padding
    runs in one pass.
    """
    import torch
    import torch.nn.functional as F

    lengths = attn.sum(dim=1)
    width = ids.shape[1]
    if not bool((attn == (torch.arange(width, device=attn.device) < lengths[:, None])).all()):
        return _logprobs(model, ids, attn, with_entropy, temperature)
    runs = length_chunks(lengths.tolist())
    if len(runs) == 1 and int(lengths.max()) == width:
        return _logprobs(model, ids, attn, with_entropy, temperature)
    logps, ents, order = [], [], []
    for run in runs:
        idx = torch.tensor(run, device=ids.device)
        w = int(lengths[run[0]])
        logp, ent = _logprobs(model, ids[idx, :w], attn[idx, :w], with_entropy, temperature)
        logps.append(F.pad(logp, (0, width - w)))
        if with_entropy:
            ents.append(F.pad(ent, (0, width - w)))
        order += run
    inverse = torch.empty(len(order), dtype=torch.long, device=ids.device)
    inverse[torch.tensor(order, device=ids.device)] = torch.arange(len(order), device=ids.device)
    return torch.cat(logps)[inverse], (torch.cat(ents)[inverse] if with_entropy else None)


def sft_batch(examples: list[Example], pad_id: int, device="cpu"):
    """(ids [S, T], attention mask [S, T], next-token loss mask [S, T-1]) of right-padded examples, on `device`."""
    import torch

    ids, attn = pad([e.ids for e in examples], pad_id, torch.long)
    mask, _ = pad([e.mask for e in examples], 0, torch.float)
    return ids.to(device), attn.to(device), mask[:, 1:].to(device)


def sft_terms(model, batch, with_entropy: bool = False):
    """(token-mean cross-entropy of an `sft_batch`'s masked tokens under `model`, and their token-mean
    entropy if asked, else None): scalars."""
    ids, attn, mask = batch
    logp, ent = forward_logprobs(model, ids, attn, with_entropy=with_entropy)
    return sft_cross_entropy(logp, mask), (aggregate("token-mean", ent, mask) if with_entropy else None)


def sft_loss(model, examples: list[Example], pad_id: int):
    """Token-mean cross-entropy of the examples' masked tokens under `model` (scalar)."""
    return sft_terms(model, sft_batch(examples, pad_id, policy_device(model)))[0]
