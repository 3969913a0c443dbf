"""Every registered method's update on one fixed batch, fingerprinted, so that a refactor of the step
can show it changed no method: run it at the commit before and at the one after, on the same box,
and compare.

    .venv/bin/python benchmarks/method_fingerprints.py --out after.json
    .venv/bin/python benchmarks/method_fingerprints.py --compare before.json after.json

Method: the embedded base (artifacts/tiny-arith) with a rank-8 LoRA whose A and B are drawn at std
0.05 (torch seed 0); one ragged RL batch of nine rows in six episodes (two of them demonstration
rows, with group accuracies and per-row correctness), the sampler's log-probs as the old ones (so
ratios move off 1 and the clips act), and a six-row SFT batch, all from fixed generators. For each
method in the registry (`utils/core/methods.py` METHODS) the update (`utils/train/update.py`
`red_grpo_loss`) runs on what the method trains (the RL rows if its RL is on, the SFT rows if its
SFT term is), at step 3 with batch accuracy 0.4 and RED's state after two folded steps, twice: with
the two demonstration rows marked as such (`demos`: the path of red_paper, SRFT and LUFFY, and of
any batch holding them) and with none marked (`rollouts`: every other method's path). A fingerprint
is the loss, a SHA-256 of every LoRA gradient's bytes in name order, and one of the logged
statistics. `--compare` prints, for each method and form both files have, `identical` or
what differs, and ends with `methods=<n> identical=<k> differing=<d>` (n counting method-forms); it exits 1 when any differs.
Bit for bit holds on one box only: CPU kernels differ between boxes (docs/PERFORMANCE.md).

The step variants (what a method does to the groups before the update) are not in the fingerprint;
their own tests pin them (tests/test_red_paper.py, test_hpt.py, test_srft.py, test_relift.py,
test_luffy.py).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from utils.core.loader import load_run_config  # noqa: E402
from utils.core.methods import METHODS  # noqa: E402
from utils.core.schema import LoraConfig, MemoryConfig  # noqa: E402
from utils.train.batch import RlBatch  # noqa: E402
from utils.train.policy import load_policy  # noqa: E402
from utils.train.red import RedState  # noqa: E402
from utils.train.update import red_grpo_loss  # noqa: E402

BASE = ROOT / "artifacts" / "tiny-arith"


def _model():
    torch.manual_seed(0)
    model = load_policy(BASE, LoraConfig(rank=8, alpha=16, dropout=0.0))
    for p in model.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05)
    return model


def _rows(g, lengths: list[int], prompt: int):
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(3, 90, (n,), generator=g)
        attn[i, :n] = 1
    mask = attn[:, 1:].float()
    mask[:, :prompt] = 0
    return ids, attn, mask


def _batches():
    """(the RL batch, the SFT batch), from fixed generators."""
    g = torch.Generator().manual_seed(7)
    ids, attn, mask = _rows(g, [38, 12, 9, 30, 14, 26, 11, 33, 20], 3)
    sampler = (-torch.rand(mask.shape, generator=g) * 3 - 0.5) * mask
    rl = RlBatch(ids, attn, mask, sampler, torch.randn(9, generator=g), ["planner", "executor", "executor"] * 3,
                 offline=torch.tensor([False] * 7 + [True, True]), accuracy=torch.rand(9, generator=g),
                 episode=torch.tensor([0, 0, 0, 1, 2, 3, 3, 4, 5]),
                 correct=torch.tensor([True, True, True, False, True, False, False, True, True]))
    return rl, _rows(g, [17, 25, 9, 31, 22, 14], 4)


def fingerprint(name: str, model, rl: RlBatch, sft) -> dict:
    """Method `name`'s update on `rl` and `sft`: its loss and the hashes of its gradients and stats."""
    alg = load_run_config(algorithm=name).algorithm
    red = RedState(ema_sft=0.85, ema_rl=1.05, prev_ema_sft=0.9, prev_ema_rl=1.1, steps=2)
    model.zero_grad(set_to_none=True)
    state = {"h_sft": 0.8, "h_rl": 1.2}  # what red_paper's loss reads from the previous step (positional: renamed)
    terms = red_grpo_loss(model, rl if alg.rl.enabled else None, rl.sampler_lp if alg.rl.enabled else None,
                          sft if alg.sft.enabled else None, alg, red, 0.4, None, state,
                          memory=MemoryConfig(micro_batch_tokens=0), step=3)
    grads = hashlib.sha256()
    for n, p in sorted(model.named_parameters()):
        if p.grad is not None:
            grads.update(n.encode() + p.grad.detach().numpy().tobytes())
    stats = hashlib.sha256(json.dumps(terms.stats, sort_keys=True).encode()).hexdigest()
    return {"loss": repr(terms.loss.item()), "grads": grads.hexdigest(), "stats": stats,
            "stat_keys": sorted(terms.stats)}


def compare(before: dict, after: dict) -> int:
    both = [m for m in after if m in before]
    differing = 0
    for m in both:
        diff = [k for k in ("loss", "grads") if before[m][k] != after[m][k]]
        keys = sorted(set(before[m]["stat_keys"]) ^ set(after[m]["stat_keys"]))
        stats = "" if before[m]["stats"] == after[m]["stats"] else \
            f" (logged statistics differ: {', '.join(keys) if keys else 'their values'})"
        differing += bool(diff)
        print(f"{m:<24} {'identical' if not diff else 'DIFFERENT: ' + ', '.join(diff)}{stats}")
    for m in sorted(set(before) ^ set(after)):
        print(f"{m:<24} only {'before' if m in before else 'after'}")
    print(f"methods={len(both)} identical={len(both) - differing} differing={differing}")
    return 1 if differing else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="write the fingerprints here (JSON)")
    ap.add_argument("--compare", type=Path, nargs=2, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args()
    if args.compare:
        return compare(*(json.loads(p.read_text()) for p in args.compare))
    torch.set_num_threads(1)  # one kernel path, whatever the box's core count
    model, (rl, sft) = _model(), _batches()
    plain = RlBatch(**{**rl.__dict__, "offline": None, "accuracy": None})
    prints = {f"{name}/{form}": fingerprint(name, model, batch, sft)
              for name in METHODS for form, batch in (("rollouts", plain), ("demos", rl))}
    for key, f in prints.items():
        print(f"{key:<24} loss={f['loss']} grads={f['grads'][:16]}")
    if args.out:
        args.out.write_text(json.dumps(prints, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
