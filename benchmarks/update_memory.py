"""The memory of one RL update and one SFT step as the batch grows, today's path against the code
before micro-batches (docs/PERFORMANCE.md, "The update's memory"):

    .venv/bin/python benchmarks/update_memory.py

A small random Gemma-2 (width 64, two layers, softcap 30) with Gemma-2's 256,000-entry vocabulary,
LoRA r16 on q/v with dropout 0.05 as the GPU model configs have it, and 05's update through the
trainer's own methods (utils/train/grpo_trainer.py `_fixed_logprobs`, the no-grad old-log-prob
pass, then `_update`: two optimizer passes with the SFT term, in train mode), and 04's step
(`SftLoop._update`), both from benchmarks/gpu_shapes.py's harness. Each episode is a planner
conversation of 24 tokens (16 generated) and two executor calls of 12 (8 generated). The sweep
runs 8, 16, 32 and 64 episodes (the SFT step: as many conversations) at a micro-batch budget of
8 episodes' tokens (the SFT step: 8 conversations'), each point in a subprocess of its own, for `--tree` this checkout and for
`--before` (a commit whose code is exported to a temporary folder: by default the last one
before micro-batches). Per point:
- `peak_mb`: ru_maxrss after the update over ru_maxrss before it (the model, the trainer and the
  batch built; the optimizer's LoRA state, a few hundred KiB, is made inside), MiB;
- `saved_mb`: the most bytes saved for backward by one graph (torch.autograd.graph.saved_tensors_hooks,
  every tensor packed between two backward calls, parameters excluded: what the allocator does not
  change);
- `vocab_saved`: the largest saved tensor with a vocabulary-sized dimension, in bytes.
The last line is exactly

    update_peak_ratio=<peak at 64 episodes / peak at 8, this tree> sft_peak_ratio=<the same, SFT step> vocab_saved=<largest vocabulary-sized saved tensor of this tree, bytes>
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "ca6c391"  # the last commit before micro-batches and the chunked LM head
VOCAB = 256000
PLANNER, EXECUTOR = (24, [(8, 16)]), (12, [(4, 8)])  # (length, generated spans) of one episode's pieces
EPISODE_TOKENS = PLANNER[0] + 2 * EXECUTOR[0]


def _batch(n: int):
    from gpu_shapes import episode_batch

    return episode_batch(n, PLANNER, EXECUTOR, 2)


class SavedBytes:
    """Bytes packed for backward per graph (reset at each backward call), parameters excluded, and the
    largest packed tensor with a vocabulary-sized dimension."""

    def __init__(self, params):
        import torch

        self.torch, self.params = torch, {p.data_ptr() for p in params}
        self.current, self.most, self.vocab = 0, 0, 0
        self.seen: set = set()

    def pack(self, t):
        key = (t.data_ptr(), t.numel(), t.dtype)
        if t.data_ptr() not in self.params and key not in self.seen:
            self.seen.add(key)
            self.current += t.numel() * t.element_size()
            self.most = max(self.most, self.current)
            if VOCAB in t.shape:
                self.vocab = max(self.vocab, t.numel() * t.element_size())
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


def point(kind: str, n: int, budget: int, where: Path) -> dict:
    """One measurement in this process (utils imported from the tree on sys.path)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from gpu_shapes import _examples, bare_trainer, memory_overrides, sft_loop, trainer_update
    from utils.core.loader import load_run_config
    from utils.train.policy import load_policy

    torch.manual_seed(0)
    cfg = AutoConfig.for_model("gemma2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=2, num_key_value_heads=1, head_dim=32, vocab_size=VOCAB,
                               final_logit_softcapping=30.0, max_position_embeddings=256, pad_token_id=0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(where / "model")
    run = load_run_config("gemma-2-2b", "red", "synthetic_arith",
                          ["algorithm.rl.stratify=false", "model.device=cpu", "algorithm.rl.ppo_epochs=2",
                           *memory_overrides(budget)])
    policy = load_policy(where / "model", run.model.lora, "float32")
    sft = _examples(max(n, run.algorithm.sft.batch_size), *PLANNER, "planner")
    if kind == "update":
        trainer = bare_trainer(run, policy, sft, where / "trainer")
        batch = _batch(n)
        step = lambda: trainer_update(trainer, batch)  # noqa: E731
    else:
        loop = sft_loop(run, policy, sft[:n], where / "sft")
        step = loop._update
    policy.train()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # the high-water mark: no warm-up before it
    with SavedBytes([p for p in policy.parameters()]) as saved:
        step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"kind": kind, "episodes": n, "tokens": n * (EPISODE_TOKENS if kind == "update" else PLANNER[0]),
            "peak_mb": round((peak - before) / 1024, 1), "saved_mb": round(saved.most / 2 ** 20, 1),
            "vocab_saved": saved.vocab}


def export(commit: str, where: Path) -> Path:
    """The code of `commit` (git archive) under `where`."""
    where.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def run_point(tree: Path, kind: str, n: int, budget: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{ROOT / 'benchmarks'}", "OMP_NUM_THREADS": "2"}
        out = subprocess.run([sys.executable, __file__, "--point", f"{kind},{n},{budget}", "--work", tmp],
                             cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            return {"kind": kind, "episodes": n, "failed": out.stderr.strip().splitlines()[-1][:300]}
        return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", default="8,16,32,64")
    ap.add_argument("--before", default=BEFORE, help="the commit to compare with ('' = none)")
    ap.add_argument("--point", help=argparse.SUPPRESS)  # internal: kind,episodes,budget in this process
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.point:
        kind, n, budget = args.point.split(",")
        print(json.dumps(point(kind, int(n), int(budget), args.work)))
        return 0
    sizes = [int(x) for x in args.episodes.split(",")]
    budgets = {"update": 8 * EPISODE_TOKENS, "sft": 8 * PLANNER[0]}  # 8 episodes' tokens, 8 conversations'
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this tree": ROOT, **({f"before ({args.before})": export(args.before, Path(tmp) / "before")}
                                       if args.before else {})}
        for name, tree in trees.items():
            for kind in ("update", "sft"):
                for n in sizes:
                    r = run_point(tree, kind, n, budgets[kind])
                    rows[(name, kind, n)] = r
                    print(f"{name:>20} {kind:>6} {n:>3} episodes: " + ", ".join(
                        f"{k} {v}" for k, v in r.items() if k not in ("kind", "episodes")), flush=True)
    mine = {k[1:]: v for k, v in rows.items() if k[0] == "this tree"}
    ratio = lambda kind: mine[(kind, sizes[-1])]["peak_mb"] / max(mine[(kind, sizes[0])]["peak_mb"], 0.1)  # noqa: E731
    print(f"micro-batch budgets {budgets} tokens (8 episodes, 8 conversations); peaks in MiB over the baseline")
    print(f"update_peak_ratio={ratio('update'):.3f} sft_peak_ratio={ratio('sft'):.3f} "
          f"vocab_saved={max(r.get('vocab_saved', 0) for r in mine.values())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
