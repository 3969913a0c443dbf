"""What this project asks of glibc's heap: keep freed blocks for reuse within a phase
(`keep_freed_memory`), and give the freed pages back to the kernel between a stage's phases
(`release_freed_memory`).

A backward frees gigabytes of activations, but glibc keeps most of those pages: its arenas hold the
freed blocks for reuse, and the settings that keep a matrix-product loop from page-faulting
(`keep_freed_memory`) raise the share it holds. On SmolLM2-135M the
process stayed at 5.9 GiB resident after 04's first step while 1.8 GiB was in use, and the vLLM
engine that started next added its own on top (docs/PERFORMANCE.md, "Where a real model's memory
goes"). `release_freed_memory` hands the free pages back at a phase boundary where the next phase
allocates elsewhere: before 04 validates (the engine starts or serves) and before an RL step's
policy goes to the engine. Within a phase nothing changes, so a loop's speed is kept.
"""
from __future__ import annotations

import ctypes
import functools


@functools.cache
def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def release_freed_memory() -> bool:
    """glibc's `malloc_trim(0)`: return every arena's free pages to the kernel. What is in use is not
    touched. Returns whether glibc released any (False on another C library, which keeps its own)."""
    libc = _libc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    return bool(libc.malloc_trim(0))


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed blocks of up to 32 MiB for reuse instead of returning them to the
    kernel (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD). Once an in-process vLLM engine holds its memory,
    glibc otherwise served every tensor of a few MiB with a fresh mmap: on this box a loop of
    matrix products then ran at half speed, page-faulting 2.4M times where it had 46k
    (docs/PERFORMANCE.md). Set as an in-process engine starts (utils/agent/vllm_compat.py
    `in_process`). Returns whether glibc took the settings (False on another C library)."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    return bool(libc.mallopt(m_mmap_threshold, 32 << 20)) and bool(libc.mallopt(m_trim_threshold, 1 << 30))
