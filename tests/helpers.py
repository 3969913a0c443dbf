"""Helpers for tests: config overrides, the mechanics tests' regime, free ports, a process killed
once it has logged. Quick protocol-following adapters are in utils/tinyarith/quick.py."""
from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

# Tests of the pipeline's mechanics run in regime D (configs/regimes/regime_d.yaml): their runs are
# too short to learn anything, and the default regime's dynamic sampling rightly stops a run whose
# every group scores alike. The default regime's own pieces have their own tests
# (test_dynamic_sampling, test_primary_metric, test_sft_stages' imperfect teacher, test_config).
REGIME_D = "regime=regime_d"


def set_args(*settings: str) -> list[str]:
    """Config overrides as command-line flags: ("a=1", "b=2") -> ["--set", "a=1", "--set", "b=2"]."""
    return [x for s in settings for x in ("--set", s)]


def free_port() -> int:
    """A TCP port free on this machine now (the kernel's pick): tests that run at once (pytest-xdist)
    must not share a launcher's rendezvous port or a server's."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_once_logged(cmd: list[str], cwd: Path, log: Path, lines: int, timeout: float) -> int:
    """Start `cmd`, SIGKILL it as soon as `log` has `lines` lines; returns its exit code
    (-SIGKILL when the kill landed, something else if it finished first)."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if log.is_file() and len(log.read_text().splitlines()) >= lines:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    return proc.wait(timeout=60)
