"""A second reader of a llama-architecture GGUF, for the conversion tests: the forward pass written from
the GGUF's own conventions in numpy (float64), sharing no code with transformers or our converter.

What it takes from the file alone: the shapes and norms from the `llama.*` metadata, every weight
through the `gguf` package's dequantizer, and llama.cpp's rotary convention for this architecture,
which rotates adjacent pairs (x[2i], x[2i+1]) of each head, where transformers' Llama rotates the two
halves (x[i], x[i + d/2]). The converter reorders the query and key rows between the two; a conversion
that left them in the GGUF's order, or mixed up heads, gives other log-probs here. The head is the
embedding when the file has no `output.weight` (a tied model, as SmolLM2 is)."""
from __future__ import annotations

import numpy as np


def _field(reader, key: str):
    return reader.fields[key].contents()


def _weights(reader) -> dict[str, np.ndarray]:
    import gguf

    return {t.name: gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64) for t in reader.tensors}


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rotate_pairs(x: np.ndarray, base: float) -> np.ndarray:
    """x: (positions, heads, head_dim); llama.cpp's NORM rope: pair (2i, 2i+1) turns by pos · base^(−2i/d)."""
    n, _, d = x.shape
    angle = np.arange(n)[:, None] * base ** (-np.arange(0, d, 2) / d)[None, :]  # (n, d/2)
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def _attention(h: np.ndarray, w: dict, i: int, heads: int, kv_heads: int, base: float) -> np.ndarray:
    n = h.shape[0]
    q = (h @ w[f"blk.{i}.attn_q.weight"].T).reshape(n, heads, -1)
    k = (h @ w[f"blk.{i}.attn_k.weight"].T).reshape(n, kv_heads, -1)
    v = (h @ w[f"blk.{i}.attn_v.weight"].T).reshape(n, kv_heads, -1)
    q, k = _rotate_pairs(q, base), _rotate_pairs(k, base)
    group = heads // kv_heads
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # query head j reads kv head j // group
    scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(q.shape[-1])
    scores = scores + np.triu(np.full((n, n), -np.inf), 1)[None]
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = np.einsum("hqk,khd->qhd", p, v).reshape(n, -1)
    return out @ w[f"blk.{i}.attn_output.weight"].T


def token_logprobs(gguf_path, ids: list[int]) -> np.ndarray:
    """log p(ids[t] | ids[:t]) for t ≥ 1, by the GGUF's weights and conventions alone."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    if _field(reader, "general.architecture") != "llama":
        raise ValueError(f"{gguf_path}: architecture {_field(reader, 'general.architecture')!r}, this reader is llama's")
    layers, heads = _field(reader, "llama.block_count"), _field(reader, "llama.attention.head_count")
    kv_heads = _field(reader, "llama.attention.head_count_kv")
    eps, base = _field(reader, "llama.attention.layer_norm_rms_epsilon"), _field(reader, "llama.rope.freq_base")
    w = _weights(reader)
    h = w["token_embd.weight"][ids]
    for i in range(layers):
        h = h + _attention(_rms_norm(h, w[f"blk.{i}.attn_norm.weight"], eps), w, i, heads, kv_heads, base)
        x = _rms_norm(h, w[f"blk.{i}.ffn_norm.weight"], eps)
        gate, up = x @ w[f"blk.{i}.ffn_gate.weight"].T, x @ w[f"blk.{i}.ffn_up.weight"].T
        h = h + (gate / (1 + np.exp(-gate)) * up) @ w[f"blk.{i}.ffn_down.weight"].T
    logits = _rms_norm(h, w["output_norm.weight"], eps) @ w.get("output.weight", w["token_embd.weight"]).T
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return logp[np.arange(len(ids) - 1), ids[1:]]
