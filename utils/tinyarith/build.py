"""Build the `tiny-arith` base model by its recipe: `python -m utils.tinyarith.build [--out DIR]`.

Writes an ordinary Hugging Face directory (config.json, model.safetensors, tokenizer files,
generation_config.json) plus `manifest.json` recording the recipe, its hash, the training curve,
the held-out accuracy and the wall time. The directory is assembled under a temporary name and
renamed into place, so an interrupted build never leaves a half-written model.

A variant for experiments: `--set` takes any recipe field and the manifest records it, e.g.
`python -m utils.tinyarith.build --out DIR --set seq_len=384 --set reduction_max_ops=6 [--device
cuda]`; a run uses it with `--set model.path=DIR`. On a GPU a helper process draws the batches ahead
of the device, the same stream as on the CPU, but the weights differ from a CPU build's (another
summation order).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from utils.core.config import ROOT, ConfigError, apply_overrides, from_dict, read_yaml, to_dict
from utils.core.files import atomic_write_json, publish_dir
from utils.core.hashing import config_sha256, path_sha256
from utils.core.manifest import read_manifest
from utils.core.provenance import git_state, package_versions
from utils.tinyarith.model import (PretrainConfig, chain_prompts, greedy_accuracy, heldout_prompts, pretrain,
                                   save_tokenizer)

DEFAULT_RECIPE = ROOT / "configs" / "pretrain" / "tiny-arith.yaml"
DEFAULT_OUT = ROOT / "artifacts" / "tiny-arith"


def build(recipe: Path, out_dir: Path, overrides: dict | None = None, device: str = "cpu") -> dict:
    import torch
    from transformers import GenerationConfig

    cfg = from_dict(PretrainConfig, {**read_yaml(recipe), **(overrides or {})}, str(recipe))
    t0 = time.time()
    model, history = pretrain(cfg, device=device)
    eval_items = heldout_prompts(cfg, cfg.eval_size, seed=cfg.seed + 2)
    acc = greedy_accuracy(model, eval_items)
    chain_items = chain_prompts(cfg, cfg.eval_size, seed=cfg.seed + 2)
    chain_acc = greedy_accuracy(model, chain_items)
    torch.manual_seed(cfg.seed + 3)
    from transformers import LlamaForCausalLM
    from utils.tinyarith.model import llama_config
    random_acc = greedy_accuracy(LlamaForCausalLM(llama_config(cfg)), eval_items)

    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0, do_sample=False).save_pretrained(tmp)
    save_tokenizer(tmp, cfg.max_position_embeddings)
    files = {p.name: path_sha256(p) for p in sorted(tmp.iterdir())}
    manifest = {
        "stage": "build_base", "status": "completed", "model": "tiny-arith",
        "recipe": to_dict(cfg), "recipe_sha256": config_sha256(to_dict(cfg)),
        "parameters": sum(p.numel() for p in model.parameters()),
        "metrics": {"heldout_acc": acc, "random_init_heldout_acc": random_acc,
                    "heldout_items": len(eval_items),
                    "task_chain_reduction_acc": chain_acc, "chain_items": len(chain_items), "final_loss": history[-1]["loss"]},
        "history": history, "files": files, "git": git_state(), "versions": package_versions(), "device": device,
        "wall_seconds": round(time.time() - t0, 1),
    }
    atomic_write_json(tmp / "manifest.json", manifest)
    publish_dir(tmp, out_dir)
    return manifest


def verify_base(model_dir: Path) -> list[str]:
    """Files whose content differs from the base model's manifest (empty list: intact)."""
    manifest = read_manifest(model_dir)
    problems = []
    for name, digest in manifest["files"].items():
        path = model_dir / name
        if not path.is_file():
            problems.append(f"{name}: missing")
        elif path_sha256(path) != digest:
            problems.append(f"{name}: sha256 differs from manifest.json")
    return problems


def ensure_base(rebuild: bool) -> None:
    """The committed base as its manifest says, else rebuilt by its recipe (`download.sh`, with no arguments)."""
    problems = ["rebuild requested"] if rebuild else None
    if problems is None:
        try:
            problems = verify_base(DEFAULT_OUT)
        except (FileNotFoundError, ValueError, KeyError) as exc:
            problems = [str(exc)]
    if not problems:
        m = read_manifest(DEFAULT_OUT)
        print(f"tiny-arith: {DEFAULT_OUT.relative_to(ROOT)} intact ({m['parameters']} parameters, "
              f"held-out acc {m['metrics']['heldout_acc']:.3f})")
        return
    print(f"tiny-arith: building by its recipe ({'; '.join(problems)}); this takes several minutes")
    m = build(DEFAULT_RECIPE, DEFAULT_OUT)
    print(f"tiny-arith: built, held-out acc {m['metrics']['heldout_acc']:.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", type=Path, default=DEFAULT_RECIPE, help="pretraining recipe YAML")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output model directory")
    ap.add_argument("--steps", type=int, default=None, help="override the recipe's step count (tests)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a recipe field (YAML value), e.g. seq_len=384; recorded in the manifest's recipe")
    ap.add_argument("--device", default="cpu", help="torch device to pretrain on (cpu, cuda)")
    args = ap.parse_args(argv)
    try:  # the stages' own KEY=VALUE parser: YAML values, unknown keys named with the nearest field
        overrides = apply_overrides({}, args.set, PretrainConfig)
    except ConfigError as exc:
        raise SystemExit(f"utils.tinyarith.build: {exc}") from None
    if args.steps is not None:
        overrides["steps"] = args.steps
    m = build(args.recipe, args.out, overrides, device=args.device)
    print(f"built {args.out}: {m['parameters']} parameters, held-out acc {m['metrics']['heldout_acc']:.3f} "
          f"(random init {m['metrics']['random_init_heldout_acc']:.3f}), task-chain reduction acc "
          f"{m['metrics']['task_chain_reduction_acc']:.3f}, {m['wall_seconds']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
