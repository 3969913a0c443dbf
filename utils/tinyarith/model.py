"""`tiny-arith`: the embedded default base model, and the recipe that pretrains it.

The model is an ordinary Hugging Face Llama directory (config.json, model.safetensors,
tokenizer.json) with a character-level tokenizer, so transformers, peft and vLLM all load it.
It is pretrained from scratch on raw arithmetic text (`utils.data.arith.pretrain_line`), never on
the agent protocol: LoRA SFT has to teach the planner/executor tags, as with a real base model.

The recipe is fully determined by `PretrainConfig` (configs/pretrain/tiny-arith.yaml): the
data stream derives from (seed, step), torch's RNG from seed. `manifest.json` beside the
weights records the recipe, its hash, the held-out accuracy and the wall time.
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

from utils.data.arith import (OperandRange, apply_op, chain_problem, pretrain_line, reduction_text,
                         sample_fact)
from utils.core.config import field
from utils.core.tensors import pad

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
# The recipe decays the LR by cosine to 10% of its peak. A constant of the committed base's recipe, not
# a PretrainConfig field, so the recipe (and its recorded hash) stays the one the base was built with.
FINAL_LR_RATIO = 0.1
MAX_GRAD_NORM = 1.0  # gradient clip of the recipe, likewise fixed with the committed base
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)


def char_vocab() -> dict[str, int]:
    """Special tokens, newline, then printable ASCII: one token per character."""
    chars = SPECIAL_TOKENS + ["\n"] + [chr(c) for c in range(32, 127)]
    return {ch: i for i, ch in enumerate(chars)}


def build_tokenizer():
    """A `tokenizers.Tokenizer` whose tokens are single characters; BOS is prepended on encode."""
    from tokenizers import Tokenizer, decoders, models, processors

    tok = Tokenizer(models.BPE(vocab=char_vocab(), merges=[], unk_token="<unk>"))
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                       special_tokens=[("<s>", BOS_ID)])
    tok.decoder = decoders.Fuse()
    return tok


def save_tokenizer(out_dir: Path, model_max_length: int) -> None:
    build_tokenizer().save(str(out_dir / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
           "pad_token": "<pad>", "unk_token": "<unk>", "add_bos_token": True,
           "model_max_length": model_max_length, "padding_side": "left", "clean_up_tokenization_spaces": False}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    special = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2, sort_keys=True) + "\n")


@dataclass
class PretrainConfig:
    seed: int = field(0, "Seeds the data stream and the weight init.")
    hidden_size: int = field(128, "Model width.")
    intermediate_size: int = field(384, "MLP width.")
    num_layers: int = field(4, "Transformer blocks.")
    num_heads: int = field(2, "Attention heads (head_dim = hidden_size / num_heads).")
    max_position_embeddings: int = field(512, "Longest context the model supports.")
    seq_len: int = field(128, "Characters per pretraining example (whole lines, packed).")
    batch_size: int = field(64, "Examples per step.")
    steps: int = field(3000, "Optimizer steps.")
    lr: float = field(3e-3, "Peak AdamW learning rate (cosine decay after warmup).")
    warmup_steps: int = field(100, "Linear warmup steps.")
    weight_decay: float = field(0.01, "AdamW weight decay.")
    ops: list[str] = field(["+", "-"], "Operators in the corpus.")
    left_max: int = field(99, "Largest left operand.")
    right_max: int = field(99, "Largest right operand.")
    mul_right_max: int = field(9, "Largest right operand of '*'.")
    reduction_max_ops: int = field(3, "Most operations in a worked chain reduction of the corpus (from 1).",
                                   minimum=1)
    eval_size: int = field(300, "Held-out facts scored at the end (never seen in pretraining).")
    threads: int = field(2, "torch CPU threads.")

    @property
    def bounds(self) -> OperandRange:
        return OperandRange(self.left_max, self.right_max, self.mul_right_max)


def llama_config(cfg: PretrainConfig):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(char_vocab()), hidden_size=cfg.hidden_size,
                       intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
                       num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
                       max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=1e-5,
                       tie_word_embeddings=False, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
                       pad_token_id=PAD_ID, torch_dtype="float32")


def pack_batch(rng: random.Random, cfg: PretrainConfig, vocab: dict[str, int]):
    """[batch, seq_len] ids: BOS + whole lines joined by '\\n', right-padded; labels -100 on pad."""
    import torch

    ops = tuple(cfg.ops)
    ids = torch.full((cfg.batch_size, cfg.seq_len), PAD_ID, dtype=torch.long)
    for row in range(cfg.batch_size):
        seq = [BOS_ID]
        while True:
            line = [vocab[c] for c in pretrain_line(rng, ops, cfg.bounds, cfg.reduction_max_ops) + "\n"]
            if len(seq) + len(line) > cfg.seq_len:
                break
            seq += line
        ids[row, :len(seq)] = torch.tensor(seq)
    labels = ids.clone()
    labels[ids == PAD_ID] = -100
    return ids, labels


def heldout_prompts(cfg: PretrainConfig, n: int, seed: int) -> list[tuple[str, str]]:
    """(prompt, expected number) pairs over facts pretraining never shows."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, op, b = sample_fact(rng, tuple(cfg.ops), cfg.bounds, heldout=True)
        out.append((f"{a}{op}{b}=", f"{apply_op(a, op, b)}"))
    return out


def chain_prompts(cfg: PretrainConfig, n: int, seed: int) -> list[tuple[str, str]]:
    """(prompt, expected reduction) pairs over task-side chains, which pretraining never shows:
    "9+26-4: " -> "9+26=35, 35-4: 35-4=31, 31\n"."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p = chain_problem(rng, tuple(cfg.ops), cfg.bounds, 2, task_side=True)
        text = reduction_text(p.question, p.steps)
        cut = len(p.question) + 2
        out.append((text[:cut], text[cut:] + "\n"))
    return out


def greedy_accuracy(model, items: list[tuple[str, str]], batch: int = 128) -> float:
    """Share of prompts whose greedy continuation is the expected text, not followed by a digit
    ("82" then "\n" or ", …": the line may go on, the number may not)."""
    import torch

    vocab, inv = char_vocab(), {i: c for c, i in char_vocab().items()}
    correct = 0
    model.eval()
    for start in range(0, len(items), batch):
        chunk = items[start:start + batch]
        ids, mask = pad([[BOS_ID] + [vocab[c] for c in prompt] for prompt, _ in chunk], PAD_ID, torch.long, left=True)
        ids, mask = ids.to(model.device), mask.to(model.device)
        width = ids.shape[1]
        max_new = max(len(e) for _, e in chunk) + 1
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new,
                                 do_sample=False, pad_token_id=PAD_ID)
        for row, (_, expected) in enumerate(chunk):
            text = "".join(inv.get(int(t), "") for t in out[row, width:width + len(expected) + 1])
            cut_number = expected[-1:].isdigit() and text[len(expected):len(expected) + 1].isdigit()
            correct += text.startswith(expected) and not cut_number
    return correct / max(len(items), 1)


def _stream(cfg: PretrainConfig):
    rng, vocab = random.Random(cfg.seed), char_vocab()
    for _ in range(cfg.steps):
        yield pack_batch(rng, cfg, vocab)


def _produce(cfg: PretrainConfig, queue) -> None:
    for batch in _stream(cfg):
        queue.put(tuple(t.numpy() for t in batch))


def batches(cfg: PretrainConfig, device: str = "cpu", ahead: bool | None = None):
    """The recipe's stream of (ids, labels) batches, one per step, on `device`. With `ahead` (the
    default off the CPU) a helper process draws it ahead of the device (the same stream: one rng, in
    order), since drawing a batch in Python takes longer than a GPU's step on it."""
    import torch

    if not (device != "cpu" if ahead is None else ahead):
        yield from _stream(cfg)
        return
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue(maxsize=256)
    producer = ctx.Process(target=_produce, args=(cfg, queue), daemon=True)
    producer.start()
    try:
        for _ in range(cfg.steps):
            yield tuple(torch.from_numpy(a).to(device) for a in queue.get(timeout=600))
    finally:
        producer.terminate()


def pretrain(cfg: PretrainConfig, log=print, device: str = "cpu"):
    """Train a fresh model by the recipe on `device`; returns (model, history of (step, loss,
    held-out acc)). The model comes back on the CPU. Another device draws the same corpus and init
    but sums in another order, so its weights differ from a CPU build's."""
    import torch
    from transformers import LlamaForCausalLM

    from utils.train.schedule import warmup_cosine

    torch.manual_seed(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model = LlamaForCausalLM(llama_config(cfg)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    probe = heldout_prompts(cfg, 100, seed=cfg.seed + 1)
    chain_probe = chain_prompts(cfg, 100, seed=cfg.seed + 1)
    history, t0 = [], time.time()
    for step, (ids, labels) in enumerate(batches(cfg, device)):
        model.train()
        for group in opt.param_groups:
            group["lr"] = cfg.lr * warmup_cosine(step, cfg.warmup_steps, cfg.steps, FINAL_LR_RATIO)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        opt.step()
        if (step + 1) % 250 == 0 or step + 1 == cfg.steps:
            acc, chain = greedy_accuracy(model, probe), greedy_accuracy(model, chain_probe)
            history.append({"step": step + 1, "loss": round(loss.item(), 4), "heldout_acc_probe": acc,
                            "chain_acc_probe": chain})
            log(f"step {step + 1}/{cfg.steps} loss {loss.item():.4f} held-out acc {acc:.2f} "
                f"chain acc {chain:.2f} ({time.time() - t0:.0f}s)")
    return model.cpu(), history
