"""What `download.sh` runs: `python -m utils.tinyarith.download [--model HF_ID] [--dataset NAME] [--rebuild-model]`.

With no arguments (the embedded default) it works offline: it checks the committed `tiny-arith`
base model against its manifest (rebuilding it by its recipe if it is missing or altered) and
writes the synthetic datasets from configs/data/synthetic_arith.yaml and synthetic_lookup.yaml.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from utils.core.config import ROOT, ConfigError, from_dict, read_yaml, repo_path
from utils.core.manifest import path_sha256, read_manifest
from utils.core.schema import DataConfig

BASE_DIR = ROOT / "artifacts" / "tiny-arith"


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
    from utils.tinyarith.build import DEFAULT_RECIPE, build

    problems = ["rebuild requested"] if rebuild else None
    if problems is None:
        try:
            problems = verify_base(BASE_DIR)
        except (FileNotFoundError, ValueError, KeyError) as exc:
            problems = [str(exc)]
    if not problems:
        m = read_manifest(BASE_DIR)
        print(f"tiny-arith: {BASE_DIR.relative_to(ROOT)} intact ({m['parameters']} parameters, "
              f"held-out acc {m['metrics']['heldout_acc']:.3f})")
        return
    print(f"tiny-arith: building by its recipe ({'; '.join(problems)}); this takes several minutes")
    m = build(DEFAULT_RECIPE, BASE_DIR)
    print(f"tiny-arith: built, held-out acc {m['metrics']['heldout_acc']:.3f}")


def ensure_synthetic(config: Path) -> None:
    from utils.data.synthetic import write_dataset

    tree = read_yaml(config)
    tree.pop("run", None)  # run-level defaults of the tier (utils/core/schema.load_run_config)
    cfg = from_dict(DataConfig, tree, str(config))
    out = repo_path(cfg.path)
    m = write_dataset(cfg, out)
    print(f"{cfg.name}: wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out} "
          f"{m['counts']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="hub id of a real base model, saved under models/<name>")
    ap.add_argument("--dataset", help="gsm8k | finqa | hotpotqa, saved under data/<name>")
    ap.add_argument("--rebuild-model", action="store_true", help="re-run the tiny-arith pretraining recipe")
    ap.add_argument("--data-config", type=Path, action="append",
                    help="data config of a synthetic dataset to write (repeatable; default: both embedded ones)")
    args = ap.parse_args(argv)
    try:
        if args.model or args.dataset:
            from utils.core.hub import HubUnreachable, fetch_dataset, fetch_model
            try:
                if args.model:
                    dest = fetch_model(args.model, ROOT / "models" / args.model.split("/")[-1])
                    print(f"model: {args.model} -> {dest}")
                if args.dataset:
                    dest = fetch_dataset(args.dataset, ROOT / "data" / args.dataset)
                    print(f"dataset: {args.dataset} -> {dest}")
            except HubUnreachable as exc:
                print(f"download.sh: error: {exc}", file=sys.stderr)
                return 3
            return 0
        ensure_base(args.rebuild_model)
        for config in args.data_config or [ROOT / "configs" / "data" / f"{n}.yaml"
                                           for n in ("synthetic_arith", "synthetic_lookup")]:
            ensure_synthetic(config)
    except (ConfigError, ValueError) as exc:
        print(f"download.sh: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
