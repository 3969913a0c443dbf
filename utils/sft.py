"""Masked SFT with LoRA (or full fine-tuning): the model, the batches and one loss.

The loss is the token-mean cross-entropy over positions whose mask is 1 (generated tokens of a
role); prompts, injected results and padding contribute nothing (tests/test_sft.py checks this
as an invariance). Batches are right-padded; labels are -100 off the mask.
"""
from __future__ import annotations

import random
from pathlib import Path

from utils.run_config import LoraConfig
from utils.traces import Example


def load_policy(base_path: Path, lora: LoraConfig, dtype: str = "float32", adapter: Path | None = None,
                trainable: bool = True):
    """The base model wrapped with a (new or loaded) LoRA adapter, or the bare model for full FT."""
    import torch
    from peft import LoraConfig as PeftLoraConfig
    from peft import PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=getattr(torch, dtype))
    if lora.full_finetune:
        return model
    if adapter is not None:
        return PeftModel.from_pretrained(model, str(adapter), is_trainable=trainable)
    cfg = PeftLoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                         target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, cfg)


def collate(examples: list[Example], pad_id: int):
    """(input_ids, attention_mask, labels) tensors, each [batch, max_len]."""
    import torch

    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    att = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, e in enumerate(examples):
        n = len(e.ids)
        ids[i, :n] = torch.tensor(e.ids)
        att[i, :n] = 1
        m = torch.tensor(e.mask, dtype=torch.bool)
        labels[i, :n] = torch.where(m, ids[i, :n], torch.tensor(-100))
    return ids, att, labels


def masked_ce(logits, labels):
    """Token-mean cross-entropy over labels != -100. logits [B, T, V], labels [B, T]."""
    import torch.nn.functional as F

    shift_logits = logits[:, :-1].float()  # [B, T-1, V]
    shift_labels = labels[:, 1:]  # [B, T-1]
    return F.cross_entropy(shift_logits.reshape(-1, shift_logits.shape[-1]), shift_labels.reshape(-1),
                           ignore_index=-100)


def sft_loss(model, examples: list[Example], pad_id: int):
    ids, att, labels = collate(examples, pad_id)
    logits = model(input_ids=ids, attention_mask=att).logits
    return masked_ce(logits, labels)


def batches(examples: list[Example], batch_size: int, seed: int, epoch: int) -> list[list[Example]]:
    """The epoch's shuffled batches; deterministic in (seed, epoch)."""
    order = list(range(len(examples)))
    random.Random(f"{seed}/{epoch}").shuffle(order)
    return [[examples[i] for i in order[k:k + batch_size]] for k in range(0, len(order), batch_size)]


def quick_sft(model, examples: list[Example], steps: int, lr: float, batch_size: int, seed: int, pad_id: int) -> list[float]:
    """A plain loop (no checkpoints): used to make protocol-following adapters in tests."""
    import torch

    torch.manual_seed(seed)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses, epoch, queue = [], 0, []
    model.train()
    for _ in range(steps):
        if not queue:
            queue = batches(examples, batch_size, seed, epoch)
            epoch += 1
        loss = sft_loss(model, queue.pop(0), pad_id)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


def gold_examples(rows: list[dict], codec) -> list[Example]:
    """Training examples from gold traces of prepared rows (rows without a decomposition are skipped)."""
    from utils.traces import examples_from_trace, trace_from_row

    out = []
    for row in rows:
        trace = trace_from_row(row, "gold")
        if trace is not None:
            out += examples_from_trace(trace, codec, row.get("context"))
    return out


def train_gold_adapter(base_path: Path, out_dir: Path, n_rows: int = 400, steps: int = 150, seed: int = 0) -> Path:
    """A quickly SFT-trained protocol-following LoRA adapter on synthetic gold traces (tests, benchmarks)."""
    from transformers import AutoTokenizer

    from utils.rollout import Codec
    from utils.run_config import DataConfig, TemplatesConfig
    from utils.synthetic import generate_rows

    tok = AutoTokenizer.from_pretrained(base_path)
    rows = [{"id": r["id"], "question": r["question"], "answers": [str(r["answer"])], "meta": {"steps": r["steps"]}}
            for r in generate_rows(DataConfig(n_train=n_rows, n_val=0, n_test=0))["train"]]
    model = load_policy(base_path, LoraConfig(rank=8, alpha=16))
    quick_sft(model, gold_examples(rows, Codec(tok, TemplatesConfig())), steps=steps, lr=3e-3, batch_size=32,
              seed=seed, pad_id=tok.pad_token_id)
    model.save_pretrained(out_dir)
    return out_dir
