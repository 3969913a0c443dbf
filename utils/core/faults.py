"""Kill points for the kill-anywhere test (tests/test_kill_anywhere.py); inert unless asked for.

With `REDCODA_FAULT=<point>[:<n>]` in its environment (and, if `REDCODA_FAULT_STAGE` is set, only
in the stage script of that name), a process SIGKILLs its whole process group the n-th time
(default: the first) it reaches `fault_point(<point>)`: the driver and its
running stage die together at an exact place, as `kill -9 -<pgid>` or a lost machine would
leave them. The test starts the driver in a session of its own, so nothing else is hit.

In a data-parallel run only rank 0 (torch's `RANK`), the rank that writes, fires: the launcher then
stops the others, as when the main node is lost. Were every rank to fire, the first to die would
have the launcher SIGTERM the rest, and a rank 0 not yet at its point would unwind and mark its
manifest failed: which of the two happened would depend on which rank got there first.

Points: `write:<file name>` (an atomic write, its temporary file complete, before the rename),
`checkpoint` (a training checkpoint half assembled: weights written, optimizer state not),
`publish:<folder name>` (`publish_dir` between its two renames: the old folder moved aside, the new
one not yet in its place),
`sft_step` (an SFT step's loss computed, the update not applied), `rollout` (an engine poll
of the agent rollout, in training or evaluation).
"""
from __future__ import annotations

import os
import signal
import sys
from collections import Counter
from pathlib import Path

FAULT_ENV, STAGE_ENV = "REDCODA_FAULT", "REDCODA_FAULT_STAGE"
_reached: Counter = Counter()


def fault_point(name: str) -> None:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    point, _, nth = spec.rpartition(":") if spec.rpartition(":")[2].isdigit() else (spec, "", "1")
    stage = os.environ.get(STAGE_ENV)
    if point != name or (stage and Path(sys.argv[0]).stem != stage) or os.environ.get("RANK", "0") != "0":
        return
    _reached[name] += 1
    if _reached[name] == int(nth):
        os.killpg(os.getpgrp(), signal.SIGKILL)
