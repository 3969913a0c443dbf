"""A prediction of the seed shapes' GPU peak for one RL micro-batch, fitted on this CPU:

    .venv/bin/python benchmarks/memory_model.py

For each shape of benchmarks/gpu_shapes.py (Qwen2.5-0.5B, Gemma-2-2B: the real widths, heads and
vocabulary, random weights, bfloat16, LoRA from configs/models/<name>.yaml) it builds the model with
1 and 2 decoder layers and runs the RL loss's forward (utils/train/update.py red_grpo_loss's pieces,
one planner conversation of 732 tokens and one executor call of 484: the seed batch's rows, so
attention's share per token is the seed's) with and without activation checkpointing, counting the
bytes saved for the backward (saved_tensors_hooks, parameters excluded). The difference between 2
and 1 layers is a layer's bytes per token; the rest is the bytes per token outside the layers.
The prediction for a micro-batch of `model.memory.micro_batch_tokens` tokens at the model's real
depth L:

    weights (2 bytes a parameter) + LoRA weights, gradients and AdamW moments (16 bytes a parameter)
    + tokens x (outside + L x layer)              what the graph keeps (checkpointed: layer inputs)
    + tokens x layer_uncheckpointed               one layer recomputed in the backward
    + logits_chunk_mib                            the LM head's chunk (its whole working set: utils/train/head.py)

It is a prediction, not a measurement: it leaves out the CUDA allocator's fragmentation and
workspaces, the no-grad old-log-prob pass (smaller than the update's), and the SFT term's pieces
(run after the RL ones, each within the same budget). The last line is exactly

    predicted_qwen_gib=<x> predicted_gemma_gib=<x>
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from gpu_shapes import SHAPES  # noqa: E402

ROWS = ((732, [(200, 256), (476, 256)]), (484, [(100, 384)]))  # (length, generated spans): the seed batch's


class SavedBytes:
    """The most bytes packed for the backward by one graph (reset at each backward call), parameters
    excluded (torch.autograd.graph.saved_tensors_hooks)."""

    def __init__(self, params):
        import torch

        self.torch, self.params = torch, {p.data_ptr() for p in params}
        self.current, self.most = 0, 0
        self.seen: set = set()

    def pack(self, t):
        key = (t.data_ptr(), t.numel(), t.dtype)
        if t.data_ptr() not in self.params and key not in self.seen:
            self.seen.add(key)
            self.current += t.numel() * t.element_size()
            self.most = max(self.most, self.current)
        return t

    def __enter__(self):
        torch = self.torch
        self.real = torch.autograd.backward

        def backward(*a, **k):
            self.current, self.seen = 0, set()
            return self.real(*a, **k)
        torch.autograd.backward = backward
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)
        self.torch.autograd.backward = self.real


def point(name: str, layers: int, checkpointing: bool) -> dict:
    """Saved bytes of one RL forward of ROWS at `layers` decoder layers of shape `name`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from gpu_shapes import _examples
    from utils.core.loader import load_run_config
    from utils.core.schema import MemoryConfig
    from utils.core.tensors import pad
    from utils.train.batch import RlBatch
    from utils.train.update import red_grpo_loss
    from utils.train.policy import load_policy
    from utils.train.red import RedState

    model_type, dims = SHAPES[name]
    cfg = load_run_config(name, "red", "synthetic_arith", ["algorithm.rl.stratify=false", "model.device=cpu"])
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        config = AutoConfig.for_model(model_type, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                      **{**dims, "num_hidden_layers": layers})
        AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(tmp)
        policy = load_policy(Path(tmp), cfg.model.lora, "bfloat16", checkpointing=checkpointing)
    seqs = [e for length, spans in ROWS for e in _examples(1, length, spans, "planner")]
    ids, attn = pad([e.ids for e in seqs], 0, torch.long)
    mask, _ = pad([e.mask for e in seqs], 0, torch.float)
    batch = RlBatch(ids, attn, mask[:, 1:], None, torch.tensor([1.0, -1.0]), ["planner", "executor"],
                    episode=torch.tensor([0, 0]))
    policy.train()
    with SavedBytes(list(policy.parameters())) as saved:
        red_grpo_loss(policy, batch, None, None, cfg.algorithm, RedState(), 0.5,
                      memory=MemoryConfig(micro_batch_tokens=0, logits_chunk_mib=cfg.model.memory.logits_chunk_mib))
    lora = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    return {"saved": saved.most, "tokens": int(attn.sum()), "lora_params": lora}


def predict(name: str, points: dict) -> dict:
    from gpu_shapes import param_count
    from utils.core.loader import load_run_config

    memory = load_run_config(name, "red", "synthetic_arith", ["algorithm.rl.stratify=false"]).model.memory
    L = SHAPES[name][1]["num_hidden_layers"]
    t = points[(1, True)]["tokens"]
    layer_ck = (points[(2, True)]["saved"] - points[(1, True)]["saved"]) / t
    outside = points[(1, True)]["saved"] / t - layer_ck
    layer_full = (points[(2, False)]["saved"] - points[(1, False)]["saved"]) / t
    tokens = memory.micro_batch_tokens
    lora = L * (points[(2, True)]["lora_params"] - points[(1, True)]["lora_params"])  # LoRA is per layer
    parts = {"weights": 2 * param_count(name), "lora_and_adam": 16 * lora,
             "graph": tokens * (outside + L * layer_ck), "recomputed_layer": tokens * layer_full,
             "head_chunk": memory.logits_chunk_mib * 2 ** 20}
    return {"bytes_per_token": {"outside_layers": round(outside), "layer_checkpointed": round(layer_ck),
                                "layer_full": round(layer_full)},
            "micro_batch_tokens": tokens, "parts_gib": {k: round(v / 2 ** 30, 2) for k, v in parts.items()},
            "predicted_gib": round(sum(parts.values()) / 2 ** 30, 2)}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--point":
        name, layers, ck = sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
        print(json.dumps(point(name, layers, ck)))
        return 0
    out = {}
    for name in SHAPES:
        points = {}
        for layers in (1, 2):
            for ck in (True, False):
                r = subprocess.run([sys.executable, __file__, "--point", name, str(layers), str(int(ck))],
                                   cwd=ROOT, capture_output=True, text=True, timeout=1800)
                if r.returncode != 0:
                    print(r.stderr[-2000:])
                    return 1
                points[(layers, ck)] = json.loads(r.stdout.strip().splitlines()[-1])
                print(f"{name} layers {layers} checkpointing {ck}: {points[(layers, ck)]}", flush=True)
        out[name] = predict(name, points)
        print(f"{name}: {json.dumps(out[name])}", flush=True)
    print(f"predicted_qwen_gib={out['qwen2.5-0.5b']['predicted_gib']} "
          f"predicted_gemma_gib={out['gemma-2-2b']['predicted_gib']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
