"""Stopping a stage that holds a real vLLM engine (utils/core/signals.py): SIGTERM to the driver
stops its running stage in order, and a SIGKILLed stage takes its engine core with it. Each
test waits for 04's first validation, so the engine is up, then signals, then checks every
process that descended from the stage is gone, the manifest says "failed" and the lock is free."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import run_stage, set_args, wait_for
from utils.core.config import ROOT
from utils.core.schema import DataConfig
from utils.data.synthetic import write_dataset

# 04 validates on vLLM after every step, for long enough that it is still training when signalled
SETS = ["data.n_train=40", "data.n_val=6", "data.n_test=6", "warmup.steps=400", "warmup.eval_every=1",
        "warmup.eval_size=2", "warmup.batch_size=4", "model.engine.name=vllm", "wandb_mode=disabled",
        "model.engine.in_process=false"]  # the engine core in a process of its own, which must not outlive the stage


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _descendants(pid: int) -> set[int]:
    todo, seen = [pid], set()
    while todo:
        for child in _children(todo.pop()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


def _state(pid: int) -> str | None:
    """The process's state letter (R, S, Z, ...), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _running(pid: int) -> bool:
    return _state(pid) not in (None, "Z", "X")


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _survivors(pids: set[int]) -> str:
    """The processes of `pids` still running, by pid, name and state, for a timeout's message."""
    return ": still running " + ", ".join(f"{p} {_comm(p)!r} ({_state(p)})" for p in sorted(pids) if _running(p))


def _start(cmd: list[str], run: Path) -> tuple[subprocess.Popen, int, set[int]]:
    """Start `cmd`; wait until 04 (its own process or the driver's child) has validated once on
    vLLM; return the process, 04's pid and every process below 04 at that moment."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = run / "04_sft_warmup" / "valid_samples" / "step_1.json"
    wait_for(lambda: first.is_file() or proc.poll() is not None, 600, "04's first validation")
    assert proc.poll() is None, f"{cmd[1]} ended (exit {proc.returncode}) before it could be signalled"
    stage = proc.pid if cmd[1] == "04_sft_warmup.py" else next(  # a forked stage keeps the driver's command
        p for p in _children(proc.pid)                               # line; its name is the stage's (the
        if "utils.core.console" not in Path(f"/proc/{p}/cmdline").read_text()  # console filter's names its log)
        and ("04_sft_warmup" in Path(f"/proc/{p}/cmdline").read_text() or _comm(p) == "04_sft_warmup"))
    below = _descendants(stage)
    assert any(_comm(p).startswith("VLLM::EngineCor") for p in below), [_comm(p) for p in below]
    return proc, stage, below


# How long an engine core may take to shut down once told to: 16 s on an idle 2-core box, but a
# CI run with a second suite beside it went past 60 s. An engine left behind never ends, so a
# generous limit costs nothing when the code is right.
SHUTDOWN_S = 180


def _assert_stopped(run: Path, pids: set[int]) -> None:
    wait_for(lambda: not [p for p in pids if _running(p)], SHUTDOWN_S, "the stage's engine processes to end",
              lambda: _survivors(pids))
    manifest = json.loads((run / "04_sft_warmup" / "manifest.json").read_text())
    assert manifest["status"] == "failed"


def _data(tmp_path) -> Path:
    write_dataset(DataConfig(n_train=40, n_val=6, n_test=6), tmp_path / "synth")
    return tmp_path / "synth"


@pytest.mark.slow
def test_sigterm_to_the_driver_stops_its_stage_and_the_engine_in_order(tmp_path):
    out, data = tmp_path / "outputs", _data(tmp_path)
    sets = set_args(*SETS, f"outputs_dir={out}", f"data.path={data}")
    cmd = [sys.executable, "09_driver.py", "--method", "sft", "--run_id", "r", *sets]
    driver, stage, below = _start(cmd, out / "r")
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=120) == 128 + signal.SIGTERM
    assert not _running(stage)
    _assert_stopped(out / "r", below)
    assert not (out / "r" / ".lock").exists()
    run_manifest = json.loads((out / "r" / "run_manifest.json").read_text())
    assert run_manifest["status"] == "terminated at 04_sft_warmup"
    log = (out / "r" / "04_sft_warmup" / "manifest.json").read_text()
    assert "Terminated" in log  # the stage unwound (its manifest names the signal), it was not SIGKILLed


@pytest.mark.slow
def test_a_sigkilled_stage_leaves_no_engine_behind(tmp_path):
    out, data = tmp_path / "outputs", _data(tmp_path)
    sets = set_args(*SETS, f"data.path={data}")
    for stage in ("00_check_data", "01_prepare_dataset", "02_build_rewards", "03_generate_sft_traces"):
        assert run_stage(stage, out, *sets) == 0  # in this process: only 04 needs one of its own
    cmd = [sys.executable, "04_sft_warmup.py", "--run_id", "t", "--set", f"outputs_dir={out}", *sets]
    proc, _, below = _start(cmd, out / "t")
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    wait_for(lambda: not [p for p in below if _running(p)], SHUTDOWN_S, "the engine core to follow its killed stage",
              lambda: _survivors(below))
    # the SIGKILLed stage could not write its manifest: it still says "running", and the next run
    # takes its lock over as stale (tests/test_lock.py)
    assert json.loads((out / "t" / "04_sft_warmup" / "manifest.json").read_text())["status"] == "running"


@pytest.mark.slow
def test_a_sigkilled_driver_takes_its_running_stage_down_in_order(tmp_path):
    """Only the driver is killed (not its process group): its stage, asked by the kernel for
    SIGTERM when the driver dies, unwinds as under a SIGTERMed driver."""
    out, data = tmp_path / "outputs", _data(tmp_path)
    sets = set_args(*SETS, f"outputs_dir={out}", f"data.path={data}")
    driver, stage, below = _start([sys.executable, "09_driver.py", "--method", "sft", "--run_id", "r", *sets], out / "r")
    driver.send_signal(signal.SIGKILL)
    assert driver.wait(timeout=30) == -signal.SIGKILL
    wait_for(lambda: not _running(stage), 120, "the driver's stage to stop")
    _assert_stopped(out / "r", below)
    assert "Terminated" in (out / "r" / "04_sft_warmup" / "manifest.json").read_text()
    # the stage released its hold; what remains is the dead driver's own lock, which the next driver
    # takes over as stale (tests/test_lock.py)
    assert json.loads((out / "r" / ".lock").read_text())["pid"] == driver.pid


def test_a_spawned_child_ends_at_the_latest_its_grace_after_its_parent_is_gone(tmp_path):
    """exit_when_orphaned: the last resort behind die_with_parent's signal (vLLM's engine core can hang
    in the shutdown that signal starts): a child whose parent has exited ends within its grace."""
    import time

    code = ("import os, sys, time; sys.path.insert(0, sys.argv[1]); from utils.core.signals import exit_when_orphaned; "
            "exit_when_orphaned(grace=1.0, poll=0.1); print(os.getpid(), flush=True); time.sleep(120)")
    middle = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable, "
                               "'-c', sys.argv[1], sys.argv[2]]); time.sleep(1)", code, str(ROOT)],
                              stdout=subprocess.PIPE, text=True)
    child = int(middle.stdout.readline())
    assert middle.wait(timeout=30) == 0
    start = time.monotonic()

    def gone() -> bool:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(gone, 30, "the orphaned child to end")
    assert time.monotonic() - start < 30
