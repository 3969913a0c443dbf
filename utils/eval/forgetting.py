"""What each arm kept of what the warmup taught: the policy's token-mean NLL of demonstrations under
every checkpoint of a run (issue 86's measure of "forgetting").

    .venv/bin/python -m utils.eval.forgetting --run outputs/peers/seed_1 [--split val] [--batch 32]

The seed argues that SFT → RL forgets what SFT taught. What SFT teaches here is the demonstrations'
decomposition: the planner's subtasks and the executor's answers. Two sets of demonstrations are
read, each checkpoint's NLL of their trained tokens taken per role and over both, for base, the SFT
warmup (04's best adapter) and every trained method of the run (05's and 06's final adapters):
- `own`: the very demonstrations the warmup trained on (03's sft_traces.jsonl, the imperfect
  teacher's flawed half included): how far an arm moved from them;
- `gold`: the gold demonstration of each question of the split (val by default: held out), built
  as 03 builds one but with the teacher unflawed: the correct decompositions.
An arm whose `own` NLL rises while its `gold` NLL holds or falls has unlearned the flaw rather than
the skill; one whose `gold` NLL rises has moved away from the decompositions themselves. Accuracy
(07) says what either cost. The model, templates and LoRA are those 04 recorded
(utils/core/stages.py `recorded_config`), so the ids are the ones the run trained on.

Prints one line per set and checkpoint, and last `forgetting <set>/<method>=<its NLL − the
warmup's> ...` over both roles. A study analysis: no stage runs it, and 08 does not read it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from utils.agent.rollout import Codec
from utils.agent.traces import gold_examples, read_trace_examples
from utils.core.config import repo_path
from utils.core.io import read_records
from utils.core.methods import BASE, SFT_WARMUP
from utils.core.stages import recorded_config

ROLES = ("planner", "executor")


def nll_by_role(model, examples: list, pad_id: int, batch: int = 32) -> dict[str, float]:
    """Token-mean NLL of the examples' trained tokens under `model`, per role and over all ("all"):
    each example's forward runs once, in its role's batches, and "all" is the roles' token-weighted mean."""
    import torch

    from utils.train.policy import policy_device, sft_batch, sft_terms

    out, tokens = {}, {}
    for role in ROLES:
        chosen = [e for e in examples if e.role == role]
        tokens[role] = sum(sum(e.mask[1:]) for e in chosen)  # the next-token targets sft_batch trains
        if not tokens[role]:
            continue
        nll = 0.0
        with torch.no_grad():
            for i in range(0, len(chosen), batch):
                part = sft_batch(chosen[i:i + batch], pad_id, policy_device(model))
                nll += sft_terms(model, part, total=torch.tensor(float(tokens[role])))[0].item()
        out[role] = nll
    if out:
        out["all"] = sum(out[r] * tokens[r] for r in out) / sum(tokens[r] for r in out)
    return out


def checkpoints(run: Path) -> dict[str, Path | None]:
    """name -> adapter folder (None: the bare base), in report order: base, sft_warmup, then each
    trained method with a final adapter under 05 or 06."""
    out: dict[str, Path | None] = {BASE: None, SFT_WARMUP: run / "04_sft_warmup" / "ckpt_sft" / "best"}
    for stage in ("05_train_red_grpo", "06_ablate_grpo_only"):
        for final in sorted((run / stage).glob("*/final_adapter")):
            out[final.parent.name] = final
    return out


def forgetting(rows: list[dict], run: Path, batch: int = 32) -> dict[str, dict[str, dict[str, float]]]:
    """set ("own", "gold") -> checkpoint -> NLL by role: on the warmup's own demonstrations (when 03's
    traces are in the run) and on the rows' gold ones."""
    from transformers import AutoTokenizer

    from utils.train.policy import load_policy

    cfg = recorded_config(run / "04_sft_warmup")
    base = repo_path(cfg.model.path)
    tok = AutoTokenizer.from_pretrained(base)
    sets = {"gold": gold_examples(rows, Codec(tok, cfg.model.templates))}
    if not sets["gold"]:
        raise SystemExit(f"forgetting: no row of the split has a gold decomposition ({run})")
    own = run / "03_generate_sft_traces" / "sft_traces.jsonl"
    if own.exists():
        sets = {"own": read_trace_examples(own), **sets}
    out: dict = {name: {} for name in sets}
    for name, adapter in checkpoints(run).items():
        model = load_policy(base, cfg.model.lora, cfg.model.dtype, adapter=adapter, trainable=False,
                            trust_remote_code=cfg.model.trust_remote_code)
        model.eval()
        for kind, examples in sets.items():
            out[kind][name] = nll_by_role(model, examples, tok.pad_token_id, batch)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="a run (or a study's seed) folder")
    ap.add_argument("--split", default="val", choices=("val", "train", "test"))
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    rows = [r for _, r in read_records(args.run / "01_prepare_dataset" / f"{args.split}.jsonl")]
    tables = forgetting(rows, args.run, args.batch)
    last = []
    for kind, table in tables.items():
        for name, nll in table.items():
            print(f"{kind}/{name}: " + "  ".join(f"nll_{role} {value:.4f}" for role, value in nll.items()))
        warm = table[SFT_WARMUP]["all"]
        last += [f"{kind}/{name}={nll['all'] - warm:+.4f}" for name, nll in table.items()
                 if name not in (BASE, SFT_WARMUP)]
    print("forgetting " + " ".join(last))
    return 0


if __name__ == "__main__":
    sys.exit(main())
