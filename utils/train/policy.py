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
from utils.core.schema import LoraConfig, MemoryConfig
from utils.core.tensors import pad
from utils.agent.episode import Example
from utils.train.head import head_logprobs
from utils.train.lora_fast import install_fast_lora
from utils.train.losses import Agg, aggregate, gather_logprobs, sft_cross_entropy, token_entropy


def load_policy(base_path: Path, lora: LoraConfig, dtype: str = "float32", adapter: Path | None = None,
                trainable: bool = True, trust_remote_code: bool = False, device: str = "cpu",
                checkpointing: bool = False):
    """The base model wrapped with a (new or loaded) LoRA adapter, or the bare model for full FT,
    on `device` (model.device; the trainers put their batches where its parameters are); with
    `checkpointing`, each decoder layer's activations are recomputed in the backward
    (model.memory.activation_checkpointing)."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import PeftModel, get_peft_model

    model = load_causal_lm(base_path, dtype, trust_remote_code)
    if checkpointing:
        enable_checkpointing(model)
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


def enable_checkpointing(model) -> None:
    """Transformers' gradient checkpointing of every decoder layer, non-reentrant (it preserves the RNG
    state, so LoRA dropout draws the same masks when it recomputes), with the embeddings' output
    asking for a gradient so that a frozen base still passes one to the adapters (peft's recipe)."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ConfigError(f"model.memory.activation_checkpointing: {type(model).__name__} does not support "
                          "gradient checkpointing")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    model.config.use_cache = False


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


def reference_logprobs(model, ids, attn, temperature: float = 1.0, need=None, memory=None):
    """Log-probs [S, T-1] of `ids` under the frozen reference adapter (no gradient), at `need`."""
    with _serving(model, REFERENCE):
        return batch_logprobs(model, ids, attn, need, temperature, memory)


def batch_logprobs(model, ids, attn, need=None, temperature: float = 1.0, memory=None):
    """No-grad log-probs [S, T-1] of a whole right-padded batch at `need` (None: every real position; 0
    elsewhere), a micro-batch of `memory.micro_batch_tokens` at a time (None: the schema's)."""
    import torch

    from utils.train.batch import cut_rows, micro_batches

    memory = memory or MemoryConfig()
    need = attn[:, 1:] > 0 if need is None else need
    out = torch.zeros(need.shape, device=ids.device)
    with torch.no_grad():
        for rows in micro_batches(attn.sum(1).tolist(), memory.micro_batch_tokens):
            i, a, nd = (ids, attn, need) if len(rows) == len(ids) else cut_rows(rows, ids, attn, need)
            logp, _ = forward_logprobs(model, i, a, temperature=temperature, need=nd, chunk_mib=memory.logits_chunk_mib)
            out[rows, :logp.shape[1]] = logp
    return out


# a forward pass's fixed cost, in padded tokens, fitted on the 2-core CPU (benchmarks/step_profile.py)
# and used on every device: a GPU's is larger (its per-token cost is far smaller), which would favour
# fewer, wider passes; benchmarks/gpu_check.py measures it (`pass_cost`) when a GPU is lent
PASS_COST_TOKENS = 256


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


def logits_logprobs(model, ids, attn, with_entropy: bool, temperature: float):
    """The same values as `forward_logprobs` from the model's own `logits` ([S, T, V], all kept):
    the reference tests/test_micro.py checks the chunked LM head against; never trained on."""
    logits = model(input_ids=ids, attention_mask=attn).logits
    logp = gather_logprobs(logits if temperature == 1.0 else logits / temperature, ids)
    return logp, (token_entropy(logits[:, :-1]) if with_entropy else None)


def forward_logprobs(model, ids, attn, with_entropy: bool = False, temperature: float = 1.0, need=None,
                     entropy_grad: bool = False, chunk_mib: float = 512.0):
    """Next-token log-probs [S, T-1] of `ids` under `model` at the sampling `temperature` (logits / T:
    the distribution the sampler drew from), and optionally the entropies [S, T-1] of the untempered
    distribution (the one estimator RED compares on RL and SFT tokens), without a gradient unless
    `entropy_grad`. Only the positions `need` [S, T-1] marks are computed (None: every real one),
    the rest hold 0; the LM head runs in chunks of `chunk_mib` MiB of fp32 logits
    (utils/train/head.py).

    A right-padded batch runs in `length_chunks` passes, each trimmed to its own longest sequence;
    a causal model's values at real positions do not depend on the padding after them, so only
    fp32 rounding differs from one pass over the whole batch. A batch with other padding runs in
    one pass.
    """
    import torch
    import torch.nn.functional as F

    entropy = ("grad" if entropy_grad else "value") if with_entropy else "none"
    lengths = attn.sum(dim=1)
    width = ids.shape[1]
    if need is None:
        need = attn[:, 1:] > 0

    def one(i, a, nd):
        return head_logprobs(model, i, a, nd, temperature, entropy, chunk_mib)

    if not bool((attn == (torch.arange(width, device=attn.device) < lengths[:, None])).all()):
        return one(ids, attn, need)
    runs = length_chunks(lengths.tolist())
    if len(runs) == 1 and int(lengths.max()) == width:
        return one(ids, attn, need)
    logps, ents, order = [], [], []
    for run in runs:
        idx = torch.tensor(run, device=ids.device)
        w = int(lengths[run[0]])
        logp, ent = one(ids[idx, :w], attn[idx, :w], need[idx, :w - 1])
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


def sft_terms(model, batch, with_entropy: bool = False, total=None, chunk_mib: float = 512.0,
              token_weight: str = "none"):
    """(token-mean cross-entropy of an `sft_batch`'s masked tokens under `model`, and their token-mean
    entropy if asked, else None): scalars. With `total`, the whole batch's target-token count, both
    are this piece's shares of the whole batch's means (a micro-batch's, utils/train/update.py).
    `token_weight` (utils/train/sft_weights.py) multiplies each token's NLL by a detached weight, the
    divisor staying the token count: `phi` (CHORD-φ) p·(1−p), p the token's probability; `entropy`
    (SRFT) exp(−H), H the mean entropy of the token's own sequence over its target tokens."""
    ids, attn, mask = batch
    need_ent = with_entropy or token_weight == "entropy"
    logp, ent = forward_logprobs(model, ids, attn, with_entropy=need_ent, need=mask > 0, chunk_mib=chunk_mib)
    if total is None and token_weight == "none":
        return sft_cross_entropy(logp, mask), (aggregate("token-mean", ent, mask) if with_entropy else None)
    agg = Agg("token-mean", total=total if total is not None else mask.sum().clamp(min=1))
    nll = -logp
    if token_weight == "phi":
        p = logp.detach().exp()
        nll = nll * p * (1 - p)
    elif token_weight == "entropy":
        h = (ent.detach() * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [B]: each sequence's mean entropy
        nll = nll * (-h).exp()[:, None]
    elif token_weight != "none":
        raise ValueError(f"token_weight must be none, phi or entropy, got {token_weight!r}")
    return aggregate(agg, nll, mask), (aggregate(agg, ent, mask) if with_entropy else None)


def sft_backward(model, batch, total, memory, scale: float = 1.0, with_entropy: bool = False) -> tuple:
    """Backward of scale · the token-mean NLL of an `sft_batch` whose whole batch (every rank's shard)
    has `total` target tokens, in micro-batches of `memory.micro_batch_tokens` (utils/train/batch.py):
    (this shard's share of the loss, detached; of the entropy, or None). The gradients accumulate."""
    import torch

    from utils.train.batch import cut_rows, micro_batches

    ids, attn, mask = batch
    loss_sum, ent_sum = torch.zeros((), device=ids.device), torch.zeros((), device=ids.device)
    for rows in micro_batches(attn.sum(1).tolist(), memory.micro_batch_tokens):
        piece = batch if len(rows) == len(ids) else cut_rows(rows, ids, attn, mask)
        nll, ent = sft_terms(model, piece, with_entropy, total, memory.logits_chunk_mib)
        loss = nll if scale == 1.0 else scale * nll
        if loss.requires_grad:  # a piece without a target token has nothing to give
            loss.backward()
        loss_sum = loss_sum + loss.detach()
        if with_entropy:
            ent_sum = ent_sum + ent
    return loss_sum, (ent_sum if with_entropy else None)


def sft_loss(model, examples: list[Example], pad_id: int):
    """Token-mean cross-entropy of the examples' masked tokens under `model` (scalar)."""
    return sft_terms(model, sft_batch(examples, pad_id, policy_device(model)))[0]
