"""Fetching real models and datasets from the Hugging Face hub, failing fast where it is unreachable.

`check_hub` makes one short HTTP request before any download, so an offline machine gets a
clear error in seconds instead of a long retry loop. `HF_ENDPOINT` is honoured (mirrors, tests).

Dataset names map to their hub ids and the native files the adapters read (docs/ARCHITECTURE.md, "Data"):
the rows are saved as JSONL under data/<name>/<split>.jsonl in the source's own schema.
"""
from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

from utils.core.registry import Registry

DATASETS = Registry("dataset", {  # name -> (hub id, config or None, {our split: hub split})
    "gsm8k": ("openai/gsm8k", "main", {"train": "train", "test": "test"}),
    "finqa": ("ibm-research/finqa", None, {"train": "train", "val": "validation", "test": "test"}),
    "hotpotqa": ("hotpotqa/hotpot_qa", "distractor", {"train": "train", "val": "validation"}),
})


class HubUnreachable(RuntimeError):
    pass


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def check_hub(timeout: float = 8.0) -> None:
    """Raise HubUnreachable with a clear message unless the hub answers within `timeout` seconds."""
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise HubUnreachable("HF_HUB_OFFLINE=1 is set; unset it to download from the hub")
    url = hub_endpoint() + "/api/models?limit=1"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - fixed https/http URL
            resp.read(1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise HubUnreachable(
            f"the Hugging Face hub at {hub_endpoint()} is unreachable ({reason}). "
            "Copy the files to this machine and point the config's `path` at them instead "
            "(model: configs/models/*.yaml `path`; dataset: configs/data/*.yaml `path`).") from None


def fetch_model(repo_id: str, dest: Path) -> Path:
    check_hub()
    from huggingface_hub import snapshot_download

    dest.mkdir(parents=True, exist_ok=True)
    snapshot_download(repo_id, local_dir=str(dest),
                      allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"])
    return dest


def fetch_dataset(name: str, dest: Path) -> Path:
    if name not in DATASETS:
        raise ValueError(f"unknown dataset '{name}'; valid: {', '.join(DATASETS.names)}")
    check_hub()
    from datasets import load_dataset

    repo_id, config, splits = DATASETS[name]
    dest.mkdir(parents=True, exist_ok=True)
    for ours, theirs in splits.items():
        ds = load_dataset(repo_id, config, split=theirs)
        tmp = dest / f".{ours}.jsonl.partial"
        ds.to_json(str(tmp), lines=True, force_ascii=False)
        tmp.rename(dest / f"{ours}.jsonl")
    return dest
