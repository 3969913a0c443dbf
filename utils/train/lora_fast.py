"""A cheaper forward for peft's LoRA linear layers on their common path.

peft's `lora.Linear.forward` computes `base(x) + lora_B(lora_A(dropout(x))) * scaling`. After the
two skinny rank-r products it makes two more passes over the full tokens x out output (the scaling,
then the sum), and autograd keeps and replays both in the backward. On the embedded default
(hidden 128, rank 8, 28 adapted layers, ~3k tokens a batch) removing them closed about a fifth of
what LoRA adds to an SFT step over the merged model (benchmarks/sft_step_profile.py,
docs/PERFORMANCE.md).

`install_fast_lora` gives each adapted layer a forward that computes the same sum as one GEMM that
adds `base(x)` to its product (out of place: an in-place `addmm_` on the base output was no faster):

    base(x) + h @ (scaling * B)^T,   h = A x        (torch.addmm)

The scaling moves onto the r x out weight, a tiny tensor, instead of the tokens x out product. For a
power-of-two scaling (lora alpha / rank = 2 on every shipped model config) scaling B instead of the
product is exact in floating point. Whether the GEMM adds `base(x)` after its dot products, as the
separate sum does, is the BLAS kernel's choice: on the AMD EPYC box the docs quote, losses and
gradients agree with peft's bit for bit (tests/test_lora_fast.py checks agreement within fp32
rounding, which holds on any kernel).

Anything off that path runs peft's own forward unchanged: dropout > 0 (the GPU model configs), more
than one active adapter, an adapter variant (DoRA and the like), merged or disabled adapters, peft's
per-row `adapter_names`, and inputs whose dtype differs from the adapter's (peft casts them; peft
keeps a bfloat16 base's adapters in float32, so the GPU model configs stay on peft's forward twice
over). Only the embedded default's path (float32, no dropout) is measured (docs/PERFORMANCE.md).

`model.lora.forward: folded` installs `folded_forward` instead: the adapter folded into the layer's
weight on every call, `x (W + scaling * B A)^T`, one wide product. Its backward computes the folded
weight's gradient (one more wide product, tokens x in x out) and passes it to A and B through two
tiny ones, where the fused sum runs four skinny rank-r products over every token; on a model whose
token count per batch far exceeds its widths (the tiny default: ~3k tokens, width 128) that is
cheaper. It is not the same arithmetic: losses agree with the sum's to fp32 rounding and gradients
to about 1e-5 of their size, so training drifts apart over hundreds of steps (a numerics change).
Off the path it also runs peft's forward.
"""
from __future__ import annotations

import types

from utils.core.registry import Registry


def fast_path(layer, x, args: tuple, kwargs: dict) -> str | None:
    """The active adapter's name when `layer`'s forward on `x` may take the fused path, else None."""
    import torch

    if args or kwargs or layer.disable_adapters or layer.merged:
        return None
    active = layer.active_adapters
    if len(active) != 1 or active[0] not in layer.lora_A or active[0] in layer.lora_variant:
        return None
    name = active[0]
    if not isinstance(layer.lora_dropout[name], torch.nn.Identity):
        return None
    weight = layer.lora_A[name].weight
    if x.dtype != weight.dtype or x.dtype != layer.base_layer.weight.dtype or x.dim() < 2:
        return None
    return name


def fast_forward(self, x, *args, **kwargs):
    """`base(x) + B(A x) * scaling` as one addmm into the base output; peft's forward off the path."""
    import torch
    import torch.nn.functional as F

    name = fast_path(self, x, args, kwargs)
    if name is None:
        return type(self).forward(self, x, *args, **kwargs)
    result = self.base_layer(x)
    h = F.linear(x, self.lora_A[name].weight)
    b = self.lora_B[name].weight * self.scaling[name]
    shape = result.shape
    return torch.addmm(result.reshape(-1, shape[-1]), h.reshape(-1, h.shape[-1]), b.t()).view(shape)


def folded_forward(self, x, *args, **kwargs):
    """`x (W + scaling * B A)^T (+ bias)`: the adapter folded into the weight; peft's forward off the path."""
    import torch
    import torch.nn.functional as F

    name = fast_path(self, x, args, kwargs)
    if name is None:
        return type(self).forward(self, x, *args, **kwargs)
    base = self.base_layer
    weight = torch.addmm(base.weight, self.lora_B[name].weight, self.lora_A[name].weight, alpha=self.scaling[name])
    return F.linear(x, weight, base.bias)


FORWARDS = Registry("LoRA forward", {"fused": fast_forward, "folded": folded_forward})  # model.lora.forward (utils/core/choices.py)


def install_fast_lora(model, forward: str = "fused") -> int:
    """Give every peft LoRA linear layer of `model` the `forward` named (FORWARDS); returns how many it
    changed. A model without peft LoRA layers (full fine-tuning) is left as it is."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    count = 0
    for module in model.modules():
        if type(module) is LoraLinear:  # subclasses (quantised layers) keep their own forward
            module.forward = types.MethodType(FORWARDS.get(forward), module)
            count += 1
    return count


def uninstall_fast_lora(model) -> int:
    """Put peft's own forward back on every layer `install_fast_lora` changed (benchmarks compare the
    two); returns how many it restored."""
    count = 0
    for module in model.modules():
        if getattr(module.__dict__.get("forward"), "__func__", None) in FORWARDS.values():
            del module.forward
            count += 1
    return count
