"""Metric logging: metrics.jsonl always, plus Weights & Biases when wanted.

`wandb_mode=auto` means online only if WANDB_API_KEY is set, else offline (files under the stage
directory, synced later with `wandb sync`); it never prompts for a login. `disabled` uses a null
backend with the same methods, so no caller needs `if wandb:`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from utils.core.files import atomic_write_text


class NullBackend:
    def log(self, metrics: dict, step: int) -> None:
        pass

    def finish(self) -> None:
        pass


class WandbBackend:
    def __init__(self, mode: str, project: str, name: str, config: dict, out_dir: Path):
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        self.run = wandb.init(project=project, name=name, config=config, mode=mode, dir=str(out_dir), reinit=True)

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(metrics, step=step)

    def finish(self) -> None:
        self.run.finish()


def resolve_mode(mode: str) -> str:
    if mode == "auto":
        return "online" if os.environ.get("WANDB_API_KEY") else "offline"
    if mode not in ("online", "offline", "disabled"):
        raise ValueError(f"wandb_mode: expected auto | online | offline | disabled, got '{mode}'")
    return mode


class NullLogger:
    """A MetricsLogger that writes nothing: the logger of a data-parallel rank other than 0."""

    def log(self, metrics: dict) -> None:
        pass

    def truncate(self, step: int) -> None:
        pass

    def finish(self) -> None:
        pass


class MetricsLogger:
    def __init__(self, path: Path, backend=None):
        self.path, self.backend = Path(path), backend or NullBackend()
        self.path.parent.mkdir(parents=True, exist_ok=True)

    @classmethod
    def create(cls, path: Path, mode: str, project: str, name: str, config: dict) -> "MetricsLogger":
        mode = resolve_mode(mode)
        backend = NullBackend() if mode == "disabled" else WandbBackend(mode, project, name, config, path.parent)
        return cls(path, backend)

    def log(self, metrics: dict) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps(metrics, sort_keys=True) + "\n")
        self.backend.log(metrics, step=metrics.get("step", 0))

    def truncate(self, step: int) -> None:
        """Drop lines logged after `step` (a resume replays them)."""
        if not self.path.is_file():
            return
        keep = [ln for ln in self.path.read_text().splitlines() if ln.strip() and json.loads(ln).get("step", 0) <= step]
        atomic_write_text(self.path, "".join(k + "\n" for k in keep))

    def finish(self) -> None:
        self.backend.finish()
