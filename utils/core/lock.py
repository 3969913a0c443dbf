"""One writer per run: a lock file in the run's output folder.

`09_driver.py` and every stage hold `outputs/<run_id>/.lock` while they write under that folder. The
lock file names its holder: pid, host, command line and start time. A second driver or stage on
the same run (or on a folder below a locked one, up to `LEVELS` folders up, e.g. `<run_id>/seed_2`
while a driver holds `<run_id>`) is refused at once with that holder named. A lock whose process is gone (a SIGKILLed
run) is stale: it is reported and taken over. The driver's stages are its children: the driver
passes its pid in `REDCODA_LOCK_HOLDER`, and a lock held by that pid lets them through.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

LOCK_NAME = ".lock"
HOLDER_ENV = "REDCODA_LOCK_HOLDER"
LEVELS = 3


class RunLocked(RuntimeError):
    """Another live process holds the run."""


def _alive(pid: int) -> bool:
    """Whether `pid` runs. A zombie (killed, not yet reaped: a SIGKILLed driver's stage whose new
    parent has not waited for it) is dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc (macOS): trust kill(0)
    return state not in ("Z", "X")


def _holder(path: Path, retry: bool = True) -> dict | None:
    """The lock's holder, or None if there is none or the file is unreadable (a lock cut off
    mid-write). An unreadable file is read again after a moment: its writer may be mid-write."""
    try:
        found = json.loads(path.read_text())
        return found if isinstance(found, dict) else None
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        if retry:
            time.sleep(0.2)
            return _holder(path, retry=False)
        return None


def _live(holder: dict | None) -> bool:
    return (holder is not None and holder.get("host") == socket.gethostname()
            and isinstance(holder.get("pid"), int) and _alive(holder["pid"]))


def live_holder(path: Path) -> dict | None:
    """The holder of lock file `path` if it is a live process on this host, else None."""
    holder = _holder(path)
    return holder if _live(holder) else None


def _describe(path: Path, holder: dict) -> str:
    return (f"{path.parent} is in use by pid {holder['pid']} on {holder['host']} since {holder.get('started')} "
            f"({holder.get('command', '?')}); wait for it to finish, stop it, or use another --run_id")


class RunLock:
    """`with RunLock(run_dir):` holds run_dir/.lock; refuses if run_dir or one of the LEVELS
    folders above it is held by another live process (not this one, not our driver)."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir).absolute()
        self.path = self.run_dir / LOCK_NAME
        self.held = False

    def _check_above(self) -> None:
        allowed = os.environ.get(HOLDER_ENV)
        for d in self.run_dir.parents[:LEVELS]:
            holder = _holder(d / LOCK_NAME)
            if _live(holder) and str(holder["pid"]) != allowed and holder["pid"] != os.getpid():
                raise RunLocked(_describe(d / LOCK_NAME, holder))

    def acquire(self) -> None:
        self._check_above()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.argv)[:300],
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = _holder(self.path)
                if _live(holder):
                    if holder["pid"] == os.getpid():
                        return  # re-entered in the same process
                    if str(holder["pid"]) == os.environ.get(HOLDER_ENV):
                        return  # our driver holds it: a stage of its plan
                    raise RunLocked(_describe(self.path, holder))
                print(f"note: taking over a stale lock on {self.run_dir} "
                      f"(pid {holder.get('pid') if holder else '?'} is gone)", file=sys.stderr)
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.held = True
            return
        raise RunLocked(f"{self.path}: could not take the lock (another process keeps creating it)")

    def release(self) -> None:
        if self.held:
            holder = _holder(self.path)
            if holder is not None and holder.get("pid") == os.getpid():
                self.path.unlink(missing_ok=True)
            self.held = False

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
