"""Files written so that a kill never leaves one half-written: a temporary file in the same folder,
fsynced, then renamed over the target (`atomic_write_*`); a folder assembled under a temporary name
and put in place by two renames (`publish_dir`), with what a cut between them leaves taken back at the
next start (`recover_aside`, `remove_stale_temporaries`); sorted-key JSON (`canonical_json`) so that
`diff` across runs is meaningful; repo-relative paths (`rel`). The kill-anywhere test cuts at the
`fault_point`s (utils/core/faults.py)."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from utils.core.config import ROOT
from utils.core.faults import fault_point


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


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
