"""Saved weights and resumable training checkpoints, shared by the SFT and RL loops.

A checkpoint directory holds `weights/` (a peft adapter or a full model), `trainer.pt`
(optimizer, optional scheduler, torch and python RNG states) and `state.json` (the loop's own
state and the config hash it belongs to). It is assembled under `<name>.tmp` and renamed into
place, so a kill mid-save leaves the previous checkpoint intact and never a half-written one.
`resume_latest` is the one resume rule: restore the newest checkpoint if it was written under the
same config hash, otherwise clear what an earlier run left and start fresh.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
from contextlib import contextmanager
from pathlib import Path

import torch

from utils.core.faults import fault_point
from utils.core.files import atomic_write_json, publish_dir


def _save_pretrained(model, out_dir: Path) -> None:
    """The trained weights only: a peft model that also holds a frozen KL reference adapter saves
    just its active (trained) adapter, so the directory is one adapter that vLLM can serve."""
    many = len(getattr(model, "peft_config", {})) > 1
    try:
        model.save_pretrained(out_dir, **({"selected_adapters": [model.active_adapter]} if many else {}))
    except Exception as exc:  # safetensors reports a full disk as its own error: "... (os error 28)"
        code = re.search(r"\(os error (\d+)\)", str(exc))
        if code is None or isinstance(exc, OSError):
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(out_dir)) from exc


@contextmanager
def _assembling(tmp: Path):
    """A fresh `tmp` directory, removed again if filling it fails (a full disk keeps no half copy)."""
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def save_weights(model, out_dir: Path) -> None:
    """An adapter (peft) or full-model directory, assembled aside and renamed into place."""
    with _assembling(out_dir.with_name(out_dir.name + ".tmp")) as tmp:
        _save_pretrained(model, tmp)
    publish_dir(tmp, out_dir)


def save_checkpoint(final: Path, model, opt, sched, state: dict, config_sha: str, rank_rngs: list | None = None) -> Path:
    """`rank_rngs`: under data parallelism, every rank's torch RNG state (rank 0 saves them all)."""
    with _assembling(final.with_name(final.name + ".tmp")) as tmp:
        _save_pretrained(model, tmp / "weights")
        fault_point("checkpoint")  # the kill-anywhere test's cut (utils/core/faults.py)
        torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict() if sched is not None else None,
                    "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(),
                    **({"torch_rng_ranks": rank_rngs} if rank_rngs else {})}, tmp / "trainer.pt")
        atomic_write_json(tmp / "state.json", {**state, "config_sha256": config_sha})
    publish_dir(tmp, final)
    return final


def is_checkpoint(path: Path) -> bool:
    return (path / "state.json").is_file() and not path.name.endswith((".tmp", ".old"))


def read_state(path: Path) -> tuple[dict, str]:
    """(loop state, config hash) of a checkpoint."""
    saved = json.loads((path / "state.json").read_text())
    return saved, saved.pop("config_sha256")


def load_checkpoint(path: Path, model, opt, sched, rank: int = 0) -> dict:
    """Restore weights, optimizer, scheduler and RNG states (`rank`'s own, if the checkpoint holds
    every rank's) in place; returns the loop state."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = path / "weights"
    if (weights / "adapter_model.safetensors").is_file():
        set_peft_model_state_dict(model, load_file(weights / "adapter_model.safetensors"))
    else:
        model.load_state_dict(load_file(weights / "model.safetensors"), strict=False)
    blob = torch.load(path / "trainer.pt", weights_only=True)  # tensors and plain containers only: no pickled code
    opt.load_state_dict(blob["optimizer"])
    if sched is not None:
        sched.load_state_dict(blob["scheduler"])
    torch.set_rng_state(blob["torch_rng_ranks"][rank] if rank < len(blob.get("torch_rng_ranks", ())) else blob["torch_rng"])
    random.setstate(blob["python_rng"])
    state, _ = read_state(path)
    return state


def resume_latest(checkpoints: list[Path], config_sha: str, model, opt, sched, logger, stale: Path,
                  rank: int = 0) -> dict | None:
    """The loop state of the newest checkpoint, restored in place, if it belongs to `config_sha`;
    else None after removing `stale` (what a killed run or another config left) and emptying the
    metrics log. A resumed log is cut back to the restored step, since the loop replays the rest."""
    if not checkpoints or read_state(checkpoints[-1])[1] != config_sha:
        shutil.rmtree(stale, ignore_errors=True)
        logger.truncate(0)
        return None
    state = load_checkpoint(checkpoints[-1], model, opt, sched, rank)
    logger.truncate(state["step"])
    return state
