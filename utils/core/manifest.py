"""Stage manifests (docs/ARCHITECTURE.md, "Stages"): what ran, on what, producing what, and with what result.

A manifest is plain JSON with sorted keys, written atomically (temporary file, fsync, rename),
so `diff` across runs is meaningful and a killed stage never leaves a manifest claiming success.
Paths are stored relative to the repo root, so two clones of the same run diff cleanly.

Only the keys in `VOLATILE_KEYS` (times, peak memory) may differ between two runs of a stage with the same
config and inputs; `manifest_digest` hashes everything else, and is what children record as
their parents' hashes. The manifest carries its own digest (`seal_sha256`), so a hand edit (say,
"failed" turned into "completed") is detected: the driver re-runs such a stage and a child
refuses such a parent.

Lifecycle, through `StageRun`:
    entry   -> status "running" replaces any previous manifest of the stage
    success -> status "completed", with outputs' hashes and metrics
    error   -> status "failed", with the error message; the exception propagates
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from utils.core.files import atomic_write_json, rel, remove_stale_temporaries
from utils.core.hashing import config_sha256, model_identity, path_sha256
from utils.core.lock import RunLock
from utils.core.provenance import device_name, git_state, package_versions, peak_gpu_mb, peak_rss_mb, utc_now


MANIFEST_NAME = "manifest.json"
VOLATILE_KEYS = ("started_at", "finished_at", "wall_seconds", "peak_rss_mb", "peak_rss_children_mb", "peak_gpu_mb",
                 "memory_estimate_gib")
SEAL_KEY = "seal_sha256"


def manifest_digest(manifest: dict) -> str:
    """Hash of a manifest without its times, memory and seal: equal for two runs with the same config
    and inputs."""
    stable = {k: v for k, v in manifest.items() if k not in (*VOLATILE_KEYS, SEAL_KEY)}
    return config_sha256(stable)


def seal_state(manifest: dict) -> str:
    """'sealed' if the manifest's seal (its digest, written with it) still matches its content,
    'edited' if not (someone changed it by hand), 'unsealed' if it has none (an older version)."""
    if SEAL_KEY not in manifest:
        return "unsealed"
    return "sealed" if manifest[SEAL_KEY] == manifest_digest(manifest) else "edited"


def read_manifest(path: Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_NAME
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: manifest not found; run the stage that writes it first") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: manifest is not valid JSON ({exc})") from None


class StageRun:
    """Context manager that owns one stage's manifest.

        with StageRun("01_prepare_dataset", out_dir, config, seed) as run:
            run.add_input(path); run.add_parent(parent_dir)
            ... write outputs ...
            run.add_output(path); run.metrics["n_train"] = 100
    """

    def __init__(self, stage: str, out_dir: Path, config: dict, seed: int | None = None, writer: bool = True):
        """`writer=False`: a data-parallel rank other than 0 (utils/train/world.py), which reads its
        parents through the run but takes no lock and writes no manifest."""
        self.stage, self.out_dir, self.writer = stage, Path(out_dir), writer
        self.path = self.out_dir / MANIFEST_NAME
        self.metrics: dict[str, Any] = {}
        self.warnings: list[str] = []
        self.data: dict[str, Any] = {
            "stage": stage, "status": "running", "config": config, "config_sha256": config_sha256(config),
            "seed": seed, "inputs": {}, "outputs": {}, "parents": {}, "git": git_state(),
            "versions": package_versions(), "device": device_name(),
        }
        self._t0 = 0.0

    def add_input(self, path: Path) -> None:
        self.data["inputs"][rel(path)] = path_sha256(path)

    def add_model(self, path: Path) -> None:
        """Record the base model folder this stage loads (`model_identity`): the driver re-runs the
        stage when its files change."""
        self.data["model"] = model_identity(path)

    def add_output(self, path: Path) -> None:
        if self.writer:
            self.data["outputs"][rel(path)] = path_sha256(path)

    def add_parent(self, stage_dir: Path) -> dict:
        """Record a parent stage's manifest digest; returns the parent manifest. It must be complete."""
        parent = read_manifest(stage_dir)
        if seal_state(parent) == "edited":
            raise RuntimeError(f"{Path(stage_dir) / MANIFEST_NAME}: edited by hand (its seal does not match "
                               f"its content); re-run stage '{parent.get('stage')}'")
        if parent.get("status") != "completed":
            raise RuntimeError(f"{Path(stage_dir) / MANIFEST_NAME}: parent stage '{parent.get('stage')}' "
                               f"has status '{parent.get('status')}', expected 'completed'")
        self.data["parents"][parent["stage"]] = manifest_digest(parent)
        return parent

    def _run_dir(self) -> Path:
        """The run folder: the parent of the folder named after the stage's script (`<run>/07_evaluate/red`
        of stage "07_evaluate/red" -> `<run>`), else the parent of out_dir."""
        script = self.stage.split("/")[0]
        named = [d for d in (self.out_dir, *self.out_dir.parents) if d.name == script]
        return (named[0] if named else self.out_dir).parent

    def _write(self) -> None:
        body = dict(self.data, metrics=self.metrics, warnings=self.warnings)
        body[SEAL_KEY] = manifest_digest(body)
        atomic_write_json(self.path, body)

    def __enter__(self) -> "StageRun":
        if not self.writer:
            return self
        self._lock = RunLock(self._run_dir())  # one writer per run (utils/core/lock.py)
        self._lock.acquire()
        remove_stale_temporaries(self.out_dir)
        self._t0 = time.time()
        self.data["started_at"] = utc_now()
        try:
            self._write()
        except BaseException:  # e.g. a full disk: nothing of this run written, and the run not left locked
            self._lock.release()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if not self.writer:
            return False
        self.data["finished_at"] = utc_now()
        self.data["wall_seconds"] = round(time.time() - self._t0, 3)
        self.data["peak_rss_mb"], self.data["peak_rss_children_mb"] = peak_rss_mb()
        if (gpu := peak_gpu_mb()) is not None:
            self.data["peak_gpu_mb"] = gpu
        if exc_type is None:
            self.data["status"] = "completed"
        else:
            self.data["status"] = "failed"
            self.data["error"] = f"{exc_type.__name__}: {exc}"
        try:
            self._write()
        finally:
            self._lock.release()
        return False
