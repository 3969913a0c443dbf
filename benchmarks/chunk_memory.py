"""What one LM-head chunk really holds (utils/train/head.py), against `model.memory.logits_chunk_mib`:

    .venv/bin/python benchmarks/chunk_memory.py            # every mode, a line each
    .venv/bin/python benchmarks/chunk_memory.py --mode grad --kind gemma2 --json   # one, as JSON

Each mode runs in a process of its own, with glibc's MALLOC_MMAP_THRESHOLD_ at 64 KiB so that every
tensor is its own mapping and the resident memory follows what is alive (with glibc's default the
heap keeps freed chunks: the same grad run grew the peak by 700-1,000 MiB over 25 chunks, 1,560 MiB
over 50, while what was alive stayed under 60 MiB): a one-layer model with a 256,000-entry vocabulary (Gemma-2's
size) and untied head, `--rows` positions through `head_logprobs` at `--chunk_mib`, forward and, but
for `nograd`, backward (the gradient reaches the final norm's weight, not the head's, so no
vocabulary-sized gradient is kept). A warm-up on 2 positions first; then the process's peak resident
memory is reset (Linux's /proc/self/clear_refs; where that is refused, the peak so far, ru_maxrss, is
the baseline) and read after the measured call: its growth over the resident memory before is the
chunk's working set plus its small [positions, hidden] tensors. The modes: `nograd` (the old-log-prob pass: entropy
value, temperature 1), `value` (the update without an entropy bonus), `grad` (with one), each at
temperature 0.7; `--kind gemma2` adds the final-logit softcap. The last line (without --json) is

    worst_grew_mib=<x> chunk_mib=<y>

On the 2-core AMD EPYC (2026-12-05), chunk_mib 64, 200 positions: when the setting bounded one fp32
tensor (65 positions a chunk), the peak grew by 193 / 256 / 383 MiB (nograd / value / grad) and
193 / 256 / 447 with Gemma's softcap, 7.0 times the setting at worst; sized by LIVE_LOGITS (8
positions a chunk) it grew by 26 / 34 / 49 and 26 / 34 / 57 MiB, under the 64 it allows.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VOCAB = 256_000
MODES = ("nograd", "value", "grad")
MMAP = {"MALLOC_MMAP_THRESHOLD_": "65536"}  # every allocation of 64 KiB or more is mapped, and unmapped when freed


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _reset_peak() -> bool:
    """Reset this process's peak resident memory (Linux: 5 to /proc/self/clear_refs); False where it cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _status_kib("VmHWM") <= _status_kib("VmRSS") + 1024
    except (OSError, KeyError):
        return False


def measure(mode: str, kind: str, rows: int, chunk_mib: float) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from utils.train.head import chunk_rows, head_logprobs

    torch.manual_seed(0)
    extra = {"head_dim": 16, "final_logit_softcapping": 30.0} if kind == "gemma2" else {}
    cfg = AutoConfig.for_model(kind, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                               num_attention_heads=2, num_key_value_heads=1, vocab_size=VOCAB,
                               max_position_embeddings=4096, tie_word_embeddings=False, **extra)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    for p in model.parameters():
        p.requires_grad_(False)
    model.model.norm.weight.requires_grad_(True)  # a gradient through the head, as LoRA's, without a [V, H] one
    ids = torch.randint(3, 1000, (1, rows + 1), generator=torch.Generator().manual_seed(1))
    temperature = 1.0 if mode == "nograd" else 0.7

    def run(n: int) -> None:
        i, a = ids[:, :n + 1], torch.ones_like(ids[:, :n + 1])
        if mode == "nograd":
            with torch.no_grad():
                head_logprobs(model, i, a, temperature=temperature, entropy="value", chunk_mib=chunk_mib)
            return
        lp, ent = head_logprobs(model, i, a, temperature=temperature, entropy=mode, chunk_mib=chunk_mib)
        (lp.sum() + (ent.sum() if mode == "grad" else 0)).backward()

    run(2)
    peak_reset = _reset_peak()  # else the peak so far (model building's included) hides the call's
    before = _status_kib("VmRSS") if peak_reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run(rows)
    after = _status_kib("VmHWM") if peak_reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    grew = (after - before) / 1024
    n = chunk_rows(VOCAB, chunk_mib)
    return {"mode": mode, "kind": kind, "rows": rows, "chunk_mib": chunk_mib, "chunk_positions": n,
            "one_fp32_chunk_mib": round(n * VOCAB * 4 / 2 ** 20, 1), "grew_mib": round(grew, 1),
            "peak": "VmHWM after a reset" if peak_reset else "ru_maxrss"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=MODES)
    ap.add_argument("--kind", default="llama", choices=("llama", "gemma2"))
    ap.add_argument("--rows", type=int, default=200, help="positions through the head (several chunks)")
    ap.add_argument("--chunk_mib", type=float, default=64.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.mode and os.environ.get("MALLOC_MMAP_THRESHOLD_") != MMAP["MALLOC_MMAP_THRESHOLD_"]:
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MMAP})  # glibc reads it at start
    if args.mode:
        r = measure(args.mode, args.kind, args.rows, args.chunk_mib)
        print(json.dumps(r) if args.json else r)
        return 0
    worst = 0.0
    for kind in ("llama", "gemma2"):
        for mode in MODES:
            out = subprocess.run([sys.executable, __file__, "--mode", mode, "--kind", kind, "--rows", str(args.rows),
                                  "--chunk_mib", str(args.chunk_mib), "--json"], capture_output=True, text=True,
                                 check=True, env={**os.environ, **MMAP})
            r = json.loads(out.stdout.strip().splitlines()[-1])
            worst = max(worst, r["grew_mib"])
            print(f"{kind:7s} {mode:7s} positions/chunk {r['chunk_positions']:4d}  peak grew {r['grew_mib']:7.1f} MiB")
    print(f"worst_grew_mib={worst} chunk_mib={args.chunk_mib}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
