"""Export a trained checkpoint as a plain Hugging Face model: its LoRA adapter folded into the base
weights, so transformers, vLLM or any other runtime loads it without peft.

    .venv/bin/python -m utils.deploy.export --run_id run_001 --checkpoint red [--out DIR]

`--checkpoint` is `sft_warmup`, a method name (its trainer's final adapter) or a peft adapter
directory. The folder (default outputs/<run_id>/export/<checkpoint>/) holds the base's config,
generation config and tokenizer files, the merged safetensors (the base's own file layout, shards
and index included) and a manifest.json that records the run, the checkpoint, and the sha256 of
the source adapter and of the base model. The fold is W + (alpha/r)·B·A in fp32, cast back to the
base's dtype: the same numbers the vLLM engine serves with `lora_serving: merged`
(utils/agent/merge.py). The base's own manifest.json (tiny-arith's build record) is not copied:
the export's manifest takes its place.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from utils.agent.merge import lora_deltas, weight_files
from utils.core.cli import parse_stage_args, stage_parser
from utils.core.config import repo_path, to_dict
from utils.core.hashing import path_sha256
from utils.core.manifest import MANIFEST_NAME, StageRun
from utils.core.methods import BASE, CHECKPOINTS
from utils.core.stages import StageError, model_dir, resolve_checkpoint, run_dir, run_main

STAGE = "export"
INDEX = "model.safetensors.index.json"


def merge_into(base: Path, adapter: Path, out: Path) -> list[Path]:
    """Write base + the adapter's LoRA update into `out` (every base file but its weights and its
    manifest copied as is); returns the files written. Each file lands whole or not at all."""
    from safetensors.torch import load_file, save_file

    try:
        deltas = lora_deltas(adapter)
    except ValueError as exc:
        raise StageError(str(exc)) from None
    out.mkdir(parents=True, exist_ok=True)
    shards = weight_files(base)
    written, merged = [], set()
    for f in sorted(base.iterdir()):
        if f.is_file() and f not in shards and f.name != MANIFEST_NAME:
            written.append(_atomic_copy(f, out / f.name))
    for shard in shards:
        tensors = load_file(str(shard))
        for name in set(deltas) & set(tensors):
            w = tensors[name]
            tensors[name] = (w.float() + deltas[name]).to(w.dtype).contiguous()
            merged.add(name)
        tmp = out / f".{shard.name}.tmp"
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        shutil.copymode(shard, tmp)  # safetensors writes owner-only files; keep the base's permissions
        written.append(tmp.replace(out / shard.name))
    missing = sorted(set(deltas) - merged)
    if missing:
        raise StageError(f"{adapter}: adapter targets {missing[0]}, which the base at {base} does not have")
    return written


def _atomic_copy(src: Path, dst: Path) -> Path:
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.copyfile(src, tmp)
    return tmp.replace(dst)


def main(argv=None) -> int:
    ap = stage_parser(__doc__)
    ap.add_argument("--checkpoint", required=True, help=f"sft_warmup | a method | an adapter DIR "
                                                        f"(one of {', '.join(c for c in CHECKPOINTS if c != BASE)})")
    ap.add_argument("--out", default=None, help="output folder (default outputs/<run_id>/export/<checkpoint>)")
    cfg, args = parse_stage_args(__doc__, argv, parser=ap)
    if args.checkpoint == BASE:
        ap.exit(2, f"{ap.prog}: --checkpoint base: the base model has nothing to merge; use {cfg.model.path} as is\n")
    label = args.checkpoint if args.checkpoint in CHECKPOINTS else Path(args.checkpoint).name
    out = repo_path(args.out) if args.out else run_dir(cfg) / STAGE / label
    settings = {"model": to_dict(cfg.model), "checkpoint": args.checkpoint}
    with StageRun(f"{STAGE}/{label}", out, settings, cfg.seed) as run:
        base = model_dir(cfg)
        adapter = resolve_checkpoint(run, cfg, args.checkpoint)
        for p in (base, adapter):
            run.add_input(p)
        for f in merge_into(base, adapter, out):
            run.add_output(f)
        run.metrics.update({"run_id": cfg.run_id, "checkpoint": args.checkpoint, "base": str(cfg.model.path),
                            "base_sha256": path_sha256(base), "adapter_sha256": path_sha256(adapter)})
    print(f"{STAGE}: {label} merged into {cfg.model.path} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(STAGE, main))
