"""Content hashes a manifest records: of a config (`config_sha256`), of a file or a folder
(`path_sha256`; a file above LARGE_FILE_BYTES by name and size only), and of the base model a stage
loaded, every file whatever its size (`model_identity`, `model_changes`), so that a replaced input
makes the stages that read it stale."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from utils.core.config import repo_path
from utils.core.files import rel


LARGE_FILE_BYTES = 256 * 1024 * 1024  # above this, a file is identified by name and size only


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
