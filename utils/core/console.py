"""The driver's quiet console (docs/OPERATIONS.md, "The console"): a stage's stdout and stderr pass
through this filter on their way to the terminal.

    python -m utils.core.console LOG ERR_FD   # the stage's stdout on stdin, its stderr on ERR_FD

Every byte goes to the stage's log file LOG. The console gets the same bytes, less the lines that
one of `HARMLESS` matches and the indented lines that continue them (a Python warning's source
line, nanobind's list of leaks). Progress bars (text between carriage returns) go to the console as
they come. Each pattern is a message of a pinned dependency that says nothing about the run: it is
kept in the log, never silenced at its source, so an unknown warning or any error still reaches the
console. `utils/core/signals.py` starts this filter for each stage the driver runs.
"""
from __future__ import annotations

import contextlib
import os
import re
import select
import sys
import tempfile
from pathlib import Path

_VLLM = r"(?:\(\w+ pid=\d+\) )?WARNING [\d-]+ [\d:]+ \[[\w.]+:\d+\] "  # vLLM 0.32's log prefix
HARMLESS = tuple(re.compile(p) for p in (
    # vLLM 0.32.0 on a CPU, each about a setting this project chose or a hint docs/PERFORMANCE.md covers
    _VLLM + r"The global random seed is set to",  # in-process engine: utils/agent/vllm_compat.py restores the RNGs
    _VLLM + r"Enforce eager set, disabling torch\.compile",  # model.engine.enforce_eager
    _VLLM + r"Inductor compilation was disabled by user settings",
    _VLLM + r"Triton is not installed\. triton-cpu is expected",
    _VLLM + r"Model Runner V2 requires Triton",
    _VLLM + r"(?:libtcmalloc|libiomp) is not found in LD_PRELOAD",  # a speed hint
    _VLLM + r"CPU backend doesn't allow to use `torch\.set_num_threads`",  # vllm_compat.in_process keeps the count
    _VLLM + r"RotaryEmbedding: Failed to load weights",  # its buffers are computed, not loaded
    _VLLM + r"Passing raw prompts to InputProcessor is deprecated",  # utils/agent/engines.py passes token ids
    # a CPU with AVX-512 BF16: the state cache of Mamba layers, which a Llama has none of
    _VLLM + r"Reset SSM cache type to float32 for accelerated GDN mamba backend",
    # its CPU worker's own variable, set in the process by a first in-process engine, seen by a second
    _VLLM + r"Unknown vLLM environment variable detected: VLLM_DIST_IDENT",
    r"Triton is installed, but doesn't include CPU backend",  # vLLM's import on a CPU
    r"(?:/[\w.-]+)+\.py:\d+: FutureWarning: `torch\.distributed\.reduce_op` is deprecated",  # vLLM's Triton dispatcher
    r"\[W\d+ [\d:.]+ utils\.cpp:\d+\] Warning: NUMA binding: Using MEMBIND policy",  # torch, vLLM's CPU worker
    r"nanobind: ",  # Triton's bindings at interpreter exit ("leaked N instances")
))
FLUSH_AFTER = 0.2  # seconds a progress bar's text may wait for its carriage return


def harmless(line: str) -> int | None:
    """Where in `line` a harmless message starts (the console keeps what is before it), or None."""
    for pattern in HARMLESS:
        m = pattern.search(line)
        if m:
            return m.start()
    return None


class Filter:
    """The console side of the stream: `feed` bytes as they come, `finish` at the end."""

    def __init__(self, console, log):
        self.console, self.log = console, log
        self.pending = b""
        self.dropping = False  # the last complete line was harmless: drop the indented lines that follow

    def _line(self, raw: bytes) -> None:
        """A complete line (ending in b"\\n")."""
        text = raw.decode("utf-8", "replace")
        if self.dropping and text[:1] in (" ", "\t"):
            return
        at = harmless(text)
        self.dropping = at is not None
        if at is None:
            self.console.write(raw)
        elif text[:at].strip():  # a progress bar that the message was printed after
            self.console.write(text[:at].encode() + b"\n")

    def feed(self, data: bytes) -> None:
        self.log.write(data)
        self.pending += data
        while True:
            nl, cr = self.pending.find(b"\n"), self.pending.find(b"\r")
            if nl < 0 and cr < 0:
                break
            if cr >= 0 and (nl < 0 or cr < nl):  # a progress bar's redraw: shown as it is
                self.console.write(self.pending[:cr + 1])
                self.pending = self.pending[cr + 1:]
                self.dropping = False
            else:
                self._line(self.pending[:nl + 1])
                self.pending = self.pending[nl + 1:]
        self.log.flush()
        self.console.flush()

    def stale(self) -> None:
        """Text that waited FLUSH_AFTER for its line's end: a progress bar mid-line, shown now."""
        if self.pending:
            self.console.write(self.pending)
            self.console.flush()
            self.pending = b""
            self.dropping = False

    def finish(self) -> None:
        if self.pending and harmless(self.pending.decode("utf-8", "replace")) is not None:
            self._line(self.pending + b"\n")  # a harmless last line without its newline: filtered as one
        elif self.pending:
            self.console.write(self.pending)
        self.pending = b""
        self.log.flush()
        self.console.flush()


@contextlib.contextmanager
def filtered_here(log_path: Path):
    """What this process writes to its file descriptors 1 and 2 inside the block (an import that
    warns) goes through a Filter afterwards: all of it to `log_path`, the rest to our stderr."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 1)
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            held.seek(0)
            with open(log_path, "ab") as log:
                f = Filter(sys.stderr.buffer, log)
                f.feed(held.read())
                f.finish()


def pump(streams: list[tuple[int, object]], log) -> None:
    """Copy each (fd, console stream) through a Filter of its own until every fd's last writer has
    closed it; all of them go to the one `log`, in the order they come."""
    filters = {fd: Filter(console, log) for fd, console in streams}
    while filters:
        ready, _, _ = select.select(list(filters), [], [], FLUSH_AFTER)
        if not ready:
            for f in filters.values():
                f.stale()
            continue
        for fd in ready:
            data = os.read(fd, 65536)
            if data:
                filters[fd].feed(data)
            else:
                filters.pop(fd).finish()


def main() -> int:
    if len(sys.argv) != 3:
        print("usage: python -m utils.core.console LOG ERR_FD  (the stage's stdout on stdin)", file=sys.stderr)
        return 2
    with open(sys.argv[1], "ab") as log:
        pump([(sys.stdin.fileno(), sys.stdout.buffer), (int(sys.argv[2]), sys.stderr.buffer)], log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
