"""Log-probs and entropies from the model's final hidden states, the LM head applied in chunks of
positions (docs/ARCHITECTURE.md, "Memory of the update").

`model(...).logits` is a [rows, T, V] tensor, and the log-softmax, the entropy's softmax and their
backward each keep another of that size in fp32: 12 bytes a position a vocabulary entry, which at
Gemma-2's 256,000 entries is 3 MB a token. Here the decoder runs once to its final hidden states
[rows, T, H]; only the positions a loss reads (the `need` mask) are gathered, and the LM head, its
softcap, the temperature, the log-softmax and the entropy run over chunks of at most `chunk`
positions. Each chunk sits under activation checkpointing (torch.utils.checkpoint, non-reentrant),
so the autograd graph keeps only the chunk's hidden states and targets, and its [chunk, V] logits
are recomputed in the backward: the largest vocabulary-sized tensor that ever exists is one
chunk's, and none is saved for the backward.

What the model's own forward does to its logits is done the same way, in the same dtype: the LM
head, then Gemma-2's final-logit softcap (`final_logit_softcapping`: z/c, tanh, ·c); then, in fp32,
the sampling temperature (the log-probs are of logits / T, the distribution the sampler drew from;
the entropy is of the untempered one, as RED compares it on RL and SFT tokens). A model whose
forward rescales its logits otherwise (Cohere's `logit_scale`, Granite's `logits_scaling`) is
refused rather than trained on a head it does not have. The entropy is computed under no_grad
unless a loss term needs its gradient (`entropy="grad"`: an entropy bonus β ≠ 0), and then only
once per chunk: the recomputation in the backward skips a no-grad entropy.
"""
from __future__ import annotations

import torch

from utils.core.config import ConfigError
from utils.train.losses import token_entropy

# config attributes with which a model's forward rescales its logits in a way this head does not
UNSUPPORTED_SCALES = ("logit_scale", "logits_scaling")
# fp32 [positions, vocabulary] tensors a chunk holds at its peak, at most: the logits, the softcap's
# tanh, the tempered copy, the log-softmax, the entropy's softmax, and in the backward their
# gradients. benchmarks/chunk_memory.py measured 3.0 (no-grad pass), 4.0 (backward), 6.0 (with the
# entropy's gradient), 7.0 (and Gemma-2's softcap) on the CPU; `chunk_rows` sizes a chunk by it, so
# `model.memory.logits_chunk_mib` bounds the chunk's whole working set, not one tensor of it.
LIVE_LOGITS = 8


def head_parts(model) -> tuple:
    """(decoder body, LM head module, softcap or None) of a causal LM, peft-wrapped or not."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = base.config
    for name in UNSUPPORTED_SCALES:
        if getattr(config, name, None) not in (None, 1, 1.0):
            raise ConfigError(f"model type {config.model_type!r} rescales its logits ({name}="
                              f"{getattr(config, name)}), which the trainer's chunked LM head "
                              f"(utils/train/head.py) does not apply")
    return base.get_decoder(), base.get_output_embeddings(), getattr(config, "final_logit_softcapping", None)


def chunk_rows(n_vocab: int, chunk_mib: float) -> int:
    """Positions per LM-head chunk: as many as keep the chunk's working set, LIVE_LOGITS fp32
    [positions, vocabulary] tensors, under `chunk_mib` MiB (at least 1)."""
    return max(1, int(chunk_mib * 2 ** 20 // (LIVE_LOGITS * 4 * n_vocab)))


def _head_chunk(head, cap, temperature: float, entropy: str, sink: list, h, y):
    """(log-probs [n], entropies [n] or None) of targets y [n] from hidden states h [n, H]. With
    `entropy="value"` the entropies go to `sink` on the first call only (the no-grad value; the
    recomputation in the backward leaves them)."""
    z = head(h)
    if cap is not None:  # Gemma-2's final-logit softcap, in the model's dtype, as its forward has it
        z = torch.tanh(z / cap) * cap
    z = z.float()
    zt = z if temperature == 1.0 else z / temperature
    logp = torch.log_softmax(zt, dim=-1).gather(-1, y[:, None]).squeeze(-1)  # [n]
    if entropy == "grad":
        return logp, token_entropy(z)
    if entropy == "value" and not sink:
        with torch.no_grad():
            sink.append(token_entropy(z))
    return logp, None


def head_logprobs(model, ids: torch.Tensor, attn: torch.Tensor, need: torch.Tensor | None = None,
                  temperature: float = 1.0, entropy: str = "none", chunk_mib: float = 512.0):
    """Next-token log-probs [S, T-1] of `ids` under `model` at `temperature`, and the untempered
    entropies [S, T-1] if `entropy` is "value" (no gradient) or "grad"; else None.

    ids, attn [S, T]; `need` [S, T-1] marks the positions a loss reads (None: every real one); the
    rest hold 0. `chunk_mib` bounds one chunk's working set (`chunk_rows`; 0: one chunk of every
    needed position)."""
    if entropy not in ("none", "value", "grad"):
        raise ValueError(f"entropy must be none, value or grad, got {entropy!r}")
    body, head, cap = head_parts(model)
    hidden = body(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state  # [S, T, H]
    if need is None:
        need = attn[:, 1:] > 0
    where = need.bool()
    h = hidden[:, :-1][where]  # [N, H]: the positions that predict a needed token
    y = ids[:, 1:][where]  # [N]
    n = chunk_rows(head.weight.shape[0], chunk_mib) if chunk_mib > 0 else max(len(y), 1)
    grad = torch.is_grad_enabled() and h.requires_grad
    logps, ents = [], []
    for start in range(0, len(y), n):
        hc, yc = h[start:start + n], y[start:start + n]
        sink: list = []
        if grad:
            lp, ent = torch.utils.checkpoint.checkpoint(_head_chunk, head, cap, temperature, entropy, sink, hc, yc,
                                                        use_reentrant=False)
        else:
            lp, ent = _head_chunk(head, cap, temperature, entropy, sink, hc, yc)
        logps.append(lp)
        if entropy != "none":
            ents.append(ent if ent is not None else sink[0])
    return _scatter(logps, where), (_scatter(ents, where) if entropy != "none" else None)


def _scatter(parts: list[torch.Tensor], where: torch.Tensor) -> torch.Tensor:
    """The chunks' values [N] back at their positions of a [S, T-1] fp32 tensor of zeros."""
    flat = torch.cat(parts) if len(parts) > 1 else parts[0] if parts else torch.zeros(0, device=where.device)
    return torch.zeros(where.shape, dtype=torch.float32, device=where.device).masked_scatter(where, flat)
