"""Padding ragged token sequences into batch tensors: the one padding loop of the project."""
from __future__ import annotations


def pad(seqs: list[list], value, dtype, left: bool = False):
    """(padded [len(seqs), longest] tensor of `dtype`, attention mask [same shape] with 1 on real
    positions). Right padding for training; left padding (`left=True`) for generation."""
    import torch

    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), value, dtype=dtype)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        span = slice(width - len(s), width) if left else slice(0, len(s))
        out[i, span] = torch.tensor(s, dtype=dtype)
        attn[i, span] = 1
    return out, attn
