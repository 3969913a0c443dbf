"""math-verify behind the numeric scorer, with a time limit no input can beat.

`math_verify` (Hugging Face's answer checker, the one TRL's and open-r1's math rewards use) parses a
prediction and a gold answer (numbers, fractions, percentages, LaTeX such as `$2^{3}$` or
`\\boxed{\\frac{3}{4}}`, sets, units) into sympy and compares them. Its own time limit is
`signal.alarm`: whole seconds, the main thread only (it raises elsewhere, e.g. in a thread of a Ray
worker), and it cannot interrupt one long C-level operation such as the power in `$9^{9^{9^{9}}}$`,
which a Python signal handler only sees after the operation ends.

So the check runs in a child process of its own (`python -m utils.reward.verify`), one JSON line in
and one out, and the caller waits `VERIFY_TIMEOUT_S` for the answer: past it the child is killed
(SIGKILL, whatever it is doing), the answer counts as not equal (`timed_out` in the components), and
the next call starts a fresh child. The child's start (importing sympy, about 1 s) is not counted
against a call's limit. Any thread may call; calls are serialised by a lock. The child exits when
its input closes, so it never outlives its caller; identical checks are cached in the caller.
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from functools import lru_cache

VERIFY_TIMEOUT_S = 2.0   # one check; a gold number against a short answer takes about 1 ms
START_TIMEOUT_S = 120.0  # the child's import of math_verify and sympy, on a loaded 2-core box
MAX_VERIFIED_CHARS = 1_000  # the end of a longer span is checked: math-verify reads an answer's last expression


class _Child:
    """The math-verify process: started on first use, killed and restarted after a time-out."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()

    def _start(self) -> None:
        from utils.core.config import ROOT

        self.proc = subprocess.Popen([sys.executable, "-m", "utils.reward.verify"], cwd=ROOT, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        if self._read(START_TIMEOUT_S) != {"ready": True}:
            self._kill()
            raise RuntimeError(f"utils/reward/verify.py: the math-verify process did not start within "
                               f"{START_TIMEOUT_S:.0f} s (is math-verify installed? bash setup.sh)")

    def _read(self, limit: float) -> dict | None:
        ready, _, _ = select.select([self.proc.stdout], [], [], limit)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else None

    def _kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def ask(self, golds: tuple[str, ...], pred: str, limit: float) -> tuple[int | None, bool]:
        """(the index of the first gold equal to `pred`, or None; timed out)."""
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            try:
                self.proc.stdin.write(json.dumps({"golds": golds, "pred": pred}) + "\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                self._kill()
                return None, False
            t0 = time.monotonic()
            answer = self._read(limit)
            if answer is None:
                self._kill()
                return None, time.monotonic() - t0 >= limit
            return answer.get("matched"), False


_CHILD = _Child()


@lru_cache(maxsize=65_536)
def verify_equal(golds: tuple[str, ...], pred: str, limit: float = VERIFY_TIMEOUT_S) -> tuple[int | None, bool]:
    """The index of the first of `golds` math-verify finds equal to `pred` (None: none), and whether it
    ran out of time (then: None). Never raises on `pred`."""
    return _CHILD.ask(golds, str(pred)[-MAX_VERIFIED_CHARS:], limit)


def _serve() -> None:
    import logging

    logging.disable(logging.WARNING)  # "Timeout is disabled": the caller's limit is the time-out
    from math_verify import parse, verify

    from utils.core.signals import die_with_parent
    die_with_parent()
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr  # whatever a library prints never reaches the answers' pipe
    print(json.dumps({"ready": True}), file=out, flush=True)
    for line in sys.stdin:
        try:
            ask = json.loads(line)
            pred = parse(ask["pred"], parsing_timeout=None)
            matched = next((k for k, g in enumerate(ask["golds"])
                            if verify(parse(g, parsing_timeout=None), pred, timeout_seconds=None)), None)
        except Exception:  # noqa: BLE001 - a prediction math-verify cannot handle is not equal
            matched = None
        print(json.dumps({"matched": matched}), file=out, flush=True)
    os._exit(0)


if __name__ == "__main__":
    _serve()
